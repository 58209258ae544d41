package sqlplan

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/shardlab/shardlab/routing"
	"github.com/shardlab/shardlab/rules"
)

// CoordinatorSource returns the data source index that stands for the coordinator
// database in the targets of layout r: one past its last data source.
func CoordinatorSource(r *rules.Compiled) int { return r.NumDataSources() }

// Coordinated reports whether the coordinator database answers the bound statement.
func (b *Bound) Coordinated() bool {
	return len(b.Targets) == 1 && b.Targets[0].DataSource == CoordinatorSource(b.Plan.rules)
}

// coordination is what the planner learns of a statement, before its analysis renames
// the tables, about the coordinator database answering it.
type coordination struct {
	tables []string // every relation it names, as written
	// inexact says why the coordinator would not answer it as one database would, if
	// it would not.
	inexact error
	joins   *joinCatalog // see joinCatalog, for a SELECT that joins tables
}

// checkCoordination returns nil for a statement the coordinator cannot answer at all
// (not a read, or one about its own session), else what the planner needs to know.
func (p *Planner) checkCoordination(ctx context.Context, stmt *pg.Node) *coordination {
	if coordinatable(stmt) != nil {
		return nil
	}
	c := &coordination{}
	walk(stmt, func(m proto.Message) bool {
		if rv, ok := m.(*pg.RangeVar); ok && rv.Relname != "" {
			c.tables = append(c.tables, rv.Relname)
		}
		return true
	})
	c.inexact = p.inexactOnCoordinator(ctx, stmt, c.tables)
	if p.shardAggs && c.inexact == nil {
		c.joins = p.joinCatalog(ctx, stmt)
	}
	return c
}

// joinCatalog reads what shardAggregates needs to know of the tables that a SELECT, or
// a self-contained one within it (see selfContained), joins in its FROM clause to
// aggregate them: their columns' types, of those the catalog knows. It returns nil when
// the statement joins none it could rewrite.
func (p *Planner) joinCatalog(ctx context.Context, stmt *pg.Node) *joinCatalog {
	if e := stmt.GetExplainStmt(); e != nil {
		stmt = e.Query
	}
	sel := stmt.GetSelectStmt()
	tc, typed := p.cat.(typedCatalog)
	if !typed || p.cat == nil || sel == nil {
		return nil
	}
	var joined []*aggItem
	selfContained(sel, nil, func(q *pg.SelectStmt, ctes map[string]bool) bool {
		items, _, ok := readAggFrom(p.rules, q.FromClause)
		if !ok || len(items) < 2 {
			return false
		}
		aggregates := false
		walk(q, func(m proto.Message) bool {
			if f, ok := m.(*pg.FuncCall); ok && mergeAggregates[foldedFuncName(f)] {
				aggregates = true
			}
			return !aggregates
		})
		for _, it := range items {
			if aggregates && (it.rv.Schemaname != "" || !ctes[it.rv.Relname]) {
				joined = append(joined, it)
			}
		}
		return false
	})
	if len(joined) == 0 {
		return nil
	}
	jc := &joinCatalog{columns: map[string]map[string]string{}}
	for _, it := range joined {
		name := it.rv.Relname
		if jc.columns[name] != nil {
			continue
		}
		types, err := tc.ColumnTypes(ctx, it.rule)
		if err != nil {
			continue // (no entry of its name is then rewritten)
		}
		jc.columns[name] = types
		if sc, ok := p.cat.(statsCatalog); ok && it.rule.Kind == rules.KindSharded {
			if jc.readAt.IsZero() {
				jc.readAt = time.Now()
			}
			if rows, distinct, err := sc.ShardStats(ctx, it.rule); err == nil && rows > 0 {
				if jc.rows == nil {
					jc.rows, jc.distinct = map[string]float64{}, map[string]map[string]float64{}
				}
				jc.rows[name], jc.distinct[name] = rows, distinct
			}
		}
	}
	return jc
}

// typedCatalog is a Catalog that knows the types of tables' columns (package sqlexec's
// does).
type typedCatalog interface {
	// ColumnTypes returns each column of a table with its type as format_type writes
	// it, modifier included.
	ColumnTypes(ctx context.Context, table *rules.TableRule) (map[string]string, error)
}

// statsCatalog is a Catalog that reads PostgreSQL's statistics of a sharded table's
// first shard (package sqlexec's does): its rows, and each column's distinct values.
type statsCatalog interface {
	ShardStats(ctx context.Context, table *rules.TableRule) (rows float64, distinct map[string]float64, err error)
}

// coordinated plans a SELECT the analysis refused (why) for the coordinator database:
// it runs there as the client wrote it. A normalised text is planned again from the
// client's own, whose literals the statement keeps.
func (p *Planner) coordinated(sql, text string, normalized bool, tree *pg.ParseResult, effects SessionEffects, why error, c *coordination) (*Plan, error) {
	if c.inexact != nil {
		return nil, unsupported("%s; %v", strings.TrimPrefix(refusalText(why), "shardlab: "), c.inexact)
	}
	a, err := p.asWritten(sql, text, normalized, tree)
	if err != nil {
		return nil, err
	}
	a.noteParams(a.tree.Stmts[0].Stmt)
	return &Plan{Kind: KindCoordinator, SQL: sql, rules: p.rules, Session: effects, NumParams: a.maxParam, Refused: why, Tables: c.tables, shardAggs: p.shardAggs, joins: c.joins}, nil
}

// bindCoordinator makes b's one target the coordinator database, running sql, its
// aggregates on the shards where that is exact (Options.ShardAggregates).
func (pl *Plan) bindCoordinator(b *Bound, v *values, why error) {
	sql := v.sql
	b.AsWritten = sql
	run := sql
	if pl.shardAggs {
		if s, ok := shardAggregates(pl.rules, sql, pl.joins); ok {
			run = s
		}
	}
	b.Targets = append(b.Targets[:0], Target{DataSource: CoordinatorSource(pl.rules), Shard: -1, SQL: run})
	b.Destination = routing.DestinationAll{}
	b.Merge, b.Limit, b.Offset, b.Broadcast = nil, -1, -1, false
	b.Refused = why
}

// errNotCoordinated says why a statement cannot go to the coordinator database.
var errNotCoordinated = errors.New("sqlplan: not for the coordinator")

// coordinatable reports whether the coordinator database may answer a statement as one
// database would: a SELECT that only reads, and asks nothing about its own session or
// server (the coordinator's are not the client's).
func coordinatable(stmt *pg.Node) error {
	if e := stmt.GetExplainStmt(); e != nil {
		// EXPLAIN shows the coordinator's plan: which rows each shard sends.
		stmt = e.Query
	}
	if stmt.GetSelectStmt() == nil {
		return errNotCoordinated
	}
	var err error
	walk(stmt, func(m proto.Message) bool {
		switch n := m.(type) {
		case *pg.LockingClause, *pg.IntoClause, *pg.InsertStmt, *pg.UpdateStmt, *pg.DeleteStmt, *pg.MergeStmt:
			err = errNotCoordinated
		case *pg.FuncCall:
			name := foldedFuncName(n)
			if schema, _ := funcName(n); sessionFunction(name) || catalogName(schema, "") && schema != "pg_catalog" {
				err = errNotCoordinated // (the coordinator's own functions: shardlab_merge.sum)
			}
			// An aggregate or window function whose answer depends on the order its
			// rows come in, with no ORDER BY to fix it, answers in the order of one
			// database's heap there, and in the shards' arrival order here.
			if rowOrdered[name] && len(n.AggOrder) == 0 && (n.Over == nil || len(n.Over.OrderClause) == 0) {
				err = errNotCoordinated
			}
		case *pg.SubLink:
			// ARRAY(SELECT ...) without ORDER BY: likewise.
			if sel := n.Subselect.GetSelectStmt(); n.SubLinkType == pg.SubLinkType_ARRAY_SUBLINK && (sel == nil || len(sel.SortClause) == 0) {
				err = errNotCoordinated
			}
		case *pg.SQLValueFunction:
			if n.Op == pg.SQLValueFunctionOp_SVFOP_CURRENT_CATALOG || n.Op == pg.SQLValueFunctionOp_SVFOP_CURRENT_SCHEMA {
				err = errNotCoordinated // the coordinator database's name
			}
		case *pg.RangeVar:
			// Catalogs describe the coordinator database, not the client's; its own
			// schemas hold what the client must not see (the user mappings).
			if catalogName(n.Schemaname, n.Relname) {
				err = errNotCoordinated
			}
		case *pg.TypeCast:
			// A reg* value is an object id of the coordinator's catalog.
			if tn := n.TypeName; tn != nil && len(tn.Names) > 0 && strings.HasPrefix(tn.Names[len(tn.Names)-1].GetString_().Sval, "reg") {
				err = errNotCoordinated
			}
		case *pg.ColumnRef:
			// System columns name the coordinator's partitions and duplicate across
			// shards.
			if f := n.Fields; len(f) > 0 && systemColumns[f[len(f)-1].GetString_().GetSval()] {
				err = errNotCoordinated
			}
		}
		return err == nil
	})
	return err
}

var systemColumns = map[string]bool{"tableoid": true, "ctid": true, "xmin": true, "xmax": true, "cmin": true, "cmax": true}

// catalogName reports whether a table reference names a catalog or one of the
// coordinator database's own schemas.
func catalogName(schema, rel string) bool {
	switch schema {
	case "pg_catalog", "information_schema", "shardlab_fdw", CoordinatorShardsSchema, "shardlab_import", CoordinatorMergeSchema:
		return true
	}
	return strings.HasPrefix(rel, "pg_")
}

// sessionFunction reports whether a function answers about the session, database or
// server it runs in, reads its catalogs, or acts on them: on the coordinator it would
// answer about the coordinator's, or leave state there.
func sessionFunction(name string) bool {
	if sessionFunctions[name] {
		return true
	}
	for _, prefix := range []string{"pg_", "lo_", "txid_", "dblink", "has_", "to_reg", "query_to_xml", "cursor_to_xml",
		"table_to_xml", "schema_to_xml", "database_to_xml"} {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// rowOrdered are the aggregates and window functions whose answer depends on the
// order of their rows.
var rowOrdered = map[string]bool{
	"string_agg": true, "array_agg": true, "json_agg": true, "jsonb_agg": true, "json_object_agg": true,
	"jsonb_object_agg": true, "xmlagg": true, "json_agg_strict": true, "jsonb_agg_strict": true,
	"row_number": true, "lag": true, "lead": true, "first_value": true, "last_value": true, "nth_value": true, "ntile": true,
	// SQLite's (its coordinator: shardsql's sqlite_attach.go).
	"group_concat": true, "json_group_array": true, "json_group_object": true, "jsonb_group_array": true, "jsonb_group_object": true,
}

// foldedFuncName is a function call's name in lower case: the coordinator's checks
// take "SUM"(x) for sum(x), as SQLite does (PostgreSQL would call another function,
// or none).
func foldedFuncName(f *pg.FuncCall) string {
	_, name := funcName(f)
	return strings.ToLower(name)
}

// MayCoordinate reports whether the coordinator database may answer the plan when its
// values make it span shards the merge cannot combine (Options.Coordinate).
func (pl *Plan) MayCoordinate() bool { return pl.coordinate }

// HoldsEveryTable reports whether data source ds holds a table of every table the
// statement names (a shard of each sharded table, and each other table), so that it
// can describe the statement. A statement may name a default data source's table
// beside a table sharded over other data sources, which no one data source holds.
func (pl *Plan) HoldsEveryTable(ds int) bool {
	for _, r := range pl.refs {
		if !slices.ContainsFunc(r.rule.Nodes, func(n rules.Node) bool { return n.DataSource == ds }) {
			return false
		}
	}
	return true
}

// sessionFunctions answer about the session or server they run in, or act on it: on
// the coordinator they would answer about the coordinator's.
var sessionFunctions = map[string]bool{
	"current_database": true, "pg_backend_pid": true, "inet_server_addr": true, "inet_server_port": true,
	"txid_current": true, "txid_current_if_assigned": true, "pg_current_xact_id": true, "pg_current_xact_id_if_assigned": true,
	"pg_notify": true, "set_config": true, "nextval": true, "setval": true, "currval": true, "lastval": true,
	"pg_advisory_lock": true, "pg_advisory_lock_shared": true, "pg_try_advisory_lock": true, "pg_try_advisory_lock_shared": true,
	"pg_advisory_xact_lock": true, "pg_advisory_xact_lock_shared": true, "pg_try_advisory_xact_lock": true, "pg_try_advisory_xact_lock_shared": true,
	"pg_advisory_unlock": true, "pg_advisory_unlock_shared": true, "pg_advisory_unlock_all": true,
	"pg_cancel_backend": true, "pg_terminate_backend": true, "setseed": true, "currtid": true, "currtid2": true,
	"obj_description": true, "col_description": true, "shobj_description": true, "format_type": true,
	"current_setting": true, "current_schema": true, "current_schemas": true, "version": true,
	"pg_current_wal_lsn": true, "pg_my_temp_schema": true, "pg_stat_get_activity": true,
}

// refusalText is an error's message for a route preview.
func refusalText(err error) string {
	if err == nil {
		return "a construct exact on one shard only"
	}
	var r *refusal
	if errors.As(err, &r) {
		return r.Message
	}
	return err.Error()
}

// callsAnything reports whether an expression calls a function or holds a subquery.
func callsAnything(n *pg.Node) bool {
	calls := false
	if n == nil {
		return false
	}
	walk(n, func(m proto.Message) bool {
		switch m.(type) {
		case *pg.FuncCall, *pg.SubLink:
			calls = true
		}
		return !calls
	})
	return calls
}

// floatCatalog is the optional Catalog capability the coordinator's float check needs:
// a table's floating-point columns.
type floatCatalog interface {
	FloatColumns(ctx context.Context, t *rules.TableRule) ([]string, error)
}

// orderedSums are the aggregates whose floating-point result depends on the order
// their rows come in.
var orderedSums = map[string]bool{
	"sum": true, "avg": true, "stddev": true, "stddev_pop": true, "stddev_samp": true, "variance": true,
	"var_pop": true, "var_samp": true, "corr": true, "covar_pop": true, "covar_samp": true, "regr_avgx": true,
	"regr_avgy": true, "regr_intercept": true, "regr_r2": true, "regr_slope": true, "regr_sxx": true,
	"regr_sxy": true, "regr_syy": true,
	"total": true, // SQLite's sum, always a float
}

// floatFunctions return floating-point values.
var floatFunctions = map[string]bool{
	"random": true, "sqrt": true, "cbrt": true, "power": true, "pow": true, "exp": true, "ln": true, "log": true,
	"log10": true, "sin": true, "cos": true, "tan": true, "cot": true, "asin": true, "acos": true, "atan": true,
	"atan2": true, "sind": true, "cosd": true, "tand": true, "cotd": true, "asind": true, "acosd": true,
	"atand": true, "atan2d": true, "sinh": true, "cosh": true, "tanh": true, "asinh": true, "acosh": true,
	"atanh": true, "degrees": true, "radians": true, "pi": true, "date_part": true, "float4": true, "float8": true,
	"erf": true, "erfc": true, "random_normal": true, "percent_rank": true, "cume_dist": true, "ts_rank": true,
	"ts_rank_cd": true, "area": true, "diameter": true, "height": true, "width": true, "radius": true,
}

// floatOperators return floating-point values over integers: power, square and cube
// roots.
var floatOperators = map[string]bool{"^": true, "|/": true, "||/": true}

// exactTypes are the numeric types whose sums are exact, as a cast names them.
var exactTypes = map[string]bool{"numeric": true, "int2": true, "int4": true, "int8": true}

// floatTypes name the floating-point types as a cast writes them.
var floatTypes = map[string]bool{"float4": true, "float8": true, "real": true, "double precision": true, "float": true}

// inexactOnCoordinator reports why the coordinator would not answer a statement
// exactly: it adds floating-point values up in an aggregate, in an order of rows no
// single database shares. Conservatively, a statement that calls such an aggregate
// (sum, avg, stddev ...) is refused when a floating-point value appears anywhere in it:
// a float column, a cast to a float type, a function returning one, or every column of
// a table that has a float column.
func (p *Planner) inexactOnCoordinator(ctx context.Context, stmt *pg.Node, tables []string) error {
	summed := ""
	walk(stmt, func(m proto.Message) bool {
		if f, ok := m.(*pg.FuncCall); ok {
			if name := foldedFuncName(f); orderedSums[name] && summed == "" {
				summed = name
			}
		}
		return true
	})
	if summed == "" {
		return nil
	}
	inexact := fmt.Errorf("%s() where a floating-point value may be summed: the coordinator would add the rows up in another order than one database", summed)
	floats := map[string]bool{}
	hasFloats := false
	fc, ok := p.cat.(floatCatalog)
	if !ok || p.cat == nil {
		return inexact
	}
	for _, name := range tables {
		r := p.rules.Lookup(name)
		if r == nil || len(r.Nodes) == 0 {
			continue
		}
		cols, err := fc.FloatColumns(ctx, r)
		if err != nil {
			return inexact
		}
		for _, c := range cols {
			floats[c] = true
			hasFloats = true
		}
	}
	var found bool
	walk(stmt, func(m proto.Message) bool {
		switch n := m.(type) {
		case *pg.ColumnRef:
			for _, f := range n.Fields {
				if f.GetAStar() != nil && hasFloats || f.GetString_() != nil && floats[f.GetString_().Sval] {
					found = true
				}
			}
		case *pg.FuncCall:
			if name := foldedFuncName(n); floatFunctions[name] {
				found = true
			}
		case *pg.A_Expr:
			// qty ^ 2 is a double precision when qty is an integer.
			if len(n.Name) > 0 && floatOperators[n.Name[len(n.Name)-1].GetString_().GetSval()] {
				found = true
			}
		case *pg.TypeCast:
			// A float made numeric or integer value by value, before any aggregate, is
			// summed exactly.
			if tn := n.TypeName; tn != nil && len(tn.Names) > 0 && exactTypes[tn.Names[len(tn.Names)-1].GetString_().Sval] &&
				len(tn.ArrayBounds) == 0 && !callsAnything(n.Arg) {
				return false
			}
		case *pg.A_Indirection:
			for _, f := range n.Indirection {
				if s := f.GetString_(); s != nil && floats[s.Sval] {
					found = true // (row).weight
				}
			}
		case *pg.TypeName:
			if len(n.Names) > 0 && floatTypes[n.Names[len(n.Names)-1].GetString_().Sval] {
				found = true
			}
		case *pg.A_Const:
			// A literal like 1.5 is numeric in PostgreSQL; 'NaN'::float8 is caught as
			// a cast.
		}
		return !found
	})
	if found {
		return inexact
	}
	return nil
}

// Relation is a relation a statement names, as the parser reads it (unquoted names
// folded to lower case).
type Relation struct {
	Schema, Name string
}

// Relations lists the relations a statement names (CTE references included) and the
// names of the CTEs it defines, for a coordinator that must resolve each name itself
// (shardsql's SQLite coordinator).
func Relations(sql string) (rels []Relation, ctes []string, err error) {
	tree, err := pg.Parse(sql)
	if err != nil {
		return nil, nil, err
	}
	for _, st := range tree.Stmts {
		walk(st.Stmt, func(m proto.Message) bool {
			switch n := m.(type) {
			case *pg.RangeVar:
				rels = append(rels, Relation{Schema: n.Schemaname, Name: n.Relname})
			case *pg.CommonTableExpr:
				ctes = append(ctes, n.Ctename)
			}
			return true
		})
	}
	return rels, ctes, nil
}
