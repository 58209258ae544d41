package router

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// runSeveralSteps runs a simple-protocol statement of several steps (INSERT ... SELECT
// into a sharded table, an UPDATE or DELETE whose subqueries run first) with run, and
// sends its whole answer.
func (s *Session) runSeveralSteps(ctx context.Context, plan *sqlplan.Plan, run func() (*sqlexec.Result, error)) error {
	s.running = true
	defer func() { s.running = false }()
	if err := severalStepsAllowed(plan); err != nil {
		return err
	}
	res, err := run()
	if err != nil {
		return err
	}
	s.sendResult(res)
	return nil
}

// severalStepsAllowed: see sqlexec.SeveralStepsAllowed.
func severalStepsAllowed(plan *sqlplan.Plan) error { return sqlexec.SeveralStepsAllowed(plan) }

// insertSelect runs an INSERT ... SELECT into a sharded table (sqlplan.Feed): its query
// through the usual paths (one shard, the merge, or the coordinator database), its
// rows read whole into a spool, then inserted in batches on the client's own shard
// connections, each row on the shard its key names. Outside a transaction block the
// statement gets a transaction of its own, committed by the committer (two-phase with
// --two-phase): a failure anywhere leaves no row written. paramOIDs are the types of the
// client's parameters, as the statement was described.
func (s *Session) insertSelect(ctx context.Context, plan *sqlplan.Plan, args sqlplan.Args, paramOIDs []uint32, resultFormats []int16) (res *sqlexec.Result, err error) {
	f := plan.Feed
	qb, qargs, err := sqlexec.FeedQuery(ctx, s.prepare, f, args, paramOIDs)
	if err != nil {
		return nil, err
	}
	spool := sqlexec.NewSpool(s.spoolLimit())
	defer spool.Close()
	own := !s.explicit && !s.implicit
	var fields []pgconn.FieldDescription
	if qb.Coordinated() {
		// The coordinator reads before the writes (which then cannot feed back into
		// the read); inside a transaction block, only where it may (readsCommitted).
		sink := &rowSink{keep: spool.Append}
		t := qb.Targets[0]
		values, oids, formats := sqlexec.TargetParams(t, qargs)
		st := backend.Statement{SQL: t.SQL, ParamOIDs: oids, Values: values, ParamFormats: formats, ResultFormats: []int16{1}, Describe: true}
		err = s.runCoordinated(ctx, qb, qargs.OIDs, false, func(c *backend.Conn) error {
			_, err := c.ExecAfter(ctx, nil, &st, sink)
			return err
		})
		if err == nil {
			err = sink.err
		}
		if err != nil {
			return nil, s.spoolError(err)
		}
		fields = sink.fields
		if own {
			s.beginImplicit()
		}
	} else {
		if own {
			s.beginImplicit()
		}
		if fields, err = s.spoolRows(ctx, qb, qargs, spool); err != nil {
			if own {
				s.endImplicit(ctx, false)
			}
			return nil, s.spoolError(err)
		}
	}
	defer func() {
		if own {
			if end := s.endImplicit(ctx, err == nil); err == nil && end != nil {
				res, err = nil, end
			}
		}
	}()
	oids := make([]uint32, len(fields))
	for i, fd := range fields {
		oids[i] = fd.DataTypeOID
	}
	if err := f.CheckColumns(oids, spool.Rows()); err != nil {
		return nil, err
	}
	return s.r.engine.InsertSpooled(ctx, f, args, paramOIDs, oids, spool, resultFormats, s.feedSteps())
}

// prepare plans a statement of several steps' step in the session's view of the
// schema.
func (s *Session) prepare(ctx context.Context, sql string) (*sqlplan.Plan, error) {
	return s.r.planner.Prepare(s.planContext(ctx), sql)
}

// feedSteps lend the engine this session's planning, keys, execution and Describe for
// an INSERT ... SELECT's batches.
func (s *Session) feedSteps() sqlexec.FeedSteps {
	return sqlexec.FeedSteps{
		Prepare:  s.prepare,
		DrawKeys: func(ctx context.Context, pl *sqlplan.Plan) ([]string, error) { return s.drawKeys(ctx, pl.Keys) },
		Execute:  s.engineExecute,
		Describe: func(ctx context.Context, ds int, sql string, oids []uint32) ([]pgconn.FieldDescription, error) {
			var described []pgproto3.FieldDescription
			err := s.onDataSource(ctx, ds, func(c *backend.Conn) error {
				var err error
				_, described, err = c.Describe(ctx, sql, oids)
				return err
			})
			if err != nil || len(described) == 0 {
				return nil, err
			}
			fields := make([]pgconn.FieldDescription, len(described))
			for i, fd := range described {
				fields[i] = pgconn.FieldDescription{Name: string(fd.Name), TableOID: fd.TableOID, TableAttributeNumber: fd.TableAttributeNumber,
					DataTypeOID: fd.DataTypeOID, DataTypeSize: fd.DataTypeSize, TypeModifier: fd.TypeModifier}
			}
			return fields, nil
		},
	}
}

// spoolRows reads a query's rows, in binary, into spool, on the client's connections
// (in its transaction: the query sees the client's own writes).
func (s *Session) spoolRows(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, spool *sqlexec.Spool) ([]pgconn.FieldDescription, error) {
	defer s.multiTarget(b)()
	rows, err := s.r.engine.Query(ctx, b, args, []int16{1}, &s.conns)
	if err != nil {
		return nil, err
	}
	return sqlexec.SpoolAll(rows, spool)
}

// spoolLimit is the most bytes of rows an INSERT ... SELECT holds: the bound on what a
// coordinated statement moves.
func (s *Session) spoolLimit() int64 {
	if s.r.coordBound <= 0 {
		return math.MaxInt64
	}
	return s.r.coordBound
}

func (s *Session) spoolError(err error) error {
	if !errors.Is(err, sqlexec.ErrSpoolFull) {
		return err
	}
	return &pgconn.PgError{Severity: "ERROR", Code: "54000",
		Message: fmt.Sprintf("shardlab: the rows of INSERT ... SELECT into a sharded table exceed %s (--coordinator-max-moved)", byteSize(s.spoolLimit())),
		Hint:    "Insert the rows in parts (a condition on the SELECT), or raise the bound (shard-proxy --coordinator-max-moved)."}
}
