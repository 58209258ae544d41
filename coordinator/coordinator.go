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
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
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

	mu struct {
		sync.Mutex
		built   bool
		version uint64 // the schema version Build was last asked for
		err     error  // the last build's failure, until a build succeeds
	}
}

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
	dsn, err := withDatabase(def.DSN, database)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBuild, err)
	}
	return &Coordinator{rules: r, database: database, adminDSN: def.DSN, dsn: dsn}, nil
}

// Database returns the coordinator database's name.
func (c *Coordinator) Database() string { return c.database }

// DSN returns the coordinator database's connection string: the default data source's,
// naming the coordinator database instead.
func (c *Coordinator) DSN() string { return c.dsn }

// Ready builds the coordinator database unless it was built for schema version
// (a counter of schema changes its caller keeps; a new one rebuilds it). Concurrent
// callers wait for one build. A failed build is tried again at the next call.
func (c *Coordinator) Ready(ctx context.Context, version uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.built && c.mu.version == version {
		return nil
	}
	if err := c.build(ctx); err != nil {
		c.mu.built, c.mu.err = false, err
		return err
	}
	c.mu.built, c.mu.version, c.mu.err = true, version, nil
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
func (c *Coordinator) build(ctx context.Context) error {
	locale, err := c.sameLocale(ctx)
	if err != nil {
		return err
	}
	if err := c.createDatabase(ctx, locale); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, c.dsn)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBuild, err)
	}
	defer conn.Close(context.Background())
	if err := c.buildSchema(ctx, conn); err != nil {
		return fmt.Errorf("%w: %v", ErrBuild, err)
	}
	return nil
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

// sameLocale reads every data source's locale; it refuses a layout whose data sources
// disagree, where a coordinator would sort text differently from one of them.
func (c *Coordinator) sameLocale(ctx context.Context) (locale, error) {
	var first locale
	for i, ds := range c.rules.DataSources() {
		conn, err := pgx.Connect(ctx, ds.DSN)
		if err != nil {
			return locale{}, fmt.Errorf("%w: data source %s: %v", ErrBuild, ds.Name, err)
		}
		var l locale
		err = conn.QueryRow(ctx, `SELECT datlocprovider::text, datcollate, datctype, coalesce(daticulocale, '')
			FROM pg_database WHERE datname = current_database()`).Scan(&l.provider, &l.collate, &l.ctype, &l.icu)
		conn.Close(context.Background())
		if err != nil {
			return locale{}, fmt.Errorf("%w: data source %s: %v", ErrBuild, ds.Name, err)
		}
		if i == 0 {
			first = l
		} else if l != first {
			return locale{}, fmt.Errorf("%w: data source %s has %s, %s has %s: a coordinator would sort text unlike one of them",
				ErrBuild, ds.Name, l, c.rules.DataSources()[0].Name, first)
		}
	}
	return first, nil
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
	if exists {
		return nil
	}
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
	fdwSchema    = "shardlab_fdw"    // postgres_fdw's functions, out of the clients' way
	shardsSchema = "shardlab_shards" // the foreign tables of sharded tables' shards
	importSchema = "shardlab_import" // scratch: a shard's table, imported to read its columns
)

// buildSchema makes the coordinator database's schema anew in one transaction, under
// an advisory lock that keeps two builders from interleaving. Statements running on
// the old schema finish first; those that come meanwhile wait for the new one.
func (c *Coordinator) buildSchema(ctx context.Context, conn *pgx.Conn) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	b := &builder{ctx: ctx, tx: tx, rules: c.rules}
	b.exec("SELECT pg_advisory_xact_lock($1)", lockKey)
	b.exec("CREATE SCHEMA IF NOT EXISTS " + fdwSchema)
	b.exec("CREATE EXTENSION IF NOT EXISTS postgres_fdw SCHEMA " + fdwSchema)
	b.exec("DROP SCHEMA IF EXISTS " + shardsSchema + " CASCADE")
	b.exec("DROP SCHEMA IF EXISTS " + importSchema + " CASCADE")
	b.exec("DROP SCHEMA IF EXISTS public CASCADE")
	b.exec("CREATE SCHEMA public")
	b.exec("CREATE SCHEMA " + shardsSchema)
	b.exec("CREATE SCHEMA " + importSchema)
	b.servers()
	b.tables()
	b.exec("DROP SCHEMA " + importSchema + " CASCADE")
	if b.err != nil {
		return b.err
	}
	return tx.Commit(ctx)
}

// lockKey is the advisory lock builders of one coordinator database take.
var lockKey = func() int64 {
	h := fnv.New64a()
	h.Write([]byte("shardlab coordinator build"))
	return int64(h.Sum64())
}()

// builder runs the statements of one build, keeping the first error.
type builder struct {
	ctx   context.Context
	tx    pgx.Tx
	rules *rules.Compiled
	err   error
	// schemas is each data source's schema of tables (its DSN's search_path, else
	// public).
	schemas []string
}

func (b *builder) exec(sql string, args ...any) {
	if b.err != nil {
		return
	}
	if _, err := b.tx.Exec(b.ctx, sql, args...); err != nil {
		b.err = fmt.Errorf("%s: %w", firstLine(sql), err)
	}
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
// only the login itself and superusers can read.
func (b *builder) servers() {
	for i, ds := range b.rules.DataSources() {
		cfg, err := pgconn.ParseConfig(ds.DSN)
		if err != nil && b.err == nil {
			b.err = fmt.Errorf("data source %s: %v", ds.Name, err)
			return
		}
		schema := "public"
		if sp := cfg.RuntimeParams["search_path"]; sp != "" {
			schema = strings.TrimSpace(strings.Split(sp, ",")[0])
		}
		b.schemas = append(b.schemas, schema)
		// keep_connections off: a coordinator session holds its connections to the
		// shards only while a statement runs, not for as long as the proxy keeps it
		// pooled, where they would count against every shard's max_connections.
		// use_remote_estimate: the shards' own statistics plan the joins, since
		// autovacuum never analyzes foreign tables.
		opts := []string{"host", cfg.Host, "port", fmt.Sprint(cfg.Port), "dbname", cfg.Database,
			"async_capable", "true", "fetch_size", "10000", "use_remote_estimate", "true", "keep_connections", "off"}
		b.exec(fmt.Sprintf("DROP SERVER IF EXISTS %s CASCADE", b.serverName(i)))
		b.exec(fmt.Sprintf("CREATE SERVER %s FOREIGN DATA WRAPPER postgres_fdw OPTIONS (%s)", b.serverName(i), options(opts...)))
		mapping := []string{"user", cfg.User}
		if cfg.Password != "" {
			mapping = append(mapping, "password", cfg.Password)
		}
		b.exec(fmt.Sprintf("CREATE USER MAPPING FOR CURRENT_USER SERVER %s OPTIONS (%s)", b.serverName(i), options(mapping...)))
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

// tables makes every logical table: the sharded ones from their shards, the others
// imported from the default data source.
func (b *builder) tables() {
	if b.err != nil {
		return
	}
	def := b.rules.DefaultDataSource()
	names, err := b.relations(def)
	if err != nil {
		b.err = err
		return
	}
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
	var imported []string
	for _, name := range names {
		r := b.rules.Lookup(name)
		if physical[name] || r != nil && r.Kind == rules.KindSharded {
			continue
		}
		imported = append(imported, pgx.Identifier{name}.Sanitize())
	}
	if len(imported) > 0 {
		b.exec(fmt.Sprintf("IMPORT FOREIGN SCHEMA %s LIMIT TO (%s) FROM SERVER %s INTO public",
			pgx.Identifier{b.schemas[def]}.Sanitize(), strings.Join(imported, ", "), b.serverName(def)))
	}
	for i, r := range sharded {
		b.sharded(i, r)
	}
}

// relations lists the tables, views and foreign tables of data source ds's schema.
func (b *builder) relations(ds int) ([]string, error) {
	conn, err := pgx.Connect(b.ctx, b.rules.DataSources()[ds].DSN)
	if err != nil {
		return nil, fmt.Errorf("data source %s: %v", b.rules.DataSources()[ds].Name, err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(b.ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND NOT c.relispartition ORDER BY c.relname`, b.schemas[ds])
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// sharded makes the logical table of a sharded table: a hash-partitioned table over
// its shards when pghash places its rows, else a view over them.
func (b *builder) sharded(index int, r *rules.TableRule) {
	if b.err != nil {
		return
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
		return fmt.Sprintf("%s.%s", shardsSchema, pgx.Identifier{fmt.Sprintf("t%d_%d", index, i)}.Sanitize())
	}
	remote := func(n rules.Node) string {
		s := n.Schema
		if s == "" {
			s = b.schemas[n.DataSource]
		}
		return fmt.Sprintf("SERVER %s OPTIONS (%s)", b.serverName(n.DataSource), options("schema_name", s, "table_name", n.Table))
	}
	if key, ok := hashPartitioned(r); ok {
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
func withDatabase(dsn, database string) (string, error) {
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
		return dsn[:i] + hostPath + rest[end:], nil
	}
	// key=value form: a later dbname wins.
	return dsn + " dbname=" + literal(database), nil
}
