package sqlplan

import (
	"slices"
	"strconv"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

func (a *analyzer) analyzeSelect(sel *pg.SelectStmt) error {
	a.plan.Kind = KindSelect
	if sel.IntoClause != nil {
		return unsupported("SELECT INTO (use CREATE TABLE ... AS, on one data source)")
	}
	a.noteParams(sel)
	a.pinPositions(sel)
	top, err := a.collectSelect(sel, nil)
	if err != nil {
		return err
	}
	a.top = top
	if err := a.buildRoute(); err != nil {
		return err
	}
	if len(sel.LockingClause) > 0 {
		a.plan.Write = false // FOR UPDATE locks rows on their shards; it changes nothing
	}
	// Mark the tables first: the shard statement of a merge is a copy of this tree.
	a.markTables()
	var merge *pg.SelectStmt
	if a.plan.route.sharded {
		if merge, err = a.planMerge(sel); err != nil {
			return err
		}
	}
	if err := a.singleTemplate(&pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: sel}}); err != nil {
		return err
	}
	if merge != nil {
		t, err := a.makeTemplate(&pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: merge}})
		if err != nil {
			return err
		}
		a.plan.mergeTmpl = t
	}
	return nil
}

// pinPositions turns the top level's ORDER BY and GROUP BY positions back into the
// literal integers they were before normalisation: ORDER BY 2 names a column, and a
// statement with ORDER BY 3 needs a plan of its own.
func (a *analyzer) pinPositions(sel *pg.SelectStmt) {
	if !a.normalized {
		return
	}
	pin := func(n *pg.Node) *pg.Node {
		p := n.GetParamRef()
		if p == nil || int(p.Number) > len(a.lits) {
			return n
		}
		l := a.lits[p.Number-1]
		text := a.sql[l.Start:l.End]
		v, err := strconv.ParseInt(text, 10, 32)
		if l.String || err != nil {
			return n
		}
		a.plan.pinned = append(a.plan.pinned, pinnedLit{index: int(p.Number) - 1, text: text})
		return pg.MakeAConstIntNode(v, p.Location)
	}
	for _, s := range sel.SortClause {
		if sb := s.GetSortBy(); sb != nil {
			sb.Node = pin(sb.Node)
		}
	}
	for i, g := range sel.GroupClause {
		sel.GroupClause[i] = pin(g)
	}
}

// supportedAggs are the aggregates a merge can combine exactly.
var supportedAggs = map[string]AggKind{"count": AggCount, "sum": AggSum, "min": AggMin, "max": AggMax, "avg": AggAvg}

// aggregateOf returns the aggregate a node is, if it is a call of one.
func (a *analyzer) aggregateOf(n *pg.Node) (*pg.FuncCall, string, bool, error) {
	f := n.GetFuncCall()
	if f == nil || f.Over != nil {
		return nil, "", false, nil
	}
	schema, name := funcName(f)
	if schema == "" || schema == "pg_catalog" {
		if _, ok := supportedAggs[name]; ok {
			return f, name, true, nil
		}
	}
	if f.AggStar || f.AggDistinct || f.AggFilter != nil || len(f.AggOrder) > 0 || f.AggWithinGroup {
		return f, name, true, nil
	}
	if a.p.cat == nil {
		return f, name, knownAggregates[name], nil
	}
	isAgg, err := a.p.cat.IsAggregate(a.ctx, name)
	return f, name, isAgg, err
}

// knownAggregates are PostgreSQL's built-in aggregates, for planners without a catalog.
var knownAggregates = map[string]bool{
	"array_agg": true, "avg": true, "bit_and": true, "bit_or": true, "bit_xor": true, "bool_and": true,
	"bool_or": true, "count": true, "every": true, "json_agg": true, "jsonb_agg": true, "json_object_agg": true,
	"jsonb_object_agg": true, "max": true, "min": true, "range_agg": true, "range_intersect_agg": true,
	"string_agg": true, "sum": true, "xmlagg": true, "corr": true, "covar_pop": true, "covar_samp": true,
	"regr_avgx": true, "regr_avgy": true, "regr_count": true, "regr_intercept": true, "regr_r2": true,
	"regr_slope": true, "regr_sxx": true, "regr_sxy": true, "regr_syy": true, "stddev": true,
	"stddev_pop": true, "stddev_samp": true, "variance": true, "var_pop": true, "var_samp": true,
	"mode": true, "percentile_cont": true, "percentile_disc": true, "any_value": true,
}

// containsAggregate reports whether an expression calls an aggregate outside subqueries.
func (a *analyzer) containsAggregate(n *pg.Node) (bool, error) {
	found := false
	var err error
	walk(n, func(m proto.Message) bool {
		if found || err != nil {
			return false
		}
		switch x := m.(type) {
		case *pg.SubLink:
			return false
		case *pg.FuncCall:
			if x.Over != nil {
				return true
			}
			_, _, isAgg, e := a.aggregateOf(&pg.Node{Node: &pg.Node_FuncCall{FuncCall: x}})
			if e != nil {
				err = e
			}
			if isAgg {
				found = true
				return false
			}
		}
		return true
	})
	return found, err
}

// hasWindow reports whether an expression calls a window function (outside subqueries).
func hasWindow(n *pg.Node) bool {
	found := false
	walk(n, func(m proto.Message) bool {
		switch x := m.(type) {
		case *pg.SubLink:
			return false
		case *pg.FuncCall:
			if x.Over != nil {
				found = true
			}
		}
		return !found
	})
	return found
}

func hasCollate(n *pg.Node) string {
	name := ""
	walk(n, func(m proto.Message) bool {
		if c, ok := m.(*pg.CollateClause); ok && name == "" {
			if len(c.Collname) > 0 {
				name = c.Collname[len(c.Collname)-1].GetString_().Sval
			}
		}
		return name == ""
	})
	return name
}

// planMerge describes how to answer sel when it spans several shards, and returns the
// SELECT each shard runs then. Constructs a merge cannot answer exactly are recorded as
// single-shard-only (Bind refuses them when the values span several shards).
func (a *analyzer) planMerge(sel *pg.SelectStmt) (*pg.SelectStmt, error) {
	if sel.Op != pg.SetOperation_SETOP_NONE {
		a.singleOnly("UNION, INTERSECT and EXCEPT")
		return nil, nil
	}
	if len(sel.ValuesLists) > 0 {
		return nil, nil
	}
	if len(sel.WindowClause) > 0 {
		a.singleOnly("window functions")
	}
	if sel.HavingClause != nil {
		a.singleOnly("HAVING")
	}
	if len(sel.DistinctClause) > 0 && sel.DistinctClause[0].GetNode() != nil {
		a.singleOnly("DISTINCT ON")
	}
	if sel.LimitOption == pg.LimitOption_LIMIT_OPTION_WITH_TIES {
		a.singleOnly("FETCH FIRST ... WITH TIES")
	}
	for _, g := range sel.GroupClause {
		if g.GetGroupingSet() != nil {
			a.singleOnly("GROUPING SETS, ROLLUP and CUBE")
		}
	}
	if sel.GroupDistinct {
		a.singleOnly("GROUP BY DISTINCT")
	}
	spec := &MergeSpec{Distinct: len(sel.DistinctClause) > 0, Tables: a.plan.Tables}
	for _, part := range [][]*pg.Node{sel.TargetList, sel.SortClause} {
		for _, n := range part {
			if hasWindow(n) {
				a.singleOnly("window functions")
			}
			if c := hasCollate(n); c != "" {
				spec.Collation = c
			}
		}
	}

	aggregating := len(sel.GroupClause) > 0
	star := false
	for _, t := range sel.TargetList {
		rt := t.GetResTarget()
		if isStar(rt.Val) {
			star = true
			continue
		}
		has, err := a.containsAggregate(rt.Val)
		if err != nil {
			return nil, err
		}
		aggregating = aggregating || has
	}
	if len(a.plan.singleOnly) > 0 {
		return nil, nil
	}

	shard := proto.Clone(sel).(*pg.SelectStmt)
	// The clone's expressions are copies; analysis below reads the original's nodes and
	// puts copies into the shard statement.
	var shardTargets []*pg.Node
	addShard := func(expr *pg.Node, name string) int {
		shardTargets = append(shardTargets, pg.MakeResTargetNodeWithNameAndVal(name, cloneNode(expr), -1))
		return len(shardTargets) - 1
	}

	type outInfo struct {
		expr  *pg.Node
		alias string
	}
	var outs []outInfo
	if aggregating {
		spec.Aggregate = true
		if star {
			a.singleOnly("SELECT * with GROUP BY or aggregates")
			return nil, nil
		}
		for _, t := range sel.TargetList {
			rt := t.GetResTarget()
			col, err := a.mergedColumn(rt.Val, rt.Name, addShard)
			if err != nil {
				return nil, err
			}
			if col == nil {
				return nil, nil
			}
			spec.Columns = append(spec.Columns, *col)
			outs = append(outs, outInfo{rt.Val, rt.Name})
		}
		spec.Outputs = len(spec.Columns)
		// Group keys, as hidden columns.
		for _, g := range sel.GroupClause {
			expr := g
			if pos, ok := position(g); ok {
				if pos < 1 || pos > len(outs) {
					return nil, nil // PostgreSQL reports the bad position
				}
				expr = outs[pos-1].expr
			} else if _, name, ok := columnRef(g); ok && isBareName(g) {
				for _, o := range outs {
					if o.alias == name {
						// PostgreSQL reads a GROUP BY name as an input column first,
						// and as an output column's alias only where no column has it.
						if !a.inputColumn(name) {
							expr = o.expr
						}
						break
					}
				}
			}
			spec.Columns = append(spec.Columns, MergedColumn{Kind: AggGroupKey, Shard: addShard(expr, "")})
		}
	} else {
		for _, t := range sel.TargetList {
			rt := t.GetResTarget()
			addShard(rt.Val, rt.Name)
			outs = append(outs, outInfo{rt.Val, rt.Name})
		}
	}

	// ORDER BY: each key is an output column or a hidden one.
	hiddenStart := len(shardTargets) // non-aggregating: hidden shard columns start here
	for _, s := range sel.SortClause {
		sb := s.GetSortBy()
		if sb.SortbyDir == pg.SortByDir_SORTBY_USING {
			a.singleOnly("ORDER BY ... USING an operator")
			return nil, nil
		}
		key := SortKey{Desc: sb.SortbyDir == pg.SortByDir_SORTBY_DESC}
		key.NullsFirst = key.Desc
		key.NullsDefault = sb.SortbyNulls == pg.SortByNulls_SORTBY_NULLS_DEFAULT
		switch sb.SortbyNulls {
		case pg.SortByNulls_SORTBY_NULLS_FIRST:
			key.NullsFirst = true
		case pg.SortByNulls_SORTBY_NULLS_LAST:
			key.NullsFirst = false
		}
		col := -1
		if pos, ok := position(sb.Node); ok {
			if pos < 1 || (!star && pos > len(outs)) {
				return nil, nil // PostgreSQL reports the bad position
			}
			col = pos - 1 // the client's columns come first in the shard's rows too
		} else if !star {
			col = matchOutput(sb.Node, func(i int) (*pg.Node, string) { return outs[i].expr, outs[i].alias }, len(outs))
		}
		if col == -1 {
			switch {
			case spec.Distinct:
				a.singleOnly("ORDER BY an expression that is not in the select list of SELECT DISTINCT")
				return nil, nil
			case aggregating:
				mc, err := a.mergedColumn(sb.Node, "", addShard)
				if err != nil {
					return nil, err
				}
				if mc == nil {
					return nil, nil
				}
				spec.Columns = append(spec.Columns, *mc)
				col = len(spec.Columns) - 1
			default:
				col = addShard(sb.Node, "") - hiddenStart
				key.hidden = true
			}
		}
		key.Column = col
		spec.OrderBy = append(spec.OrderBy, key)
	}
	if !aggregating {
		spec.Hidden = len(shardTargets) - hiddenStart
	}
	if placed, total, names := collateClauses(sel); (len(names) > 1 || placed < total) && spec.ComparesValues() {
		// spec.Collation names the collation the merge compares text under: one
		// COLLATE clause, where it decides a sort key or an aggregate's input.
		a.singleOnly("ORDER BY, min() or max() beside a COLLATE clause in a subquery, a CTE or a condition, or beside several collations")
		return nil, nil
	}

	// LIMIT and OFFSET.
	if sel.LimitCount != nil {
		v, ok := a.valueOf(sel.LimitCount)
		if !ok {
			a.singleOnly("LIMIT with an expression")
			return nil, nil
		}
		if v.kind != valueNull {
			spec.HasLimit, spec.limit = true, &v
		}
	}
	if sel.LimitOffset != nil {
		v, ok := a.valueOf(sel.LimitOffset)
		if !ok {
			a.singleOnly("OFFSET with an expression")
			return nil, nil
		}
		if v.kind != valueNull {
			spec.HasOffset, spec.offset = true, &v
		}
	}
	spec.pushLimit = spec.HasLimit && !aggregating && (!spec.Distinct || len(spec.OrderBy) > 0)
	switch {
	case !groupOrderSafe(sel):
	case aggregating && !spec.Distinct:
		spec.GroupOrder, spec.GroupOrdered = groupOrder(spec, shardTargets)
	case spec.Distinct && !aggregating && !star:
		spec.GroupOrder, spec.GroupOrdered = distinctOrder(spec, len(outs)), true
	}

	shard.TargetList = shardTargets
	shard.LimitOffset = nil
	shard.LimitCount = nil
	shard.LimitOption = pg.LimitOption_LIMIT_OPTION_DEFAULT
	if spec.pushLimit {
		shard.LimitCount = pg.MakeParamRefNode(slotBase+slotLimit, -1)
		shard.LimitOption = pg.LimitOption_LIMIT_OPTION_COUNT
	}
	if aggregating {
		// Shards group and aggregate; the merge sorts. GROUP BY positions name the
		// client's columns, which the shard's target list no longer matches.
		shard.SortClause = nil
		shard.GroupClause = nil
		for _, c := range spec.Columns {
			if c.Kind == AggGroupKey {
				shard.GroupClause = append(shard.GroupClause, cloneNode(shardTargets[c.Shard].GetResTarget().Val))
			}
		}
	}
	if len(spec.GroupOrder) > 0 {
		shard.SortClause = sortClauseOf(spec.GroupOrder)
	}
	a.plan.merge = spec
	return shard, nil
}

// inputColumn reports whether a table the statement reads has a column of this name,
// as its catalog says (without a catalog, none is known).
func (a *analyzer) inputColumn(name string) bool {
	if a.p.cat == nil {
		return false
	}
	for _, r := range a.plan.refs {
		if r.rule == nil {
			continue
		}
		if cols, err := a.p.cat.Columns(a.ctx, r.rule); err == nil && slices.Contains(cols, name) {
			return true
		}
	}
	return false
}

// groupOrder is the order the shards sort their groups in (over shard columns), so
// that the merge meets each group's rows one after another: the group keys the
// client's ORDER BY names first, as it names them, then the rest. ordered reports
// whether the groups then come out in the client's order (every ORDER BY item is a
// group key); otherwise the merge sorts the groups. A plain aggregate (no GROUP BY)
// has one group and no order.
func groupOrder(spec *MergeSpec, targets []*pg.Node) (order []SortKey, ordered bool) {
	var keys []int // the group keys' shard columns
	for _, c := range spec.Columns {
		if c.Kind == AggGroupKey {
			keys = append(keys, c.Shard)
		}
	}
	if len(keys) == 0 {
		return nil, false
	}
	exprOf := func(col int) string { return exprKey(targets[col].GetResTarget().Val) }
	used := map[int]bool{}
	ordered = true
	for _, k := range spec.OrderBy {
		c := spec.Columns[k.Column]
		key := -1
		if c.Kind == AggAny || c.Kind == AggGroupKey {
			want := exprOf(c.Shard)
			for _, g := range keys {
				if !used[g] && exprOf(g) == want {
					key = g
					break
				}
			}
		}
		if key < 0 {
			ordered = false
			break
		}
		used[key] = true
		order = append(order, SortKey{Column: key, Desc: k.Desc, NullsFirst: k.NullsFirst, NullsDefault: k.NullsDefault})
	}
	if !ordered {
		order, used = nil, map[int]bool{}
	}
	for _, g := range keys {
		if !used[g] {
			order = append(order, SortKey{Column: g, NullsDefault: true})
		}
	}
	return order, ordered
}

// collateClauses counts the COLLATE clauses of sel's select list and ORDER BY (placed)
// and of the whole statement (total), and names their collations.
func collateClauses(sel *pg.SelectStmt) (placed, total int, names []string) {
	count := func(root proto.Message, n *int) {
		walk(root, func(m proto.Message) bool {
			if c, ok := m.(*pg.CollateClause); ok {
				*n++
				if len(c.Collname) > 0 && n == &total {
					if name := c.Collname[len(c.Collname)-1].GetString_().GetSval(); !slices.Contains(names, name) {
						names = append(names, name)
					}
				}
			}
			return true
		})
	}
	for _, part := range [][]*pg.Node{sel.TargetList, sel.SortClause} {
		for _, n := range part {
			count(n, &placed)
		}
	}
	count(sel, &total)
	return placed, total, names
}

// groupOrderSafe reports whether the shards may be asked to sort a grouping merge's
// rows: not where a COLLATE clause anywhere in the statement could put a key under a
// collation the merge cannot tell from the tables' (the merge compares text by bytes
// only where the tables' collations do), and not where a system column (xmin, cmin of
// types that hash but do not sort) may be a key. Such statements are merged from the
// shards' whole answers.
func groupOrderSafe(sel *pg.SelectStmt) bool {
	safe := true
	walk(sel, func(m proto.Message) bool {
		switch n := m.(type) {
		case *pg.CollateClause:
			safe = false
		case *pg.ColumnRef:
			if len(n.Fields) > 0 {
				switch n.Fields[len(n.Fields)-1].GetString_().GetSval() {
				case "xmin", "xmax", "cmin", "cmax":
					safe = false
				}
			}
		}
		return safe
	})
	return safe
}

// distinctOrder is the order the shards sort a SELECT DISTINCT's rows in (over its n
// columns), so that the merge meets equal rows one after another: the client's ORDER
// BY (whose items DISTINCT requires to be columns of the select list), then the rest.
func distinctOrder(spec *MergeSpec, n int) []SortKey {
	var order []SortKey
	used := map[int]bool{}
	for _, k := range spec.OrderBy {
		if !used[k.Column] {
			used[k.Column] = true
			order = append(order, SortKey{Column: k.Column, Desc: k.Desc, NullsFirst: k.NullsFirst, NullsDefault: k.NullsDefault})
		}
	}
	for i := range n {
		if !used[i] {
			order = append(order, SortKey{Column: i, NullsDefault: true})
		}
	}
	return order
}

// sortClauseOf is an ORDER BY of shard columns by position. NULLs are placed as the
// client placed them: explicitly where it said NULLS FIRST or LAST, else by the
// database's default (PostgreSQL's, which SortKey.NullsFirst then holds, or SQLite's,
// whose merge reads whole answers and sorts them itself).
func sortClauseOf(order []SortKey) []*pg.Node {
	out := make([]*pg.Node, len(order))
	for i, k := range order {
		dir, nulls := pg.SortByDir_SORTBY_DEFAULT, pg.SortByNulls_SORTBY_NULLS_DEFAULT
		if k.Desc {
			dir = pg.SortByDir_SORTBY_DESC
		}
		switch {
		case k.NullsDefault:
		case k.NullsFirst:
			nulls = pg.SortByNulls_SORTBY_NULLS_FIRST
		default:
			nulls = pg.SortByNulls_SORTBY_NULLS_LAST
		}
		out[i] = pg.MakeSortByNode(pg.MakeAConstIntNode(int64(k.Column+1), -1), dir, nulls, -1)
	}
	return out
}

// mergedColumn describes how one select-list (or ORDER BY) expression of an
// aggregating query combines, adding the shard columns it needs; nil means the
// construct was recorded as single-shard-only.
func (a *analyzer) mergedColumn(expr *pg.Node, alias string, addShard func(*pg.Node, string) int) (*MergedColumn, error) {
	f, name, isAgg, err := a.aggregateOf(expr)
	if err != nil {
		return nil, err
	}
	if !isAgg {
		has, err := a.containsAggregate(expr)
		if err != nil {
			return nil, err
		}
		if has {
			a.singleOnly("an expression over an aggregate, such as sum(x) + 1")
			return nil, nil
		}
		return &MergedColumn{Kind: AggAny, Shard: addShard(expr, alias)}, nil
	}
	kind, ok := supportedAggs[name]
	switch {
	case !ok:
		a.singleOnly("the aggregate " + name + "()")
		return nil, nil
	case f.AggDistinct:
		a.singleOnly("aggregates over DISTINCT values, such as count(DISTINCT x)")
		return nil, nil
	case f.AggFilter != nil:
		a.singleOnly("aggregates with FILTER")
		return nil, nil
	case len(f.AggOrder) > 0 || f.AggWithinGroup:
		a.singleOnly("aggregates with ORDER BY or WITHIN GROUP")
		return nil, nil
	case f.FuncVariadic || (len(f.Args) != 1 && !f.AggStar):
		a.singleOnly("the aggregate " + name + "() with these arguments")
		return nil, nil
	}
	if kind == AggAvg {
		sum := &pg.FuncCall{Funcname: []*pg.Node{pg.MakeStrNode("sum")}, Args: f.Args, Location: -1, Funcformat: pg.CoercionForm_COERCE_EXPLICIT_CALL}
		cnt := &pg.FuncCall{Funcname: []*pg.Node{pg.MakeStrNode("count")}, Args: f.Args, Location: -1, Funcformat: pg.CoercionForm_COERCE_EXPLICIT_CALL}
		name := alias
		if name == "" {
			name = "avg"
		}
		return &MergedColumn{
			Kind:  AggAvg,
			Shard: addShard(&pg.Node{Node: &pg.Node_FuncCall{FuncCall: sum}}, ""),
			Count: addShard(&pg.Node{Node: &pg.Node_FuncCall{FuncCall: cnt}}, ""),
			Name:  name,
		}, nil
	}
	return &MergedColumn{Kind: kind, Shard: addShard(expr, alias)}, nil
}

// matchOutput finds the output column an ORDER BY item names: by alias, by a bare
// column name the select list has unaliased, or by an identical expression. -1: none.
func matchOutput(item *pg.Node, out func(int) (*pg.Node, string), n int) int {
	if _, name, ok := columnRef(item); ok && isBareName(item) {
		for i := range n {
			if _, alias := out(i); alias == name {
				return i
			}
		}
		for i := range n {
			expr, alias := out(i)
			if _, col, ok := columnRef(expr); ok && alias == "" && isBareName(expr) && col == name {
				return i
			}
		}
	}
	key := exprKey(item)
	for i := range n {
		if expr, _ := out(i); exprKey(expr) == key {
			return i
		}
	}
	return -1
}

// position returns the integer of ORDER BY 2 or GROUP BY 2.
func position(n *pg.Node) (int, bool) {
	c := n.GetAConst()
	if c == nil || c.GetIval() == nil {
		return 0, false
	}
	return int(c.GetIval().Ival), true
}

func isStar(n *pg.Node) bool {
	cr := n.GetColumnRef()
	if cr == nil {
		return false
	}
	return cr.Fields[len(cr.Fields)-1].GetAStar() != nil
}

func isBareName(n *pg.Node) bool {
	cr := n.GetColumnRef()
	return cr != nil && len(cr.Fields) == 1
}

// exprKey is a key equal for two expressions that differ only in where they were
// written (their location fields).
func exprKey(n *pg.Node) string {
	c := cloneNode(n)
	walk(c, func(m proto.Message) bool {
		r := m.ProtoReflect()
		if fd := r.Descriptor().Fields().ByName("location"); fd != nil {
			r.Set(fd, protoreflect.ValueOfInt32(0))
		}
		return true
	})
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	return string(b)
}

func cloneNode(n *pg.Node) *pg.Node {
	if n == nil {
		return nil
	}
	return proto.Clone(n).(*pg.Node)
}
