package shardsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
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
// functions whose answer depends on their rows' order without an ORDER BY; statements
// about the session):
//   - a read inside a transaction: the attached files are read through a connection of
//     their own, which cannot see the transaction's writes;
//   - rowids, SQLite's catalog (sqlite_*), pragmas and the functions that answer about
//     the connection (changes(), last_insert_rowid()): the views have no rowid, and the
//     connection is the coordinator's;
//   - any error SQLite raises for the statement there: one file might not have raised it.

// maxAttached is how many files one SQLite connection attaches (SQLITE_MAX_ATTACHED of
// the SQLite library the driver is built with).
const maxAttached = 10

// liteCoordinator keeps the connections that attach every shard file.
type liteCoordinator struct {
	shards   *sqliteShards
	physical map[string]bool // see physicalTables
	memory   *sql.DB         // each connection an empty in-memory database, the files attached to it
	idle     chan *liteConn
	// generation counts the schema changes made through this handle: a connection made
	// for an older one is made again, so that its views have every column.
	generation atomic.Uint64
	closeOnce  sync.Once
}

// liteConn is one attaching connection, made for a schema generation.
type liteConn struct {
	c          *sql.Conn
	generation uint64
	views      map[string]bool // the logical tables it has views of
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
	l.closeOnce.Do(func() {
		for {
			select {
			case c := <-l.idle:
				c.c.Close()
			default:
				l.memory.Close()
				return
			}
		}
	})
}

// acquire returns a connection with every file attached and the views of the current
// schema generation: a kept one, unless fresh.
func (l *liteCoordinator) acquire(ctx context.Context, fresh bool) (*liteConn, error) {
	gen := l.generation.Load()
	for !fresh {
		select {
		case c := <-l.idle:
			if c.generation == gen {
				return c, nil
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
	lc := &liteConn{c: c, generation: gen, views: map[string]bool{}}
	if err := l.attach(ctx, lc); err != nil {
		c.Close()
		return nil, err
	}
	return lc, nil
}

// missingView names a sharded or broadcast table of tables that c has no view of (one
// made since c attached the files, beside this handle), if any: unviewed, its name
// would reach the default data source's part alone.
func (l *liteCoordinator) missingView(c *liteConn, tables []string) string {
	for _, name := range tables {
		if t := l.shards.rules.Lookup(name); t != nil && (t.Kind == rules.KindSharded || t.Kind == rules.KindBroadcast) && !c.views[name] {
			return name
		}
	}
	return ""
}

// release keeps c for the next statement, or closes it if enough are kept.
func (l *liteCoordinator) release(c *liteConn, ok bool) {
	if ok {
		select {
		case l.idle <- c:
			return
		default:
		}
	}
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
	order := []int{def}
	for ds := range r.NumDataSources() {
		if ds != def {
			order = append(order, ds)
		}
	}
	for _, ds := range order {
		if _, err := c.ExecContext(ctx, fmt.Sprintf("ATTACH DATABASE ? AS shard_%d", ds), l.shards.dbs[ds].AttachURI()); err != nil {
			return err
		}
	}
	var names []string
	rows, err := c.QueryContext(ctx, fmt.Sprintf("SELECT name FROM shard_%d.sqlite_schema WHERE type IN ('table', 'view') ORDER BY name", def))
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
	for _, t := range r.Rules().Tables {
		if !strings.HasSuffix(t.Name, "*") && !slices.Contains(names, t.Name) {
			names = append(names, t.Name)
		}
	}
	for _, name := range names {
		t := r.Lookup(name)
		if t == nil || t.Kind == rules.KindDefault || len(t.Nodes) == 0 || l.physical[name] {
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
		var parts []string
		for _, n := range nodes {
			parts = append(parts, fmt.Sprintf("SELECT * FROM shard_%d.%s", n.DataSource, quoteIdent(n.Table)))
		}
		view := fmt.Sprintf("CREATE TEMP VIEW %s AS %s", quoteIdent(name), strings.Join(parts, " UNION ALL "))
		if _, err := c.ExecContext(ctx, view); err != nil {
			return fmt.Errorf("the view of table %s: %w", name, err)
		}
		lc.views[name] = true
	}
	return nil
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
					out[n.Table] = true
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
	if what := liteNotCoordinated(b.Targets[0].SQL); what != "" {
		return nil, sqlplan.Unsupported("%s; the coordinator over SQLite files does not answer %s", why, what)
	}
	for _, name := range b.Plan.Tables {
		if l.physical[name] {
			return nil, sqlplan.Unsupported("%s; it names %s, a physical table of a sharded table", why, name)
		}
	}
	c, err := l.acquire(ctx, false)
	if err == nil && l.missingView(c, b.Plan.Tables) != "" {
		// A table made beside this handle since the connection attached the files.
		l.release(c, false)
		c, err = l.acquire(ctx, true)
	}
	if err != nil {
		return nil, sqlplan.Unsupported("%s; the coordinator over SQLite files is not available: %v", why, err)
	}
	if name := l.missingView(c, b.Plan.Tables); name != "" {
		l.release(c, true)
		return nil, sqlplan.Unsupported("%s; the coordinator over SQLite files has no view of table %s (it is not in the default data source's file)", why, name)
	}
	t := b.Targets[0]
	lt := s.c.sqlite.liteTextOf(b.Plan, t.SQL)
	r, err := runSQLiteTarget(ctx, c.c, nil, b.Plan, lt, t, args)
	l.release(c, err == nil || ctx.Err() == nil)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, sqlplan.Unsupported("%s; the coordinator over SQLite files could not answer it as one file would (%v)", why, err)
	}
	results := []sqlexec.ShardResult{r}
	if err := unifyTypes(results); err != nil {
		return nil, err
	}
	return &sqlexec.Result{Fields: r.Fields, Rows: r.Rows, Tag: r.Tag}, nil
}
