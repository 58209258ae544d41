package sqlplan

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgtype"
	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/shardlab/shardlab/rules"
)

// Feed is an INSERT ... SELECT into a sharded table. No one shard can run it: each row
// belongs where its key says. So the caller runs it in two steps, as Citus runs such a
// statement when the rows must be repartitioned:
//  1. Query, planned and bound as a statement of its own (one shard, the merge or the
//     coordinator answers it), with the INSERT's parameters; its rows are read whole,
//     so that the writes cannot feed back into the read (INSERT INTO t SELECT ... FROM t);
//  2. the rows, in batches, as the parameters of Batch statements: INSERT ... VALUES,
//     with the INSERT's column list, ON CONFLICT and RETURNING, which the planner routes
//     row by row, as any multi-row INSERT (drawing keys the rows leave out).
//
// Every batch runs in the statement's transaction: a failure anywhere leaves no row
// written. Each value travels in binary with the type the SELECT gave it, so the
// server converts it to the column's type as one database's INSERT ... SELECT would
// (an assignment cast), not from text.
type Feed struct {
	// Table is the target's logical name.
	Table string
	// Query is the SELECT, with the INSERT's WITH clause, as SQL over logical tables.
	Query string
	// Params is the number of the client's parameters ($1 ... $Params); a batch's row
	// values are the parameters after them.
	Params int
	// Upsert is set for ON CONFLICT DO UPDATE, which one database refuses to apply
	// twice to a row in one statement: its rows must fit one batch.
	Upsert bool

	insert   *pg.InsertStmt // the client's INSERT, its SELECT to be replaced by VALUES rows
	version  int32
	untyped  []bool // per column of the query: a string literal or NULL, without a type
	keys     []feedKey
	describe describeAt
	batches  sync.Map // rows<<20 | columns -> string
}

// feedKey is a sharding column among the INSERT's columns.
type feedKey struct {
	column string
	at     int // its position in the column list
	typ    rules.KeyType
}

// describeAt is where a statement can be described: a data source and the statement
// with its tables named as there.
type describeAt struct {
	ds  int
	sql string
}

// MaxParams is PostgreSQL's bound on a statement's parameters.
const MaxParams = 65535

// BatchRows is the most rows one Batch statement inserts.
const BatchRows = 500

// errAsWritten asks the planner to plan a normalised statement from the client's own
// text: a Feed's query keeps its literals.
var errAsWritten = errors.New("sqlplan: plan the statement as written")

// analyzeFeed plans an INSERT ... SELECT into a sharded table (see Feed).
func (a *analyzer) analyzeFeed(ins *pg.InsertStmt) error {
	if a.normalized {
		return errAsWritten
	}
	orig := proto.Clone(ins).(*pg.InsertStmt)
	query := proto.Clone(ins.SelectStmt).(*pg.Node)
	if w := ins.WithClause; w != nil {
		// The INSERT's WITH queries go with the query, which alone reads them.
		sel := query.GetSelectStmt()
		if sel.WithClause != nil {
			return unsupported("INSERT ... SELECT into sharded table %s with a WITH clause on the INSERT and another on the SELECT", ins.Relation.Relname)
		}
		names := map[string]bool{}
		for _, c := range w.Ctes {
			names[c.GetCommonTableExpr().GetCtename()] = true
		}
		var rest []proto.Message
		for _, r := range ins.ReturningList {
			rest = append(rest, r)
		}
		if ins.OnConflictClause != nil {
			rest = append(rest, ins.OnConflictClause)
		}
		for _, m := range rest {
			named := false
			walk(m, func(m proto.Message) bool {
				if rv, ok := m.(*pg.RangeVar); ok && rv.Schemaname == "" && names[rv.Relname] {
					named = true
				}
				return !named
			})
			if named {
				return unsupported("INSERT ... SELECT into sharded table %s whose RETURNING or ON CONFLICT reads a WITH query of the INSERT", ins.Relation.Relname)
			}
		}
		sel.WithClause = proto.Clone(w).(*pg.WithClause)
	}
	text, err := deparse(a.tree.Version, query)
	if err != nil {
		return err
	}
	s := &scope{}
	a.top = s
	target, err := a.addRef(ins.Relation, s)
	if err != nil {
		return err
	}
	if ins.Override == pg.OverridingKind_OVERRIDING_USER_VALUE {
		return unsupported("INSERT ... SELECT into sharded table %s with OVERRIDING USER VALUE", target.name)
	}
	cols, err := a.insertColumns(ins, target)
	if err != nil {
		return err
	}
	untyped, ok := untypedColumns(query)
	if !ok {
		return unsupported("INSERT ... SELECT into sharded table %s with * and a string literal or NULL in its select list (the literal's column, which takes the target column's type, is not known before the query runs); give the literal a type (::type)", target.name)
	}
	f := &Feed{Table: target.name, Query: text, Params: a.maxParam, insert: orig, version: a.tree.Version, untyped: untyped}
	for _, key := range target.rule.KeyColumns() {
		if i := slices.Index(cols, key); i >= 0 {
			f.keys = append(f.keys, feedKey{column: key, at: i, typ: target.keyTypes[key]})
		}
	}
	if oc := ins.OnConflictClause; oc != nil && oc.Action == pg.OnConflictAction_ONCONFLICT_UPDATE {
		f.Upsert = true
	}
	clone := proto.Clone(ins).(*pg.InsertStmt)
	if f.describe, err = a.describeAnywhere(&pg.Node{Node: &pg.Node_InsertStmt{InsertStmt: clone}}, clone.Relation); err != nil {
		return err
	}
	a.plan.Feed = f
	// The query's tables, which it reads when it runs (planned then, on its own).
	for _, name := range namedTables(query) {
		a.plan.Tables = appendUnique(a.plan.Tables, name)
	}
	return nil
}

// describeAnywhere finds a data source that holds a copy or a shard of every table a
// statement (a clone, which it changes) names, and names them as there: the
// statement's parameter types and RETURNING columns are the same on every shard.
//
// target, when not nil, is the statement's target, a table whatever WITH queries say.
func (a *analyzer) describeAnywhere(stmt *pg.Node, target *pg.RangeVar) (describeAt, error) {
	ctes := map[string]bool{}
	var rvs []*pg.RangeVar
	walk(stmt, func(m proto.Message) bool {
		switch n := m.(type) {
		case *pg.CommonTableExpr:
			ctes[n.Ctename] = true
		case *pg.RangeVar:
			rvs = append(rvs, n)
		}
		return true
	})
	def := a.p.rules.DefaultDataSource()
	var common []int // nil: any data source
	first := true
	lookup := func(rv *pg.RangeVar) *rules.TableRule {
		if rv.Schemaname == "" && ctes[rv.Relname] && rv != target || rv.Schemaname == "pg_catalog" || rv.Schemaname == "information_schema" || strings.HasPrefix(rv.Relname, "pg_") {
			return nil
		}
		return a.p.rules.Lookup(rv.Relname)
	}
	for _, rv := range rvs {
		var here []int
		if r := lookup(rv); r != nil {
			for _, n := range r.Nodes {
				here = append(here, n.DataSource)
			}
		} else if rv.Schemaname != "" || !ctes[rv.Relname] || rv == target {
			here = []int{def}
		} else {
			continue
		}
		if first {
			common, first = here, false
			continue
		}
		common = slices.DeleteFunc(common, func(ds int) bool { return !slices.Contains(here, ds) })
	}
	ds := def
	switch {
	case first || slices.Contains(common, def):
	case len(common) > 0:
		ds = slices.Min(common)
	default:
		return describeAt{ds: -1}, nil // no data source holds every table: not described
	}
	for _, rv := range rvs {
		if r := lookup(rv); r != nil {
			for _, n := range r.Nodes {
				if n.DataSource == ds {
					setNode(rv, n)
					break
				}
			}
		}
	}
	text, err := deparse(a.tree.Version, stmt)
	if err != nil {
		return describeAt{}, err
	}
	return describeAt{ds: ds, sql: text}, nil
}

// RowsPerBatch is how many rows of columns values each Batch statement takes.
func (f *Feed) RowsPerBatch(columns int) int {
	return max(1, min(BatchRows, (MaxParams-f.Params)/max(columns, 1)))
}

// NextBatch is the number of rows of the next batch when left rows remain: a whole
// batch, else the greatest power of two that fits, so that the statements of a Feed
// are a few texts (and plans), not one per remainder.
func (f *Feed) NextBatch(columns int, left int64) int {
	per := f.RowsPerBatch(columns)
	if left >= int64(per) {
		return per
	}
	n := 1
	for int64(n*2) <= left {
		n *= 2
	}
	return n
}

// Batch returns the INSERT ... VALUES statement of rows rows of columns values each:
// the client's parameters are $1 ... $Params, the rows' values the parameters after.
func (f *Feed) Batch(rows, columns int) (string, error) {
	key := rows<<20 | columns
	if s, ok := f.batches.Load(key); ok {
		return s.(string), nil
	}
	ins := proto.Clone(f.insert).(*pg.InsertStmt)
	ins.WithClause = nil
	values := make([]*pg.Node, rows)
	n := f.Params
	for r := range values {
		items := make([]*pg.Node, columns)
		for c := range items {
			n++
			items[c] = &pg.Node{Node: &pg.Node_ParamRef{ParamRef: &pg.ParamRef{Number: int32(n)}}}
		}
		values[r] = &pg.Node{Node: &pg.Node_List{List: &pg.List{Items: items}}}
	}
	ins.SelectStmt = &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: &pg.SelectStmt{ValuesLists: values, Op: pg.SetOperation_SETOP_NONE, LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT}}}
	text, err := deparse(f.version, &pg.Node{Node: &pg.Node_InsertStmt{InsertStmt: ins}})
	if err != nil {
		return "", err
	}
	f.batches.Store(key, text)
	return text, nil
}

// untypedColumns marks the columns of a query that are a string literal or NULL with no
// type: one database's INSERT ... SELECT reads them as the target column's type (from
// their text), where the query alone would make them text.
//
// ok is false when the select list has both a * (which stands for columns not known
// here) and such a literal: the literal's column is not known.
func untypedColumns(query *pg.Node) (untyped []bool, ok bool) {
	sel := query.GetSelectStmt()
	if sel == nil || sel.Op != pg.SetOperation_SETOP_NONE || len(sel.DistinctClause) > 0 || len(sel.GroupClause) > 0 {
		return nil, true // made text by the set operation, DISTINCT or GROUP BY, as alone
	}
	// ORDER BY a literal's position or name makes it text, as alone.
	sorted := map[int]bool{}
	for _, sb := range sel.SortClause {
		n := sb.GetSortBy().GetNode()
		if c := n.GetAConst(); c != nil && c.GetIval() != nil {
			sorted[int(c.GetIval().Ival)-1] = true
		}
		if q, col, isCol := columnRef(n); isCol && q == "" {
			for i, t := range sel.TargetList {
				if t.GetResTarget().GetName() == col {
					sorted[i] = true
				}
			}
		}
	}
	star := false
	untyped = make([]bool, len(sel.TargetList))
	for i, t := range sel.TargetList {
		v := t.GetResTarget().GetVal()
		if cr := v.GetColumnRef(); cr != nil && len(cr.Fields) > 0 && cr.Fields[len(cr.Fields)-1].GetAStar() != nil {
			star = true
		}
		c := v.GetAConst()
		untyped[i] = c != nil && (c.Isnull || c.GetSval() != nil) && !sorted[i]
	}
	if star {
		return nil, !slices.Contains(untyped, true)
	}
	return untyped, true
}

// Untyped reports whether column i of the query is an untyped string literal or NULL,
// whose value a batch passes as text of no declared type (the server reads it as the
// column's type, as one database would the literal).
func (f *Feed) Untyped(i int) bool { return i < len(f.untyped) && f.untyped[i] }

// CheckColumns checks the types of the query's columns (their OIDs, as the answering
// server described them) before any row is written. A type of the database's own
// (an enum, a domain) has another OID on each data source, and a sharding key must be
// read, to route it, as the value the column will hold.
func (f *Feed) CheckColumns(oids []uint32, rows int64) error {
	if len(oids) == 0 {
		return unsupported("INSERT ... SELECT of no columns into sharded table %s", f.Table)
	}
	for i, oid := range oids {
		if oid >= firstNormalOID && !f.Untyped(i) {
			return unsupported("INSERT ... SELECT into sharded table %s: column %d of the SELECT is of a type the database defines (OID %d), which other data sources number differently; cast it to a built-in type", f.Table, i+1, oid)
		}
	}
	for _, k := range f.keys {
		if k.at >= len(oids) {
			continue // a key the SELECT does not give: drawn, or the batch refuses it
		}
		if f.Untyped(k.at) {
			continue // read from its text as the key's type, as one database reads it
		}
		if !keyFrom(k.typ, oids[k.at]) {
			return unsupported("INSERT ... SELECT into sharded table %s: the SELECT gives its sharding key %s as %s, not as the key's type %s, and the row's shard depends on the converted value; cast it in the SELECT (::%s)", f.Table, k.column, typeName(oids[k.at]), k.typ, k.typ)
		}
	}
	if f.Upsert && rows > int64(f.RowsPerBatch(len(oids))) {
		return unsupported("INSERT ... SELECT ... ON CONFLICT DO UPDATE into sharded table %s of more than %d rows: one database refuses to update a row twice in one statement, which batches of rows cannot tell", f.Table, f.RowsPerBatch(len(oids)))
	}
	return nil
}

// firstNormalOID is the first OID PostgreSQL gives objects a database defines; below
// it, types are built in and numbered alike everywhere.
const firstNormalOID = 16384

// keyFrom reports whether a value of type oid is read as a key of type typ without a
// conversion that could change it.
func keyFrom(typ rules.KeyType, oid uint32) bool {
	switch {
	case typ.IsInteger():
		return oid == oidInt2 || oid == oidInt4 || oid == oidInt8
	case typ == rules.TypeText:
		return oid == oidText || oid == oidVarchar
	case typ == rules.TypeUUID:
		return oid == oidUUID
	}
	return false
}

var typeNames = pgtype.NewMap()

func typeName(oid uint32) string {
	if t, ok := typeNames.TypeForOID(oid); ok {
		return t.Name
	}
	return fmt.Sprintf("type %d", oid)
}

// Explain describes a Feed plan without running its query.
func (f *Feed) Explain() string {
	return fmt.Sprintf("insert of %s from a query (1 target per batch of rows)\n  query: %s\n  rows: read whole, then inserted in batches of up to %d rows, each row on the shard its key names, in one transaction\n",
		f.Table, f.Query, BatchRows)
}
