package shardsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/shardlab/shardlab/internal/sqlitedb"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// The coordinator on SQLite shards (Config.Coordinate). What the merge cannot answer
// exactly over several SQLite files, SQLite answers itself: one connection attaches
// every shard file read-only (ATTACH DATABASE), each logical table is a temporary view
// there, the UNION ALL of its physical tables, and the statement runs on it as the
// program wrote it, with SQLite's own semantics (joins, CTEs, window functions,
// subqueries, expressions over aggregates). No row moves between processes, and no
// SQL is interpreted by shardlab. SQLite attaches at most maxAttached files; a layout
// of more data sources is refused, naming the limit.
//
// What it refuses (0A000), beside what the planner refuses for every coordinator (sums
// and averages, which SQLite adds in the order the rows come; aggregates and window
// functions whose answer depends on their rows' order without an ORDER BY, however
// their names are quoted or cased; statements about the session):
//   - a read inside a transaction: the attached files are read through a connection of
//     their own, which cannot see the transaction's writes;
//   - a name it cannot resolve as one file would: a schema-qualified one (the attached
//     files and temp are the coordinator's), a physical table of a split table, a name
//     that is neither a CTE, a logical table with a view, nor a table of the default
//     data source's file (SQLite would look it up in the other files; a view of that
//     file reads that file alone), and a CTE named like a table of any file (outside
//     its WITH the name reaches the file);
//   - a table whose columns differ between its shards (the view would pair them by
//     position), or that declares a collation (a compound view does not carry it into
//     UNION, INTERSECT or EXCEPT);
//   - rowids, SQLite's catalog (sqlite_*), pragmas and the functions that answer about
//     the connection (changes(), last_insert_rowid()): the views have no rowid, and the
//     connection is the coordinator's;
//   - any error SQLite raises for the statement there, after one more try on a new
//     connection: one file might not have raised it.
//
// A kept connection is made again when a file's schema version moved since it attached
// them (a table or column made beside the handle), so that its views name every column.
//
// Bare columns (a column neither grouped nor aggregated, which SQLite takes from a row
// it picks) and LIMIT without ORDER BY answer from rows in the order the files are
// read: as one file may answer from any row, any of them is its answer too.

// maxAttached is how many files one SQLite connection attaches (SQLITE_MAX_ATTACHED of
// the SQLite library the driver is built with).
const maxAttached = 10

// liteCoordinator keeps the connections that attach every shard file.
type liteCoordinator struct {
	shards   *sqliteShards
	physical map[string]bool // see physicalTables
	memory   *sql.DB         // each connection an empty in-memory database, the files attached to it
	// idle keeps connections for the next statements, until closed (mu guards both).
	mu     sync.Mutex
	idle   chan *liteConn
	closed bool
	// generation counts the schema changes made through this handle: a connection made
	// for an older one is made again, so that its views have every column.
	generation atomic.Uint64
}

// liteConn is one attaching connection, made for a schema generation.
type liteConn struct {
	c          *sql.Conn
	generation uint64
	// names are the relations a statement may name there, in lower case: the logical
	// tables with a view, and the default data source's own tables.
	names map[string]bool
	// refused are the logical tables a statement may not name, with why (lower case).
	refused map[string]string
	// tables are every table and view of every attached file (lower case): no CTE
	// may take one's name, since outside the CTE's own WITH the name reaches a file.
	tables map[string]bool
	// versions are the attached files' schema versions when it attached them: a kept
	// connection whose files changed since is made again.
	versions []int64
}

// liteCoordinatorConns bounds the attaching connections kept.
const liteCoordinatorConns = 4

func newLiteCoordinator(s *sqliteShards) (*liteCoordinator, error) {
	db, err := sql.Open(sqlitedb.DriverName, ":memory:")
	if err != nil {
		return nil, err
	}
	// The connections kept are the coordinator's (idle): one given back is closed, its
	// attachments and views with it.
	db.SetMaxIdleConns(0)
	return &liteCoordinator{shards: s, physical: physicalTables(s.rules), memory: db, idle: make(chan *liteConn, liteCoordinatorConns)}, nil
}

func (l *liteCoordinator) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	for {
		select {
		case c := <-l.idle:
			c.c.Close()
		default:
			l.memory.Close()
			return
		}
	}
}

// acquire returns a connection with every file attached and the views of the current
// schema generation: a kept one, unless fresh.
func (l *liteCoordinator) acquire(ctx context.Context, fresh bool) (*liteConn, error) {
	gen := l.generation.Load()
	for !fresh {
		select {
		case c := <-l.idle:
			if c.generation == gen {
				if same, err := l.sameSchemas(ctx, c); err == nil && same {
					return c, nil
				}
			}
			c.c.Close()
			continue
		default:
		}
		break
	}
	c, err := l.memory.Conn(ctx)
	if err != nil {
		return nil, err
	}
	lc := &liteConn{c: c, generation: gen, names: map[string]bool{}, refused: map[string]string{}, tables: map[string]bool{}}
	if err := l.attach(ctx, lc); err != nil {
		c.Close()
		return nil, err
	}
	return lc, nil
}

// unresolved says why c cannot answer a statement over rels and ctes as one file
// would, if it cannot (see the package comment).
func (l *liteCoordinator) unresolved(c *liteConn, rels []sqlplan.Relation, ctes []string) string {
	for _, cte := range ctes {
		if lower := strings.ToLower(cte); c.tables[lower] || c.names[lower] || c.refused[lower] != "" || l.physical[lower] {
			// Outside its own WITH the name would reach a file's table.
			return fmt.Sprintf("a CTE named like a table (%s)", cte)
		}
	}
	for _, r := range rels {
		name := strings.ToLower(r.Name)
		switch {
		case r.Schema != "":
			return fmt.Sprintf("a schema-qualified name (%s.%s)", r.Schema, r.Name)
		case slices.ContainsFunc(ctes, func(cte string) bool { return strings.EqualFold(cte, r.Name) }):
		case l.physical[name]:
			return fmt.Sprintf("%s, a physical table of a sharded table", r.Name)
		case c.refused[name] != "":
			return fmt.Sprintf("table %s (%s)", r.Name, c.refused[name])
		case !c.names[name]:
			return fmt.Sprintf("table %s, which is neither a logical table with a view nor in the default data source's file", r.Name)
		}
	}
	return ""
}

// sameSchemas reports whether the files c attached have the schemas they had then.
func (l *liteCoordinator) sameSchemas(ctx context.Context, c *liteConn) (bool, error) {
	r := l.shards.rules
	def := r.DefaultDataSource()
	i := 0
	for _, ds := range append([]int{def}, otherSources(r.NumDataSources(), def)...) {
		var v int64
		if err := c.c.QueryRowContext(ctx, fmt.Sprintf("PRAGMA shard_%d.schema_version", ds)).Scan(&v); err != nil {
			return false, err
		}
		if i >= len(c.versions) || c.versions[i] != v {
			return false, nil
		}
		i++
	}
	return true, nil
}

// otherSources are the data sources 0 ... n-1 but def, in order.
func otherSources(n, def int) []int {
	var out []int
	for ds := range n {
		if ds != def {
			out = append(out, ds)
		}
	}
	return out
}

// release keeps c for the next statement, or closes it if enough are kept.
func (l *liteCoordinator) release(c *liteConn, ok bool) {
	l.mu.Lock()
	if ok && !l.closed {
		select {
		case l.idle <- c:
			l.mu.Unlock()
			return
		default:
		}
	}
	l.mu.Unlock()
	c.c.Close()
}

// attach attaches every data source's file (shard_0, shard_1, ...) and makes each
// logical table a temporary view: a sharded table the UNION ALL of its physical tables,
// a broadcast table its default data source's copy (or its first). A table of the
// default data source needs none: SQLite looks an unqualified name up in temp, main,
// then the attached files in the order they were attached, and the default data
// source's is attached first. The logical tables are those of the default data
// source's file and those the rules name; the physical tables of split sharded tables
// are not the program's (physical).
func (l *liteCoordinator) attach(ctx context.Context, lc *liteConn) error {
	c := lc.c
	r := l.shards.rules
	def := r.DefaultDataSource()
	// A lock held by a shard's writer is waited for, as the shards' own connections do.
	if _, err := c.ExecContext(ctx, "PRAGMA busy_timeout = 5000"); err != nil {
		return err
	}
	order := append([]int{def}, otherSources(r.NumDataSources(), def)...)
	for _, ds := range order {
		if _, err := c.ExecContext(ctx, fmt.Sprintf("ATTACH DATABASE ? AS shard_%d", ds), l.shards.dbs[ds].AttachURI()); err != nil {
			return err
		}
	}
	for _, ds := range order {
		var v int64
		if err := c.QueryRowContext(ctx, fmt.Sprintf("PRAGMA shard_%d.schema_version", ds)).Scan(&v); err != nil {
			return err
		}
		lc.versions = append(lc.versions, v)
		rows, err := c.QueryContext(ctx, fmt.Sprintf("SELECT name FROM shard_%d.sqlite_schema WHERE type IN ('table', 'view')", ds))
		if err != nil {
			return err
		}
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				rows.Close()
				return err
			}
			lc.tables[strings.ToLower(name)] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	// The default data source's tables, not its views: a view of a file reads that
	// file's tables alone, whatever temp holds.
	var names []string
	rows, err := c.QueryContext(ctx, fmt.Sprintf("SELECT name FROM shard_%d.sqlite_schema WHERE type = 'table' ORDER BY name", def))
	if err != nil {
		return err
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return err
		}
		names = append(names, name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, name := range names {
		lc.names[strings.ToLower(name)] = true // the default data source's; a view below takes its place
	}
	for _, t := range r.Rules().Tables {
		if !strings.HasSuffix(t.Name, "*") && !slices.Contains(names, t.Name) {
			names = append(names, t.Name)
		}
	}
	for _, name := range names {
		t := r.Lookup(name)
		if t == nil || len(t.Nodes) == 0 || l.physical[name] {
			continue
		}
		lower := strings.ToLower(name)
		if t.Kind == rules.KindDefault {
			if collated, err := declaresCollation(ctx, c, def, name); err != nil {
				return err
			} else if collated {
				lc.refused[lower] = "its columns declare a collation"
			}
			continue
		}
		nodes := t.Nodes
		if t.Kind == rules.KindBroadcast {
			nodes = nodes[:1]
			for _, n := range t.Nodes {
				if n.DataSource == def {
					nodes = []rules.Node{n}
				}
			}
		}
		delete(lc.names, lower)
		why, err := l.makeView(ctx, c, name, nodes)
		if err != nil {
			return err
		}
		if why != "" {
			lc.refused[lower] = why
			continue
		}
		lc.names[lower] = true
	}
	return nil
}

// makeView makes the view of logical table name over nodes: each node's columns
// named, in the first node's order. It makes none, and says why, when the nodes'
// columns differ (a view would pair them by position) or declare a collation; a table
// that is on no shard yet gets none either.
func (l *liteCoordinator) makeView(ctx context.Context, c *sql.Conn, name string, nodes []rules.Node) (string, error) {
	var cols []string
	for i, n := range nodes {
		var these []string
		// Generated columns too (hidden 2 and 3), which SELECT * shows; not the hidden
		// columns of virtual tables (1).
		rows, err := c.QueryContext(ctx, "SELECT name FROM pragma_table_xinfo(?, ?) WHERE hidden IN (0, 2, 3) ORDER BY cid", n.Table, fmt.Sprintf("shard_%d", n.DataSource))
		if err != nil {
			return "", err
		}
		for rows.Next() {
			var col string
			if err := rows.Scan(&col); err != nil {
				rows.Close()
				return "", err
			}
			these = append(these, col)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return "", err
		}
		if len(these) == 0 {
			return "it is missing on a shard", nil
		}
		if collated, err := declaresCollation(ctx, c, n.DataSource, n.Table); err != nil {
			return "", err
		} else if collated {
			return "its columns declare a collation", nil
		}
		if i == 0 {
			cols = these
			continue
		}
		if !sameSet(cols, these) {
			return "its shards' columns differ", nil
		}
	}
	list := make([]string, len(cols))
	for i, col := range cols {
		list[i] = quoteIdent(col)
	}
	var parts []string
	for _, n := range nodes {
		parts = append(parts, fmt.Sprintf("SELECT %s FROM shard_%d.%s", strings.Join(list, ", "), n.DataSource, quoteIdent(n.Table)))
	}
	view := fmt.Sprintf("CREATE TEMP VIEW %s AS %s", quoteIdent(name), strings.Join(parts, " UNION ALL "))
	if _, err := c.ExecContext(ctx, view); err != nil {
		return "", fmt.Errorf("the view of table %s: %w", name, err)
	}
	return "", nil
}

// declaresCollation reports whether a table's definition on data source ds names a
// collation.
func declaresCollation(ctx context.Context, c *sql.Conn, ds int, table string) (bool, error) {
	var def sql.NullString
	err := c.QueryRowContext(ctx, fmt.Sprintf("SELECT sql FROM shard_%d.sqlite_schema WHERE type = 'table' AND name = ?", ds), table).Scan(&def)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return strings.Contains(strings.ToUpper(def.String), "COLLATE"), err
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.ContainsFunc(b, func(y string) bool { return strings.EqualFold(x, y) }) {
			return false
		}
	}
	return true
}

// physicalTables are the physical tables of sharded tables that are not logical
// tables themselves (t_order_0 of a split t_order): a statement that names one is not
// answered, since one database would not have it.
func physicalTables(r *rules.Compiled) map[string]bool {
	out := map[string]bool{}
	for _, t := range r.Rules().Tables {
		if strings.HasSuffix(t.Name, "*") {
			continue
		}
		if tr := r.Lookup(t.Name); tr != nil && tr.Kind == rules.KindSharded {
			for _, n := range tr.Nodes {
				if n.Table != t.Name {
					out[strings.ToLower(n.Table)] = true
				}
			}
		}
	}
	return out
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// liteNotCoordinated names what the SQLite coordinator does not answer, by the
// statement's words: rowids, SQLite's catalog and pragmas, and the functions that
// answer about the connection.
func liteNotCoordinated(sql string) string {
	for _, w := range sqlplan.Tokens(sql) {
		lw := strings.ToLower(strings.Trim(w, `"`))
		switch {
		case lw == "rowid" || lw == "_rowid_" || lw == "oid":
			return "a rowid (the coordinator's views have none)"
		case lw == "changes" || lw == "total_changes" || lw == "last_insert_rowid":
			return lw + "() (it answers about the coordinator's connection)"
		case strings.HasPrefix(lw, "sqlite_") || strings.HasPrefix(lw, "pragma"):
			return lw + " (SQLite's catalog or settings, the coordinator's)"
		}
	}
	return ""
}

// coordinated answers a statement the merge refused on SQLite shards, on a connection
// that attaches every file.
func (s *sqliteSession) coordinated(ctx context.Context, b *sqlplan.Bound, args []driver.NamedValue) (*sqlexec.Result, error) {
	why := why(b.Refused)
	l := s.c.sqliteCoord
	switch {
	case s.inTx:
		return nil, sqlplan.UnsupportedHint("Run it outside a transaction (or on one shard).",
			"%s; the coordinator that answers such statements over several SQLite files reads only outside a transaction, where the program has no write it could not see", why)
	case s.c.cfg.Rules.NumDataSources() > maxAttached:
		return nil, sqlplan.Unsupported("%s; the coordinator attaches every SQLite file to one connection, and SQLite attaches at most %d (the layout has %d)", why, maxAttached, s.c.cfg.Rules.NumDataSources())
	}
	t := b.Targets[0]
	if what := liteNotCoordinated(t.SQL); what != "" {
		return nil, sqlplan.Unsupported("%s; the coordinator over SQLite files does not answer %s", why, what)
	}
	rels, ctes, err := sqlplan.Relations(t.SQL)
	if err != nil {
		return nil, sqlplan.Unsupported("%s; the coordinator over SQLite files cannot read its names: %v", why, err)
	}
	lt := s.c.sqlite.liteTextOf(b.Plan, t.SQL)
	var r sqlexec.ShardResult
	// A kept connection first; a new one when it cannot resolve a name, or SQLite
	// fails the statement there, since a schema may have changed beside the handle
	// since it attached the files.
	for attempt := 0; ; attempt++ {
		c, err := l.acquire(ctx, attempt > 0)
		if err != nil {
			return nil, sqlplan.Unsupported("%s; the coordinator over SQLite files is not available: %v", why, err)
		}
		if what := l.unresolved(c, rels, ctes); what != "" {
			l.release(c, attempt > 0)
			if attempt == 0 {
				continue
			}
			return nil, sqlplan.Unsupported("%s; the coordinator over SQLite files does not answer a statement naming %s", why, what)
		}
		r, err = runSQLiteTarget(ctx, c.c, nil, b.Plan, lt, t, args)
		l.release(c, err == nil)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, err
		}
		if attempt > 0 {
			return nil, sqlplan.Unsupported("%s; the coordinator over SQLite files could not answer it as one file would (%v)", why, err)
		}
	}
	results := []sqlexec.ShardResult{r}
	if err := unifyTypes(results); err != nil {
		return nil, err
	}
	return &sqlexec.Result{Fields: r.Fields, Rows: r.Rows, Tag: r.Tag}, nil
}
