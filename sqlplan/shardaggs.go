package sqlplan

import (
	"fmt"

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
// the coordinator aggregates the distinct values the shards send. The statement is
// rewritten only when that is exact: one sharded table in FROM, grouped by plain
// columns, whose aggregates are count, sum, min, max and avg (with FILTER, or over
// DISTINCT values without one; no ORDER BY), with no subquery, window function, CTE,
// set operation or whole-row reference, and no parameter written twice. Everything
// else in it (expressions over the aggregates, HAVING, ORDER BY, DISTINCT, LIMIT) the
// coordinator evaluates over the combined rows as written. It returns ok false, and
// the statement runs as written, otherwise.
func shardAggregates(r *rules.Compiled, sql string) (string, bool) {
	tree, err := pg.Parse(sql)
	if err != nil || len(tree.Stmts) != 1 {
		return "", false
	}
	stmt := tree.Stmts[0].Stmt
	if e := stmt.GetExplainStmt(); e != nil {
		stmt = e.Query
	}
	sel := stmt.GetSelectStmt()
	if sel == nil || !rewriteShardAggregates(r, sel) {
		return "", false
	}
	out, err := pg.Deparse(tree)
	if err != nil {
		return "", false
	}
	return out, true
}

// mergeAggregates are the aggregates shardAggregates splits into shards' partial
// aggregates and the coordinator's combination.
var mergeAggregates = map[string]bool{"count": true, "sum": true, "min": true, "max": true, "avg": true}

func rewriteShardAggregates(r *rules.Compiled, sel *pg.SelectStmt) bool {
	if sel.Op != pg.SetOperation_SET_OPERATION_UNDEFINED && sel.Op != pg.SetOperation_SETOP_NONE ||
		sel.WithClause != nil || sel.IntoClause != nil || len(sel.LockingClause) > 0 || len(sel.WindowClause) > 0 ||
		len(sel.ValuesLists) > 0 || len(sel.FromClause) != 1 || sel.GroupDistinct {
		return false
	}
	rv := sel.FromClause[0].GetRangeVar()
	if rv == nil || !rv.Inh || rv.Catalogname != "" || rv.Schemaname != "" && rv.Schemaname != "public" ||
		rv.Alias != nil && len(rv.Alias.Colnames) > 0 {
		return false
	}
	rule := r.Lookup(rv.Relname)
	if rule == nil || rule.Kind != rules.KindSharded || len(rule.Nodes) < 2 {
		return false
	}
	shards := make([]string, len(rule.Nodes))
	for i := range rule.Nodes {
		if shards[i] = CoordinatorShardTable(rv.Relname, i); shards[i] == "" {
			return false
		}
	}
	alias := rv.Relname
	if rv.Alias != nil {
		alias = rv.Alias.Aliasname
	}

	// Nothing whose meaning a subquery in FROM would change: no subquery, window
	// function, whole-row or star reference, or aggregate other than the five (a
	// quoted "SUM" is no aggregate of PostgreSQL's).
	exact := true
	params := map[int32]int{}
	walk(sel, func(m proto.Message) bool {
		switch n := m.(type) {
		case *pg.SubLink, *pg.RangeSubselect, *pg.RangeFunction, *pg.WithClause, *pg.GroupingSet, *pg.GroupingFunc:
			exact = false
		case *pg.ColumnRef:
			exact = exact && plainColumn(n, alias)
		case *pg.ParamRef:
			params[n.Number]++
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

	// The groups: plain columns of the table, none also the name of an output column
	// (which PostgreSQL would read as the column, and a reader might not).
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
	var branchTargets, groups []*pg.Node
	seen := map[string]bool{}
	for _, g := range sel.GroupClause {
		cr := g.GetColumnRef()
		if cr == nil {
			return false
		}
		col := cr.Fields[len(cr.Fields)-1].GetString_().Sval
		if out, ok := outputs[col]; ok && out != col {
			return false
		}
		if !seen[col] {
			seen[col] = true
			branchTargets = append(branchTargets, resTarget(col, proto.Clone(g).(*pg.Node)))
			groups = append(groups, proto.Clone(g).(*pg.Node))
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
	// An output PostgreSQL names after an aggregate keeps that name; its combination
	// would give another (count would become sum).
	for _, t := range sel.TargetList {
		if rt := t.GetResTarget(); rt != nil && rt.Name == "" {
			if name, fn := figureColname(rt.Val); fn != nil && mergeAggregates[foldedFuncName(fn)] {
				rt.Name = name
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

	var union *pg.SelectStmt
	for i, shard := range shards {
		b := &pg.SelectStmt{
			TargetList:  cloneNodes(branchTargets),
			FromClause:  []*pg.Node{{Node: &pg.Node_RangeVar{RangeVar: &pg.RangeVar{Schemaname: CoordinatorShardsSchema, Relname: shard, Inh: true, Relpersistence: "p", Alias: &pg.Alias{Aliasname: alias}, Location: -1}}}},
			WhereClause: cloneNode(sel.WhereClause),
			GroupClause: append(cloneNodes(groups), cloneNodes(distinctGroups)...),
			Op:          pg.SetOperation_SETOP_NONE,
		}
		if i == 0 {
			union = b
			continue
		}
		union = &pg.SelectStmt{Op: pg.SetOperation_SETOP_UNION, All: true, Larg: union, Rarg: b}
	}
	sel.FromClause = []*pg.Node{{Node: &pg.Node_RangeSubselect{RangeSubselect: &pg.RangeSubselect{
		Subquery: &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: union}}, Alias: &pg.Alias{Aliasname: alias}}}}}
	sel.WhereClause = nil
	return true
}

// plainColumn reports whether a column reference names one column of the table read
// as alias: not a star, not the whole row.
func plainColumn(cr *pg.ColumnRef, alias string) bool {
	f := cr.Fields
	for _, p := range f {
		if p.GetString_() == nil {
			return false
		}
	}
	switch len(f) {
	case 1:
		return f[0].GetString_().Sval != alias
	case 2:
		return f[0].GetString_().Sval == alias
	}
	return false
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
