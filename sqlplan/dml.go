package sqlplan

import (
	"errors"
	"slices"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/shardlab/shardlab/routing"
	"github.com/shardlab/shardlab/rules"
)

// keyUpdate is an assignment to a sharding column (UPDATE ... SET key = v).
type keyUpdate struct {
	ref   *tableRef
	col   string
	value valueRef
}

// insertSpec is a multi-row INSERT into a sharded table: each row goes to its shard.
type insertSpec struct {
	target *tableRef
	keys   [][]valueRef // per row, the value of each key column (in KeyColumns order)
	// prefix, rows and suffix cut the statement so that a target gets only its rows.
	prefix, suffix *template
	rows           []*template
}

// writeSteps makes the Pre of an UPDATE or DELETE (see Pre), if it has one: a semi-join
// written with EXISTS or with FROM (USING), as a subquery that reads no column of the
// statement (semiJoinWrite), or its own subqueries.
func (a *analyzer) writeSteps(stmt *pg.Node, with *pg.WithClause) *Pre {
	if !hasSublink(stmt) {
		if semi := a.semiJoinWrite(stmt, -1, false); semi != nil {
			return a.buildPre(semi, nil, true)
		}
		return nil
	}
	if semi := a.semiJoinWrite(existsJoin(stmt)); semi != nil {
		return a.buildPre(semi, nil, false)
	}
	return a.buildPre(stmt, with, false)
}

func (a *analyzer) analyzeUpdate(u *pg.UpdateStmt) error {
	a.plan.Kind, a.plan.Write, a.plan.Returning = KindUpdate, true, len(u.ReturningList) > 0
	a.noteParams(u)
	a.pre = a.writeSteps(&pg.Node{Node: &pg.Node_UpdateStmt{UpdateStmt: u}}, u.WithClause)
	s := &scope{}
	a.top = s
	if u.WithClause != nil {
		if err := a.collectWith(u.WithClause, s); err != nil {
			return err
		}
	}
	target, err := a.addRef(u.Relation, s)
	if err != nil {
		return err
	}
	s.addName(target.qualifier())
	for _, item := range u.FromClause {
		if err := a.collectFrom(item, s, true); err != nil {
			return err
		}
	}
	if err := a.collectWhere(u.WhereClause, s); err != nil {
		return err
	}
	for _, t := range u.TargetList {
		rt := t.GetResTarget()
		if err := a.collectSublinks(rt.Val, s); err != nil {
			return err
		}
		if err := a.checkKeyAssignment(target, rt, "UPDATE"); err != nil {
			return err
		}
	}
	for _, r := range u.ReturningList {
		if err := a.collectSublinks(r, s); err != nil {
			return err
		}
	}
	return a.finishWrite(target, &pg.Node{Node: &pg.Node_UpdateStmt{UpdateStmt: u}})
}

func (a *analyzer) analyzeDelete(d *pg.DeleteStmt) error {
	a.plan.Kind, a.plan.Write, a.plan.Returning = KindDelete, true, len(d.ReturningList) > 0
	a.noteParams(d)
	a.pre = a.writeSteps(&pg.Node{Node: &pg.Node_DeleteStmt{DeleteStmt: d}}, d.WithClause)
	s := &scope{}
	a.top = s
	if d.WithClause != nil {
		if err := a.collectWith(d.WithClause, s); err != nil {
			return err
		}
	}
	target, err := a.addRef(d.Relation, s)
	if err != nil {
		return err
	}
	s.addName(target.qualifier())
	for _, item := range d.UsingClause {
		if err := a.collectFrom(item, s, true); err != nil {
			return err
		}
	}
	if err := a.collectWhere(d.WhereClause, s); err != nil {
		return err
	}
	for _, r := range d.ReturningList {
		if err := a.collectSublinks(r, s); err != nil {
			return err
		}
	}
	return a.finishWrite(target, &pg.Node{Node: &pg.Node_DeleteStmt{DeleteStmt: d}})
}

func (a *analyzer) collectWhere(where *pg.Node, s *scope) error {
	if where == nil {
		return nil
	}
	conj := conjuncts(where)
	s.narrowing = append(s.narrowing, conj...)
	s.equalities = append(s.equalities, conj...)
	return a.collectSublinks(where, s)
}

// checkKeyAssignment refuses assignments to a sharding column unless the new value is
// known at bind time (Bind then checks that the row stays on its shard).
func (a *analyzer) checkKeyAssignment(target *tableRef, rt *pg.ResTarget, what string) error {
	if !target.sharded() {
		return nil
	}
	if rt.Val.GetMultiAssignRef() != nil {
		if _, ok := target.keyTypes[rt.Name]; ok {
			return unsupported("%s of sharding key %s.%s in a multiple-column assignment", what, target.name, rt.Name)
		}
		return nil
	}
	if _, ok := target.keyTypes[rt.Name]; !ok {
		return nil
	}
	v, ok := a.valueOf(rt.Val)
	if !ok {
		return unsupported("%s of sharding key %s.%s to an expression: the row could belong on another shard (set it to a constant or a parameter, with a WHERE clause that pins the row's shard)", what, target.name, rt.Name)
	}
	a.plan.keyUpdates = append(a.plan.keyUpdates, keyUpdate{ref: target, col: rt.Name, value: v})
	return nil
}

// finishWrite routes an UPDATE or DELETE and makes its template.
func (a *analyzer) finishWrite(target *tableRef, stmt *pg.Node) error {
	if err := a.checkWriteTarget(target); err != nil {
		return err
	}
	if err := a.buildRoute(); err != nil {
		return err
	}
	a.markTables()
	return a.singleTemplate(stmt)
}

// checkWriteTarget refuses writes whose copies or shards would diverge.
func (a *analyzer) checkWriteTarget(target *tableRef) error {
	if target.rule.Kind != rules.KindSharded {
		for _, r := range a.plan.refs {
			if r.sharded() {
				return unsupported("a write to %s table %s that reads sharded table %s: each shard would see only its own rows", target.rule.Kind, target.name, r.name)
			}
		}
	}
	return nil
}

func (a *analyzer) analyzeInsert(ins *pg.InsertStmt) error {
	a.plan.Kind, a.plan.Write, a.plan.Returning = KindInsert, true, len(ins.ReturningList) > 0
	a.noteParams(ins)
	if sel := ins.SelectStmt.GetSelectStmt(); sel != nil && !(len(sel.ValuesLists) > 0 && sel.Op == pg.SetOperation_SETOP_NONE) {
		if r := a.p.rules.Lookup(ins.Relation.Relname); r != nil && r.Kind == rules.KindSharded && ins.Relation.Catalogname == "" && !a.p.rules.OneShard() &&
			ins.Relation.Schemaname != "pg_catalog" && ins.Relation.Schemaname != "information_schema" && !strings.HasPrefix(ins.Relation.Relname, "pg_") {
			return a.analyzeFeed(ins)
		}
	}
	s := &scope{}
	a.top = s
	if ins.WithClause != nil {
		if err := a.collectWith(ins.WithClause, s); err != nil {
			return err
		}
	}
	target, err := a.addRef(ins.Relation, s)
	if err != nil {
		return err
	}
	s.addName(target.qualifier())
	sel := ins.SelectStmt.GetSelectStmt()
	values := sel != nil && len(sel.ValuesLists) > 0 && sel.Op == pg.SetOperation_SETOP_NONE
	if sel != nil && !values {
		if target.sharded() {
			// Rules of one shard: the statement runs there as written (passthrough).
			return unsupported("INSERT ... SELECT into sharded table %s", target.name)
		}
		if _, err := a.collectSelect(sel, s); err != nil {
			return err
		}
	}
	if ins.OnConflictClause != nil {
		oc := ins.OnConflictClause
		for _, t := range oc.TargetList {
			rt := t.GetResTarget()
			if _, isKey := target.keyTypes[rt.Name]; isKey && target.sharded() {
				if q, c, ok := columnRef(rt.Val); !ok || q != "excluded" || c != rt.Name {
					return unsupported("INSERT ... ON CONFLICT DO UPDATE of sharding key %s.%s: the row could belong on another shard", target.name, rt.Name)
				}
			}
			if err := a.collectSublinks(rt.Val, s); err != nil {
				return err
			}
		}
		if err := a.collectSublinks(oc.WhereClause, s); err != nil {
			return err
		}
	}
	for _, r := range ins.ReturningList {
		if err := a.collectSublinks(r, s); err != nil {
			return err
		}
	}
	if values {
		for _, row := range sel.ValuesLists {
			if err := a.collectSublinks(row, s); err != nil {
				return err
			}
		}
	}
	if err := a.checkWriteTarget(target); err != nil {
		return err
	}
	for _, r := range a.plan.refs[1:] {
		if r.sharded() {
			return unsupported("an INSERT that reads sharded table %s", r.name)
		}
	}
	if err := a.buildRoute(); err != nil {
		return err
	}
	stmt := &pg.Node{Node: &pg.Node_InsertStmt{InsertStmt: ins}}
	if !target.sharded() {
		a.markTables()
		return a.singleTemplate(stmt)
	}

	// A sharded target: find each row's key values, drawing from the key's sequence
	// those the statement leaves out.
	if err := a.drawKeys(ins, target); err != nil {
		return err
	}
	sel = ins.SelectStmt.GetSelectStmt()
	if values = sel != nil && len(sel.ValuesLists) > 0 && sel.Op == pg.SetOperation_SETOP_NONE; !values {
		return keyMissing(target, strings.Join(target.rule.KeyColumns(), ", "))
	}
	cols, err := a.insertColumns(ins, target)
	if err != nil {
		return err
	}
	spec := &insertSpec{target: target}
	for _, key := range target.rule.KeyColumns() {
		i := slices.Index(cols, key)
		if i < 0 {
			return keyMissing(target, key)
		}
		for r, row := range sel.ValuesLists {
			items := row.GetList().Items
			if i >= len(items) {
				return pgErr(CodeSyntaxError, "INSERT has more target columns than expressions")
			}
			v, ok := a.valueOf(items[i])
			if !ok {
				return unsupported("INSERT into sharded table %s: the sharding key %s must be a constant or a parameter, not an expression or DEFAULT", target.name, key)
			}
			if len(spec.keys) <= r {
				spec.keys = append(spec.keys, nil)
			}
			spec.keys[r] = append(spec.keys[r], v)
		}
	}
	a.plan.insert = spec
	a.markTables()
	if len(sel.ValuesLists) == 1 {
		if a.plan.Keys != nil {
			// The drawn key is a slot of the template, even where no name changes.
			t, err := a.makeTemplate(stmt)
			a.plan.tmpl = t
			return err
		}
		return a.singleTemplate(stmt)
	}
	return a.splitTemplate(stmt, spec)
}

// keyMissing refuses an INSERT that gives no value for a sharding key and draws none.
func keyMissing(target *tableRef, key string) error {
	if len(target.rule.KeyColumns()) > 1 {
		return unsupported("INSERT into sharded table %s without a value for its sharding key %s: a key of several columns is never drawn from a sequence; give every key column a value", target.name, key)
	}
	return unsupported("INSERT into sharded table %s without a value for its sharding key %s", target.name, key)
}

// insertColumns returns the INSERT's column names: its list, or the table's columns.
func (a *analyzer) insertColumns(ins *pg.InsertStmt, target *tableRef) ([]string, error) {
	if len(ins.Cols) > 0 {
		var cols []string
		for _, c := range ins.Cols {
			rt := c.GetResTarget()
			if len(rt.Indirection) > 0 {
				cols = append(cols, "") // an array element or field: never a key
				continue
			}
			cols = append(cols, rt.Name)
		}
		return cols, nil
	}
	if a.p.cat == nil {
		return nil, unsupported("INSERT into sharded table %s without a column list (no catalog to read the column order from)", target.name)
	}
	return a.p.cat.Columns(a.ctx, target.rule)
}

// splitTemplate cuts a multi-row INSERT into the text before its rows, each row, and
// the text after, so that each target renders only its own rows.
func (a *analyzer) splitTemplate(stmt *pg.Node, spec *insertSpec) error {
	text, err := deparse(a.tree.Version, stmt)
	if err != nil {
		return err
	}
	// Find VALUES at depth 0, then the parenthesised rows after it.
	l := lexer{s: text}
	depth := 0
	start := -1
	var rows [][2]int
	rowStart := -1
	end := -1
	for {
		t := l.next()
		if t.kind == tokEOF {
			break
		}
		w := text[t.start:t.end]
		if start < 0 {
			if depth == 0 && keywordIs(text, t, "values") {
				start = t.end
			}
			if w == "(" {
				depth++
			} else if w == ")" {
				depth--
			}
			continue
		}
		switch {
		case w == "(":
			if depth == 0 {
				rowStart = t.start
			}
			depth++
		case w == ")":
			depth--
			if depth == 0 {
				rows = append(rows, [2]int{rowStart, t.end})
			}
		case depth == 0 && w == ",":
		case depth == 0:
			end = t.start
		}
		if end >= 0 {
			break
		}
	}
	if start < 0 || len(rows) != len(spec.keys) {
		return unsupported("a multi-row INSERT the rewriter could not split by shard")
	}
	spec.prefix = a.cut(text[:rows[0][0]])
	for _, r := range rows {
		spec.rows = append(spec.rows, a.cut(text[r[0]:r[1]]))
	}
	spec.suffix = a.cut(text[rows[len(rows)-1][1]:])
	return nil
}

// bindInsert routes each row of an INSERT.
func (pl *Plan) bindInsert(b *Bound, v *values) error {
	spec := pl.insert
	if spec == nil {
		// Not sharded: the default data source, or every copy of a broadcast table.
		return pl.bindUnsharded(b, v)
	}
	target := spec.target
	cols := target.rule.KeyColumns()
	byNode := map[int][]int{}
	var order []int
	for r, keys := range spec.keys {
		m := make(map[string]rules.Key, len(cols))
		for i, col := range cols {
			k, err := v.key(keys[i])
			if errors.Is(err, ErrUnsupported) {
				return err
			}
			if err != nil {
				return pgErr(CodeInvalidParameter, "shardlab: sharding key %s of row %d: %v", col, r+1, err)
			}
			m[col] = k
		}
		nodes, err := target.rule.ShardsFor(m, target.keyTypes)
		if err != nil {
			return pgErr(CodeInvalidParameter, "shardlab: sharding key of row %d: %v", r+1, err)
		}
		n := nodes[0]
		if _, ok := byNode[n]; !ok {
			order = append(order, n)
		}
		byNode[n] = append(byNode[n], r)
	}
	slices.Sort(order)
	b.Destination = routing.NewShards(order...)
	names := func(n int) func(int) string {
		return func(ref int) string {
			if ref == target.index {
				return nodeSQL(target.rule.Nodes[n])
			}
			return quoteIdent(pl.refs[ref].name)
		}
	}
	for _, n := range order {
		t := Target{DataSource: target.rule.Nodes[n].DataSource, Shard: n, RowOrder: byNode[n]}
		if spec.rows == nil || (len(order) == 1 && pl.tmpl == nil && pl.Keys == nil && !pl.needsRenameAt(n)) {
			t.SQL, t.Params = pl.render(pl.tmpl, v, placement{{pl.route.groups[0], n}}, b)
		} else {
			r := &renderer{sql: v.sql, lits: v.lits, table: names(n), slot: pl.slotFunc(b)}
			var sb strings.Builder
			sb.WriteString(r.render(spec.prefix))
			for i, row := range byNode[n] {
				if i > 0 {
					sb.WriteString(", ")
				}
				sb.WriteString(r.render(spec.rows[row]))
			}
			sb.WriteString(r.render(spec.suffix))
			t.SQL = sb.String()
			t.Params = r.params
			if identity(r.params, pl.NumParams) {
				t.Params = nil
			} else if t.Params == nil {
				t.Params = []int{}
			}
		}
		b.Targets = append(b.Targets, t)
	}
	return nil
}

// needsRenameAt reports whether some table has another physical name on shard n.
func (pl *Plan) needsRenameAt(n int) bool {
	for _, r := range pl.refs {
		if nd := r.rule.Nodes[n]; r.sharded() && (nd.Table != r.name || nd.Schema != "") {
			return true
		}
	}
	return false
}

// checkKeyUpdates refuses an UPDATE that would move a row to another shard.
func (pl *Plan) checkKeyUpdates(b *Bound, v *values) error {
	for _, ku := range pl.keyUpdates {
		k, err := v.key(ku.value)
		if errors.Is(err, ErrUnsupported) {
			return err
		}
		if err != nil {
			return pgErr(CodeInvalidParameter, "shardlab: new value of sharding key %s: %v", ku.col, err)
		}
		nodes, err := ku.ref.rule.ShardsFor(map[string]rules.Key{ku.col: k}, ku.ref.keyTypes)
		if err != nil {
			return pgErr(CodeInvalidParameter, "shardlab: new value of sharding key %s: %v", ku.col, err)
		}
		if len(b.Targets) != 1 || !slices.Contains(nodes, b.Targets[0].Shard) {
			return unsupported("UPDATE of sharding key %s.%s to a value on another shard, or without a WHERE clause that pins the row's shard: moving rows between shards is not supported (delete and insert instead)", ku.ref.name, ku.col)
		}
	}
	return nil
}
