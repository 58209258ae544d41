package sqlplan

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/shardlab/shardlab/rules"
)

// A subquery of an UPDATE or DELETE that reads the changed table's columns
// (correlated) cannot run alone. It can still be evaluated in two steps, with no SQL
// interpreted by the project: first the columns of its tables that it reads, over its
// FROM clause and the conditions that read its tables alone (a statement of its own,
// answered by one shard, the merge or the coordinator database); then the subquery
// over those rows, which arrive as one array parameter per column:
//
//	UPDATE orders o SET name = (SELECT c.name FROM custs c WHERE c.id = o.cust AND c.active)
//	SELECT c.name, c.id FROM custs c WHERE c.active                                    -- first
//	UPDATE orders o SET name = (SELECT p.c1 FROM unnest($1, $2) AS p(c1, c2) WHERE p.c2 = o.cust)
//
// The rewritten subquery reads, for each row of the statement, the same rows the
// written one reads (the rows of its FROM clause that meet its conditions), with the
// same values: a scalar subquery of no row is NULL and of two rows the error 21000, IN
// and ALL keep their three-valued logic, and count, sum (of exact types), min, max and
// avg over the same rows are the same. PostgreSQL evaluates it over other rows and in
// another order than the written one (a function scan of arrays, where one database
// may use an index), so nothing in it may fail.

// preAlias names the rewritten subquery's one FROM entry, and prePrefix its columns.
const preAlias, prePrefix = "shardlab_pre", "shardlab_"

// multisetAggregates are the aggregates whose value depends on the rows they read but
// not on their order (sum and avg only over exact types: see Subquery.Summed).
var multisetAggregates = map[string]bool{"count": true, "sum": true, "avg": true, "min": true, "max": true,
	"bool_and": true, "bool_or": true, "every": true}

// correlatedSub is a correlated subquery's two steps.
type correlatedSub struct {
	first   *pg.Node // SELECT of the columns the subquery reads, over its FROM clause
	sub     *pg.Node // the subquery over unnest of their arrays
	cols    int      // the parameters: one per column of first
	summed  []int    // the columns sum or avg add
	bounded []int    // of them, those whose sum may not overflow (Subquery.Bounded)
	picked  []int    // the columns min or max pick from, an aggregate's DISTINCT keeps, or a limit keeps sorted by
}

// correlatedSub returns the two steps of sl, a subquery of an UPDATE or DELETE of target
// without FROM (USING) or WITH of its own, whose arrays are parameters param+1 ...; nil
// when the subquery reads no column of the changed table, or is not of the shape this
// covers:
//   - a scalar, EXISTS, IN, ANY or ALL subquery (not ARRAY, whose order is the rows');
//   - a SELECT of plain or inner-joined tables that the rules name, without WITH, a set
//     operation, window, DISTINCT or locking, and without a subquery of its own;
//   - GROUP BY columns of its tables, and HAVING over aggregates (compared with
//     constants) and group keys that cannot fail (cannotFail); beside them, every
//     column of its tables outside an aggregate a group key;
//   - ORDER BY columns of its tables or values computed over them, and constant LIMIT
//     and OFFSET, without aggregates or grouping;
//   - conditions, join conditions, aggregate arguments and FILTERs that cannot fail
//     (cannotFail), join conditions reading its own tables alone;
//   - in its select list, the aggregates count, sum, avg, min, max, bool_and, bool_or
//     and every, without FILTER reading the changed table, ORDER BY, WITHIN GROUP or
//     OVER, whose arguments read its own tables alone (sum, avg, min and max: a column
//     or a computed value, whose type the first step's answer tells; see
//     Subquery.Summed); beside an aggregate, every column of its tables inside one, and
//     PostgreSQL's scalar functions (groupFunctions) over the aggregates' values,
//     evaluated once per evaluation as on one database; without one, columns,
//     constants and computed values only;
//   - values computed over its own tables by the first step, once per row of them
//     (computable): PostgreSQL's operators, casts and the functions that answer the
//     same whatever the session (firstStepFunctions), where the database overloads
//     none of them (a volatile one of the user's would be called once per row, not
//     once per pair);
//   - every column reference resolved by the catalog to exactly one table, innermost
//     first, as PostgreSQL resolves it; no whole row or star but a bare * in EXISTS's
//     select list.
func (a *analyzer) correlatedSub(target *pg.RangeVar, sl *pg.SubLink, param int, inWhere bool) *correlatedSub {
	switch sl.SubLinkType {
	case pg.SubLinkType_EXISTS_SUBLINK, pg.SubLinkType_ANY_SUBLINK, pg.SubLinkType_ALL_SUBLINK, pg.SubLinkType_EXPR_SUBLINK:
	default:
		return nil // ARRAY(...) in the rows' order, which one database gives in its heap's; SET (a, b) = (...)
	}
	sel := sl.Subselect.GetSelectStmt()
	if a.p.cat == nil || target == nil || sel == nil || !plainSelect(sel) || hasSublink(sl.Subselect) {
		return nil
	}
	outerRule := a.p.rules.Lookup(target.Relname)
	if outerRule == nil || target.Catalogname != "" || target.Schemaname != "" && target.Schemaname != "public" {
		return nil
	}
	if outerRule.Kind == rules.KindBroadcast && (sel.LimitCount != nil || sel.LimitOffset != nil) {
		// Rows left equal by the ORDER BY come in no defined order: each copy of the
		// table could keep another, and the copies would differ.
		return nil
	}
	outerName := target.Relname
	if target.Alias != nil {
		outerName = target.Alias.Aliasname
	}
	tc, typed := a.p.cat.(typedCatalog)
	if !typed || outerName == preAlias {
		return nil
	}
	outerTypes, err := tc.ColumnTypes(a.ctx, outerRule)
	if err != nil {
		return nil
	}
	outer := map[string]bool{}
	for c := range outerTypes {
		if strings.HasPrefix(c, prePrefix) {
			return nil // would be shadowed by the rewrite's columns
		}
		outer[c] = true
	}
	items, onQuals, ok := readAggFrom(a.p.rules, sel.FromClause)
	if !ok {
		return nil
	}
	seen := map[string]bool{}
	for _, it := range items {
		if it.rule == nil || seen[it.name] {
			return nil
		}
		seen[it.name] = true
		if it.cols, err = tc.ColumnTypes(a.ctx, it.rule); err != nil {
			return nil
		}
	}
	const unresolved = -1
	isOuter := len(items)
	// resolve returns the FROM entry a column reference reads (isOuter: the changed
	// table), innermost scope first, or unresolved.
	resolve := func(cr *pg.ColumnRef) (int, string) {
		var f []string
		for _, p := range cr.Fields {
			if p.GetString_() == nil {
				return unresolved, "" // a star
			}
			f = append(f, p.GetString_().Sval)
		}
		switch len(f) {
		case 1:
			found := unresolved
			for i, it := range items {
				if _, has := it.cols[f[0]]; has {
					if found != unresolved {
						return unresolved, "" // ambiguous
					}
					found = i
				}
			}
			if found == unresolved && outer[f[0]] {
				found = isOuter
			}
			return found, f[0]
		case 2:
			for i, it := range items {
				if it.name == f[0] {
					if _, has := it.cols[f[1]]; has {
						return i, f[1]
					}
					return unresolved, ""
				}
			}
			if f[0] == outerName && outer[f[1]] {
				return isOuter, f[1]
			}
		}
		return unresolved, ""
	}
	// reads says whether n reads the changed table and whether it reads the
	// subquery's tables; ok is false for a reference resolved to neither.
	reads := func(n proto.Message) (changed, own, ok bool) {
		ok = true
		walk(n, func(m proto.Message) bool {
			if cr, is := m.(*pg.ColumnRef); is {
				switch i, _ := resolve(cr); i {
				case unresolved:
					ok = false
				case isOuter:
					changed = true
				default:
					own = true
				}
			}
			return ok
		})
		return changed, own, ok
	}
	typeOf := func(cr *pg.ColumnRef) string {
		switch i, col := resolve(cr); i {
		case unresolved:
			return ""
		case isOuter:
			return outerTypes[col]
		default:
			return items[i].cols[col]
		}
	}
	typedValues := typedComparisons(typeOf)
	type ref struct {
		item int
		col  string
	}
	// GROUP BY columns of the subquery's own tables, each a name PostgreSQL reads as
	// an input column (an input column's name comes before an output column's there);
	// no expression (the select list names it again, and a copy computed first would
	// be another column), no grouping sets, no GROUP BY DISTINCT. The same rows fall
	// into the same groups, by the same equality of the same types.
	groupKeys := map[ref]bool{}
	groupClause := cloneNodes(sel.GroupClause)
	for _, g := range groupClause {
		cr := g.GetColumnRef()
		if cr == nil || sel.GroupDistinct {
			return nil
		}
		i, col := resolve(cr)
		if i == unresolved || i == isOuter {
			return nil
		}
		groupKeys[ref{i, col}] = true
	}
	grouped := len(groupClause) > 0 || sel.HavingClause != nil
	if sl.SubLinkType == pg.SubLinkType_ANY_SUBLINK || sl.SubLinkType == pg.SubLinkType_ALL_SUBLINK {
		// The operator is applied to the subquery's rows one after another, until one
		// decides: in the rows' order. It may not fail (a regular expression's ~, a
		// numeric compared with a float).
		op := "="
		if len(sl.OperName) == 1 {
			op = sl.OperName[0].GetString_().GetSval()
		}
		if len(sl.OperName) > 1 || !comparisons[op] || len(sel.TargetList) != 1 || !typedValues(sl.Testexpr, sel.TargetList[0].GetResTarget().GetVal()) {
			return nil
		}
	}
	for _, f := range sel.FromClause {
		if calls(f) {
			return nil
		}
	}
	for _, q := range onQuals {
		// A join condition is evaluated in the first step, over every pair of rows:
		// one that may fail could fail there where one database never evaluates it.
		if changed, _, ok := reads(q.cond); changed || !ok || !cannotFail(q.cond, anyValues) {
			return nil
		}
	}
	// No condition may fail: one database evaluates them over rows and in an order of
	// its plan's (an index scan tests a division only on the rows its key condition
	// finds), and the rewrite over other rows and in another order (10 / c.z > 1 over
	// every row of the array). The conditions that read the subquery's tables alone then
	// filter its rows in the first step.
	var first, correlated []*pg.Node
	changedAny := false
	for _, c := range conjuncts(sel.WhereClause) {
		changed, _, ok := reads(c)
		if !ok || !cannotFail(c, anyValues) || changed && !cannotFail(c, typedValues) {
			return nil
		}
		changedAny = changedAny || changed
		if changed {
			correlated = append(correlated, proto.Clone(c).(*pg.Node))
		} else {
			first = append(first, c)
		}
	}
	list := cloneNodes(sel.TargetList)
	star := names(&pg.List{Items: list}, func(m proto.Message) bool { _, is := m.(*pg.A_Star); return is })
	if sl.SubLinkType == pg.SubLinkType_EXISTS_SUBLINK && constantsOrStar(list) && !(grouped && star) {
		// Whether a row exists: the select list is never read (but * beside GROUP BY
		// names every column, and one database raises 42803 for those no key holds).
		list = []*pg.Node{resTarget("", &pg.Node{Node: &pg.Node_AConst{AConst: &pg.A_Const{Val: &pg.A_Const_Ival{Ival: &pg.Integer{Ival: 1}}}}})}
	}
	// computed are the expressions over the subquery's own tables that the first step
	// computes, one value a row, in place of the columns they read (an aggregate's
	// argument, a value of the select list): an error there is the first step's, and
	// refused, where one database may never evaluate them on the rows that fail.
	computed := map[*pg.Node]bool{}
	builtinOnly := -1 // whether the database overloads none of PostgreSQL's operators, casts and functions (-1: not asked yet)
	builtin := func() bool {
		if builtinOnly < 0 {
			builtinOnly = 0
			if oc, has := a.p.cat.(overloadCatalog); has {
				if user, err := oc.UserOverloads(a.ctx); err == nil && !user {
					builtinOnly = 1
				}
			}
		}
		return builtinOnly == 1
	}
	computable := func(n *pg.Node) bool {
		// An operator or a cast is a function call, and CASE, GREATEST and LEAST
		// compare: one of the user's (a volatile one) would be called once per row
		// of the tables, and its failures and writes would not be one database's.
		if n == nil || n.GetColumnRef() != nil || n.GetAConst() != nil || !builtin() {
			return false
		}
		cols, ok := 0, true
		walk(n, func(m proto.Message) bool {
			switch x := m.(type) {
			case *pg.ColumnRef:
				// A name column's values compare under collation C, its type's,
				// which an expression over them carries and a text array does not.
				if i, col := resolve(x); i == unresolved || i == isOuter || items[i].cols[col] == "name" {
					ok = false
				}
				cols++
				return false
			case *pg.A_Const:
				// 'now', 'today' and the like are the time of the transaction the
				// first step runs in, not the statement's.
				if v := x.GetSval(); v != nil && timeWords.MatchString(v.Sval) {
					ok = false
				}
				return false
			case *pg.A_Expr:
				ok = ok && len(x.Name) <= 1 // not OPERATOR(schema.op)
			case *pg.TypeCast:
				// Not to a date or time (from text that may say 'now'), nor to an
				// object's identifier (each database has its own).
				names := x.GetTypeName().GetNames()
				last := ""
				if len(names) > 0 {
					last = names[len(names)-1].GetString_().GetSval()
				}
				// Nor to name, whose values the cast leaves in the collation of its
				// operand, and an array's elements take name's own, C.
				ok = ok && !castToUserType(x) && !timeTypes[last] && !strings.HasPrefix(last, "reg") && last != "name"
			case *pg.FuncCall:
				// Called once per row of the tables, not once per evaluation: of
				// PostgreSQL's functions that return the same value for the same
				// arguments whatever the session's settings.
				ok = ok && scalarCall(x, firstStepFunctions)
			case *pg.Node, *pg.BoolExpr, *pg.NullTest, *pg.BooleanTest, *pg.CaseExpr, *pg.CaseWhen, *pg.CoalesceExpr,
				*pg.MinMaxExpr, *pg.TypeName, *pg.List, *pg.String, *pg.Integer:
			default:
				// A subquery, a parameter, a row, an array, a collation, the
				// time of the statement...
				ok = false
			}
			return ok
		})
		return ok && cols > 0
	}
	// The select list: aggregates of the allowed kinds, and beside one, every column of
	// the subquery's tables inside one (else PostgreSQL's error would name the rewrite's
	// columns, not the written ones).
	aggregated := false
	var summedNodes, pickedNodes []proto.Message
	aggregates := func(t proto.Message) bool {
		ok := true
		walk(t, func(m proto.Message) bool {
			fc, is := m.(*pg.FuncCall)
			if !is {
				return ok
			}
			if scalarCall(fc, groupFunctions) && builtin() {
				// Of the aggregates' values or the changed table's columns (the
				// select list reads no other column outside an aggregate):
				// evaluated once per evaluation, as on one database.
				return true
			}
			schema, name := funcName(fc)
			if schema != "" && schema != "pg_catalog" || !multisetAggregates[name] || fc.Over != nil || fc.AggWithinGroup ||
				len(fc.AggOrder) > 0 || fc.FuncVariadic || len(fc.Funcname) > 2 {
				ok = false
				return false
			}
			// Its arguments and FILTER are evaluated row by row, in the order the
			// rows come: nothing there may fail.
			for _, arg := range fc.Args {
				if computable(arg) {
					computed[arg] = true
					continue
				}
				changed, _, resolved := reads(arg)
				if !resolved || changed || !cannotFail(arg, typedValues) {
					ok = false
				}
			}
			if fc.AggFilter != nil {
				if changed, _, resolved := reads(fc.AggFilter); !resolved || changed || !cannotFail(fc.AggFilter, typedValues) {
					ok = false
				}
			}
			switch name {
			case "sum", "avg", "min", "max":
				// Of a column or a computed value, whose type the first step's
				// answer tells: sum and avg of types whose sum is exact and cannot
				// overflow in some order only; min, max and DISTINCT of types whose
				// equal values are alike (max of numerics 1.0 and 1.00 is the later
				// one).
				if len(fc.Args) != 1 || fc.Args[0].GetColumnRef() == nil && !computed[fc.Args[0]] {
					ok = false
					break
				}
				if name == "sum" || name == "avg" {
					summedNodes = append(summedNodes, fc.Args[0])
				}
				if name == "min" || name == "max" || fc.AggDistinct {
					pickedNodes = append(pickedNodes, fc.Args[0])
				}
			}
			aggregated = true
			return false
		})
		_, _, resolved := reads(t)
		return ok && resolved
	}
	for _, t := range list {
		if !aggregates(t) {
			return nil
		}
	}
	if aggregated && inWhere {
		// Whether one database evaluates a subquery in WHERE for a row follows the
		// costs of the conditions beside it, which the rewrite changes: a value
		// computed over aggregates that may fail (mod(count(*), 0), count(*)::int)
		// would fail for other rows. Aggregates, columns and constants only.
		for _, t := range list {
			v := t.GetResTarget().GetVal()
			if fc := v.GetFuncCall(); v.GetColumnRef() == nil && v.GetAConst() == nil && (fc == nil || scalarCall(fc, groupFunctions)) {
				return nil
			}
		}
	}
	if !aggregated && sl.SubLinkType != pg.SubLinkType_EXISTS_SUBLINK {
		// Each row's value is computed in the order the rows come: one that may fail
		// could fail before or after a second row raised 21000, or at all, where one
		// database's order differs. Columns and constants only, and values computed
		// first where nothing groups (GROUP BY reads the columns its keys name).
		for _, t := range list {
			switch v := t.GetResTarget().GetVal(); {
			case v.GetColumnRef() != nil, v.GetAConst() != nil:
			case !grouped && computable(v):
				computed[v] = true
			default:
				return nil
			}
		}
	}
	// Beside aggregates or grouping, a column of the subquery's tables outside an
	// aggregate is a group key: one database would also take a column its key
	// determines (GROUP BY a primary key), which the rewrite's rows have none of.
	// A group key the select list reads is the group's value of its first row, in
	// the rows' order (see picked).
	var keysRead []ref
	outsideAggregates := func(t proto.Message, list bool) bool {
		ok := true
		walk(t, func(m proto.Message) bool {
			if fc, is := m.(*pg.FuncCall); is && !scalarCall(fc, groupFunctions) {
				return false // an aggregate
			}
			if cr, is := m.(*pg.ColumnRef); is {
				if i, col := resolve(cr); i != isOuter {
					ok = groupKeys[ref{i, col}]
					if list {
						keysRead = append(keysRead, ref{i, col})
					}
				}
			}
			return ok
		})
		return ok
	}
	if aggregated || grouped {
		for _, t := range list {
			if !outsideAggregates(t, true) {
				return nil
			}
		}
	}
	if grouped {
		// Each group's values are computed in the order the groups come (one
		// database's GroupAggregate over an index, a HashAggregate here): one that may
		// fail could fail on the first group here and not there (EXISTS reads the
		// first group only), or before a second group raised 21000. Group keys,
		// constants and aggregates, nothing computed over them.
		for _, t := range list {
			v := t.GetResTarget().GetVal()
			if fc := v.GetFuncCall(); v.GetColumnRef() == nil && v.GetAConst() == nil && (fc == nil || scalarCall(fc, groupFunctions)) {
				return nil
			}
		}
	}
	// HAVING: aggregates and group keys, conditions that cannot fail (whether one
	// database evaluates the subquery for a row, in WHERE, follows the costs of the
	// conditions beside it), an aggregate compared with constants only (its type is
	// not known here).
	var having *pg.Node
	if sel.HavingClause != nil {
		having = cloneNode(sel.HavingClause)
		if !aggregates(having) || !outsideAggregates(having, false) {
			return nil
		}
		probe := cloneNode(having)
		walk(probe, func(m proto.Message) bool {
			node, is := m.(*pg.Node)
			if fc := node.GetFuncCall(); is && fc != nil && !scalarCall(fc, groupFunctions) {
				node.Node = &pg.Node_ColumnRef{ColumnRef: &pg.ColumnRef{Fields: []*pg.Node{
					{Node: &pg.Node_String_{String_: &pg.String{Sval: prePrefix + "aggregate"}}}}, Location: -1}}
				return false
			}
			return true
		})
		if !cannotFail(probe, typedValues) {
			return nil
		}
	}
	// ORDER BY and LIMIT (the latest row: ORDER BY at DESC LIMIT 1): the statement
	// sorts the same rows by the same values, of the same types. Rows the ORDER BY
	// leaves equal come in no defined order, on one database as here. Over one row per
	// evaluation, not beside aggregates; sort keys are columns of the subquery's tables
	// (an expression may fail), without USING; LIMIT and OFFSET constants. A bare name
	// reads an output column first (SELECT o.user_id ... ORDER BY user_id sorts by the
	// changed table's column): it must be no output column's name, or that of the very
	// column it names.
	var sortKeys []*pg.Node
	sortClause := cloneNodes(sel.SortClause)
	if len(sortClause) > 0 || sel.LimitCount != nil || sel.LimitOffset != nil {
		withTies := sel.LimitOption == pg.LimitOption_LIMIT_OPTION_WITH_TIES
		if aggregated || grouped || !constantCount(sel.LimitCount) || !constantCount(sel.LimitOffset) ||
			withTies && (len(sortClause) == 0 || sel.LimitCount.GetAConst().GetIsnull()) {
			return nil // FETCH FIRST NULL ROWS WITH TIES would print back as ALL, which is no SQL
		}
		for _, n := range sortClause {
			sb := n.GetSortBy()
			if sb == nil || sb.SortbyDir == pg.SortByDir_SORTBY_USING || len(sb.UseOp) > 0 {
				return nil
			}
			if computable(sb.Node) {
				// An expression over the subquery's own tables: computed by the
				// first step, a value a row, sorted by in the second.
				computed[sb.Node] = true
				sortKeys = append(sortKeys, sb.Node)
				continue
			}
			if sb.Node.GetColumnRef() == nil {
				return nil
			}
			cr := sb.Node.GetColumnRef()
			i, col := resolve(cr)
			if i == unresolved || i == isOuter || len(cr.Fields) == 1 && !outputOf(sel.TargetList, col, func(t *pg.ColumnRef) bool {
				j, c := resolve(t)
				return j == i && c == col
			}) {
				return nil
			}
			sortKeys = append(sortKeys, sb.Node)
		}
	}
	// The columns the rewrite reads, numbered in order of appearance.
	index := map[ref]int{}
	var refs []ref
	exprs := map[*pg.Node]int{} // a computed value's position among refs
	var firstExprs []*pg.Node   // for each of refs, the computed value's expression, or nil
	number := func(n proto.Message) {
		walk(n, func(m proto.Message) bool {
			if node, is := m.(*pg.Node); is && computed[node] {
				if _, has := exprs[node]; !has {
					exprs[node] = len(refs)
					refs = append(refs, ref{item: unresolved, col: fmt.Sprint(len(refs))})
					firstExprs = append(firstExprs, proto.Clone(node).(*pg.Node))
				}
				return false
			}
			if cr, is := m.(*pg.ColumnRef); is {
				if i, col := resolve(cr); i != isOuter {
					if _, has := index[ref{i, col}]; !has {
						index[ref{i, col}] = len(refs)
						refs = append(refs, ref{i, col})
						firstExprs = append(firstExprs, nil)
					}
				}
			}
			return true
		})
	}
	for _, n := range list {
		number(n)
	}
	for _, n := range correlated {
		number(n)
	}
	for _, n := range sortKeys {
		number(n)
	}
	for _, n := range groupClause {
		number(n)
	}
	number(having)
	if !changedAny && !readsChanged(append(slices.Clone(list), having), reads) {
		return nil // not correlated: evaluated alone
	}
	cs := &correlatedSub{cols: max(len(refs), 1)}
	columnsOf := func(ns []proto.Message) []int {
		var out []int
		for _, n := range ns {
			walk(n, func(m proto.Message) bool {
				if node, is := m.(*pg.Node); is && computed[node] {
					out = append(out, exprs[node])
					return false
				}
				if cr, is := m.(*pg.ColumnRef); is {
					if i, col := resolve(cr); i != isOuter {
						out = append(out, index[ref{i, col}])
					}
				}
				return true
			})
		}
		return out
	}
	var boundedNodes []proto.Message
	if grouped || inWhere {
		// A numeric sum overflows past 1e131072: where groups are finished in another
		// order (a HashAggregate here, one database's GroupAggregate over an index
		// that stops at the first group EXISTS needs), or where whether the subquery
		// runs for a row follows the costs beside it (in WHERE), one database's answer
		// and the rewrite's could differ by that error. Sums of integers, and of
		// numeric columns with a precision, which cannot reach it; a computed value's
		// type is known when the first step answers (Subquery.Bounded).
		for _, n := range summedNodes {
			cr := n.(*pg.Node).GetColumnRef()
			if cr == nil {
				boundedNodes = append(boundedNodes, n)
				continue
			}
			if typ := typeOf(cr); typ != "smallint" && typ != "integer" && typ != "bigint" && !strings.HasPrefix(typ, "numeric(") {
				return nil
			}
		}
	}
	cs.summed, cs.picked, cs.bounded = columnsOf(summedNodes), columnsOf(pickedNodes), columnsOf(boundedNodes)
	if sl.SubLinkType == pg.SubLinkType_EXPR_SUBLINK {
		// A scalar subquery answers the group key's value, its group's first row's.
		// EXISTS reads no value, and IN, ANY and ALL compare it by a comparison,
		// under which equal values (1.0 and 1.00) answer alike.
		for _, r := range keysRead {
			cs.picked = append(cs.picked, index[r])
		}
	}
	if sel.LimitCount != nil || sel.LimitOffset != nil {
		// SELECT x ... ORDER BY x LIMIT 1 is min(x): which of equal values it keeps
		// is the rows' order's (see picked). A sort key is picked when the select
		// list reads a column it reads, plainly or inside a computed value
		// (SELECT abs(c.v) ... ORDER BY abs(c.v) LIMIT 1 is min(abs(c.v)); SELECT
		// (p.amount + 0)::text ... ORDER BY p.amount keeps 1.0 or 1.00).
		selected := map[ref]bool{}
		for _, n := range list {
			walk(n, func(m proto.Message) bool {
				if cr, is := m.(*pg.ColumnRef); is {
					if i, col := resolve(cr); i != isOuter {
						selected[ref{i, col}] = true
					}
				}
				return true
			})
		}
		for _, n := range sortKeys {
			readsSelected := false
			walk(n, func(m proto.Message) bool {
				if cr, is := m.(*pg.ColumnRef); is {
					if i, col := resolve(cr); i != isOuter && selected[ref{i, col}] {
						readsSelected = true
					}
				}
				return !readsSelected
			})
			switch {
			case !readsSelected:
			case computed[n]:
				cs.picked = append(cs.picked, exprs[n])
			default:
				i, col := resolve(n.GetColumnRef())
				cs.picked = append(cs.picked, index[ref{i, col}])
			}
		}
	}
	// Replace each column of the subquery's tables by the rewrite's.
	substitute := func(n proto.Message) {
		walk(n, func(m proto.Message) bool {
			node, is := m.(*pg.Node)
			if !is || node.GetColumnRef() == nil && !computed[node] {
				return true
			}
			k, isExpr := exprs[node]
			if !isExpr {
				i, col := resolve(node.GetColumnRef())
				if i == isOuter {
					return false
				}
				k = index[ref{i, col}]
			}
			node.Node = &pg.Node_ColumnRef{ColumnRef: &pg.ColumnRef{Fields: []*pg.Node{
				{Node: &pg.Node_String_{String_: &pg.String{Sval: preAlias}}},
				{Node: &pg.Node_String_{String_: &pg.String{Sval: fmt.Sprintf("%s%d", prePrefix, k+1)}}},
			}, Location: -1}}
			return false
		})
	}
	var firstList []*pg.Node
	for k, r := range refs {
		if firstExprs[k] != nil {
			firstList = append(firstList, resTarget("", firstExprs[k]))
			continue
		}
		firstList = append(firstList, resTarget("", &pg.Node{Node: &pg.Node_ColumnRef{ColumnRef: &pg.ColumnRef{Fields: []*pg.Node{
			{Node: &pg.Node_String_{String_: &pg.String{Sval: items[r.item].name}}},
			{Node: &pg.Node_String_{String_: &pg.String{Sval: r.col}}},
		}, Location: -1}}}))
	}
	if len(firstList) == 0 {
		// Only the number of rows counts: a constant column carries it.
		firstList = []*pg.Node{resTarget("", &pg.Node{Node: &pg.Node_AConst{AConst: &pg.A_Const{Val: &pg.A_Const_Ival{Ival: &pg.Integer{Ival: 1}}}}})}
	}
	cs.first = &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: &pg.SelectStmt{TargetList: firstList, FromClause: cloneNodes(sel.FromClause),
		WhereClause: and(cloneNodes(first)), Op: pg.SetOperation_SETOP_NONE, LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT}}}
	for _, n := range list {
		substitute(n)
	}
	for _, n := range correlated {
		substitute(n)
	}
	from, err := unnestFrom(param, cs.cols)
	if err != nil {
		return nil
	}
	for _, n := range append(append(slices.Clone(sortClause), groupClause...), having) {
		substitute(n)
	}
	rewritten := proto.Clone(sel).(*pg.SelectStmt)
	rewritten.TargetList, rewritten.FromClause, rewritten.WhereClause, rewritten.SortClause = list, []*pg.Node{from}, and(correlated), sortClause
	rewritten.GroupClause, rewritten.HavingClause = groupClause, having
	cs.sub = &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: rewritten}}
	return cs
}

// overloadCatalog tells whether the database defines operators or casts of its own, or
// functions named as one of PostgreSQL's (beyond those PostgreSQL creates with it):
// the two steps compute values and call functions only where every operator, cast and
// function they may call is PostgreSQL's.
type overloadCatalog interface {
	UserOverloads(ctx context.Context) (bool, error)
}

// firstStepFunctions are the functions of groupFunctions that a correlated subquery's
// first step may call over its tables' rows, once per row rather than once per
// evaluation: immutable, whatever their arguments' types, and blind to the session's
// settings (to_char, date_trunc and date_part read TimeZone, concat DateStyle).
var firstStepFunctions = map[string]bool{
	"lower": true, "upper": true, "initcap": true, "substr": true, "substring": true, "left": true, "right": true,
	"length": true, "char_length": true, "octet_length": true, "btrim": true, "ltrim": true, "rtrim": true,
	"replace": true, "split_part": true, "md5": true, "abs": true, "round": true, "trunc": true,
	"floor": true, "ceil": true, "ceiling": true, "mod": true, "sign": true, "div": true,
}

// scalarCall reports whether fc calls one of the allowed functions of PostgreSQL by
// name (unqualified or in pg_catalog), as a plain call: not over a window, with none of
// an aggregate's clauses, not VARIADIC.
func scalarCall(fc *pg.FuncCall, allowed map[string]bool) bool {
	schema, name := funcName(fc)
	return allowed[name] && (schema == "" || schema == "pg_catalog") && len(fc.Funcname) <= 2 && fc.Over == nil &&
		!fc.AggStar && !fc.AggDistinct && fc.AggFilter == nil && len(fc.AggOrder) == 0 && !fc.AggWithinGroup && !fc.FuncVariadic
}

// timeWords are the date and time inputs that read the clock (the transaction's start).
var timeWords = regexp.MustCompile(`(?i)\b(now|today|tomorrow|yesterday)\b`)

// timeTypes are the types whose input reads timeWords.
var timeTypes = map[string]bool{"date": true, "timestamp": true, "timestamptz": true, "time": true, "timetz": true}

// readsChanged reports whether any of ns reads the changed table.
func readsChanged(ns []*pg.Node, reads func(proto.Message) (bool, bool, bool)) bool {
	for _, n := range ns {
		if changed, _, _ := reads(n); changed {
			return true
		}
	}
	return false
}

// plainSelect reports whether a SELECT reads rows of a FROM clause, filtered, without
// anything that locks, combines or windows them or removes duplicates (its GROUP BY,
// HAVING, ORDER BY and LIMIT are the caller's to judge).
func plainSelect(s *pg.SelectStmt) bool {
	return s.Op == pg.SetOperation_SETOP_NONE && len(s.FromClause) > 0 && s.WithClause == nil && s.IntoClause == nil &&
		len(s.WindowClause) == 0 && len(s.LockingClause) == 0 && len(s.ValuesLists) == 0 && len(s.DistinctClause) == 0
}

// outputOf reports whether a bare name in ORDER BY reads, among the output columns of
// list, none or only columns same says are the one it names: PostgreSQL takes an
// output column's name (an alias, or a column's own) before an input column's.
// Output columns whose names it does not tell (a function call, CASE, a cast: named
// after the function, the keyword, the type or the column cast) make it false.
func outputOf(list []*pg.Node, name string, same func(*pg.ColumnRef) bool) bool {
	for _, t := range list {
		rt := t.GetResTarget()
		out := rt.GetName()
		cr := rt.GetVal().GetColumnRef()
		switch {
		case out != "":
		case cr != nil:
			last := cr.Fields[len(cr.Fields)-1]
			if last.GetAStar() != nil {
				continue // a bare *: the input columns themselves
			}
			out = last.GetString_().GetSval()
		case rt.GetVal().GetAConst() != nil, rt.GetVal().GetAExpr() != nil, rt.GetVal().GetBoolExpr() != nil,
			rt.GetVal().GetNullTest() != nil, rt.GetVal().GetBooleanTest() != nil:
			out = "?column?" // PostgreSQL's name for an operator's value
		default:
			return false
		}
		if out == name && (cr == nil || !same(cr)) {
			return false // an alias of the very column (c.name AS name) reads it
		}
	}
	return true
}

// constantCount reports whether a LIMIT or OFFSET is absent, NULL (ALL), or a
// constant integer that is not negative.
func constantCount(n *pg.Node) bool {
	if n == nil {
		return true
	}
	c := n.GetAConst()
	return c != nil && (c.Isnull || c.GetIval() != nil && c.GetIval().Ival >= 0)
}

// constantsOrStar reports whether a select list holds only constants and * (not
// x.*, which is an error where x names no table).
func constantsOrStar(list []*pg.Node) bool {
	for _, t := range list {
		switch v := t.GetResTarget().GetVal(); {
		case v.GetAConst() != nil:
		case v.GetColumnRef() != nil && len(v.GetColumnRef().Fields) == 1 && v.GetColumnRef().Fields[0].GetAStar() != nil:
		default:
			return false
		}
	}
	return true
}

// cannotFail reports whether a condition cannot raise an error, whatever its columns
// hold: columns, parameters and constants compared, tested for NULL, in a list or a
// range, or matched by a LIKE pattern without an escape, joined by AND, OR and NOT. Arithmetic
// (a division by zero, an overflow), casts (a domain's check) and operators of
// other kinds may fail.
//
// compare judges each pair of values compared (an IN list's and a range's items each
// with the value tested): a comparison of two types may cast one to the other, which
// may fail (a numeric of 1e400 compared with a float8).
func cannotFail(n *pg.Node, compare func(l, r *pg.Node) bool) bool {
	ok := true
	walk(n, func(m proto.Message) bool {
		switch x := m.(type) {
		case *pg.ColumnRef, *pg.ParamRef, *pg.A_Const:
			return false // a value: nothing below fails
		case *pg.Node, *pg.BoolExpr, *pg.NullTest, *pg.BooleanTest, *pg.List, *pg.String:
		case *pg.A_Expr:
			pairs := []*pg.Node{x.Rexpr}
			if l := x.Rexpr.GetList(); l != nil {
				pairs = l.Items
			}
			for _, r := range pairs {
				ok = ok && compare(x.Lexpr, r)
			}
			switch x.Kind {
			case pg.A_Expr_Kind_AEXPR_OP:
				ok = ok && len(x.Name) == 1 && comparisons[x.Name[0].GetString_().GetSval()]
			case pg.A_Expr_Kind_AEXPR_DISTINCT, pg.A_Expr_Kind_AEXPR_NOT_DISTINCT, pg.A_Expr_Kind_AEXPR_IN,
				pg.A_Expr_Kind_AEXPR_BETWEEN, pg.A_Expr_Kind_AEXPR_NOT_BETWEEN:
			case pg.A_Expr_Kind_AEXPR_LIKE, pg.A_Expr_Kind_AEXPR_ILIKE:
				pattern := x.Rexpr.GetAConst().GetSval()
				ok = ok && pattern != nil && !strings.Contains(pattern.Sval, `\`)
			default:
				ok = false
			}
		default:
			ok = false
		}
		return ok
	})
	return ok
}

// typedComparisons lets cannotFail take, in what the statement evaluates, columns and
// constants compared, two columns only of types compared without a cast that may fail
// (castFree); not a parameter, whose type the client chose. typeOf gives a column's
// type as format_type writes it ("" when unknown).
func typedComparisons(typeOf func(*pg.ColumnRef) string) func(l, r *pg.Node) bool {
	return func(l, r *pg.Node) bool {
		for _, v := range []*pg.Node{l, r} {
			if v == nil || v.GetColumnRef() == nil && v.GetAConst() == nil {
				return false
			}
		}
		if l.GetColumnRef() == nil || r.GetColumnRef() == nil {
			return true
		}
		return castFree(typeOf(l.GetColumnRef()), typeOf(r.GetColumnRef()))
	}
}

// anyValues lets cannotFail take any values compared: a condition evaluated where its
// failure is refused (the first step, over every row).
func anyValues(_, _ *pg.Node) bool { return true }

// castFree reports whether values of types x and y (format_type's names) compare
// without a cast that may fail: of one type (modifiers aside), of one family (integers;
// text, varchar and char; real and double precision), or an integer with a numeric.
func castFree(x, y string) bool {
	base := func(t string) string {
		if i := strings.IndexByte(t, '('); i >= 0 {
			t = t[:i]
		}
		switch t {
		case "smallint", "integer", "bigint":
			return "integer"
		case "text", "character varying", "character":
			return "text"
		case "real", "double precision":
			return "float"
		}
		return t
	}
	bx, by := base(x), base(y)
	return bx != "" && (bx == by || bx == "integer" && by == "numeric" || bx == "numeric" && by == "integer")
}

// unnestFrom is the rewritten subquery's FROM entry: pg_catalog.unnest of parameters
// param+1 ... param+n side by side (a user's unnest on the search path is not called),
// each column named after its position.
func unnestFrom(param, n int) (*pg.Node, error) {
	args := make([]string, n)
	cols := make([]string, n)
	for i := range n {
		args[i] = fmt.Sprintf("pg_catalog.unnest($%d)", param+i+1)
		cols[i] = fmt.Sprintf("%s%d", prePrefix, i+1)
	}
	tree, err := pg.Parse(fmt.Sprintf("SELECT FROM ROWS FROM (%s) AS %s(%s)", strings.Join(args, ", "), preAlias, strings.Join(cols, ", ")))
	if err != nil {
		return nil, err
	}
	return tree.Stmts[0].Stmt.GetSelectStmt().FromClause[0], nil
}
