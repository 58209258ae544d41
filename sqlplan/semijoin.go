package sqlplan

import (
	"fmt"
	"slices"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/shardlab/shardlab/rules"
)

// calls reports whether an expression calls a function.
func calls(n *pg.Node) bool {
	found := false
	walk(n, func(m proto.Message) bool {
		if _, ok := m.(*pg.FuncCall); ok {
			found = true
		}
		return !found
	})
	return found
}

// semiJoinWrite rewrites an UPDATE ... FROM or a DELETE ... USING whose other tables
// are joined to the changed table by one equality, and read nowhere else, into the
// statement without them, the changed table's column compared IN a subquery over them:
//
//	UPDATE orders o SET status = 'n' FROM custs c WHERE c.id = o.cust AND c.region = 'north'
//	UPDATE orders o SET status = 'n' WHERE o.cust IN (SELECT c.id FROM custs c WHERE c.region = 'north')
//
// The two are one statement: a row changes when some row of the other tables meets
// the conditions, once however many do, and neither the SET list nor RETURNING reads
// those tables. Its subquery is then evaluated first (see Pre), and the statement runs
// on the shards' own connections. It returns nil for any other statement: another
// condition joining the tables, a subquery anywhere, a column of the other tables (or
// a star) in the SET list or RETURNING, a function in the value compared, a condition
// of no column that calls one, a parameter read twice, a WITH clause, a column the
// catalog does not place in exactly one table.
//
// own is -1 for a statement written with FROM (USING). For one that existsJoin made
// from an EXISTS, own is how many of the WHERE clause's first conditions are the
// statement's own: they, the SET list and RETURNING were in the scope of the changed
// table alone, and stay there, unchanged, as the rewritten statement has no other.
// anti is set for one made from NOT EXISTS: a row changes when no row of the other
// tables meets the conditions, and the statement becomes
//
//	o.cust IS NULL OR NOT o.cust IN (SELECT c.id FROM custs c WHERE ... AND c.id IS NOT NULL)
//
// which is the same where = answers true or false for two values that are not NULL (a
// composite value compared, which may answer NULL, is refused when the subquery's
// answer is read); a condition of the subquery that reads the changed table alone,
// which could not stay outside the NOT, is refused.
func (a *analyzer) semiJoinWrite(stmt *pg.Node, own int, anti bool) *pg.Node {
	if stmt == nil || a.p.cat == nil || hasSublink(stmt) {
		return nil
	}
	// PostgreSQL types a parameter where it first reads it, and the rewrite reorders
	// the statement: each may be read once.
	params := map[int32]bool{}
	twice := false
	walk(stmt, func(m proto.Message) bool {
		if p, ok := m.(*pg.ParamRef); ok {
			twice = twice || params[p.Number]
			params[p.Number] = true
		}
		return !twice
	})
	if twice {
		return nil
	}
	stmt = proto.Clone(stmt).(*pg.Node)
	var target *pg.RangeVar
	var from *[]*pg.Node
	var where **pg.Node
	var reads []*pg.Node // what must read the changed table alone
	if u := stmt.GetUpdateStmt(); u != nil {
		if u.WithClause != nil {
			return nil
		}
		target, from, where = u.Relation, &u.FromClause, &u.WhereClause
		reads = append(slices.Clone(u.TargetList), u.ReturningList...) // subscripts too
	} else if d := stmt.GetDeleteStmt(); d != nil {
		if d.WithClause != nil {
			return nil
		}
		target, from, where = d.Relation, &d.UsingClause, &d.WhereClause
		reads = d.ReturningList
	} else {
		return nil
	}
	if len(*from) == 0 || *where == nil {
		return nil
	}
	targets, _, ok := readAggFrom(a.p.rules, []*pg.Node{{Node: &pg.Node_RangeVar{RangeVar: target}}})
	if !ok {
		return nil
	}
	others, onQuals, ok := readAggFrom(a.p.rules, *from)
	if !ok {
		return nil
	}
	items := append(targets, others...)
	seen := map[string]bool{}
	for _, it := range items {
		cols, err := a.p.cat.Columns(a.ctx, it.rule)
		if err != nil || seen[it.name] {
			return nil
		}
		seen[it.name] = true
		it.cols = map[string]string{}
		for _, c := range cols {
			it.cols[c] = ""
		}
	}
	// resolve returns the table a column reference reads (0: the changed one), or -1.
	resolve := func(cr *pg.ColumnRef) int {
		if len(cr.Fields) == 0 {
			return -1
		}
		if len(cr.Fields) == 2 && cr.Fields[1].GetAStar() != nil && cr.Fields[0].GetString_().GetSval() == items[0].name {
			return 0 // o.*: the changed table's columns
		}
		var f []string
		for _, p := range cr.Fields {
			if p.GetString_() == nil {
				return -1
			}
			f = append(f, p.GetString_().Sval)
		}
		found := -1
		for i, it := range items {
			_, has := it.cols[f[len(f)-1]]
			if has && (len(f) == 1 || len(f) == 2 && it.name == f[0]) {
				if found >= 0 {
					return -1
				}
				found = i
			}
		}
		if len(f) > 2 {
			return -1
		}
		return found
	}
	// readsOf returns whether n reads the changed table, and whether it reads the others;
	// ok is false for a column of no one table.
	readsOf := func(n *pg.Node) (changed, other, ok bool) {
		ok = true
		walk(n, func(m proto.Message) bool {
			if cr, isRef := m.(*pg.ColumnRef); isRef {
				switch i := resolve(cr); {
				case i < 0:
					ok = false
				case i == 0:
					changed = true
				default:
					other = true
				}
			}
			return ok
		})
		return changed, other, ok
	}
	if own >= 0 {
		reads = nil
	}
	joined := false   // the SET list reads the other tables (see joinedRows)
	defaults := false // the SET list sets a column to its DEFAULT
	for i, n := range reads {
		// A function there (nextval) is evaluated once per joined pair on one
		// database, once per row after the rewrite.
		_, other, ok := readsOf(n)
		if !ok || calls(n) {
			return nil
		}
		defaults = defaults || names(n, func(m proto.Message) bool { _, is := m.(*pg.SetToDefault); return is })
		if other {
			// Not in RETURNING, a subscript or a multiple assignment.
			rt := n.GetResTarget()
			if own >= 0 || anti || i >= len(stmt.GetUpdateStmt().GetTargetList()) || len(rt.GetIndirection()) > 0 || rt.GetVal().GetMultiAssignRef() != nil {
				return nil
			}
			joined = true
		}
	}
	for _, q := range onQuals {
		if changed, _, ok := readsOf(q.cond); !ok || changed {
			return nil
		}
	}
	var keep, sub, both []*pg.Node
	var column, value *pg.Node
	for i, c := range conjuncts(*where) {
		if i < own {
			keep = append(keep, c)
			continue
		}
		changed, other, ok := readsOf(c)
		switch {
		case !ok:
			return nil
		case !changed && !other && calls(c):
			return nil // nextval('s') > 0: evaluated once per joined pair, or never
		case !changed:
			sub = append(sub, c)
		case !other:
			// A condition of the changed table alone may never be evaluated on one
			// database (a join that finds no row of the others first), and is
			// evaluated on every row after the rewrite: it may not fail.
			if anti || own < 0 && !cannotFail(c, anyValues) {
				return nil
			}
			keep = append(keep, c)
		default:
			both = append(both, c)
			e := c.GetAExpr()
			if column != nil || e == nil || e.Kind != pg.A_Expr_Kind_AEXPR_OP || len(e.Name) != 1 || e.Name[0].GetString_().GetSval() != "=" {
				column = nil
				continue
			}
			for _, side := range [][2]*pg.Node{{e.Lexpr, e.Rexpr}, {e.Rexpr, e.Lexpr}} {
				cr := side[0].GetColumnRef()
				if cr == nil || resolve(cr) != 0 {
					continue
				}
				// The value moves from WHERE to a select list, which accepts
				// aggregates, window and set-returning functions that WHERE refuses.
				// A whole row (o.*, ROW(...)) is refused: a composite value IS NULL
				// only when every field is, and = counts NULL fields as equal, so
				// NOT EXISTS would not be NOT IN over it.
				if changed, _, _ := readsOf(side[1]); !changed && !calls(side[1]) && !star(cr) && !names(side[1], isRow) {
					column, value = side[0], side[1]
				}
			}
		}
	}
	if len(both) == 0 {
		return nil
	}
	if joined {
		return a.joinedRows(stmt, items, resolve, onQuals, from, where, keep, sub, both)
	}
	if defaults {
		// A column's default (nextval) is evaluated once per joined pair on one
		// database, and its sequence moves as far; once per row after the rewrite.
		return nil
	}
	if column == nil || len(both) > 1 {
		if own >= 0 || anti {
			return nil
		}
		return existsOfFrom(stmt, from, where, keep, append(sub, both...))
	}
	if anti {
		// A parameter in value is read twice, in one expression both times: typed alike.
		sub = append(sub, isNull(proto.Clone(value).(*pg.Node), pg.NullTestType_IS_NOT_NULL))
	}
	subselect := &pg.SelectStmt{TargetList: []*pg.Node{resTarget("", value)}, FromClause: *from, WhereClause: and(sub),
		Op: pg.SetOperation_SETOP_NONE, LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT}
	in := &pg.Node{Node: &pg.Node_SubLink{SubLink: &pg.SubLink{SubLinkType: pg.SubLinkType_ANY_SUBLINK, Testexpr: column,
		Subselect: &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: subselect}}, Location: -1}}}
	if anti {
		not := &pg.Node{Node: &pg.Node_BoolExpr{BoolExpr: &pg.BoolExpr{Boolop: pg.BoolExprType_NOT_EXPR, Args: []*pg.Node{in}, Location: -1}}}
		in = &pg.Node{Node: &pg.Node_BoolExpr{BoolExpr: &pg.BoolExpr{Boolop: pg.BoolExprType_OR_EXPR,
			Args: []*pg.Node{isNull(proto.Clone(column).(*pg.Node), pg.NullTestType_IS_NULL), not}, Location: -1}}}
	}
	*from = nil
	*where = and(append(keep, in))
	return stmt
}

// joinedRows writes an UPDATE ... FROM whose SET list reads the other tables as the
// statement over their rows that meet their own conditions, a derived table named
// preAlias, which buildPre reads first and puts in its place as arrays:
//
//	UPDATE orders o SET status = c.name FROM custs c WHERE c.id = o.cust AND c.region = 'north'
//	UPDATE orders o SET status = shardlab_pre.shardlab_1
//	  FROM (SELECT c.name, c.id FROM custs c WHERE c.region = 'north') shardlab_pre(shardlab_1, shardlab_2)
//	  WHERE shardlab_pre.shardlab_2 = o.cust
//	then: ... FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) shardlab_pre(shardlab_1, shardlab_2) ...
//
// It is the same join of the same rows (a row of the derived table for each row of the
// others' join that meets their conditions), which PostgreSQL plans as it plans the
// written one (a hash join where it can). Like the written one it computes the SET list
// over every joined pair, and a row that joins several rows takes one of them, which
// PostgreSQL's documentation calls not readily predictable, on one database as here.
// The join conditions, which one database may evaluate over fewer pairs (an index
// finds some first), may not fail: columns and constants compared, two columns of
// types compared without a cast (castFree), no parameter. RETURNING reads the changed
// table alone (a derived column loses its type modifier, numeric(12,2)), as semiJoinWrite
// checked, with the rest.
func (a *analyzer) joinedRows(stmt *pg.Node, items []*aggItem, resolve func(*pg.ColumnRef) int, onQuals []onQual, from *[]*pg.Node, where **pg.Node, keep, sub, both []*pg.Node) *pg.Node {
	tc, typed := a.p.cat.(typedCatalog)
	if !typed || items[0].rule.Kind == rules.KindBroadcast {
		// A row of a broadcast table that joins several rows could take another on
		// each copy, and the copies would differ.
		return nil
	}
	// The other tables are read first as one join: tables joined only through the
	// changed one would be read as their cross product, where one database joins each
	// to it. They must be joined by their own conditions.
	group := make([]int, len(items))
	for i := range group {
		group[i] = i
	}
	var root func(int) int
	root = func(i int) int {
		if group[i] != i {
			group[i] = root(group[i])
		}
		return group[i]
	}
	link := func(n proto.Message) {
		first := -1
		walk(n, func(m proto.Message) bool {
			if cr, is := m.(*pg.ColumnRef); is {
				if i := resolve(cr); i > 0 && first < 0 {
					first = i
				} else if i > 0 {
					group[root(i)] = root(first)
				}
			}
			return true
		})
	}
	for _, q := range onQuals {
		link(q.cond)
	}
	for _, c := range sub {
		link(c)
	}
	for i := 2; i < len(items); i++ {
		if root(i) != root(1) {
			return nil
		}
	}
	types := make([]map[string]string, len(items))
	for i, it := range items {
		var err error
		if types[i], err = tc.ColumnTypes(a.ctx, it.rule); err != nil || it.name == preAlias {
			return nil
		}
	}
	for c := range types[0] {
		if strings.HasPrefix(c, prePrefix) {
			return nil // would be ambiguous beside the derived table's columns
		}
	}
	column := func(cr *pg.ColumnRef) (int, string) {
		i := resolve(cr)
		if i < 0 {
			return i, ""
		}
		return i, cr.Fields[len(cr.Fields)-1].GetString_().GetSval()
	}
	typedValues := typedComparisons(func(cr *pg.ColumnRef) string {
		if i, col := column(cr); i >= 0 {
			return types[i][col]
		}
		return ""
	})
	for _, c := range both {
		if !cannotFail(c, typedValues) {
			return nil
		}
	}
	// The other tables' columns the statement reads, numbered in order of appearance,
	// each replaced by the derived table's.
	type ref struct {
		item int
		col  string
	}
	index := map[ref]int{}
	var list []*pg.Node
	substitute := func(n proto.Message) {
		walk(n, func(m proto.Message) bool {
			node, is := m.(*pg.Node)
			if !is || node.GetColumnRef() == nil {
				return true
			}
			i, col := column(node.GetColumnRef())
			if i <= 0 {
				return false
			}
			k, seen := index[ref{i, col}]
			if !seen {
				k = len(list)
				index[ref{i, col}] = k
				list = append(list, resTarget("", &pg.Node{Node: &pg.Node_ColumnRef{ColumnRef: &pg.ColumnRef{Fields: []*pg.Node{
					{Node: &pg.Node_String_{String_: &pg.String{Sval: items[i].name}}},
					{Node: &pg.Node_String_{String_: &pg.String{Sval: col}}},
				}, Location: -1}}}))
			}
			node.Node = &pg.Node_ColumnRef{ColumnRef: &pg.ColumnRef{Fields: []*pg.Node{
				{Node: &pg.Node_String_{String_: &pg.String{Sval: preAlias}}},
				{Node: &pg.Node_String_{String_: &pg.String{Sval: fmt.Sprintf("%s%d", prePrefix, k+1)}}},
			}, Location: -1}}
			return false
		})
	}
	for _, t := range stmt.GetUpdateStmt().GetTargetList() {
		substitute(t.GetResTarget().GetVal())
	}
	for _, c := range both {
		substitute(c)
	}
	colnames := make([]*pg.Node, len(list))
	for k := range list {
		colnames[k] = &pg.Node{Node: &pg.Node_String_{String_: &pg.String{Sval: fmt.Sprintf("%s%d", prePrefix, k+1)}}}
	}
	derived := &pg.SelectStmt{TargetList: list, FromClause: *from, WhereClause: and(sub), Op: pg.SetOperation_SETOP_NONE,
		LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT}
	*from = []*pg.Node{{Node: &pg.Node_RangeSubselect{RangeSubselect: &pg.RangeSubselect{
		Subquery: &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: derived}},
		Alias:    &pg.Alias{Aliasname: preAlias, Colnames: colnames}}}}}
	*where = and(append(keep, both...))
	return stmt
}

// existsOfFrom makes an UPDATE ... FROM or DELETE ... USING whose other tables are
// joined to the changed table otherwise than by one equality the statement with
// EXISTS over them, which is the same statement (a row changes once when some row of
// the other tables meets the conditions), when no condition can fail:
//
//	DELETE FROM orders o USING custs c WHERE c.id < o.cust AND c.region = 'north'
//	DELETE FROM orders o WHERE EXISTS (SELECT 1 FROM custs c WHERE c.id < o.cust AND c.region = 'north')
//
// The subquery is then evaluated in two steps (see correlatedSub). A condition that may
// fail is refused: the join evaluates it over every pair, EXISTS stops at a row's
// first match. semiJoinWrite checked the rest: the SET list and RETURNING read the
// changed table alone, the conditions kept read it alone, every column is of one table.
func existsOfFrom(stmt *pg.Node, from *[]*pg.Node, where **pg.Node, keep, sub []*pg.Node) *pg.Node {
	for _, c := range sub {
		if !cannotFail(c, anyValues) {
			return nil
		}
	}
	subselect := &pg.SelectStmt{TargetList: []*pg.Node{resTarget("", &pg.Node{Node: &pg.Node_AConst{AConst: &pg.A_Const{Val: &pg.A_Const_Ival{Ival: &pg.Integer{Ival: 1}}}}})},
		FromClause: *from, WhereClause: and(sub), Op: pg.SetOperation_SETOP_NONE, LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT}
	exists := &pg.Node{Node: &pg.Node_SubLink{SubLink: &pg.SubLink{SubLinkType: pg.SubLinkType_EXISTS_SUBLINK,
		Subselect: &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: subselect}}, Location: -1}}}
	*from = nil
	*where = and(append(keep, exists))
	return stmt
}

func star(cr *pg.ColumnRef) bool {
	for _, f := range cr.Fields {
		if f.GetAStar() != nil {
			return true
		}
	}
	return false
}

// isRow reports whether a node builds a row (ROW(...), (a, b)).
func isRow(m proto.Message) bool { _, ok := m.(*pg.RowExpr); return ok }

// isNull is the test n IS NULL (or IS NOT NULL).
func isNull(n *pg.Node, kind pg.NullTestType) *pg.Node {
	return &pg.Node{Node: &pg.Node_NullTest{NullTest: &pg.NullTest{Arg: n, Nulltesttype: kind, Location: -1}}}
}

// existsJoin rewrites an UPDATE or DELETE whose WHERE clause has, among its conditions,
// one EXISTS over a subquery of plain rows into the statement with the subquery's
// tables in FROM (USING) and its conditions beside the statement's own, which come
// first (own says how many):
//
//	DELETE FROM orders o WHERE o.amount > 5 AND EXISTS (SELECT 1 FROM custs c WHERE c.id = o.cust AND c.region = 'north')
//	DELETE FROM orders o USING custs c WHERE o.amount > 5 AND c.id = o.cust AND c.region = 'north'
//
// The two are one statement: a row changes when some row of the subquery's tables
// meets its conditions, once however many do. NOT EXISTS is the same join, negated
// (anti). semiJoinWrite then makes it a subquery
// that reads no column of the statement, evaluated first (see Pre), where a column
// resolves to the same table in both: the statement's own conditions read the changed
// table alone, and a name both scopes hold is refused. It returns nil for any other
// statement: no such EXISTS or several, one under OR, a subquery that groups,
// aggregates, orders, limits, locks or has a WITH clause or a set operation, a select
// list of anything but constants and * (a set-returning function there could return no
// row, and a column there that does not exist is an error the rewrite would drop), a
// function call anywhere in the subquery (PostgreSQL evaluates a volatile one once per
// row of the statement, and never joins such an EXISTS itself), a statement with FROM
// (USING) or WITH of its own.
func existsJoin(stmt *pg.Node) (joined *pg.Node, own int, anti bool) {
	var where *pg.Node
	switch {
	case stmt.GetUpdateStmt() != nil:
		u := stmt.GetUpdateStmt()
		if len(u.FromClause) > 0 || u.WithClause != nil {
			return nil, 0, false
		}
		where = u.WhereClause
	case stmt.GetDeleteStmt() != nil:
		d := stmt.GetDeleteStmt()
		if len(d.UsingClause) > 0 || d.WithClause != nil {
			return nil, 0, false
		}
		where = d.WhereClause
	default:
		return nil, 0, false
	}
	var rest []*pg.Node
	var sub *pg.SelectStmt
	for _, c := range conjuncts(where) {
		sl, not := c.GetSubLink(), false
		if b := c.GetBoolExpr(); b != nil && b.Boolop == pg.BoolExprType_NOT_EXPR && len(b.Args) == 1 && b.Args[0].GetSubLink() != nil {
			sl, not = b.Args[0].GetSubLink(), true
		}
		if sl == nil || sl.SubLinkType != pg.SubLinkType_EXISTS_SUBLINK {
			rest = append(rest, c)
			continue
		}
		if sub != nil {
			return nil, 0, false
		}
		anti = not
		if sub = sl.Subselect.GetSelectStmt(); !plainRows(sub) {
			return nil, 0, false
		}
	}
	if sub == nil {
		return nil, 0, false
	}
	stmt = proto.Clone(stmt).(*pg.Node)
	sub = proto.Clone(sub).(*pg.SelectStmt)
	cond := and(append(rest, conjuncts(sub.WhereClause)...))
	if u := stmt.GetUpdateStmt(); u != nil {
		u.FromClause, u.WhereClause = sub.FromClause, cond
	} else {
		d := stmt.GetDeleteStmt()
		d.UsingClause, d.WhereClause = sub.FromClause, cond
	}
	return stmt, len(rest), anti
}

// plainRows reports whether a SELECT, under EXISTS, has a row exactly when a row of its
// FROM clause meets its WHERE clause.
func plainRows(s *pg.SelectStmt) bool {
	if s == nil || s.Op != pg.SetOperation_SETOP_NONE || len(s.FromClause) == 0 || s.WithClause != nil || s.IntoClause != nil ||
		len(s.GroupClause) > 0 || s.HavingClause != nil || len(s.WindowClause) > 0 || len(s.SortClause) > 0 ||
		s.LimitCount != nil || s.LimitOffset != nil || len(s.LockingClause) > 0 || len(s.ValuesLists) > 0 || len(s.DistinctClause) > 0 {
		return false
	}
	for _, t := range s.TargetList {
		switch v := t.GetResTarget().GetVal(); {
		case v.GetAConst() != nil:
		case v.GetColumnRef() != nil && len(v.GetColumnRef().Fields) == 1 && v.GetColumnRef().Fields[0].GetAStar() != nil:
		default:
			return false
		}
	}
	if calls(s.WhereClause) {
		return false
	}
	for _, f := range s.FromClause {
		if calls(f) {
			return false
		}
	}
	return true
}
