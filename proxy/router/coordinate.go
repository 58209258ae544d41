package router

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/coordinator"
	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// The coordinator database (Config.Coordinator) answers, as the client wrote them, the
// SELECTs the merge cannot answer exactly over several shards. It reads the shards'
// committed rows through postgres_fdw, in sessions and transactions of its own: it
// answers outside a transaction block, and inside a READ COMMITTED one where no write
// of the client's would be unseen (readsCommitted), and only for the data sources' own
// user, whose user mapping it holds.

// coordinatorIndex is the coordinator's data source index in a session's pools.
func (s *Session) coordinatorIndex() int { return sqlplan.CoordinatorSource(s.r.rules) }

// readyCoordinator checks that the coordinator may answer a bound statement for this
// client now, and builds its database if a schema change made through the proxy (or
// the proxy's start) left it unbuilt. partial is set for an answer fetched in parts
// (Execute with a row limit).
func (s *Session) readyCoordinator(ctx context.Context, refused error, partial bool) error {
	why := strings.TrimPrefix(refusalMessage(refused), "shardlab: ")
	err := s.coordinatorAllowed(partial)
	if err == nil && s.tx.InTransaction() {
		// The check's own failures (a cancel, a broken connection, an aborted
		// transaction) are the client's as they are; its refusals name the statement.
		if err = s.readsCommitted(ctx); err != nil && !errors.Is(err, sqlplan.ErrUnsupported) {
			return err
		}
	}
	if err != nil {
		return sqlplan.UnsupportedHint(hintOf(err), "%s; %s", why, strings.TrimPrefix(refusalMessage(err), "shardlab: "))
	}
	if err := s.r.coord.Ready(ctx, s.r.generation.Load()); err != nil {
		if errors.Is(err, coordinator.ErrSchemaChanged) {
			// Planned from catalogs that changed beside the proxy: plans and catalog
			// answers go, and this statement is refused once rather than run on them.
			s.r.planner.Invalidate()
			s.r.catalog.Invalidate()
			s.r.describes.reset()
			return sqlplan.UnsupportedHint("Run it again.", "%s; the data sources' schemas changed beside the proxy since it was planned", why)
		}
		if ctx.Err() != nil {
			return err
		}
		return sqlplan.Unsupported("%s; the coordinator database that would answer it is not available: %v", why, err)
	}
	return nil
}

// coordinatorAllowed says why the coordinator may not answer this client now, if so.
func (s *Session) coordinatorAllowed(partial bool) error {
	switch {
	case s.r.coord == nil:
		return sqlplan.Unsupported("the proxy runs without its coordinator database (--coordinator=false)")
	case partial:
		return sqlplan.Unsupported("an answer of the coordinator database is not fetched in parts (Execute with a row limit)")
	case len(s.pools) <= s.coordinatorIndex():
		return sqlplan.Unsupported("the coordinator database answers only the clients that run as the data sources' own users, whose user mappings it holds")
	case s.madeState:
		return sqlplan.Unsupported("the session may hold temporary objects or other state on its server connections, which the coordinator database's sessions do not see")
	}
	for _, list := range [][]setting{s.startup, s.currentSettings()} {
		for _, st := range list {
			name := st.name
			if name == "options" {
				// A startup packet's -c name=value, one SET each.
				if _, n, err := classifySet(st.sql); err == nil {
					name = n
				}
			}
			if !coordinatorSetting(name) {
				return sqlplan.Unsupported("the session set %s, which the coordinator database does not carry (it could name other schemas there, or its own reading of the shards)", name)
			}
		}
	}
	return nil
}

// readsCommitted says why the coordinator may not answer inside the client's open
// transaction, if so (sqlexec.Session.CommittedReads): its statements read committed
// rows in transactions of their own, outside the client's (newTransactions), and
// carry none of the transaction's own settings (SET LOCAL, SET TRANSACTION,
// set_config(..., true)).
func (s *Session) readsCommitted(ctx context.Context) error {
	if len(s.txLocal) > 0 {
		return sqlplan.UnsupportedHint("Run it outside a transaction block, or before SET LOCAL.",
			"the transaction ran SET LOCAL or SET TRANSACTION, which the coordinator database's own transactions would not carry")
	}
	return s.tx.CommittedReads(ctx, &s.conns)
}

// coordinatorSetting reports whether the coordinator's sessions take a client's
// setting as they are (coordinator.CarriesSetting). Any other (search_path, role,
// postgres_fdw.*, default_transaction_read_only, custom settings) refuses the client's
// coordinated statements.
func coordinatorSetting(name string) bool { return coordinator.CarriesSetting(name) }

func hintOf(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Hint
	}
	return ""
}

func refusalMessage(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Message
	}
	if err == nil {
		return "shardlab: a construct exact on one shard only, over several shards"
	}
	return err.Error()
}

// runCoordinated runs a statement on the coordinator database with fn, relaying its
// answer, and checks an error the coordinator gives against one database (see
// coordinatorError).
func (s *Session) runCoordinated(ctx context.Context, b *sqlplan.Bound, oids []uint32, partial bool, fn func(*backend.Conn) error) error {
	if err := s.readyCoordinator(ctx, b.Refused, partial); err != nil {
		return err
	}
	var moved *coordinator.Movement
	err := s.onDataSource(ctx, s.coordinatorIndex(), func(c *backend.Conn) error {
		pid := c.PgConn().PID()
		moved = s.r.coord.Track(pid, s.r.coordBound)
		defer s.r.coord.Untrack(pid)
		return fn(c)
	})
	st := &s.r.coordStats
	st.statements.Add(1)
	if moved != nil {
		st.rows.Add(moved.Rows())
		st.bytes.Add(moved.Bytes())
		st.lastRows.Store(moved.Rows())
		st.lastBytes.Store(moved.Bytes())
		if moved.Exceeded() {
			st.cut.Add(1)
			return coordinator.MovedError(moved, s.r.coordBound, "shard-proxy --coordinator-max-moved")
		}
	}
	if err != nil {
		return s.coordinatorError(ctx, b, oids, err)
	}
	return nil
}

// coordinatorError decides what a client sees of the coordinator's error. An error of
// the statement's analysis (SQLSTATE class 42: an unknown column, a grouping error) may
// be the coordinator's own: its tables have no keys, so a GROUP BY a primary key is
// not one there, and its database has none of the shards' functions and types. The
// statement is then analysed on the default data source, where every table it names
// has its logical name: that database's error is the client's answer, and when it
// accepts the statement the coordinator's failure is a refusal (0A000), never an error
// one database would not raise. An error of the coordinator's own making (its login to
// a shard) is a refusal too. Other errors (a division by zero, a cancel, an unreachable
// shard) are the statement's.
func (s *Session) coordinatorError(ctx context.Context, b *sqlplan.Bound, oids []uint32, err error) error {
	return s.coordinatorFailure(ctx, b.Refused, b.Plan, b, b.AsWritten, oids, err)
}

func (s *Session) coordinatorFailure(ctx context.Context, refused error, plan *sqlplan.Plan, b *sqlplan.Bound, sql string, oids []uint32, err error) error {
	why := strings.TrimPrefix(refusalMessage(refused), "shardlab: ")
	return s.r.coord.ClientError(why, plan.Tables, err, func(logical bool) (bool, error) {
		return sqlexec.OneDatabase(plan, b, s.r.rules, sql, logical, func(ds int, sql string) error {
			return s.onDataSource(ctx, ds, func(c *backend.Conn) error {
				_, _, err := c.Describe(ctx, sql, oids)
				return err
			})
		})
	})
}

func byteSize(n int64) string { return coordinator.ByteSize(n) }
