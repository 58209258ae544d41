package sqlexec

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardlab/shardlab/internal/postgresdb"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// DB is a sharded database reached through one connection pool per data source: the
// SQL core on its own, without a driver or a proxy in front. Exec and SimpleExec run
// each statement in autocommit (a statement that writes to several shards runs in a
// transaction on each); Begin opens a transaction across the data sources.
type DB struct {
	rules     *rules.Compiled
	pools     pgxPools
	catalog   *Catalog
	planner   *sqlplan.Planner
	engine    *Engine
	committer *Committer
	settler   *Settler
	detector  *DeadlockDetector
}

// PoolOptions sizes and bounds a data source's pool of PostgreSQL connections.
type PoolOptions = postgresdb.Options

// Config tunes a DB. The zero value is usable.
type Config struct {
	// Pool sizes and bounds each data source's pool (PoolOptions' defaults).
	Pool PoolOptions
	// TwoPhase commits transactions that span data sources with two-phase commit; every
	// data source then needs max_prepared_transactions above zero. Open starts a
	// Settler, which settles transactions left in doubt while the DB is open.
	TwoPhase bool
	// SettleInterval is how often the settler looks for transactions in doubt (0:
	// DefaultSettleInterval; negative: only when Open starts it).
	SettleInterval time.Duration
	// DeadlockInterval is how often transactions are checked for deadlocks across data
	// sources (0: DefaultDeadlockInterval; negative: never).
	DeadlockInterval time.Duration
}

// Open makes a pool for every data source of r. Connections are made on demand, so a
// data source that is down fails only the statements that need it. With TwoPhase it
// first finishes any prepared transaction a crash left behind, which needs every data
// source up, and keeps settling transactions in doubt until Close (see Settler).
func Open(ctx context.Context, r *rules.Compiled, cfg Config) (*DB, error) {
	db := &DB{rules: r}
	opts := cfg.Pool
	opts.Lazy = true
	for _, ds := range r.DataSources() {
		pool, err := postgresdb.NewPool(ctx, ds.DSN, opts)
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("sqlexec: data source %s: %w", ds.Name, err)
		}
		db.pools = append(db.pools, pool)
	}
	db.catalog = NewCatalog(r, db.pools)
	db.planner = sqlplan.New(r, db.catalog, sqlplan.Options{})
	db.committer = NewCommitter(r, cfg.TwoPhase)
	db.engine = NewEngine(r, db.catalog, db.committer)
	if cfg.DeadlockInterval >= 0 {
		db.detector = NewDeadlockDetector(r, db.pools, cfg.DeadlockInterval)
		db.detector.Start()
	}
	if cfg.TwoPhase {
		s, err := NewSettler(db.committer, SettlerConfig{Interval: cfg.SettleInterval})
		if err == nil {
			err = s.Start(ctx)
		}
		if err != nil {
			db.Close()
			return nil, err
		}
		db.settler = s
	}
	return db, nil
}

// Planner returns the DB's planner.
func (db *DB) Planner() *sqlplan.Planner { return db.planner }

// Engine returns the DB's engine.
func (db *DB) Engine() *Engine { return db.engine }

// Committer returns the DB's committer.
func (db *DB) Committer() *Committer { return db.committer }

// Recover runs one pass of the settler now (two-phase commit; see Settler.Settle): it
// finishes the prepared transactions that no live coordinator is committing, and
// returns how many it committed and rolled back. Without TwoPhase it does nothing.
func (db *DB) Recover(ctx context.Context) (committed, rolledBack int, err error) {
	if db.settler == nil {
		return 0, 0, nil
	}
	res, err := db.settler.Settle(ctx)
	return res.Committed, res.RolledBack, err
}

// Settler returns the DB's settler of two-phase transactions in doubt; nil without
// TwoPhase.
func (db *DB) Settler() *Settler { return db.settler }

// DeadlockVictims returns how many transactions the deadlock detector has ended.
func (db *DB) DeadlockVictims() int64 {
	if db.detector == nil {
		return 0
	}
	return db.detector.Victims()
}

// Close stops the settler and the deadlock detector and closes every pool.
func (db *DB) Close() {
	if db.settler != nil {
		db.settler.Close()
	}
	if db.detector != nil {
		db.detector.Close()
	}
	for _, p := range db.pools {
		if p != nil {
			p.Close()
		}
	}
}

// PgxPools lends connections of pgx pools, one per data source (in order).
type PgxPools []*pgxpool.Pool

type pgxPools = PgxPools

// Acquire implements Pool.
func (p PgxPools) Acquire(ctx context.Context, ds int) (Lease, error) {
	c, err := p[ds].Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return pgxLease{c}, nil
}

type pgxLease struct{ c *pgxpool.Conn }

func (l pgxLease) Run(_ context.Context, fn func(*pgconn.PgConn) error) error {
	return fn(l.c.Conn().PgConn())
}

func (l pgxLease) Release(reuse bool) {
	if !reuse {
		l.c.Conn().Close(context.Background()) // the pool drops a closed connection
	}
	l.c.Release()
}

// Exec plans (or finds in the cache) one extended-protocol statement, binds args and
// runs it in autocommit; formats are the result formats (none: text).
func (db *DB) Exec(ctx context.Context, sql string, args sqlplan.Args, formats []int16) (*Result, error) {
	return db.exec(ctx, NewSession(db.pools, db.committer), sql, args, formats)
}

func (db *DB) exec(ctx context.Context, s *Session, sql string, args sqlplan.Args, formats []int16) (*Result, error) {
	plan, err := db.planner.Prepare(ctx, sql)
	if err != nil {
		return nil, err
	}
	if plan.Keys != nil {
		if args.Keys, err = db.drawKeys(ctx, s, plan.Keys); err != nil {
			return nil, err
		}
	}
	b, err := plan.Bind(args)
	if err != nil {
		return nil, err
	}
	return db.run(ctx, s, b, args, formats)
}

// drawKeys is DrawKeys; a default changed since planning drops plans and catalog
// answers, and refuses the statement once.
func (db *DB) drawKeys(ctx context.Context, s *Session, k *sqlplan.KeySource) ([]string, error) {
	keys, err := DrawKeys(ctx, s, k)
	if errors.Is(err, ErrKeyDefaultChanged) {
		db.catalog.Invalidate()
		db.planner.Invalidate()
		return nil, sqlplan.UnsupportedHint("Run it again.", "the default of sharding key %s.%s changed since the statement was planned", k.Table, k.Column)
	}
	return keys, err
}

// SimpleExec runs a simple-protocol query string, which may hold several statements,
// and returns one result per statement; it stops at the first error.
func (db *DB) SimpleExec(ctx context.Context, sql string) ([]*Result, error) {
	s := NewSession(db.pools, db.committer)
	var out []*Result
	for _, stmt := range sqlplan.SplitStatements(sql) {
		plan, lits, err := db.planner.PlanSimple(ctx, stmt)
		if err != nil {
			return out, err
		}
		var args sqlplan.Args
		if plan.Keys != nil {
			if args.Keys, err = db.drawKeys(ctx, s, plan.Keys); err != nil {
				return out, err
			}
		}
		b, err := plan.BindSimpleArgs(stmt, lits, args)
		if err != nil {
			return out, err
		}
		r, err := db.run(ctx, s, b, sqlplan.Args{}, nil)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

func (db *DB) run(ctx context.Context, s *Session, b *sqlplan.Bound, args sqlplan.Args, formats []int16) (*Result, error) {
	switch b.Plan.Kind {
	case sqlplan.KindTransaction, sqlplan.KindSet, sqlplan.KindDiscard, sqlplan.KindCopy, sqlplan.KindListen:
		return nil, unsupported("%s statements on a DB handle (use Begin for transactions)", b.Plan.Kind)
	case sqlplan.KindEmpty:
		return &Result{}, nil
	}
	if b.Plan.Feed != nil {
		return nil, sqlplan.UnsupportedHint("Run it through shard-proxy, or select the rows and insert them with VALUES.",
			"INSERT ... SELECT into sharded table %s on a DB handle: its rows must be read, then routed one by one, which only the wire proxy does so far", b.Plan.Feed.Table)
	}
	r, err := db.engine.Execute(ctx, b, args, formats, s)
	if b.Plan.Kind == sqlplan.KindDDL {
		db.catalog.Invalidate()
		db.planner.Invalidate()
	}
	return r, err
}

// Tx is a transaction across the data sources its statements touch.
type Tx struct {
	db *DB
	s  *Session
}

// Begin opens a transaction; data sources join it as statements need them.
func (db *DB) Begin(ctx context.Context) (*Tx, error) {
	s := NewSession(db.pools, db.committer)
	if db.detector != nil {
		s.SetDeadlockDetector(db.detector)
	}
	if err := s.Begin("BEGIN"); err != nil {
		return nil, err
	}
	return &Tx{db: db, s: s}, nil
}

// Exec runs one statement in the transaction.
func (tx *Tx) Exec(ctx context.Context, sql string, args sqlplan.Args, formats []int16) (*Result, error) {
	return tx.db.exec(ctx, tx.s, sql, args, formats)
}

// Commit commits on every data source the transaction touched.
func (tx *Tx) Commit(ctx context.Context) error { return tx.s.Commit(ctx) }

// Rollback rolls back everywhere.
func (tx *Tx) Rollback(ctx context.Context) error { return tx.s.Rollback(ctx) }

// Touched returns the data sources the transaction joined.
func (tx *Tx) Touched() []int { return tx.s.Touched() }
