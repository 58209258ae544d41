package sqlplan

import (
	"context"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/shardlab/shardlab/rules"
)

// analyzer builds one Plan from one parsed statement.
type analyzer struct {
	ctx        context.Context
	p          *Planner
	sql        string // the client's text
	text       string // the text that was parsed (normalised or the client's)
	normalized bool
	lits       []Literal
	plan       *Plan
	tree       *pg.ParseResult
	maxParam   int
	top        *scope
	// quals, bare and written: see mayReferTo.
	quals, bare map[string]bool
	written     map[*pg.RangeVar]bool
	pre         *Pre // an UPDATE's or DELETE's subqueries to evaluate first, if refused
}

// scope is one query level: a SELECT (or the top of an UPDATE or DELETE) with the
// tables of its FROM clause. Subqueries are scopes of their own.
type scope struct {
	parent *scope
	refs   []*tableRef
	ctes   map[string]bool
	// narrowing are conditions every row of this scope's result satisfies: WHERE
	// conjuncts and the quals of inner joins that no outer join makes optional.
	narrowing []*pg.Node
	// equalities are every conjunct of WHERE and JOIN quals, anywhere: where two key
	// columns are equal, their tables' rows meet on one shard.
	equalities []*pg.Node
	// using lists USING (...) join columns, as pairs of the two sides' tables.
	using []usingJoin
	// inlined is set for a subquery in FROM that only filters and projects rows (no
	// aggregate, DISTINCT, LIMIT or window): each shard computes its part exactly, so
	// its tables count as the outer query's.
	inlined bool
	// names are the names the scope's FROM items answer to (tables, aliases, subquery
	// and function aliases): a qualified column naming one of them is not an outer
	// reference.
	names map[string]bool
}

func (s *scope) addName(n string) {
	if n == "" {
		return
	}
	if s.names == nil {
		s.names = map[string]bool{}
	}
	s.names[n] = true
}

// topLevel reports whether s is the statement's top scope or a subquery inlined into
// it.
func (a *analyzer) topLevel(s *scope) bool {
	for sc := s; sc != nil; sc = sc.parent {
		if sc == a.top {
			return true
		}
		if !sc.inlined {
			return false
		}
	}
	return false
}

type usingJoin struct {
	left, right []*tableRef
	columns     []string
}

func (s *scope) cteVisible(name string) bool {
	for sc := s; sc != nil; sc = sc.parent {
		if sc.ctes[name] {
			return true
		}
	}
	return false
}

func (a *analyzer) analyze(stmt *pg.Node) error {
	switch n := stmt.Node.(type) {
	case *pg.Node_SelectStmt:
		return a.analyzeSelect(n.SelectStmt)
	case *pg.Node_InsertStmt:
		return a.analyzeInsert(n.InsertStmt)
	case *pg.Node_UpdateStmt:
		return a.analyzeUpdate(n.UpdateStmt)
	case *pg.Node_DeleteStmt:
		return a.analyzeDelete(n.DeleteStmt)
	case *pg.Node_TransactionStmt:
		return a.analyzeTransaction(n.TransactionStmt)
	case *pg.Node_VariableSetStmt:
		a.plan.Kind = KindSet
		return nil
	case *pg.Node_VariableShowStmt:
		a.plan.Kind = KindShow
		return nil
	case *pg.Node_DiscardStmt:
		a.plan.Kind = KindDiscard
		return nil
	case *pg.Node_CopyStmt:
		return a.analyzeCopy(n.CopyStmt)
	case *pg.Node_ExplainStmt:
		return a.analyzeExplain(n.ExplainStmt)
	case *pg.Node_LockStmt:
		return a.analyzeLock(n.LockStmt)
	case *pg.Node_DoStmt:
		return unsupported("DO blocks run code the sharding layer cannot see into; run it on the shards directly")
	case *pg.Node_CallStmt:
		return unsupported("CALL runs a procedure the sharding layer cannot see into; run it on the shards directly")
	case *pg.Node_PrepareStmt, *pg.Node_ExecuteStmt, *pg.Node_DeallocateStmt:
		return unsupported("SQL-level PREPARE, EXECUTE and DEALLOCATE; use the protocol's prepared statements")
	case *pg.Node_DeclareCursorStmt, *pg.Node_FetchStmt, *pg.Node_ClosePortalStmt:
		return unsupported("cursors (DECLARE, FETCH, CLOSE)")
	case *pg.Node_ListenStmt, *pg.Node_NotifyStmt, *pg.Node_UnlistenStmt:
		a.plan.Kind = KindListen
		return nil
	default:
		return a.analyzeDDL(stmt)
	}
}

func (a *analyzer) analyzeTransaction(t *pg.TransactionStmt) error {
	a.plan.Kind = KindTransaction
	switch t.Kind {
	case pg.TransactionStmtKind_TRANS_STMT_BEGIN, pg.TransactionStmtKind_TRANS_STMT_START:
		a.plan.Tx = TxBegin
	case pg.TransactionStmtKind_TRANS_STMT_COMMIT:
		a.plan.Tx = TxCommit
	case pg.TransactionStmtKind_TRANS_STMT_ROLLBACK:
		a.plan.Tx = TxRollback
	case pg.TransactionStmtKind_TRANS_STMT_SAVEPOINT:
		a.plan.Tx = TxSavepoint
	case pg.TransactionStmtKind_TRANS_STMT_RELEASE:
		a.plan.Tx = TxRelease
	case pg.TransactionStmtKind_TRANS_STMT_ROLLBACK_TO:
		a.plan.Tx = TxRollbackTo
	case pg.TransactionStmtKind_TRANS_STMT_PREPARE:
		if !a.p.rules.OneShard() {
			return unsupported("PREPARE TRANSACTION over several shards: the sharding layer runs its own two-phase commit (--two-phase)")
		}
		// One shard: the client's own two-phase commit, on that server.
		a.plan.Tx = TxPrepare
	default:
		return unsupported("PREPARE TRANSACTION, COMMIT PREPARED and ROLLBACK PREPARED: the sharding layer runs its own two-phase commit")
	}
	if a.plan.Tx == TxSavepoint || a.plan.Tx == TxRelease || a.plan.Tx == TxRollbackTo {
		a.plan.Savepoint = QuoteIdent(t.SavepointName)
	}
	a.plan.Chain = t.Chain
	return nil
}

// addRef registers a table reference found in scope s.
func (a *analyzer) addRef(rv *pg.RangeVar, s *scope) (*tableRef, error) {
	if rv.Catalogname != "" {
		return nil, unsupported("three-part table name %s.%s.%s", rv.Catalogname, rv.Schemaname, rv.Relname)
	}
	r := &tableRef{
		rule:     a.p.rules.Lookup(rv.Relname),
		name:     rv.Relname,
		schema:   rv.Schemaname,
		scope:    s,
		index:    len(a.plan.refs),
		rangeVar: rv,
	}
	if rv.Alias != nil {
		r.alias = rv.Alias.Aliasname
	}
	// System catalogs and information_schema are per database: they live where the
	// default data source is, whatever rules say of a table with the same name.
	if r.schema == "pg_catalog" || r.schema == "information_schema" || strings.HasPrefix(r.name, "pg_") {
		r.rule = &rules.TableRule{Name: r.name, Kind: rules.KindDefault, Binding: -1,
			Nodes: []rules.Node{{DataSource: a.p.rules.DefaultDataSource(), Table: r.name}}}
	}
	if r.sharded() {
		r.keyTypes = map[string]rules.KeyType{}
		for _, col := range r.rule.KeyColumns() {
			t := r.rule.KeyType(col)
			if t == rules.TypeUnknown {
				if a.p.cat == nil {
					return nil, unsupported("the type of sharding column %s.%s is not in the rules and no catalog was given", r.name, col)
				}
				var err error
				if t, err = a.p.cat.KeyType(a.ctx, r.rule, col); err != nil {
					return nil, err
				}
			}
			r.keyTypes[col] = t
		}
	}
	a.plan.refs = append(a.plan.refs, r)
	a.plan.Tables = appendUnique(a.plan.Tables, r.name)
	if s != nil {
		s.refs = append(s.refs, r)
	}
	return r, nil
}

func appendUnique(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}

// collectSelect registers the tables of a SELECT (and of its subqueries, as child
// scopes) and returns its scope.
func (a *analyzer) collectSelect(sel *pg.SelectStmt, parent *scope) (*scope, error) {
	s := &scope{parent: parent}
	if sel.WithClause != nil {
		if err := a.collectWith(sel.WithClause, s); err != nil {
			return nil, err
		}
	}
	if sel.Op != pg.SetOperation_SETOP_NONE {
		for _, arm := range []*pg.SelectStmt{sel.Larg, sel.Rarg} {
			if _, err := a.collectSelect(arm, s); err != nil {
				return nil, err
			}
		}
		// The whole operation's ORDER BY, LIMIT and OFFSET may hold subqueries too.
		for _, part := range [][]*pg.Node{sel.SortClause, {sel.LimitCount}, {sel.LimitOffset}} {
			for _, n := range part {
				if err := a.collectSublinks(n, s); err != nil {
					return nil, err
				}
			}
		}
		return s, nil
	}
	for _, item := range sel.FromClause {
		if err := a.collectFrom(item, s, true); err != nil {
			return nil, err
		}
	}
	if sel.WhereClause != nil {
		conj := conjuncts(sel.WhereClause)
		s.narrowing = append(s.narrowing, conj...)
		s.equalities = append(s.equalities, conj...)
	}
	// Subqueries anywhere else in the statement are scopes of their own.
	for _, part := range [][]*pg.Node{sel.TargetList, {sel.WhereClause}, sel.GroupClause, {sel.HavingClause},
		sel.SortClause, {sel.LimitCount}, {sel.LimitOffset}, sel.WindowClause, sel.DistinctClause} {
		for _, n := range part {
			if err := a.collectSublinks(n, s); err != nil {
				return nil, err
			}
		}
	}
	for _, row := range sel.ValuesLists {
		if err := a.collectSublinks(row, s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (a *analyzer) collectWith(w *pg.WithClause, s *scope) error {
	if s.ctes == nil {
		s.ctes = map[string]bool{}
	}
	if w.Recursive {
		for _, c := range w.Ctes {
			s.ctes[c.GetCommonTableExpr().Ctename] = true
		}
	}
	for _, c := range w.Ctes {
		cte := c.GetCommonTableExpr()
		if err := a.collectQuery(cte.Ctequery, s); err != nil {
			return err
		}
		s.ctes[cte.Ctename] = true
	}
	return nil
}

// collectQuery collects a subquery: a SELECT, or a data-modifying statement in WITH.
func (a *analyzer) collectQuery(n *pg.Node, parent *scope) error {
	switch q := n.Node.(type) {
	case *pg.Node_SelectStmt:
		_, err := a.collectSelect(q.SelectStmt, parent)
		return err
	default:
		return unsupported("data-modifying statements in WITH")
	}
}

// collectFrom registers one FROM item. preserved is false under the nullable side of
// an outer join, where join quals do not restrict the result's rows.
func (a *analyzer) collectFrom(item *pg.Node, s *scope, preserved bool) error {
	switch n := item.Node.(type) {
	case *pg.Node_RangeVar:
		rv := n.RangeVar
		if rv.Schemaname == "" && s.cteVisible(rv.Relname) {
			s.addName(rv.Relname)
			if rv.Alias != nil {
				s.addName(rv.Alias.Aliasname)
			}
			return nil // a CTE, not a table
		}
		r, err := a.addRef(rv, s)
		if err == nil {
			s.addName(r.qualifier())
		}
		return err
	case *pg.Node_JoinExpr:
		j := n.JoinExpr
		inner := j.Jointype == pg.JoinType_JOIN_INNER
		lp := preserved && (inner || j.Jointype == pg.JoinType_JOIN_LEFT)
		rp := preserved && (inner || j.Jointype == pg.JoinType_JOIN_RIGHT)
		before := len(s.refs)
		if err := a.collectFrom(j.Larg, s, lp); err != nil {
			return err
		}
		mid := len(s.refs)
		if err := a.collectFrom(j.Rarg, s, rp); err != nil {
			return err
		}
		if j.IsNatural {
			s.using = append(s.using, usingJoin{left: s.refs[before:mid], right: s.refs[mid:], columns: nil})
		}
		if len(j.UsingClause) > 0 {
			var cols []string
			for _, c := range j.UsingClause {
				cols = append(cols, c.GetString_().Sval)
			}
			s.using = append(s.using, usingJoin{left: s.refs[before:mid], right: s.refs[mid:], columns: cols})
		}
		if j.Quals != nil {
			conj := conjuncts(j.Quals)
			s.equalities = append(s.equalities, conj...)
			if inner && preserved {
				s.narrowing = append(s.narrowing, conj...)
			}
			for _, q := range conj {
				if err := a.collectSublinks(q, s); err != nil {
					return err
				}
			}
		}
		a.noteOuterJoin(j, s, before, mid)
		return nil
	case *pg.Node_RangeSubselect:
		if al := n.RangeSubselect.Alias; al != nil {
			s.addName(al.Aliasname)
		}
		sub := n.RangeSubselect.Subquery.GetSelectStmt()
		child, err := a.collectSelect(sub, s)
		if err != nil {
			return err
		}
		child.inlined, err = a.rowwise(sub)
		return err
	case *pg.Node_RangeFunction:
		if al := n.RangeFunction.Alias; al != nil {
			s.addName(al.Aliasname)
		}
		for _, f := range n.RangeFunction.Functions {
			if err := a.collectSublinks(f, s); err != nil {
				return err
			}
		}
		return nil
	default:
		return a.collectSublinks(item, s)
	}
}

// rowwise reports whether a SELECT only filters and projects rows, so that running it
// on each shard and concatenating gives its exact answer.
func (a *analyzer) rowwise(sel *pg.SelectStmt) (bool, error) {
	if sel == nil || sel.Op != pg.SetOperation_SETOP_NONE || len(sel.GroupClause) > 0 || sel.HavingClause != nil ||
		len(sel.DistinctClause) > 0 || sel.LimitCount != nil || sel.LimitOffset != nil || len(sel.WindowClause) > 0 ||
		len(sel.ValuesLists) > 0 || sel.WithClause != nil {
		return false, nil
	}
	for _, t := range sel.TargetList {
		rt := t.GetResTarget()
		if hasWindow(rt.Val) {
			return false, nil
		}
		if has, err := a.containsAggregate(rt.Val); err != nil || has {
			return false, err
		}
	}
	return true, nil
}

// noteOuterJoin records why an outer join may be exact only on one target: a copied
// (broadcast) table on the preserved side of an outer join with a sharded table would
// have its unmatched rows repeated by every shard.
func (a *analyzer) noteOuterJoin(j *pg.JoinExpr, s *scope, before, mid int) {
	if j.Jointype == pg.JoinType_JOIN_INNER {
		return
	}
	left, right := s.refs[before:mid], s.refs[mid:]
	has := func(refs []*tableRef, k rules.Kind) bool {
		for _, r := range refs {
			if r.rule.Kind == k {
				return true
			}
		}
		return false
	}
	leftPreserved := j.Jointype == pg.JoinType_JOIN_LEFT || j.Jointype == pg.JoinType_JOIN_FULL
	rightPreserved := j.Jointype == pg.JoinType_JOIN_RIGHT || j.Jointype == pg.JoinType_JOIN_FULL
	if (leftPreserved && !has(left, rules.KindSharded) && has(right, rules.KindSharded)) ||
		(rightPreserved && !has(right, rules.KindSharded) && has(left, rules.KindSharded)) {
		a.singleOnly("an outer join that keeps the unmatched rows of a table that is not sharded, against a sharded table")
	}
}

func (a *analyzer) singleOnly(why string) {
	for _, w := range a.plan.singleOnly {
		if w == why {
			return
		}
	}
	a.plan.singleOnly = append(a.plan.singleOnly, why)
}

// collectSublinks finds the subqueries inside an expression and collects each as a
// child scope of s.
func (a *analyzer) collectSublinks(n *pg.Node, s *scope) error {
	if n == nil {
		return nil
	}
	var err error
	walk(n, func(m proto.Message) bool {
		if err != nil {
			return false
		}
		if sl, ok := m.(*pg.SubLink); ok {
			if sub := sl.Subselect.GetSelectStmt(); sub != nil {
				_, err = a.collectSelect(sub, s)
			}
			if sl.Testexpr != nil && err == nil {
				err = a.collectSublinks(sl.Testexpr, s)
			}
			return false
		}
		return true
	})
	return err
}

// conjuncts splits an expression at its top-level ANDs.
func conjuncts(n *pg.Node) []*pg.Node {
	if n == nil {
		return nil
	}
	if b := n.GetBoolExpr(); b != nil && b.Boolop == pg.BoolExprType_AND_EXPR {
		var out []*pg.Node
		for _, arg := range b.Args {
			out = append(out, conjuncts(arg)...)
		}
		return out
	}
	return []*pg.Node{n}
}

// walk visits every protobuf message under root, depth first; fn returns false to skip
// a message's children.
func walk(root proto.Message, fn func(proto.Message) bool) {
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if !m.IsValid() {
			return
		}
		if !fn(m.Interface()) {
			return
		}
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				l := v.List()
				for i := 0; i < l.Len(); i++ {
					visit(l.Get(i).Message())
				}
			case fd.Message() != nil && !fd.IsMap():
				visit(v.Message())
			}
			return true
		})
	}
	visit(root.ProtoReflect())
}

// noteParams records the highest $n in the statement.
func (a *analyzer) noteParams(root proto.Message) {
	walk(root, func(m proto.Message) bool {
		if p, ok := m.(*pg.ParamRef); ok && int(p.Number) > a.maxParam && int(p.Number) < slotBase {
			a.maxParam = int(p.Number)
		}
		return true
	})
}

// funcName returns the last part of a function's (possibly qualified) name, and its
// schema when given.
func funcName(f *pg.FuncCall) (schema, name string) {
	parts := f.Funcname
	if len(parts) == 0 {
		return "", ""
	}
	name = parts[len(parts)-1].GetString_().Sval
	if len(parts) > 1 {
		schema = parts[len(parts)-2].GetString_().Sval
	}
	return schema, name
}

// columnRef returns the qualifier and column of a column reference (qualifier "" when
// unqualified), and ok false for anything else (including t.*).
func columnRef(n *pg.Node) (qual, col string, ok bool) {
	for {
		tc := n.GetTypeCast()
		if tc == nil {
			break
		}
		n = tc.Arg
	}
	cr := n.GetColumnRef()
	if cr == nil {
		return "", "", false
	}
	var parts []string
	for _, f := range cr.Fields {
		s := f.GetString_()
		if s == nil {
			return "", "", false
		}
		parts = append(parts, s.Sval)
	}
	switch len(parts) {
	case 1:
		return "", parts[0], true
	case 2:
		return parts[0], parts[1], true
	case 3:
		return parts[1], parts[2], true
	}
	return "", "", false
}

// resolveKeyColumn finds which sharded table of scope s a column reference names, when
// the column is one of that table's sharding columns. An unqualified name matches
// every sharded table of the scope with that key column (PostgreSQL would call it
// ambiguous unless a USING join merged them, in which case they are equal).
func resolveKeyColumn(s *scope, qual, col string) []*tableRef {
	var out []*tableRef
	for _, r := range s.refs {
		if !r.sharded() {
			continue
		}
		if qual != "" && qual != r.qualifier() {
			continue
		}
		if _, ok := r.keyTypes[col]; ok {
			out = append(out, r)
		}
	}
	// A qualifier this scope does not answer to names a table of an enclosing query.
	if len(out) == 0 && qual != "" && !s.names[qual] && s.parent != nil {
		return resolveKeyColumn(s.parent, qual, col)
	}
	return out
}
