package sqlplan

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/shardlab/shardlab/rules"
)

// The coordinator database (package coordinator) keeps each shard of a sharded table
// as a foreign table of its own, and the aggregates that combine shards' partial
// aggregates, in schemas of these names.
const (
	CoordinatorShardsSchema = "shardlab_shards"
	CoordinatorMergeSchema  = "shardlab_merge"
)

// CoordinatorShardTable returns the name, unquoted, of the coordinator database's
// foreign table of shard i of sharded table name, or "" when that name would be
// longer than PostgreSQL keeps (the coordinator then names it otherwise, and
// statements over it are not rewritten). The name is the table's, a slash and the
// shard: no two tables' shards share one.
func CoordinatorShardTable(name string, i int) string {
	n := fmt.Sprintf("%s/%d", name, i)
	if len(n) > 63 {
		return ""
	}
	return n
}

// shardAggregates rewrites a coordinated SELECT that aggregates one sharded table so
// that every shard aggregates its own rows, and the coordinator only combines one row
// per group per shard. PostgreSQL 15's postgres_fdw pushes down only whole
// aggregates over one foreign table, so over the partitioned parent
// `SELECT round(avg(amount), 2) FROM t_order` moves every row to the coordinator; as
//
//	SELECT round(shardlab_merge.avg(shardlab_merge.sum(p1), shardlab_merge.sum(p2)), 2)
//	FROM (SELECT sum(amount) AS p1, count(amount) AS p2 FROM shardlab_shards."t_order/0" t_order
//	      UNION ALL SELECT ... FROM shardlab_shards."t_order/1" t_order) t_order
//
// each shard sends one row. The combining aggregates (shardlab_merge.sum of int8 is
// int8, of numeric numeric; shardlab_merge.count is 0 over no rows; avg divides as
// PostgreSQL's avg does) keep the result types and values one database gives. An
// aggregate over DISTINCT values groups each shard's rows by its argument too, and
// the coordinator aggregates the distinct values the shards send.
//
// Under inner joins, each shard joins the tables the aggregates read with the sharded
// tables joined to them on equal keys and placed alike (their rows meet on one shard
// only), and groups the joined rows by every column the coordinator reads of them; the
// coordinator joins those groups with the statement's other tables (cat says which
// table an unqualified column is of, and the columns' types). An aggregate of a group
// then counts once per row it meets there, as its rows would.
//
// The statement is rewritten only when that is exact: sharded tables in FROM, grouped
// by columns or expressions, whose aggregates are count, sum, min, max and avg (with
// FILTER, or over DISTINCT values without one; no ORDER BY), with no subquery, window
// function, CTE, set operation or whole-row reference, and no parameter written twice;
// under joins, the further conditions below. Everything else in it (expressions over
// the aggregates, HAVING, ORDER BY, DISTINCT, LIMIT) the coordinator evaluates over the
// combined rows as written.
//
// Where the statement itself is not rewritten, each SELECT within it that reads no
// column of a query around it (see selfContained) is, on the same conditions: a common
// table expression's body, a subquery in FROM, an arm of a set operation. It returns ok
// false, and the statement runs as written, when nothing is rewritten.
func shardAggregates(r *rules.Compiled, sql string, cat *joinCatalog) (string, bool) {
	tree, err := pg.Parse(sql)
	if err != nil || len(tree.Stmts) != 1 {
		return "", false
	}
	stmt := tree.Stmts[0].Stmt
	if e := stmt.GetExplainStmt(); e != nil {
		stmt = e.Query
	}
	sel := stmt.GetSelectStmt()
	if sel == nil {
		return "", false
	}
	params := map[int32]int{}
	walk(sel, func(m proto.Message) bool {
		if p, ok := m.(*pg.ParamRef); ok {
			params[p.Number]++
		}
		return true
	})
	rewritten := false
	selfContained(sel, nil, func(q *pg.SelectStmt, ctes map[string]bool) bool {
		if !readsOwnTables(q, ctes, params) {
			return false
		}
		c := proto.Clone(q).(*pg.SelectStmt) // a rewrite that gives up leaves its work undone
		if !rewriteShardAggregates(r, c, cat) {
			return false
		}
		proto.Reset(q)
		proto.Merge(q, c)
		rewritten = true
		return true
	})
	if !rewritten {
		return "", false
	}
	out, err := deparse(tree.Version, tree.Stmts[0].Stmt)
	if err != nil {
		return "", false
	}
	return out, true
}

// selfContained calls visit with sel and, unless visit returns true for it, with every
// SELECT within it that reads no column of a query around it, and the names of the
// common table expressions in scope there: the bodies of a WITH clause that is not
// RECURSIVE, the subqueries in FROM that are not LATERAL, the arms of a set operation,
// and theirs in turn. A subquery elsewhere (in WHERE, the select list) may read the
// columns of the rows it is evaluated for, and is not visited.
func selfContained(sel *pg.SelectStmt, ctes map[string]bool, visit func(*pg.SelectStmt, map[string]bool) bool) {
	if sel == nil || visit(sel, ctes) {
		return
	}
	if w := sel.WithClause; w != nil {
		ctes = maps.Clone(ctes)
		if ctes == nil {
			ctes = map[string]bool{}
		}
		for _, c := range w.Ctes {
			ctes[c.GetCommonTableExpr().GetCtename()] = true
		}
		if !w.Recursive {
			for _, c := range w.Ctes {
				selfContained(c.GetCommonTableExpr().GetCtequery().GetSelectStmt(), ctes, visit)
			}
		}
	}
	selfContained(sel.Larg, ctes, visit)
	selfContained(sel.Rarg, ctes, visit)
	var from func(n *pg.Node)
	from = func(n *pg.Node) {
		if s := n.GetRangeSubselect(); s != nil && !s.Lateral {
			selfContained(s.Subquery.GetSelectStmt(), ctes, visit)
		}
		if j := n.GetJoinExpr(); j != nil {
			from(j.Larg)
			from(j.Rarg)
		}
	}
	for _, n := range sel.FromClause {
		from(n)
	}
}

// readsOwnTables reports whether a SELECT within a statement may be rewritten on its
// own: no table it names is a common table expression in scope (which the name would
// mean instead), and no parameter it reads is read elsewhere in the statement too
// (params counts each one's readings), whose type the rewrite's order of reading could
// change.
func readsOwnTables(sel *pg.SelectStmt, ctes map[string]bool, params map[int32]int) bool {
	ok := true
	walk(sel, func(m proto.Message) bool {
		switch n := m.(type) {
		case *pg.RangeVar:
			ok = ok && (n.Schemaname != "" || !ctes[n.Relname])
		case *pg.ParamRef:
			ok = ok && params[n.Number] == 1
		}
		return ok
	})
	return ok
}

// mergeAggregates are the aggregates shardAggregates splits into shards' partial
// aggregates and the coordinator's combination.
var mergeAggregates = map[string]bool{"count": true, "sum": true, "min": true, "max": true, "avg": true}

func rewriteShardAggregates(r *rules.Compiled, sel *pg.SelectStmt, cat *joinCatalog) bool {
	if sel.Op != pg.SetOperation_SET_OPERATION_UNDEFINED && sel.Op != pg.SetOperation_SETOP_NONE ||
		sel.WithClause != nil || sel.IntoClause != nil || len(sel.LockingClause) > 0 || len(sel.WindowClause) > 0 ||
		len(sel.ValuesLists) > 0 || len(sel.FromClause) == 0 || sel.GroupDistinct {
		return false
	}
	items, onQuals, ok := readAggFrom(r, sel.FromClause)
	if !ok {
		return false
	}
	joined := len(items) > 1
	if joined {
		if cat == nil {
			return false
		}
		names := map[string]bool{}
		for _, it := range items {
			if it.cols = cat.columns[it.rv.Relname]; it.cols == nil || names[it.name] {
				return false // unknown, or two entries of one name (an error)
			}
			names[it.name] = true
		}
	}
	// resolve returns the FROM entry a column reference reads, or -1: a star, the whole
	// row, a name of no entry or of several.
	resolve := func(cr *pg.ColumnRef) int {
		var f []string
		for _, p := range cr.Fields {
			if p.GetString_() == nil {
				return -1
			}
			f = append(f, p.GetString_().Sval)
		}
		switch {
		case len(f) == 1 && !joined:
			if f[0] == items[0].name {
				return -1
			}
			return 0
		case len(f) == 1:
			found := -1
			for i, it := range items {
				if _, ok := it.cols[f[0]]; ok {
					if found >= 0 {
						return -1
					}
					found = i
				}
			}
			return found
		case len(f) == 2:
			for i, it := range items {
				if _, ok := it.cols[f[1]]; it.name == f[0] && (!joined || ok) {
					return i
				}
			}
		}
		return -1
	}
	typeOf := func(cr *pg.ColumnRef) string {
		if i := resolve(cr); i >= 0 {
			return items[i].cols[cr.Fields[len(cr.Fields)-1].GetString_().GetSval()]
		}
		return ""
	}
	outputs := map[string]string{} // output name, written or inferred: the column it shows, if one
	for _, t := range sel.TargetList {
		if rt := t.GetResTarget(); rt != nil {
			name := rt.Name
			if name == "" {
				name, _ = figureColname(rt.Val)
			}
			_, col, _ := columnRef(rt.Val)
			if prev, ok := outputs[name]; ok && prev != col {
				col = "" // two outputs of one name
			}
			outputs[name] = col
		}
	}

	// Nothing whose meaning a subquery in FROM would change: no subquery, window
	// function, whole-row or star reference, or aggregate other than the five (a
	// quoted "SUM" is no aggregate of PostgreSQL's). The entries the aggregates read
	// are noted.
	exact := true
	params := map[int32]int{}
	aggItems := map[int]bool{}
	aggregated := false // an aggregate of the five, reading columns or none (count(*))
	walk(sel, func(m proto.Message) bool {
		switch n := m.(type) {
		case *pg.SubLink, *pg.RangeSubselect, *pg.RangeFunction, *pg.WithClause, *pg.GroupingSet, *pg.GroupingFunc:
			exact = false
		case *pg.ColumnRef:
			_, output := outputs[n.Fields[len(n.Fields)-1].GetString_().GetSval()]
			exact = exact && (resolve(n) >= 0 || joined && len(n.Fields) == 1 && output)
		case *pg.ParamRef:
			params[n.Number]++
			exact = exact && n.Number > 0
		case *pg.FuncCall:
			schema, written := funcName(n)
			name := foldedFuncName(n)
			if n.Over != nil || n.AggWithinGroup || schema != "" && schema != "pg_catalog" && (knownAggregates[name] || mergeAggregates[name]) {
				exact = false
			}
			if knownAggregates[name] && (!mergeAggregates[name] || written != name) || len(n.AggOrder) > 0 || n.FuncVariadic {
				exact = false
			}
			if n.AggDistinct && (!mergeAggregates[name] || len(n.Args) != 1 || n.AggFilter != nil || !groupable(n.Args[0])) {
				exact = false
			}
			if mergeAggregates[name] {
				aggregated = true
				for _, arg := range append(slices.Clone(n.Args), n.AggFilter) {
					walk(arg, func(m proto.Message) bool {
						if cr, ok := m.(*pg.ColumnRef); ok {
							i := resolve(cr)
							exact = exact && i >= 0
							aggItems[i] = true
						}
						return exact
					})
				}
			}
		}
		return exact
	})
	// PostgreSQL types a parameter where it first reads it: select list, WHERE,
	// HAVING, ORDER BY. The rewrite reads WHERE and the aggregates' arguments first, so
	// a parameter used twice could take another type.
	for _, n := range params {
		if n > 1 {
			exact = false
		}
	}
	if !exact {
		return false
	}

	// The entries the shards read: the one table, or under a join the tables the
	// aggregates read with those whose rows they meet on the same shard only (see
	// pushedEntries). Of a join's conditions, those over these entries alone filter
	// the branches; the others stay the coordinator's.
	inP := []bool{true}
	var branchQuals, outerQuals []*pg.Node
	if joined {
		// A join's condition reads its own entries only (PostgreSQL refuses others); the
		// coordinator's WHERE would read any.
		quals := conjuncts(sel.WhereClause)
		for _, q := range onQuals {
			walk(q.cond, func(m proto.Message) bool {
				if cr, ok := m.(*pg.ColumnRef); ok && !slices.Contains(q.scope, resolve(cr)) {
					exact = false
				}
				return exact
			})
			quals = append(quals, q.cond)
		}
		if !exact {
			return false
		}
		if inP = pushedEntries(items, quals, aggItems, aggregated, resolve); inP == nil {
			return false
		}
		for _, q := range quals {
			other, columns, calls := false, false, false
			walk(q, func(m proto.Message) bool {
				switch n := m.(type) {
				case *pg.ColumnRef:
					i := resolve(n)
					exact = exact && i >= 0 // not an output's name, an error of the statement's
					other = other || i >= 0 && !inP[i]
					columns = true
				case *pg.FuncCall:
					calls = true
				}
				return true
			})
			// A condition of no column that calls a function (random() < 0.5) is
			// evaluated once per joined row, not once per row of some tables.
			exact = exact && (columns || !calls)
			if other {
				outerQuals = append(outerQuals, q) // one reading pushed columns too is checked below
			} else {
				branchQuals = append(branchQuals, q)
			}
		}
		if !exact {
			return false
		}
	}
	// Under a join with entries the shards do not read, a shard aggregates rows the
	// coordinator's join may then drop: nothing it evaluates of them may fail where one
	// database, which evaluates it over the joined rows only, would not (100 / qty where
	// qty is 0). Each aggregate reads a column as it is (a sum or avg one of integers
	// or numerics), or adds and multiplies numerics of a precision and constants, with
	// no FILTER; the shards group by no expression.
	others := slices.Contains(inP, false)
	alone := others && slices.Index(inP[slices.Index(inP, true)+1:], true) < 0
	if others {
		safe := true
		for _, list := range [][]*pg.Node{sel.TargetList, sel.DistinctClause, sel.SortClause, {sel.HavingClause}} {
			for _, n := range list {
				walk(n, func(m proto.Message) bool {
					if fn, ok := m.(*pg.FuncCall); ok && mergeAggregates[foldedFuncName(fn)] {
						safe = safe && evaluatesSafely(fn, typeOf)
						return false
					}
					return safe
				})
			}
		}
		if !safe {
			return false
		}
	}
	first := slices.Index(inP, true)
	alias := items[first].name
	shardNames := map[int][]string{}
	for i, it := range items {
		if !inP[i] {
			continue
		}
		if it.rule.Kind != rules.KindSharded || len(it.rule.Nodes) < 2 || len(it.rule.Nodes) != len(items[first].rule.Nodes) {
			return false
		}
		for s := range it.rule.Nodes {
			name := CoordinatorShardTable(it.rv.Relname, s)
			if name == "" {
				return false
			}
			shardNames[i] = append(shardNames[i], name)
		}
	}
	// A column of the shards' entries the coordinator reads is sent under its own name;
	// two of one name (of two tables) cannot be. A join condition the coordinator keeps
	// compares such a column with another entry's: each branch groups its rows by the
	// column as well, and every row of a group meets the same rows there (a comparison
	// holds of equal values alike), so that each partial aggregate counts as often as
	// its rows would.
	exposed := map[string]int{}
	expose := func(item int, col string) bool {
		if prev, ok := exposed[col]; ok && prev != item {
			return false
		}
		exposed[col] = item
		return true
	}
	var joinCols []string
	for _, q := range outerQuals {
		if mixed, _ := readsEntries(q, resolve, inP); !mixed {
			continue
		}
		e := q.GetAExpr()
		if e == nil || e.Kind != pg.A_Expr_Kind_AEXPR_OP || len(e.Name) != 1 || !comparisons[e.Name[0].GetString_().GetSval()] ||
			e.Lexpr.GetColumnRef() == nil || e.Rexpr.GetColumnRef() == nil {
			return false
		}
		if !comparable(typeOf(e.Lexpr.GetColumnRef()), typeOf(e.Rexpr.GetColumnRef())) {
			return false
		}
		for _, side := range []*pg.ColumnRef{e.Lexpr.GetColumnRef(), e.Rexpr.GetColumnRef()} {
			if i := resolve(side); i >= 0 && inP[i] {
				col := side.Fields[len(side.Fields)-1].GetString_().Sval
				if !expose(i, col) {
					return false
				}
				if !slices.Contains(joinCols, col) {
					joinCols = append(joinCols, col)
				}
			}
		}
	}

	// The groups: columns of the table, none also the name of an output column (which
	// PostgreSQL would read as the column, and a reader might not); positions in the
	// select list; expressions over columns, which the branches group by and send as
	// hidden columns, and which the coordinator reads there wherever the statement
	// writes them alike.
	var branchTargets, groups, outerGroups []*pg.Node
	seen := map[string]bool{}
	grouped := map[string]string{} // a grouping expression's key: its hidden column
	for _, g := range sel.GroupClause {
		if c := g.GetAConst(); c != nil {
			k := int(c.GetIval().GetIval())
			if c.GetIval() == nil || k < 1 || k > len(sel.TargetList) || sel.TargetList[k-1].GetResTarget() == nil {
				return false
			}
			g = sel.TargetList[k-1].GetResTarget().Val
		}
		cr := g.GetColumnRef()
		if cr == nil {
			switch pushed, other := readsEntries(g, resolve, inP); {
			case !pushed && other:
				outerGroups = append(outerGroups, cloneNode(g)) // another entry's: the coordinator's
				continue
			case other || others || !groupExpression(g):
				return false
			}
			key := exprKey(g)
			col, ok := grouped[key]
			if !ok {
				col = fmt.Sprintf("%sg%d", markerPrefix, len(grouped)+1)
				grouped[key] = col
				branchTargets = append(branchTargets, resTarget(col, cloneNode(g)))
				groups = append(groups, cloneNode(g))
			}
			outerGroups = append(outerGroups, pg.MakeColumnRefNode([]*pg.Node{pg.MakeStrNode(col)}, -1))
			continue
		}
		outerGroups = append(outerGroups, cloneNode(g))
		i := resolve(cr)
		if i < 0 {
			return false
		}
		if !inP[i] {
			continue
		}
		col := cr.Fields[len(cr.Fields)-1].GetString_().Sval
		if out, ok := outputs[col]; ok && out != col || !expose(i, col) {
			return false
		}
		if !seen[col] {
			seen[col] = true
			branchTargets = append(branchTargets, resTarget(col, proto.Clone(g).(*pg.Node)))
			groups = append(groups, proto.Clone(g).(*pg.Node))
		}
	}
	for _, col := range joinCols {
		if !seen[col] {
			ref := pg.MakeColumnRefNode([]*pg.Node{pg.MakeStrNode(items[exposed[col]].name), pg.MakeStrNode(col)}, -1)
			branchTargets = append(branchTargets, resTarget(col, ref))
			groups = append(groups, cloneNode(ref))
		}
	}

	if alone {
		// One table grouped by the columns it is joined by: where its groups were
		// nearly its rows (a foreign key's), the coordinator's plan over them was
		// slower than over the rows (docs/sql-sharding.md, "Aggregates on the
		// shards"). It aggregates on the shards only where the statistics say its
		// groups are few.
		cols := slices.Collect(maps.Keys(seen))
		for _, c := range joinCols {
			if !seen[c] {
				cols = append(cols, c)
			}
		}
		// An aggregate over DISTINCT values groups by its argument too.
		for _, list := range [][]*pg.Node{sel.TargetList, sel.SortClause, {sel.HavingClause}} {
			for _, n := range list {
				walk(n, func(m proto.Message) bool {
					if fn, ok := m.(*pg.FuncCall); ok && fn.AggDistinct {
						cr := fn.Args[0].GetColumnRef()
						if cr == nil {
							cols = append(cols, "") // no statistics
						} else {
							cols = append(cols, cr.Fields[len(cr.Fields)-1].GetString_().GetSval())
						}
					}
					return true
				})
			}
		}
		if share, ok := cat.groupShare(items[first].rv.Relname, cols); !ok || share > fewGroups {
			return false
		}
	}

	// Each aggregate: its partials in the branches, its combination in place. One
	// database computes an aggregate written twice once, and matches an ORDER BY or
	// DISTINCT ON expression to the select list's: identical aggregates (calling no
	// function, which might be volatile) share their partials, so that their
	// combinations are identical too.
	aggs := 0
	partials := map[string]string{}
	partial := func(fn *pg.FuncCall, name string) *pg.Node {
		branch := proto.Clone(fn).(*pg.FuncCall)
		branch.Funcname = []*pg.Node{pg.MakeStrNode(name)}
		node := &pg.Node{Node: &pg.Node_FuncCall{FuncCall: branch}}
		key := exprKey(node)
		col, shared := partials[key]
		if !shared || callsFunction(branch) {
			aggs++
			col = fmt.Sprintf("%sp%d", markerPrefix, aggs)
			partials[key] = col
			branchTargets = append(branchTargets, resTarget(col, node))
		}
		return pg.MakeColumnRefNode([]*pg.Node{pg.MakeStrNode(col)}, -1)
	}
	merge := func(name string, args ...*pg.Node) *pg.FuncCall {
		return &pg.FuncCall{Funcname: []*pg.Node{pg.MakeStrNode(CoordinatorMergeSchema), pg.MakeStrNode(name)}, Args: args,
			Funcformat: pg.CoercionForm_COERCE_EXPLICIT_CALL, Location: -1}
	}
	// An aggregate over DISTINCT values groups each shard's rows by its argument as
	// well, and aggregates the distinct values the shards send: they are the union of
	// each shard's. The other partials are then per group and value, and combine alike.
	distinct := map[string]string{}
	var distinctGroups []*pg.Node
	distinctValue := func(arg *pg.Node) *pg.Node {
		key := exprKey(arg)
		col, ok := distinct[key]
		if !ok {
			aggs++
			col = fmt.Sprintf("%sd%d", markerPrefix, aggs)
			distinct[key] = col
			branchTargets = append(branchTargets, resTarget(col, cloneNode(arg)))
			distinctGroups = append(distinctGroups, cloneNode(arg))
		}
		return pg.MakeColumnRefNode([]*pg.Node{pg.MakeStrNode(col)}, -1)
	}
	combine := func(fn *pg.FuncCall) {
		name := foldedFuncName(fn)
		var to *pg.FuncCall
		switch {
		case fn.AggDistinct:
			to = &pg.FuncCall{Funcname: []*pg.Node{pg.MakeStrNode(name)}, Args: []*pg.Node{distinctValue(fn.Args[0])},
				AggDistinct: true, Funcformat: pg.CoercionForm_COERCE_EXPLICIT_CALL, Location: -1}
		case name == "count":
			// Zero over no partials (a shard's groups by distinct value may be none).
			to = merge("count", partial(fn, name))
		case name == "sum":
			to = merge("sum", partial(fn, name))
		case name == "min" || name == "max":
			to = &pg.FuncCall{Funcname: []*pg.Node{pg.MakeStrNode(name)}, Args: []*pg.Node{partial(fn, name)},
				Funcformat: pg.CoercionForm_COERCE_EXPLICIT_CALL, Location: -1}
		case name == "avg":
			sum, count := partial(fn, "sum"), partial(fn, "count")
			to = merge("avg", &pg.Node{Node: &pg.Node_FuncCall{FuncCall: merge("sum", sum)}},
				&pg.Node{Node: &pg.Node_FuncCall{FuncCall: merge("count", count)}})
		}
		proto.Reset(fn) // the node is replaced where it stands
		proto.Merge(fn, to)
	}
	// Every output keeps the name PostgreSQL gives it as written: a combination, or a
	// hidden column, would give another (count would become sum). One whose naming is
	// not modelled is named after its own node, which stays unless a grouping
	// expression replaces it whole.
	var unnamed []*pg.ResTarget
	for _, t := range sel.TargetList {
		if rt := t.GetResTarget(); rt != nil && rt.Name == "" {
			if name, modelled := outputName(rt.Val); modelled {
				rt.Name = name
			} else {
				unnamed = append(unnamed, rt)
			}
		}
	}
	// The partials keep their FILTER in the branches; the combinations have none.
	odd := false
	find := func(n *pg.Node) {
		walk(n, func(m proto.Message) bool {
			fn, ok := m.(*pg.FuncCall)
			if !ok || !mergeAggregates[foldedFuncName(fn)] {
				return true
			}
			if len(fn.Args) > 1 || len(fn.Args) == 0 && (!fn.AggStar || foldedFuncName(fn) != "count") {
				odd = true // count(*) or one argument; PostgreSQL has no other
				return false
			}
			combine(fn)
			return false // an aggregate's argument holds none
		})
	}
	for _, list := range [][]*pg.Node{sel.TargetList, sel.DistinctClause, sel.SortClause} {
		for _, n := range list {
			find(n)
		}
	}
	find(sel.HavingClause)
	if odd || aggs == 0 && len(groups) == 0 {
		return false
	}
	// The grouping expressions, outside the aggregates (now combinations), become
	// their hidden columns.
	if len(grouped) > 0 {
		replace := func(n *pg.Node) {
			walk(n, func(m proto.Message) bool {
				e, ok := m.(*pg.Node)
				if !ok || e.Node == nil {
					return true
				}
				if col, ok := grouped[exprKey(e)]; ok {
					e.Node = pg.MakeColumnRefNode([]*pg.Node{pg.MakeStrNode(col)}, -1).Node
					return false
				}
				return true
			})
		}
		for _, list := range [][]*pg.Node{sel.TargetList, sel.DistinctClause, sel.SortClause} {
			for _, n := range list {
				replace(n)
			}
		}
		replace(sel.HavingClause)
		// An output PostgreSQL names in a way not modelled here may take its name from
		// a hidden column (x[1] is named x): none may read one.
		for _, rt := range unnamed {
			hidden := false
			walk(rt.Val, func(m proto.Message) bool {
				if cr, ok := m.(*pg.ColumnRef); ok && strings.HasPrefix(cr.Fields[len(cr.Fields)-1].GetString_().GetSval(), markerPrefix) {
					hidden = true
				}
				return !hidden
			})
			if hidden {
				return false
			}
		}
	}
	// What the coordinator reads now is a grouping column or a hidden one (an ORDER BY
	// may name an output too); anything else (p.city where GROUP BY lower(city) reads
	// it, a column not grouped) would fail where one database answers or errs otherwise:
	// the statement runs as written.
	readable := func(n *pg.Node, outputsToo bool) bool {
		ok := true
		walk(n, func(m proto.Message) bool {
			if cr, isRef := m.(*pg.ColumnRef); isRef {
				col := cr.Fields[len(cr.Fields)-1].GetString_().GetSval()
				_, output := outputs[col]
				i := resolve(cr)
				pushed := i >= 0 && inP[i] && seen[col] && exposed[col] == i
				ok = ok && (pushed || i >= 0 && !inP[i] || strings.HasPrefix(col, markerPrefix) || outputsToo && len(cr.Fields) == 1 && output)
			}
			return ok
		})
		return ok
	}
	for _, n := range sel.TargetList {
		if !readable(n.GetResTarget().GetVal(), false) {
			return false
		}
	}
	// An ORDER BY or DISTINCT ON item names an output only as a bare name.
	for _, n := range sel.SortClause {
		item := n.GetSortBy().GetNode()
		if !readable(item, isBareName(item)) {
			return false
		}
	}
	for _, n := range sel.DistinctClause {
		if !readable(n, isBareName(n)) {
			return false
		}
	}
	if !readable(sel.HavingClause, false) {
		return false
	}
	sel.GroupClause = outerGroups

	var union *pg.SelectStmt
	for shard := range shardNames[first] {
		b := &pg.SelectStmt{
			TargetList:  cloneNodes(branchTargets),
			WhereClause: cloneNode(sel.WhereClause),
			GroupClause: append(cloneNodes(groups), cloneNodes(distinctGroups)...),
			Op:          pg.SetOperation_SETOP_NONE,
			LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT,
		}
		if joined {
			b.WhereClause = and(cloneNodes(branchQuals))
		}
		if others && len(b.GroupClause) == 0 {
			// An aggregate without groups answers a row over no rows, which the
			// coordinator would join with the other entries' rows.
			b.HavingClause = &pg.Node{Node: &pg.Node_AExpr{AExpr: &pg.A_Expr{Kind: pg.A_Expr_Kind_AEXPR_OP, Name: []*pg.Node{pg.MakeStrNode(">")},
				Lexpr: &pg.Node{Node: &pg.Node_FuncCall{FuncCall: &pg.FuncCall{Funcname: []*pg.Node{pg.MakeStrNode("count")}, AggStar: true,
					Funcformat: pg.CoercionForm_COERCE_EXPLICIT_CALL, Location: -1}}},
				Rexpr: pg.MakeAConstIntNode(0, -1), Location: -1}}}
		}
		for i, it := range items {
			if inP[i] {
				b.FromClause = append(b.FromClause, &pg.Node{Node: &pg.Node_RangeVar{RangeVar: &pg.RangeVar{Schemaname: CoordinatorShardsSchema,
					Relname: shardNames[i][shard], Inh: true, Relpersistence: "p", Alias: &pg.Alias{Aliasname: it.name}, Location: -1}}})
			}
		}
		if union == nil {
			union = b
			continue
		}
		union = &pg.SelectStmt{Op: pg.SetOperation_SETOP_UNION, All: true, Larg: union, Rarg: b, LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT}
	}
	derived := &pg.Node{Node: &pg.Node_RangeSubselect{RangeSubselect: &pg.RangeSubselect{
		Subquery: &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: union}}, Alias: &pg.Alias{Aliasname: alias}}}}
	if !joined {
		sel.FromClause, sel.WhereClause = []*pg.Node{derived}, nil
		return true
	}
	// The coordinator joins the shards' groups, under the name of the first entry they
	// stand for, with the other entries; inner joins' conditions are its WHERE.
	sel.FromClause = nil
	for i, it := range items {
		switch {
		case i == first:
			sel.FromClause = append(sel.FromClause, derived)
		case !inP[i]:
			sel.FromClause = append(sel.FromClause, &pg.Node{Node: &pg.Node_RangeVar{RangeVar: it.rv}})
		}
	}
	sel.WhereClause = and(outerQuals)
	requalify := func(n *pg.Node) {
		walk(n, func(m proto.Message) bool {
			if cr, ok := m.(*pg.ColumnRef); ok && len(cr.Fields) == 2 {
				if i := slices.IndexFunc(items, func(it *aggItem) bool { return it.name == cr.Fields[0].GetString_().GetSval() }); i >= 0 && inP[i] {
					cr.Fields[0] = pg.MakeStrNode(alias)
				}
			}
			return true
		})
	}
	for _, list := range [][]*pg.Node{sel.TargetList, sel.DistinctClause, sel.SortClause, sel.GroupClause} {
		for _, n := range list {
			requalify(n)
		}
	}
	requalify(sel.HavingClause)
	requalify(sel.WhereClause)
	return true
}

// aggItem is a table in the FROM clause of a statement shardAggregates rewrites.
type aggItem struct {
	rv   *pg.RangeVar
	name string // what the statement calls it: its alias, or the table's name
	rule *rules.TableRule
	cols map[string]string // its columns and their types, under a join (see joinCatalog)
}

// onQual is a condition of an inner join, and the FROM entries it may read: the
// join's own.
type onQual struct {
	cond  *pg.Node
	scope []int
}

// readAggFrom returns the tables of a FROM clause that lists tables and inner joins of
// them, and the conditions of the joins, split at AND. ok is false for anything else:
// an outer join, USING or NATURAL (which merge columns), a subquery, a function, ONLY,
// a table of another schema or with its columns renamed.
func readAggFrom(r *rules.Compiled, from []*pg.Node) (items []*aggItem, quals []onQual, ok bool) {
	var add func(n *pg.Node) bool
	add = func(n *pg.Node) bool {
		if rv := n.GetRangeVar(); rv != nil {
			if !rv.Inh || rv.Catalogname != "" || rv.Schemaname != "" && rv.Schemaname != "public" || rv.Alias != nil && len(rv.Alias.Colnames) > 0 {
				return false
			}
			it := &aggItem{rv: rv, name: rv.Relname, rule: r.Lookup(rv.Relname)}
			if rv.Alias != nil {
				it.name = rv.Alias.Aliasname
			}
			items = append(items, it)
			return true
		}
		j := n.GetJoinExpr()
		if j == nil || j.Jointype != pg.JoinType_JOIN_INNER || j.IsNatural || len(j.UsingClause) > 0 || j.Alias != nil || j.JoinUsingAlias != nil {
			return false
		}
		from := len(items)
		if !add(j.Larg) || !add(j.Rarg) {
			return false
		}
		var scope []int
		for i := from; i < len(items); i++ {
			scope = append(scope, i)
		}
		for _, c := range conjuncts(j.Quals) {
			quals = append(quals, onQual{cond: c, scope: scope})
		}
		return true
	}
	for _, n := range from {
		if !add(n) {
			return nil, nil, false
		}
	}
	return items, quals, true
}

// pushedEntries returns which FROM entries each shard reads under a join: those the
// aggregates read, and every sharded table whose rows they meet on the same shard only,
// through a condition that equates the integer or uuid sharding keys of two tables
// placed alike. Where the aggregates read no entry (count(*)), the most sharded tables
// so joined. It returns nil when the aggregates read entries not so joined, when there
// is no aggregate (aggregated), or no table is sharded.
func pushedEntries(items []*aggItem, quals []*pg.Node, aggItems map[int]bool, aggregated bool, resolve func(*pg.ColumnRef) int) []bool {
	parent := make([]int, len(items))
	for i := range parent {
		parent[i] = i
	}
	var find func(i int) int
	find = func(i int) int {
		if parent[i] != i {
			parent[i] = find(parent[i])
		}
		return parent[i]
	}
	key := func(n *pg.Node) int {
		cr := n.GetColumnRef()
		if cr == nil {
			return -1
		}
		i := resolve(cr)
		if i < 0 {
			return -1
		}
		keys := items[i].rule.KeyColumns()
		if items[i].rule.Kind != rules.KindSharded || len(keys) != 1 || cr.Fields[len(cr.Fields)-1].GetString_().GetSval() != keys[0] {
			return -1
		}
		return i
	}
	for _, q := range quals {
		e := q.GetAExpr()
		if e == nil || e.Kind != pg.A_Expr_Kind_AEXPR_OP || len(e.Name) != 1 || e.Name[0].GetString_().GetSval() != "=" {
			continue
		}
		x, y := key(e.Lexpr), key(e.Rexpr)
		if x < 0 || y < 0 || x == y || !rules.SamePlacement(items[x].rule, items[y].rule) {
			continue
		}
		// Equal keys of these types are the same bytes to the rules (a text key's
		// collation might call two strings equal that the rules place apart).
		tx, ty := items[x].cols[items[x].rule.KeyColumns()[0]], items[y].cols[items[y].rule.KeyColumns()[0]]
		if !(integerTypes[tx] && integerTypes[ty] || tx == "uuid" && ty == "uuid") {
			continue
		}
		parent[find(x)] = find(y)
	}
	root := -1
	for i := range aggItems {
		if root < 0 {
			root = find(i)
		} else if find(i) != root {
			return nil
		}
	}
	if root < 0 && aggregated {
		// Aggregates that read no column (count(*)) count joined rows wherever the
		// shards group them: the most sharded tables so joined read on the shards.
		// (Without an aggregate, a group would stand for its rows once.)
		size, most := map[int]int{}, 0
		for i, it := range items {
			if it.rule.Kind != rules.KindSharded {
				continue
			}
			if size[find(i)]++; size[find(i)] > most {
				root, most = find(i), size[find(i)]
			}
		}
	}
	if root < 0 {
		return nil
	}
	in := make([]bool, len(items))
	for i := range items {
		in[i] = find(i) == root
	}
	return in
}

// readsEntries reports whether an expression reads pushed entries' columns, and
// whether it reads others (or columns of no one entry).
func readsEntries(n *pg.Node, resolve func(*pg.ColumnRef) int, inP []bool) (pushed, other bool) {
	walk(n, func(m proto.Message) bool {
		if cr, ok := m.(*pg.ColumnRef); ok {
			if i := resolve(cr); i >= 0 && inP[i] {
				pushed = true
			} else {
				other = true
			}
		}
		return true
	})
	return pushed, other
}

// comparisons are the operators a join condition the coordinator keeps may compare a
// pushed column with: each holds of values equal to one another alike, for the types
// comparable allows.
var comparisons = map[string]bool{"=": true, "<>": true, "!=": true, "<": true, "<=": true, ">": true, ">=": true}

// decimalLiteral is a numeric literal of a decimal point, no exponent and a bounded
// length.
var decimalLiteral = regexp.MustCompile(`^([0-9]{1,30}\.[0-9]{0,30}|\.[0-9]{1,30})$`)

// arithmetic are the operators evaluatesSafely lets a numeric through.
var arithmetic = map[string]bool{"+": true, "-": true, "*": true}

// numericType reports whether format_type's name of a type is numeric's.
func numericType(t string) bool {
	return t == "numeric" || strings.HasPrefix(t, "numeric(")
}

// integerTypes are PostgreSQL's integer types as format_type names them.
var integerTypes = map[string]bool{"smallint": true, "integer": true, "bigint": true}

// comparable reports whether a shard may group rows by a column of type x that the
// coordinator then compares with one of type y: the grouping's equality is the
// comparison's, and values it calls equal compare alike (integers with integers; a
// numeric with a numeric, 1.0 as 1.00; dates, timestamps, uuids with their own type).
// Text is not: a comparison with a column of another collation, or of another type
// (citext with text), may tell apart strings the grouping merged.
func comparable(x, y string) bool {
	switch {
	case integerTypes[x] && integerTypes[y]:
		return true
	case numericType(x) && numericType(y):
		return true
	}
	return x == y && (x == "date" || x == "uuid" || x == "timestamp without time zone" || x == "timestamp with time zone")
}

// evaluatesSafely reports whether a shard may evaluate an aggregate over rows one
// database would not aggregate, without failing where that database would not: it reads
// a column as it is (sum and avg one of integers or numerics; a sum of int4 adds into an
// int8), or adds, subtracts and multiplies numerics of a precision, integers and
// constants into a numeric (which cannot overflow); with no FILTER.
func evaluatesSafely(fn *pg.FuncCall, typeOf func(*pg.ColumnRef) string) bool {
	if fn.AggFilter != nil || len(fn.Args) > 1 {
		return false
	}
	if fn.AggStar || len(fn.Args) == 0 {
		return fn.AggStar
	}
	if cr := fn.Args[0].GetColumnRef(); cr != nil {
		t := typeOf(cr)
		name := foldedFuncName(fn)
		return t != "" && (name != "sum" && name != "avg" || integerTypes[t] || strings.HasPrefix(t, "numeric("))
	}
	if fn.AggDistinct {
		return false
	}
	// The kind of value an expression gives: "int", "numeric", or "" for one that might
	// fail (an integer overflowing, or anything else). An operation with a numeric is
	// a numeric's.
	var kind func(n *pg.Node) string
	kind = func(n *pg.Node) string {
		switch {
		case n.GetColumnRef() != nil:
			t := typeOf(n.GetColumnRef())
			switch {
			case integerTypes[t]:
				return "int"
			case strings.HasPrefix(t, "numeric("):
				return "numeric"
			}
		case n.GetAConst() != nil && n.GetAConst().GetIval() != nil:
			return "int"
		case n.GetAConst() != nil && n.GetAConst().GetFval() != nil:
			// A literal with a decimal point and no exponent is a numeric; one
			// without is an integer too long for int4 (an int8, which may overflow).
			if decimalLiteral.MatchString(n.GetAConst().GetFval().GetFval()) {
				return "numeric"
			}
		case n.GetAExpr() != nil:
			e := n.GetAExpr()
			if e.Kind != pg.A_Expr_Kind_AEXPR_OP || len(e.Name) != 1 || e.Lexpr == nil || !arithmetic[e.Name[0].GetString_().GetSval()] {
				return ""
			}
			l, r := kind(e.Lexpr), kind(e.Rexpr)
			if l != "" && r != "" && (l == "numeric" || r == "numeric") {
				return "numeric"
			}
		}
		return ""
	}
	return kind(fn.Args[0]) == "numeric"
}

// and is the conjunction of conditions (nil for none).
func and(ns []*pg.Node) *pg.Node {
	switch len(ns) {
	case 0:
		return nil
	case 1:
		return ns[0]
	}
	return &pg.Node{Node: &pg.Node_BoolExpr{BoolExpr: &pg.BoolExpr{Boolop: pg.BoolExprType_AND_EXPR, Args: ns, Location: -1}}}
}

// joinCatalog is what aggregating on the shards under a join needs to know of the
// tables a statement names, read when it is planned: their columns (to tell which table
// an unqualified column is of) and the columns' types (to tell which joins meet rows of
// one shard only, and which expressions the shards may evaluate over rows the
// coordinator's joins would drop).
type joinCatalog struct {
	columns map[string]map[string]string // table: column: type
	// What PostgreSQL's statistics say of a sharded table's first shard, where it has
	// them: its rows, and each column's distinct values.
	rows     map[string]float64
	distinct map[string]map[string]float64
	// readAt is when the statistics were read (zero: none were asked for). They
	// change without the planner hearing of it (autovacuum's ANALYZE): a plan that
	// read them is planned again once they are statsMaxAge old.
	readAt time.Time
}

// statsMaxAge is how long a cached plan keeps the statistics it read (see
// joinCatalog.readAt). An ANALYZE or VACUUM through the proxy or the driver empties the
// plan cache at once, as any DDL does.
const statsMaxAge = time.Minute

// staleStats reports whether a plan's choices rest on statistics read more than
// statsMaxAge ago.
func (p *Plan) staleStats() bool {
	return p.joins != nil && !p.joins.readAt.IsZero() && time.Since(p.joins.readAt) > statsMaxAge
}

// fewGroups is the largest share of a shard's rows in groups at which one table,
// grouped by the columns it is joined by, aggregates on the shards: at 26% and 37%
// that was measured slower than sending the rows (docs/sql-sharding.md).
const fewGroups = 0.1

// groupShare estimates, from the statistics, the share of a shard's rows of table that
// its groups by cols are: at most the product of the columns' distinct values, and at
// most 1. ok is false without statistics for each.
func (jc *joinCatalog) groupShare(table string, cols []string) (share float64, ok bool) {
	rows := jc.rows[table]
	if rows <= 0 || len(cols) == 0 {
		return 0, false
	}
	groups := 1.0
	for _, c := range cols {
		d, ok := jc.distinct[table][c]
		if !ok || d <= 0 {
			return 0, false
		}
		groups *= d
	}
	return min(1, groups/rows), true
}

// figureColname returns the name PostgreSQL gives an output column it is not told
// the name of (its parser's FigureColname), and the function call the name comes from,
// if it comes from one. Names it does not model are "?column?".
func figureColname(n *pg.Node) (string, *pg.FuncCall) {
	name, fn, strength := figureColnameOf(n)
	if strength == 0 {
		return "?column?", nil
	}
	return name, fn
}

// outputName is figureColname's name, and whether it is the one PostgreSQL gives: the
// node kinds PostgreSQL names "?column?" are known, the others are not modelled.
func outputName(n *pg.Node) (string, bool) {
	name, _, strength := figureColnameOf(n)
	if strength > 0 {
		return name, true
	}
	for n.GetTypeCast() != nil || n.GetCollateClause() != nil || n.GetCaseExpr() != nil {
		switch {
		case n.GetTypeCast() != nil:
			return "", false // a cast with a name of its own has strength 1
		case n.GetCollateClause() != nil:
			n = n.GetCollateClause().Arg
		default:
			return "", false
		}
	}
	switch n.Node.(type) {
	case *pg.Node_AExpr, *pg.Node_AConst, *pg.Node_ParamRef, *pg.Node_BoolExpr, *pg.Node_NullTest, *pg.Node_BooleanTest:
		return "?column?", true
	}
	return "", false
}

func figureColnameOf(n *pg.Node) (name string, fn *pg.FuncCall, strength int) {
	if n == nil {
		return "", nil, 0
	}
	switch v := n.Node.(type) {
	case *pg.Node_ColumnRef:
		if f := v.ColumnRef.Fields; len(f) > 0 && f[len(f)-1].GetString_() != nil {
			return f[len(f)-1].GetString_().Sval, nil, 2
		}
	case *pg.Node_AIndirection:
		var last string
		for _, i := range v.AIndirection.Indirection {
			if s := i.GetString_(); s != nil {
				last = s.Sval
			}
		}
		if last != "" {
			return last, nil, 2
		}
		return figureColnameOf(v.AIndirection.Arg)
	case *pg.Node_FuncCall:
		_, name := funcName(v.FuncCall)
		return name, v.FuncCall, 2
	case *pg.Node_AExpr:
		if v.AExpr.Kind == pg.A_Expr_Kind_AEXPR_NULLIF {
			return "nullif", nil, 2
		}
	case *pg.Node_TypeCast:
		name, fn, strength := figureColnameOf(v.TypeCast.Arg)
		if strength <= 1 && v.TypeCast.TypeName != nil && len(v.TypeCast.TypeName.Names) > 0 {
			names := v.TypeCast.TypeName.Names
			return names[len(names)-1].GetString_().GetSval(), nil, 1
		}
		return name, fn, strength
	case *pg.Node_CollateClause:
		return figureColnameOf(v.CollateClause.Arg)
	case *pg.Node_CaseExpr:
		name, fn, strength := figureColnameOf(v.CaseExpr.Defresult)
		if strength <= 1 {
			return "case", nil, 1
		}
		return name, fn, strength
	case *pg.Node_AArrayExpr:
		return "array", nil, 2
	case *pg.Node_RowExpr:
		return "row", nil, 2
	case *pg.Node_CoalesceExpr:
		return "coalesce", nil, 2
	case *pg.Node_MinMaxExpr:
		if v.MinMaxExpr.Op == pg.MinMaxOp_IS_GREATEST {
			return "greatest", nil, 2
		}
		return "least", nil, 2
	}
	return "", nil, 0
}

// groupable reports whether the argument of an aggregate over DISTINCT values may be a
// GROUP BY item of the branches, meaning there what it means in the aggregate: it
// reads a column (a bare constant would be a position, or an error), and calls no
// function (a volatile one would be evaluated once for two aggregates that write it
// alike; a set-returning one would fail with another message).
func groupable(arg *pg.Node) bool {
	column, calls := false, false
	walk(arg, func(m proto.Message) bool {
		switch m.(type) {
		case *pg.ColumnRef:
			column = true
		case *pg.FuncCall, *pg.SubLink:
			calls = true
		}
		return true
	})
	return column && !calls
}

// groupExpression reports whether a GROUP BY expression may be grouped by in the
// branches and read there as a hidden column: it reads a column, and holds no
// aggregate, window function or subquery (those are errors, or not the branches').
func groupExpression(g *pg.Node) bool {
	column, other := false, false
	walk(g, func(m proto.Message) bool {
		switch n := m.(type) {
		case *pg.ColumnRef:
			column = true
		case *pg.SubLink, *pg.CollateClause:
			// A COLLATE would be only implicit on the hidden column: an explicit
			// collation that won a comparison would then conflict.
			other = true
		case *pg.FuncCall:
			schema, _ := funcName(n)
			if !groupFunctions[foldedFuncName(n)] || schema != "" && schema != "pg_catalog" || n.Over != nil || n.AggStar || n.AggDistinct || n.AggFilter != nil {
				other = true
			}
		}
		return !other
	})
	return column && !other
}

// groupFunctions are the built-in scalar functions a grouping expression may call: none
// returns a set (a set-returning function read where the hidden column stands, in a
// HAVING say, would answer where one database refuses), and PostgreSQL has them all.
var groupFunctions = map[string]bool{
	"lower": true, "upper": true, "initcap": true, "substr": true, "substring": true, "left": true, "right": true,
	"length": true, "char_length": true, "octet_length": true, "btrim": true, "ltrim": true, "rtrim": true,
	"replace": true, "split_part": true, "md5": true, "concat": true, "concat_ws": true, "to_char": true,
	"date_trunc": true, "date_part": true, "extract": true, "abs": true, "round": true, "trunc": true,
	"floor": true, "ceil": true, "ceiling": true, "mod": true, "sign": true, "div": true,
}

// callsFunction reports whether a function call calls another in its arguments or
// FILTER.
func callsFunction(fn *pg.FuncCall) bool {
	found := false
	walk(fn, func(m proto.Message) bool {
		if f, ok := m.(*pg.FuncCall); ok && f != fn {
			found = true
		}
		return !found
	})
	return found
}

func resTarget(name string, val *pg.Node) *pg.Node {
	return &pg.Node{Node: &pg.Node_ResTarget{ResTarget: &pg.ResTarget{Name: name, Val: val, Location: -1}}}
}

func cloneNodes(ns []*pg.Node) []*pg.Node {
	out := make([]*pg.Node, len(ns))
	for i, n := range ns {
		out[i] = cloneNode(n)
	}
	return out
}
