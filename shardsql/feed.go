package shardsql

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/coordinator"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// insertSelect runs an INSERT ... SELECT into a sharded table (sqlplan.Feed) on
// PostgreSQL data sources: its query through the usual paths (one shard, the merge, or
// with Config.Coordinate the coordinator database), its rows read whole into a spool
// (memory, then a temporary file, within spoolLimit), then inserted in batches, each row
// on the shard its key names (sqlexec.Engine.InsertSpooled, as the wire proxy does).
// Outside a transaction the statement gets one of its own, committed by the handle's
// committer (two-phase with Config.TwoPhase): a failure anywhere leaves no row written.
// paramOIDs are the types of the statement's parameters, as it was described.
func (cn *conn) insertSelect(ctx context.Context, pl *sqlplan.Plan, a sqlplan.Args, paramOIDs []uint32) (res *sqlexec.Result, err error) {
	if err := sqlexec.SeveralStepsAllowed(pl); err != nil {
		return nil, err
	}
	f := pl.Feed
	qb, qargs, err := sqlexec.FeedQuery(ctx, cn.prepare, f, a, paramOIDs)
	if err != nil {
		return nil, err
	}
	spool := sqlexec.NewSpool(cn.spoolLimit())
	defer spool.Close()
	// Its own transaction outside the program's, ended here whatever happens; inside
	// the program's, a failure fails that transaction, as on PostgreSQL (batches
	// already written must not be committed).
	own, began, txn := !cn.s.InTransaction(), false, cn.s.Transaction()
	defer func() {
		switch {
		case !own:
			if err != nil {
				cn.s.Fail(txn)
			}
		case began:
			p := recover()
			if err != nil || p != nil {
				cn.s.Rollback(context.WithoutCancel(ctx))
			} else if cerr := cn.s.Commit(ctx); cerr != nil {
				res, err = nil, cerr
			}
			cn.endTx()
			if p != nil {
				panic(p)
			}
		}
	}()
	begin := func() error {
		if !own {
			return nil
		}
		if err := cn.s.Begin("BEGIN"); err != nil {
			return err
		}
		began = true
		return nil
	}
	var fields []pgconn.FieldDescription
	if qb.Coordinated() {
		// The coordinator reads before the writes (which then cannot feed back into
		// the read); inside the program's transaction, only where it may
		// (readsCommitted).
		if cn.c.coord == nil {
			return nil, qb.Refused
		}
		if fields, err = cn.spoolCoordinated(ctx, qb, qargs, spool); err != nil {
			return nil, cn.spoolError(err)
		}
		if err := begin(); err != nil {
			return nil, err
		}
	} else {
		if err := begin(); err != nil {
			return nil, err
		}
		if fields, err = cn.spoolRows(ctx, qb, qargs, spool); err != nil {
			return nil, cn.spoolError(err)
		}
	}
	oids := make([]uint32, len(fields))
	for i, fd := range fields {
		oids[i] = fd.DataTypeOID
	}
	if err := f.CheckColumns(oids, spool.Rows()); err != nil {
		return nil, err
	}
	return cn.c.engine.InsertSpooled(ctx, f, a, paramOIDs, oids, spool, nil, sqlexec.FeedSteps{
		Prepare:  cn.prepare,
		DrawKeys: cn.drawKeys,
		Execute: func(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, formats []int16) (*sqlexec.Result, error) {
			return cn.c.engine.Execute(ctx, b, args, formats, cn.s)
		},
		Describe: func(ctx context.Context, ds int, sql string, oids []uint32) ([]pgconn.FieldDescription, error) {
			var fields []pgconn.FieldDescription
			err := cn.s.Run(ctx, ds, func(pc *pgconn.PgConn) error {
				sd, err := pc.Prepare(ctx, "", sql, oids)
				if err == nil {
					fields = sd.Fields
				}
				return err
			})
			cn.s.Release(ds, err)
			return fields, err
		},
	})
}

// prepare plans a step of a statement of several in the connection's view of the
// schema.
func (cn *conn) prepare(ctx context.Context, sql string) (*sqlplan.Plan, error) {
	return cn.c.planner.Prepare(cn.planContext(ctx), sql)
}

// spoolRows reads a query's rows, in binary, into spool, on the connection's session
// (in its transaction: the query sees its own writes).
func (cn *conn) spoolRows(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, spool *sqlexec.Spool) ([]pgconn.FieldDescription, error) {
	rows, err := cn.c.engine.Query(ctx, b, args, []int16{1}, cn.s)
	if err != nil {
		return nil, err
	}
	return sqlexec.SpoolAll(rows, spool)
}

// spoolCoordinated reads a coordinated query's rows into spool, as coordinated reads
// every answer (the relay counting what moves).
func (cn *conn) spoolCoordinated(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, spool *sqlexec.Spool) ([]pgconn.FieldDescription, error) {
	streaming := cn.streaming
	cn.streaming = true
	_, err := cn.coordinated(ctx, b, args, []int16{1})
	cn.streaming = streaming
	rows, fail := cn.streamed, cn.streamFail
	cn.streamed, cn.streamFail = nil, nil
	if err != nil {
		return nil, err
	}
	fields, err := sqlexec.SpoolAll(rows, spool)
	if err != nil && !errors.Is(err, sqlexec.ErrSpoolFull) {
		return nil, fail(err)
	}
	return fields, err
}

// spoolLimit is the most bytes of rows an INSERT ... SELECT holds: the bound on what a
// coordinated statement moves (Config.CoordinatorMaxMoved).
func (cn *conn) spoolLimit() int64 {
	switch n := cn.c.cfg.CoordinatorMaxMoved; {
	case n == 0:
		return DefaultCoordinatorMaxMoved
	case n < 0:
		return math.MaxInt64
	default:
		return n
	}
}

func (cn *conn) spoolError(err error) error {
	if !errors.Is(err, sqlexec.ErrSpoolFull) {
		return err
	}
	return &pgconn.PgError{Severity: "ERROR", Code: "54000",
		Message: fmt.Sprintf("shardlab: the rows of INSERT ... SELECT into a sharded table exceed %s (shardsql.Config.CoordinatorMaxMoved)", coordinator.ByteSize(cn.spoolLimit())),
		Hint:    "Insert the rows in parts (a condition on the SELECT), or raise the bound (shardsql.Config.CoordinatorMaxMoved)."}
}
