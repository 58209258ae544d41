package sqlplan

import (
	"fmt"
	"strings"

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
	if _, err := pg.Parse(out); err != nil {
		return "", false // the deparser wrote what the grammar does not read ($0 as ?)
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

	// The groups: columns of the table, none also the name of an output column (which
	// PostgreSQL would read as the column, and a reader might not); positions in the
	// select list; expressions over columns, which the branches group by and send as
	// hidden columns, and which the coordinator reads there wherever the statement
	// writes them alike.
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
			if !groupExpression(g) {
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
				ok = ok && (seen[col] || strings.HasPrefix(col, markerPrefix) || outputsToo && len(cr.Fields) == 1 && output)
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
