package shardsql

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardlab/shardlab/coordinator"
	"github.com/shardlab/shardlab/internal/postgresdb"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// The coordinator database (Config.Coordinate) answers, as the program wrote them, the
// SELECTs the merge cannot answer exactly over several shards, as it does for the wire
// proxy (package coordinator). Its statements run through the same core as every other
// (sqlexec.Engine over the connection's sqlexec.Session): the coordinator is one more
// data source, at index sqlplan.CoordinatorSource, lent by coordinatedPools. It reads
// the shards' committed rows in sessions of its own, so it answers only outside a
// transaction, where the program has no write it could not see.

// coordination is a handle's coordinator database: its builder, its connections and
// the bound on what one statement moves.
type coordination struct {
	coord    *coordinator.Coordinator
	pool     *pgxpool.Pool
	maxMoved int64 // 0: no bound
	// generation counts the schema changes made through this handle: the coordinator
	// database is rebuilt at the next coordinated statement after one.
	generation atomic.Uint64
}

// openCoordination prepares the coordinator database of cfg's layout: it starts the
// relay through which the coordinator's foreign servers read the shards, and a lazy
// pool to the database. Nothing is built until the first statement that needs it.
func openCoordination(ctx context.Context, cfg Config) (*coordination, error) {
	coord, err := coordinator.New(cfg.Rules, cfg.CoordinatorDatabase)
	if err != nil {
		return nil, fmt.Errorf("shardsql: %w", err)
	}
	size := cfg.CoordinatorPoolSize
	if size <= 0 {
		size = DefaultCoordinatorPoolSize
	}
	pool, err := postgresdb.NewPool(ctx, coord.DSN(), postgresdb.Options{PoolSize: int32(size), Lazy: true})
	if err != nil {
		return nil, fmt.Errorf("shardsql: the coordinator database: %w", err)
	}
	host, err := coordinator.RelayHost(coord.DSN())
	if err == nil {
		err = coord.StartRelay(host)
	}
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("shardsql: the coordinator's relay: %w", err)
	}
	c := &coordination{coord: coord, pool: pool}
	switch {
	case cfg.CoordinatorMaxMoved == 0:
		c.maxMoved = DefaultCoordinatorMaxMoved
	case cfg.CoordinatorMaxMoved > 0:
		c.maxMoved = cfg.CoordinatorMaxMoved
	}
	if c.maxMoved > 0 {
		// What moved may be sorted or hashed into temporary files there: as much.
		coord.SetTempFileLimit(c.maxMoved)
	}
	return c, nil
}

func (c *coordination) close() {
	c.pool.Close()
	c.coord.Close()
}

// coordinatedPools lends the data sources' connections, and the coordinator
// database's at index sqlplan.CoordinatorSource. A coordinator connection's statement
// is counted by the relay from Acquire to Release (coordinator.Track), into the
// movement a coordinated statement's context carries.
type coordinatedPools struct {
	sqlexec.PgxPools
	c *coordination
}

// movementKey carries a *coordinator.Movement slot in a coordinated statement's context.
type movementKey struct{}

// Acquire implements sqlexec.Pool.
func (p coordinatedPools) Acquire(ctx context.Context, ds int) (sqlexec.Lease, error) {
	if ds != len(p.PgxPools) {
		return p.PgxPools.Acquire(ctx, ds)
	}
	conn, err := p.c.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	pid := conn.Conn().PgConn().PID()
	moved := p.c.coord.Track(pid, p.c.maxMoved)
	if slot, ok := ctx.Value(movementKey{}).(**coordinator.Movement); ok {
		*slot = moved
	}
	return coordinatorLease{conn: conn, c: p.c, pid: pid}, nil
}

type coordinatorLease struct {
	conn *pgxpool.Conn
	c    *coordination
	pid  uint32
}

func (l coordinatorLease) Run(_ context.Context, fn func(*pgconn.PgConn) error) error {
	return fn(l.conn.Conn().PgConn())
}

func (l coordinatorLease) Release(reuse bool) {
	l.c.coord.Untrack(l.pid)
	if !reuse {
		l.conn.Conn().Close(context.Background())
	}
	l.conn.Release()
}

// why is the message of the merge's refusal of a coordinated statement.
func why(refused error) string {
	var pe *pgconn.PgError
	if errors.As(refused, &pe) {
		return strings.TrimPrefix(pe.Message, "shardlab: ")
	}
	if refused == nil {
		return "a construct exact on one shard only, over several shards"
	}
	return strings.TrimPrefix(refused.Error(), "shardlab: ")
}

// readsCommitted says why the coordinator may not answer inside the program's open
// transaction, if so (sqlexec.Session.CommittedReads): its statements read committed
// rows in transactions of their own, outside the program's (Connect keeps it out), and
// carry none of the transaction's own settings.
func (cn *conn) readsCommitted(ctx context.Context) error {
	if cn.s == nil || !cn.s.InTransaction() {
		return nil
	}
	if cn.localTxn == cn.s.Transaction() {
		return sqlplan.UnsupportedHint("Run it outside a transaction, or before set_config.",
			"the transaction ran set_config, DO or CALL, which may set what the coordinator database's own transactions would not carry")
	}
	return cn.s.CommittedReads(ctx, cn.s)
}

func hintOf(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Hint
	}
	return ""
}

// readyCoordinator checks that the coordinator may answer a statement the merge
// refused (refused) on this connection now, and builds its database if a schema change
// made through this handle (or its start) left it unbuilt.
func (cn *conn) readyCoordinator(ctx context.Context, refused error) error {
	c := cn.c.coord
	if err := cn.readsCommitted(ctx); err != nil {
		if !errors.Is(err, sqlplan.ErrUnsupported) {
			return err // the check's own failure, as it is
		}
		return sqlplan.UnsupportedHint(hintOf(err), "%s; %s", why(refused), strings.TrimPrefix(why(err), "shardlab: "))
	}
	if err := c.coord.Ready(ctx, c.generation.Load()); err != nil {
		if errors.Is(err, coordinator.ErrSchemaChanged) {
			// Planned from catalogs that changed beside this handle: plans and catalog
			// answers go, and this statement is refused once rather than run on them.
			cn.c.planner.Invalidate()
			cn.c.catalog.Invalidate()
			return sqlplan.UnsupportedHint("Run it again.", "%s; the data sources' schemas changed beside this handle since it was planned", why(refused))
		}
		if ctx.Err() != nil {
			return err
		}
		return sqlplan.Unsupported("%s; the coordinator database that would answer it is not available: %v", why(refused), err)
	}
	return nil
}

// coordinated runs a statement the coordinator database answers, its columns in
// formats (none: text): its rows streamed
// from the coordinator's connection when the caller reads them one by one (the relay
// counts what it moves until they end), else gathered (within Config.MaxHeld).
func (cn *conn) coordinated(ctx context.Context, b *sqlplan.Bound, a sqlplan.Args, formats []int16) (*sqlexec.Result, error) {
	if err := cn.readyCoordinator(ctx, b.Refused); err != nil {
		return nil, err
	}
	var moved *coordinator.Movement
	ctx = context.WithValue(ctx, movementKey{}, &moved)
	fail := func(err error) error {
		if err == nil {
			return nil
		}
		if moved != nil && moved.Exceeded() {
			return coordinator.MovedError(moved, cn.c.coord.maxMoved, "shardsql.Config.CoordinatorMaxMoved")
		}
		return cn.coordinatorFailure(ctx, b.Refused, b.Plan, b, b.AsWritten, a.OIDs, err)
	}
	if cn.streaming {
		rows, err := cn.c.engine.Query(ctx, b, a, formats, cn.s)
		if err != nil {
			return nil, fail(err)
		}
		cn.streamed, cn.streamFail = rows, fail
		return &sqlexec.Result{Fields: rows.Fields()}, nil
	}
	res, err := cn.c.engine.Execute(ctx, b, a, formats, cn.s)
	if err != nil {
		return nil, fail(err)
	}
	return res, nil
}

// coordinatorFailure is what the program sees of err, the coordinator database's error
// for sql, a statement the merge refused (refused) over tables: see
// coordinator.ClientError and sqlexec.OneDatabase.
func (cn *conn) coordinatorFailure(ctx context.Context, refused error, plan *sqlplan.Plan, b *sqlplan.Bound, sql string, oids []uint32, err error) error {
	return cn.c.coord.coord.ClientError(why(refused), plan.Tables, err, func(logical bool) (bool, error) {
		return sqlexec.OneDatabase(plan, b, cn.c.cfg.Rules, sql, logical, func(ds int, sql string) error {
			return runOn(ctx, cn.c.pgxPools, ds, func(pc *pgconn.PgConn) error {
				_, err := pc.Prepare(ctx, "", sql, oids)
				return err
			})
		})
	})
}
