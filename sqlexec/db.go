package sqlexec

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardlab/shardlab/postgres"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// DB is a sharded database reached through one connection pool per data source: the
// SQL core on its own, without a driver or a proxy in front. Each statement runs in
// autocommit; a statement that writes to several shards runs in a transaction on each.
type DB struct {
	rules   *rules.Compiled
	pools   []*pgxpool.Pool
	catalog *Catalog
	planner *sqlplan.Planner
	engine  *Engine
}

// Open makes a pool for every data source of r, with postgres.Options (pool size and
// timeouts; the zero value gets the defaults). Connections are made on demand, so a data
// source that is down fails only the statements that need it.
func Open(ctx context.Context, r *rules.Compiled, opts postgres.Options) (*DB, error) {
	db := &DB{rules: r}
	opts.Lazy = true
	for _, ds := range r.DataSources() {
		pool, err := postgres.NewPool(ctx, ds.DSN, opts)
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("sqlexec: data source %s: %w", ds.Name, err)
		}
		db.pools = append(db.pools, pool)
	}
	db.catalog = NewCatalog(r, db.acquire)
	db.planner = sqlplan.New(r, db.catalog, sqlplan.Options{})
	db.engine = NewEngine(r, db.catalog)
	return db, nil
}

func (db *DB) acquire(ctx context.Context, ds int) (*pgconn.PgConn, func(error), error) {
	c, err := db.pools[ds].Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	return c.Conn().PgConn(), func(error) { c.Release() }, nil
}

// Planner returns the DB's planner.
func (db *DB) Planner() *sqlplan.Planner { return db.planner }

// Close closes every pool.
func (db *DB) Close() {
	for _, p := range db.pools {
		if p != nil {
			p.Close()
		}
	}
}

// autocommit lends pooled connections for one statement.
type autocommit struct {
	db    *DB
	mu    sync.Mutex
	conns map[*pgconn.PgConn]*pgxpool.Conn
}

func (a *autocommit) Acquire(ctx context.Context, ds int) (*pgconn.PgConn, error) {
	c, err := a.db.pools[ds].Acquire(ctx)
	if err != nil {
		return nil, err
	}
	pc := c.Conn().PgConn()
	a.mu.Lock()
	a.conns[pc] = c
	a.mu.Unlock()
	return pc, nil
}

func (a *autocommit) Release(_ int, conn *pgconn.PgConn, err error) {
	a.mu.Lock()
	c := a.conns[conn]
	delete(a.conns, conn)
	a.mu.Unlock()
	if c == nil {
		return
	}
	var pe *pgconn.PgError
	if err != nil && !errors.As(err, &pe) {
		c.Conn().Close(context.Background()) // a broken connection is not reused
	}
	c.Release()
}

func (a *autocommit) InTransaction() bool { return false }

func (db *DB) conns() *autocommit {
	return &autocommit{db: db, conns: map[*pgconn.PgConn]*pgxpool.Conn{}}
}

// Exec plans (or finds in the cache) one extended-protocol statement, binds args and
// runs it; formats are the result formats (none: text).
func (db *DB) Exec(ctx context.Context, sql string, args sqlplan.Args, formats []int16) (*Result, error) {
	plan, err := db.planner.Prepare(ctx, sql)
	if err != nil {
		return nil, err
	}
	b, err := plan.Bind(args)
	if err != nil {
		return nil, err
	}
	return db.run(ctx, b, args, formats)
}

// SimpleExec runs a simple-protocol query string, which may hold several statements,
// and returns one result per statement; it stops at the first error.
func (db *DB) SimpleExec(ctx context.Context, sql string) ([]*Result, error) {
	var out []*Result
	for _, stmt := range sqlplan.SplitStatements(sql) {
		b, err := db.planner.Simple(ctx, stmt)
		if err != nil {
			return out, err
		}
		r, err := db.run(ctx, b, sqlplan.Args{}, nil)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

func (db *DB) run(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, formats []int16) (*Result, error) {
	switch b.Plan.Kind {
	case sqlplan.KindTransaction, sqlplan.KindSet, sqlplan.KindDiscard, sqlplan.KindCopy:
		return nil, unsupported("%s statements on a DB handle (each statement runs in autocommit)", b.Plan.Kind)
	case sqlplan.KindEmpty:
		return &Result{}, nil
	}
	r, err := db.engine.Execute(ctx, b, args, formats, db.conns())
	if b.Plan.Kind == sqlplan.KindDDL {
		db.catalog.Invalidate()
		db.planner.Invalidate()
	}
	return r, err
}
