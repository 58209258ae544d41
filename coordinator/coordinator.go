// Package coordinator keeps a coordinator database: one PostgreSQL database, on the
// server of a layout's default data source, in which every logical table of the layout
// is a table whose rows are the shards' (postgres_fdw foreign tables). A statement the
// sharding layer's own merge cannot answer exactly runs there as the client wrote it,
// and PostgreSQL evaluates it with its own semantics: joins on any column, CTEs,
// window functions, expressions over aggregates.
//
// What the coordinator database holds, rebuilt whole by Build in one transaction:
//   - a foreign server per data source (ds_0, ds_1, ... as the rules name them), with a
//     user mapping for the coordinator's own login only (no PUBLIC mapping);
//   - a sharded table hashed with pghash over one strategy: a PARTITION BY HASH table,
//     whose partitions are foreign tables on the shards, shard i being remainder i of
//     modulus len(Nodes), which is the placement pghash routes by;
//   - any other sharded table (crc32, jump, mod, range, or separate database and table
//     strategies): a view, the UNION ALL of its foreign tables, without pruning;
//   - broadcast tables and the default data source's tables: foreign tables on the
//     default data source, imported with their columns' collations and NOT NULL.
//
// The coordinator only reads: writes run on the shards' own connections (postgres_fdw
// sessions have no two-phase commit and cannot see a client's uncommitted writes).
package coordinator

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// ErrBuild is wrapped by the errors of a coordinator database that could not be built.
var ErrBuild = errors.New("coordinator: cannot build the coordinator database")

// Coordinator builds and keeps in step the coordinator database of one layout. It is
// safe for concurrent use.
type Coordinator struct {
	rules    *rules.Compiled
	database string
	adminDSN string // the default data source's
	dsn      string // the coordinator database's
	refused  error  // why it answers nothing (a setting it cannot carry), if so

	// turn is held by the one caller of Ready that surveys and builds; the others
	// wait for it, or for their context.
	turn chan struct{}

	mu struct {
		sync.Mutex
		built bool
		// fingerprint is the data sources' schemas as the last build saw them: a
		// schema change made beside the proxy rebuilds too.
		fingerprint string
		// surveyors are connections to each data source, kept for the survey each
		// coordinated statement starts with.
		surveyors []*pgx.Conn
		// changed: the last build followed a schema change made beside the caller.
		changed bool
		closed  bool
		version uint64 // the schema version Build was last asked for
		err     error  // the last build's failure, until a build succeeds
		failed  time.Time
		relay   *relay
		// tempLimit is the coordinator database's temp_file_limit, in kB (0: the
		// server's).
		tempLimit int64
		// skipped are the logical tables the last build could not make, with why.
		skipped map[string]string
		// owner holds, while the relay runs, a session advisory lock in the
		// coordinator database that says whose relay its foreign servers point at.
		owner *pgx.Conn
	}
}

// retryBuild is how long a failed build is not tried again.
const retryBuild = 5 * time.Second

// DefaultDatabase returns the coordinator database's usual name for a layout whose
// default data source's database is db.
func DefaultDatabase(db string) string { return db + "_coordinator" }

// New returns the coordinator of layout r, in database (DefaultDatabase of the default
// data source's database when empty) on the default data source's server. It makes no
// connection.
func New(r *rules.Compiled, database string) (*Coordinator, error) {
	def := r.DataSources()[r.DefaultDataSource()]
	cfg, err := pgconn.ParseConfig(def.DSN)
	if err != nil {
		return nil, fmt.Errorf("%w: data source %s: %v", ErrBuild, def.Name, err)
	}
	if database == "" {
		database = DefaultDatabase(cfg.Database)
	}
	if database == cfg.Database {
		return nil, fmt.Errorf("%w: the coordinator database %q is a data source's", ErrBuild, database)
	}
	for _, ds := range r.DataSources() {
		c, err := pgconn.ParseConfig(ds.DSN)
		if err != nil {
			return nil, fmt.Errorf("%w: data source %s: %v", ErrBuild, ds.Name, err)
		}
		if c.Database == database && c.Host == cfg.Host && c.Port == cfg.Port {
			return nil, fmt.Errorf("%w: the coordinator database %q is data source %s's", ErrBuild, database, ds.Name)
		}
	}
	// The default data source's settings (its options) shape how its values are
	// written: the coordinator's sessions take the same, or answer nothing.
	kept, other := carriedOptions(cfg.RuntimeParams["options"])
	var refused error
	if other != "" {
		refused = fmt.Errorf("%w: data source %s's connection string sets %s in its options, which the coordinator database does not carry (it could name other schemas there, or change its reading of the shards); set only how values are written and read, limits and planner choices there", ErrBuild, def.Name, other)
	}
	dsn, err := withDatabase(def.DSN, database, kept)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBuild, err)
	}
	return &Coordinator{rules: r, database: database, adminDSN: def.DSN, dsn: dsn, refused: refused, turn: make(chan struct{}, 1)}, nil
}

// Skipped returns the logical tables the last build could not make in the coordinator
// database, each with why (a type the coordinator does not have, row-level security, a
// shard that is not a plain table): statements naming them are not answered there.
func (c *Coordinator) Skipped() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.mu.skipped)
}

// Database returns the coordinator database's name.
func (c *Coordinator) Database() string { return c.database }

// DSN returns the coordinator database's connection string: the default data source's,
// naming the coordinator database instead.
func (c *Coordinator) DSN() string { return c.dsn }

// Ready makes the coordinator database ready for a statement: it surveys the data
// sources (their locale, schemas and columns, on connections it keeps) and builds the
// database again when it was not built for this schema version (a counter of schema
// changes its caller keeps) or the data sources' schemas changed since. Concurrent
// callers wait for one build, or until ctx ends. A failed build is not tried again
// for a few seconds.
func (c *Coordinator) Ready(ctx context.Context, version uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.turn }()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed {
		return fmt.Errorf("%w: the coordinator is closed", ErrBuild)
	}
	if c.refused != nil {
		return c.refused
	}
	if c.mu.err != nil && time.Since(c.mu.failed) < retryBuild {
		return c.mu.err // a server without postgres_fdw, a login without CREATEDB: not at every statement
	}
	// A client that goes away does not stop a build the next statement needs too (nor
	// lose the hold a cancelled ping would drop).
	work, cancel := context.WithTimeout(context.WithoutCancel(ctx), buildTimeout)
	defer cancel()
	err := c.ready(work, version)
	if err != nil {
		c.mu.built, c.mu.err, c.mu.failed = false, err, time.Now()
		return err
	}
	c.mu.err = nil
	if c.mu.changed {
		c.mu.changed = false
		return ErrSchemaChanged
	}
	return nil
}

// ErrSchemaChanged is returned by Ready when it rebuilt the coordinator database after
// a schema change made on the data sources themselves: what the caller planned from
// its own view of their catalogs may be stale, and the statement should be planned
// again (the proxy refuses it once).
var ErrSchemaChanged = errors.New("coordinator: the data sources' schemas changed since the last build")

// buildTimeout bounds one survey and build.
const buildTimeout = 2 * time.Minute

func (c *Coordinator) ready(ctx context.Context, version uint64) error {
	if c.mu.owner != nil && c.mu.owner.Ping(ctx) != nil {
		// The hold was lost (the server restarted, say): another proxy may have
		// pointed the foreign servers at its own relay since.
		c.mu.owner.Close(context.Background())
		c.mu.owner, c.mu.built = nil, false
	}
	sv, err := c.survey(ctx)
	if err != nil {
		return err
	}
	if c.mu.built && c.mu.version == version && c.mu.fingerprint == sv.fingerprint {
		return nil
	}
	c.mu.changed = c.mu.built && c.mu.version == version // only the shards' own schemas changed
	c.mu.built = false
	if err := c.build(ctx, sv); err != nil {
		return err
	}
	c.mu.built, c.mu.version, c.mu.fingerprint = true, version, sv.fingerprint
	return nil
}

// StartRelay starts the relay through which the coordinator database reads the
// shards (see Movement), listening on host (an address the default data source's server
// can reach; port 0 picks free ports, one per data source). From then on the coordinator
// database is its caller's alone: Ready refuses it while another relay's owner holds it.
func (c *Coordinator) StartRelay(host string) error {
	var targets []string
	for _, ds := range c.rules.DataSources() {
		cfg, err := pgconn.ParseConfig(ds.DSN)
		if err != nil {
			return fmt.Errorf("%w: data source %s: %v", ErrBuild, ds.Name, err)
		}
		if strings.HasPrefix(cfg.Host, "/") {
			targets = append(targets, fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port))
		} else {
			targets = append(targets, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
		}
	}
	// Connections come from the coordinator database's server: the default data
	// source's host.
	var peers []net.IP
	if cfg, err := pgconn.ParseConfig(c.adminDSN); err == nil && !strings.HasPrefix(cfg.Host, "/") {
		if ips, err := net.LookupIP(cfg.Host); err == nil {
			peers = ips
		}
	}
	r, err := startRelay(host, targets, peers)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.relay != nil {
		r.close()
		return errors.New("coordinator: the relay runs already")
	}
	c.mu.relay, c.mu.built = r, false
	return nil
}

// SetTempFileLimit makes the coordinator database's sessions stop a statement whose
// temporary files (sorts and hashes of the rows read from the shards) pass n bytes
// (PostgreSQL's temp_file_limit), from the next build on. Only a superuser may set it;
// for another login the server's own setting stays.
func (c *Coordinator) SetTempFileLimit(n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.tempLimit, c.mu.built = max(n>>10, 1), false
}

// Track starts counting what the statement that coordinator backend pid runs next
// reads from the shards, and cuts it off past limit bytes (0: no bound). It returns
// nil without a relay. Call Untrack when the statement ends.
func (c *Coordinator) Track(pid uint32, limit int64) *Movement {
	c.mu.Lock()
	r := c.mu.relay
	c.mu.Unlock()
	if r == nil {
		return nil
	}
	return r.track(pid, limit)
}

// Untrack ends Track.
func (c *Coordinator) Untrack(pid uint32) {
	c.mu.Lock()
	r := c.mu.relay
	c.mu.Unlock()
	if r != nil {
		r.untrack(pid)
	}
}

// Close stops the relay, closes the survey's connections and gives the coordinator
// database up. It is idempotent.
func (c *Coordinator) Close() error {
	c.mu.Lock()
	r, owner, surveyors := c.mu.relay, c.mu.owner, c.mu.surveyors
	c.mu.relay, c.mu.owner, c.mu.built, c.mu.surveyors, c.mu.closed = nil, nil, false, nil, true
	c.mu.Unlock()
	if r != nil {
		r.close()
	}
	for _, conn := range surveyors {
		if conn != nil {
			conn.Close(context.Background())
		}
	}
	if owner != nil {
		return owner.Close(context.Background())
	}
	return nil
}

// own takes, or checks that it still holds, the coordinator database for this
// coordinator's relay; a new hold rebuilds the foreign servers.
func (c *Coordinator) own(ctx context.Context) error {
	if c.mu.relay == nil {
		return nil
	}
	if c.mu.owner != nil {
		return nil
	}
	conn, err := pgx.Connect(ctx, c.dsn)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBuild, err)
	}
	// A proxy's previous layout may still be giving the database up (a layout switch
	// closes the old coordinator beside the new one's first statements): wait a little.
	_, err = conn.Exec(ctx, "SET lock_timeout = '5s'")
	if err == nil {
		_, err = conn.Exec(ctx, "SELECT pg_advisory_lock($1)", ownerKey)
	}
	if err != nil {
		conn.Close(context.Background())
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55P03" {
			return fmt.Errorf("%w: the coordinator database %q is in use by another proxy or driver process; give each its own (shard-proxy --coordinator-database, shardsql.Config.CoordinatorDatabase)", ErrBuild, c.database)
		}
		return fmt.Errorf("%w: %v", ErrBuild, err)
	}
	c.mu.owner, c.mu.built = conn, false
	return nil
}

// Drop removes the coordinator database (for tests and tools that made one for a
// layout they are done with).
func (c *Coordinator) Drop(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.adminDSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{c.database}.Sanitize()+" WITH (FORCE)")
	return err
}

// build makes the coordinator database if it is missing, then its schema.
func (c *Coordinator) build(ctx context.Context, sv *survey) error {
	if err := c.createDatabase(ctx, sv.locale); err != nil {
		return err
	}
	if err := c.own(ctx); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, c.dsn)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBuild, err)
	}
	defer conn.Close(context.Background())
	if err := c.buildSchema(ctx, conn, sv); err != nil {
		return fmt.Errorf("%w: %v", ErrBuild, err)
	}
	if err := c.analyze(ctx, conn); err != nil {
		return fmt.Errorf("%w: ANALYZE: %v", ErrBuild, err)
	}
	return nil
}

// analyze gathers the coordinator's statistics of its tables, from samples of the
// shards' rows: autovacuum never analyzes foreign tables, and without statistics the
// coordinator's planner guesses every join's size (and picks nested loops over
// millions of rows).
func (c *Coordinator) analyze(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, "SET default_transaction_read_only = off"); err != nil {
		return err
	}
	rows, err := conn.Query(ctx, `SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname IN ('public', $1) AND c.relkind IN ('f', 'p') ORDER BY 1`, shardsSchema)
	if err != nil {
		return err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(tables) == 0 {
		return err
	}
	// The sample travels through the relay, which passes on only what it counts.
	pid := conn.PgConn().PID()
	if c.mu.relay != nil {
		c.mu.relay.track(pid, 0)
		defer c.mu.relay.untrack(pid)
	}
	_, err = conn.Exec(ctx, "ANALYZE "+strings.Join(tables, ", "))
	return err
}

// locale is how a database sorts and classifies text.
type locale struct {
	provider, collate, ctype, icu string
}

func (l locale) String() string {
	if l.provider == "i" {
		return fmt.Sprintf("ICU locale %s", l.icu)
	}
	return fmt.Sprintf("collation %s, ctype %s", l.collate, l.ctype)
}

// survey is what the data sources say of themselves before a coordinator statement.
type survey struct {
	locale locale
	// schemas is each data source's schema of tables (its current_schema(), which a
	// DSN's search_path names for shards that are schemas).
	schemas []string
	// tables are, per data source, the tables (and partitioned and foreign tables)
	// of its schema without row-level security: only those become the coordinator's.
	// Views are left out: postgres_fdw evaluates them on the shard in a session that
	// has none of the client's settings.
	tables []map[string]bool
	// fingerprint sums up every data source's columns.
	fingerprint string
}

// surveySQL reads a data source's locale, schema, plain tables and columns.
const surveySQL = `SELECT d.datlocprovider::text, d.datcollate, d.datctype, coalesce(d.daticulocale, ''), current_schema(),
	coalesce((SELECT array_agg(c.relname::text ORDER BY c.relname) FROM pg_class c
	   WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p', 'f') AND NOT c.relrowsecurity
	     AND NOT c.relispartition), '{}'),
	(SELECT md5(coalesce(string_agg(c.relname || '.' || a.attnum || ':' || a.attname || ':' || a.atttypid || ':' || a.atttypmod
	     || ':' || a.attnotnull || ':' || a.attcollation || ':' || c.relrowsecurity || ':' || c.relkind::text, ',' ORDER BY c.relname, a.attnum), ''))
	   FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
	  WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p', 'f', 'v', 'm'))
	FROM pg_database d WHERE d.datname = current_database()`

// survey asks every data source, on the connections the coordinator keeps; it refuses
// a layout whose data sources sort text differently, where a coordinator would sort
// unlike one of them.
func (c *Coordinator) survey(ctx context.Context) (*survey, error) {
	dss := c.rules.DataSources()
	if c.mu.surveyors == nil {
		c.mu.surveyors = make([]*pgx.Conn, len(dss))
	}
	sv := &survey{}
	var sums []string
	for i, ds := range dss {
		conn := c.mu.surveyors[i]
		if conn == nil || conn.IsClosed() {
			var err error
			if conn, err = pgx.Connect(ctx, ds.DSN); err != nil {
				return nil, fmt.Errorf("%w: data source %s: %v", ErrBuild, ds.Name, err)
			}
			c.mu.surveyors[i] = conn
		}
		var l locale
		var schema, sum string
		var tables []string
		if err := conn.QueryRow(ctx, surveySQL).Scan(&l.provider, &l.collate, &l.ctype, &l.icu, &schema, &tables, &sum); err != nil {
			conn.Close(context.Background())
			c.mu.surveyors[i] = nil
			return nil, fmt.Errorf("%w: data source %s: %v", ErrBuild, ds.Name, err)
		}
		if i == 0 {
			sv.locale = l
		} else if l != sv.locale {
			return nil, fmt.Errorf("%w: data source %s has %s, %s has %s: a coordinator would sort text unlike one of them",
				ErrBuild, ds.Name, l, dss[0].Name, sv.locale)
		}
		set := map[string]bool{}
		for _, t := range tables {
			set[t] = true
		}
		sv.schemas = append(sv.schemas, schema)
		sv.tables = append(sv.tables, set)
		sums = append(sums, schema+"/"+sum)
	}
	sv.fingerprint = strings.Join(sums, ",")
	return sv, nil
}

// createDatabase makes the coordinator database with the data sources' locale, unless
// it exists.
func (c *Coordinator) createDatabase(ctx context.Context, l locale) error {
	conn, err := pgx.Connect(ctx, c.adminDSN)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBuild, err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", c.database).Scan(&exists); err != nil {
		return fmt.Errorf("%w: %v", ErrBuild, err)
	}
	if !exists {
		if err := c.create(ctx, conn, l); err != nil {
			return err
		}
	} else {
		var have locale
		if err := conn.QueryRow(ctx, `SELECT datlocprovider::text, datcollate, datctype, coalesce(daticulocale, '')
			FROM pg_database WHERE datname = $1`, c.database).Scan(&have.provider, &have.collate, &have.ctype, &have.icu); err != nil {
			return fmt.Errorf("%w: %v", ErrBuild, err)
		}
		if have != l {
			return fmt.Errorf("%w: the database %q exists with %s, the data sources have %s: it would sort text unlike them; drop it, or name another (--coordinator-database)",
				ErrBuild, c.database, have, l)
		}
	}
	if c.mu.tempLimit > 0 {
		_, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s SET temp_file_limit = '%dkB'", pgx.Identifier{c.database}.Sanitize(), c.mu.tempLimit))
		var pe *pgconn.PgError
		if err != nil && !(errors.As(err, &pe) && pe.Code == "42501") {
			return fmt.Errorf("%w: %v", ErrBuild, err)
		}
	}
	return nil
}

// create makes the coordinator database.
func (c *Coordinator) create(ctx context.Context, conn *pgx.Conn, l locale) error {
	create := fmt.Sprintf("CREATE DATABASE %s TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE %s LC_CTYPE %s",
		pgx.Identifier{c.database}.Sanitize(), literal(l.collate), literal(l.ctype))
	if l.provider == "i" {
		create += " LOCALE_PROVIDER icu ICU_LOCALE " + literal(l.icu)
	}
	if _, err := conn.Exec(ctx, create); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42P04" {
			return nil // another coordinator made it meanwhile
		}
		return fmt.Errorf("%w: %v", ErrBuild, err)
	}
	return nil
}

// Schemas of the coordinator database besides public, where the logical tables are.
const (
	fdwSchema    = "shardlab_fdw"                  // postgres_fdw's functions, out of the clients' way
	shardsSchema = sqlplan.CoordinatorShardsSchema // the foreign tables of sharded tables' shards
	mergeSchema  = sqlplan.CoordinatorMergeSchema  // what combines the shards' partial aggregates
	importSchema = "shardlab_import"               // scratch: a shard's table, imported to read its columns
)

// buildSchema makes the coordinator database's schema anew in one transaction, under
// an advisory lock that keeps two builders from interleaving. Statements running on
// the old schema finish first; those that come meanwhile wait for the new one.
func (c *Coordinator) buildSchema(ctx context.Context, conn *pgx.Conn, sv *survey) error {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadWrite}) // the database's default is read only

	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	b := &builder{ctx: ctx, tx: tx, rules: c.rules, relay: c.mu.relay, schemas: sv.schemas, tables: sv.tables}
	// A statement running on the old schema finishes first; past the timeout the
	// build fails and is tried again, rather than hold every statement behind it.
	b.exec("SET LOCAL lock_timeout = '10s'")
	b.exec("SELECT pg_advisory_xact_lock($1)", lockKey)
	b.exec("CREATE SCHEMA IF NOT EXISTS " + fdwSchema)
	b.exec("CREATE EXTENSION IF NOT EXISTS postgres_fdw SCHEMA " + fdwSchema)
	// Parents before their partitions, as a statement locks them.
	b.exec("DROP SCHEMA IF EXISTS public CASCADE")
	b.exec("DROP SCHEMA IF EXISTS " + shardsSchema + " CASCADE")
	b.exec("DROP SCHEMA IF EXISTS " + importSchema + " CASCADE")
	b.exec("DROP SCHEMA IF EXISTS " + mergeSchema + " CASCADE")
	b.exec("CREATE SCHEMA public")
	b.exec("CREATE SCHEMA " + shardsSchema)
	b.exec("CREATE SCHEMA " + importSchema)
	b.mergeAggregates()
	// Statements there only read: a function that would write (a large object, say)
	// fails instead.
	b.exec(fmt.Sprintf("ALTER DATABASE %s SET default_transaction_read_only = on", pgx.Identifier{c.database}.Sanitize()))
	b.servers()
	b.logicalTables()
	b.exec("DROP SCHEMA " + importSchema + " CASCADE")
	if b.err != nil {
		return b.err
	}
	c.mu.skipped = b.skipped
	return tx.Commit(ctx)
}

// lockKey is the advisory lock builders of one coordinator database take; ownerKey
// the one a relay's owner holds for as long as the foreign servers point at its relay.
var lockKey, ownerKey = advisoryKey("shardlab coordinator build"), advisoryKey("shardlab coordinator owner")

func advisoryKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64())
}

// builder runs the statements of one build, keeping the first error.
type builder struct {
	ctx   context.Context
	tx    pgx.Tx
	rules *rules.Compiled
	relay *relay // nil: the foreign servers connect to the shards themselves
	err   error
	// schemas and tables are the survey's.
	schemas []string
	tables  []map[string]bool
	// skipped are the logical tables the coordinator could not make (a type it does
	// not have, row-level security, a shard without the table), with why.
	skipped map[string]string
}

// exec runs one statement of the build; what labels it in an error (the statement's
// first line by default; never a statement that carries a password).
func (b *builder) exec(sql string, args ...any) {
	b.execAs(firstLine(sql), sql, args...)
}

func (b *builder) execAs(label, sql string, args ...any) {
	if b.err != nil {
		return
	}
	if _, err := b.tx.Exec(b.ctx, sql, args...); err != nil {
		b.err = fmt.Errorf("%s: %w", label, err)
	}
}

// try runs the statements of one logical table in a savepoint: when one fails, the
// table is skipped (its statements are then refused, naming why), not the build.
func (b *builder) try(table string, fn func()) {
	if b.err != nil {
		return
	}
	b.exec("SAVEPOINT shardlab_table")
	if b.err != nil {
		return
	}
	fn()
	if b.err == nil {
		b.exec("RELEASE SAVEPOINT shardlab_table")
		return
	}
	why := b.err
	b.err = nil
	b.exec("ROLLBACK TO SAVEPOINT shardlab_table")
	if b.skipped == nil {
		b.skipped = map[string]string{}
	}
	b.skipped[table] = why.Error()
}

func firstLine(sql string) string {
	if i := strings.IndexByte(sql, '\n'); i >= 0 {
		return sql[:i]
	}
	return sql
}

// serverName is the foreign server of data source ds.
func (b *builder) serverName(ds int) string {
	return pgx.Identifier{b.rules.DataSources()[ds].Name}.Sanitize()
}

// servers makes a foreign server and a user mapping for the builder's own login per
// data source. The login's password, if its DSN has one, goes into the mapping, which
// only the login itself and superusers can read (and which no coordinated statement
// may name: sqlplan refuses the catalogs there).
func (b *builder) servers() {
	for i, ds := range b.rules.DataSources() {
		cfg, err := pgconn.ParseConfig(ds.DSN)
		if err != nil && b.err == nil {
			b.err = fmt.Errorf("data source %s: %v", ds.Name, err)
			return
		}
		// A coordinator session keeps its connections to the shards (postgres_fdw's
		// keep_connections): the coordinator's pool is small (a few statements at
		// once), so every shard sees at most that many more. use_remote_estimate: the
		// shards' own statistics plan the joins, since autovacuum never analyzes
		// foreign tables.
		host, port := cfg.Host, int(cfg.Port)
		if b.relay != nil {
			host, port = b.relay.addr(i)
		}
		opts := []string{"host", host, "port", strconv.Itoa(port), "dbname", cfg.Database,
			"async_capable", "true", "fetch_size", "10000", "use_remote_estimate", "true",
			"application_name", appNamePrefix + "%p"}
		b.exec(fmt.Sprintf("DROP SERVER IF EXISTS %s CASCADE", b.serverName(i)))
		b.exec(fmt.Sprintf("CREATE SERVER %s FOREIGN DATA WRAPPER postgres_fdw OPTIONS (%s)", b.serverName(i), options(opts...)))
		mapping := []string{"user", cfg.User}
		if cfg.Password != "" {
			mapping = append(mapping, "password", cfg.Password)
		}
		b.execAs("CREATE USER MAPPING for data source "+ds.Name,
			fmt.Sprintf("CREATE USER MAPPING FOR CURRENT_USER SERVER %s OPTIONS (%s)", b.serverName(i), options(mapping...)))
	}
}

// options renders name, value pairs as a postgres_fdw OPTIONS list.
func options(pairs ...string) string {
	var parts []string
	for i := 0; i+1 < len(pairs); i += 2 {
		parts = append(parts, pairs[i]+" "+literal(pairs[i+1]))
	}
	return strings.Join(parts, ", ")
}

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// logicalTables makes every logical table: the sharded ones from their shards, the
// others imported from the default data source.
func (b *builder) logicalTables() {
	if b.err != nil {
		return
	}
	def := b.rules.DefaultDataSource()
	names := slices.Sorted(maps.Keys(b.tables[def]))
	for _, t := range b.rules.Rules().Tables {
		if !strings.HasSuffix(t.Name, "*") && !slices.Contains(names, t.Name) {
			names = append(names, t.Name)
		}
	}
	// Physical tables of sharded tables that are not logical tables themselves
	// (people_0 of a split table) are not the client's.
	physical := map[string]bool{}
	var sharded []*rules.TableRule
	for _, name := range names {
		r := b.rules.Lookup(name)
		if r == nil || r.Kind != rules.KindSharded {
			continue
		}
		sharded = append(sharded, r)
		for _, n := range r.Nodes {
			if n.DataSource == def && n.Table != name {
				physical[n.Table] = true
			}
		}
	}
	for _, name := range names {
		r := b.rules.Lookup(name)
		if physical[name] || r != nil && r.Kind == rules.KindSharded || !b.tables[def][name] {
			continue
		}
		b.try(name, func() {
			b.exec(fmt.Sprintf("IMPORT FOREIGN SCHEMA %s LIMIT TO (%s) FROM SERVER %s INTO public",
				pgx.Identifier{b.schemas[def]}.Sanitize(), pgx.Identifier{name}.Sanitize(), b.serverName(def)))
		})
	}
	for i, r := range sharded {
		b.try(r.Name, func() { b.sharded(i, r) })
	}
}

// sharded makes the logical table of a sharded table: a hash-partitioned table over
// its shards when pghash places its rows, else a view over them.
func (b *builder) sharded(index int, r *rules.TableRule) {
	if b.err != nil {
		return
	}
	for i, n := range r.Nodes {
		if n.Schema != "" {
			b.err = fmt.Errorf("shard %d of %s is in schema %s, which the coordinator does not survey", i, r.Name, n.Schema)
			return
		}
		if !b.tables[n.DataSource][n.Table] {
			b.err = fmt.Errorf("shard %d of %s (%s on data source %s) is not a plain table without row-level security",
				i, r.Name, n.Table, b.rules.DataSources()[n.DataSource].Name)
			return
		}
	}
	first := r.Nodes[0]
	schema := first.Schema
	if schema == "" {
		schema = b.schemas[first.DataSource]
	}
	b.exec(fmt.Sprintf("IMPORT FOREIGN SCHEMA %s LIMIT TO (%s) FROM SERVER %s INTO %s",
		pgx.Identifier{schema}.Sanitize(), pgx.Identifier{first.Table}.Sanitize(), b.serverName(first.DataSource), importSchema))
	if b.err != nil {
		return
	}
	var columns string
	err := b.tx.QueryRow(b.ctx, `SELECT string_agg(format('%I %s%s%s', a.attname, format_type(a.atttypid, a.atttypmod),
			CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation THEN format(' COLLATE %I.%I', cn.nspname, co.collname) ELSE '' END,
			CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END), ', ' ORDER BY a.attnum)
		FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
		LEFT JOIN pg_collation co ON co.oid = a.attcollation LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace
		WHERE a.attrelid = format('%I.%I', $1::text, $2::text)::regclass AND a.attnum > 0 AND NOT a.attisdropped`,
		importSchema, first.Table).Scan(&columns)
	if err != nil {
		b.err = fmt.Errorf("the columns of %s: %w", r.Name, err)
		return
	}
	logical := "public." + pgx.Identifier{r.Name}.Sanitize()
	shard := func(i int) string {
		name := sqlplan.CoordinatorShardTable(r.Name, i)
		if name == "" {
			name = fmt.Sprintf("t%d_%d", index, i) // too long; its statements run as written
		}
		return pgx.Identifier{shardsSchema, name}.Sanitize()
	}
	remote := func(n rules.Node) string {
		s := n.Schema
		if s == "" {
			s = b.schemas[n.DataSource]
		}
		return fmt.Sprintf("SERVER %s OPTIONS (%s)", b.serverName(n.DataSource), options("schema_name", s, "table_name", n.Table))
	}
	if key, ok := hashPartitioned(r); ok && b.hashesAsRules(r, key, first.Table) {
		b.exec(fmt.Sprintf("CREATE TABLE %s (%s) PARTITION BY HASH (%s)", logical, columns, pgx.Identifier{key}.Sanitize()))
		for i, n := range r.Nodes {
			b.exec(fmt.Sprintf("CREATE FOREIGN TABLE %s PARTITION OF %s FOR VALUES WITH (MODULUS %d, REMAINDER %d) %s",
				shard(i), logical, len(r.Nodes), i, remote(n)))
		}
		return
	}
	var union []string
	for i, n := range r.Nodes {
		b.exec(fmt.Sprintf("CREATE FOREIGN TABLE %s (%s) %s", shard(i), columns, remote(n)))
		union = append(union, "SELECT * FROM "+shard(i))
	}
	b.exec(fmt.Sprintf("CREATE VIEW %s AS %s", logical, strings.Join(union, " UNION ALL ")))
}

// mergeAggregates makes what combines the shards' partial aggregates when sqlplan
// rewrites a statement to aggregate on the shards (sqlplan.Options.ShardAggregates):
// sum adds partial sums keeping their type (a sum of integers is int8; PostgreSQL's
// own sum of int8 would make it numeric), count adds partial counts into an int8 that
// is 0 over none, and avg divides a combined sum by a combined count as PostgreSQL's
// avg does (numeric division; an interval by a float8), NULL over no rows.
func (b *builder) mergeAggregates() {
	b.exec("CREATE SCHEMA " + mergeSchema)
	b.exec(fmt.Sprintf("CREATE AGGREGATE %s.count(int8) (SFUNC = int8pl, STYPE = int8, INITCOND = '0', PARALLEL = SAFE)", mergeSchema))
	for _, sum := range []struct{ typ, add string }{
		{"int8", "int8pl"}, {"numeric", "numeric_add"}, {"money", "cash_pl"}, {"interval", "interval_pl"},
	} {
		b.exec(fmt.Sprintf("CREATE AGGREGATE %s.sum(%s) (SFUNC = %s, STYPE = %s, PARALLEL = SAFE)", mergeSchema, sum.typ, sum.add, sum.typ))
	}
	for _, avg := range []struct{ sum, result, div string }{
		{"int8", "numeric", "$1::numeric / $2::numeric"},
		{"numeric", "numeric", "$1 / $2::numeric"},
		{"interval", "interval", "$1 / $2::float8"},
	} {
		b.exec(fmt.Sprintf(`CREATE FUNCTION %s.avg(%s, int8) RETURNS %s LANGUAGE sql IMMUTABLE PARALLEL SAFE
			AS 'SELECT CASE WHEN $2 = 0 THEN NULL ELSE %s END'`, mergeSchema, avg.sum, avg.result, avg.div))
	}
}

// hashesAsRules reports whether PostgreSQL's hash of the imported table's key column
// is the one the rules place rows by: the column has the type the rules declare (or
// leave to the catalog), and a deterministic collation.
func (b *builder) hashesAsRules(r *rules.TableRule, key, imported string) bool {
	var typ string
	var deterministic bool
	err := b.tx.QueryRow(b.ctx, `SELECT format_type(a.atttypid, NULL), coalesce(co.collisdeterministic, true)
		FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation
		WHERE a.attrelid = format('%I.%I', $1::text, $2::text)::regclass AND a.attname = $3`,
		importSchema, imported, key).Scan(&typ, &deterministic)
	if err != nil || !deterministic {
		return false
	}
	actual, err := rules.ParseKeyType(typ)
	declared := r.KeyType(key)
	return err == nil && (declared == rules.TypeUnknown || declared == actual)
}

// hashPartitioned returns the sharding column of a table that PostgreSQL's own hash
// partitioning places as the rules do: one pghash strategy over every shard, shard i
// being remainder i of modulus len(Nodes).
func hashPartitioned(r *rules.TableRule) (string, bool) {
	cols := r.KeyColumns()
	if len(cols) != 1 || r.Algorithm(cols[0]) != rules.AlgorithmPGHash || !r.SingleStrategy() {
		return "", false
	}
	return cols[0], true
}

// withDatabase returns dsn naming database instead of its own.
func withDatabase(dsn, database, options string) (string, error) {
	if strings.Contains(dsn, "://") {
		i := strings.Index(dsn, "://") + 3
		rest := dsn[i:]
		end := len(rest)
		if q := strings.IndexAny(rest, "?#"); q >= 0 {
			end = q
		}
		hostPath := rest[:end]
		slash := strings.IndexByte(hostPath, '/')
		if slash < 0 {
			hostPath += "/" + url.PathEscape(database)
		} else {
			hostPath = hostPath[:slash+1] + url.PathEscape(database)
		}
		// The coordinator's tables are in public: a shard's search_path is not the
		// coordinator's, and of its options only those carried (options), set even
		// when empty so that PGOPTIONS cannot add others.
		vals := url.Values{}
		if query := rest[end:]; strings.HasPrefix(query, "?") {
			var err error
			if vals, err = url.ParseQuery(query[1:]); err != nil {
				return "", err
			}
		}
		vals.Set("search_path", "public")
		vals.Set("options", options)
		// Spaces as %20: the driver reads a + as itself.
		query := "?" + strings.ReplaceAll(vals.Encode(), "+", "%20")
		return dsn[:i] + hostPath + query, nil
	}
	// key=value form: a later setting wins.
	return dsn + " dbname=" + connValue(database) + " search_path=public options=" + connValue(options), nil
}

// connValue quotes a value of a key=value connection string as libpq reads it: in
// single quotes, a backslash escaping a quote or a backslash.
func connValue(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
