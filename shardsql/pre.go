package shardsql

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// runPre runs an UPDATE or DELETE that Bind refused (refused) over several shards,
// whose subqueries over sharded tables are evaluated first (sqlplan.Pre) on PostgreSQL
// data sources, as the wire proxy does (sqlexec.Engine.RunPre): each subquery alone,
// through the usual paths (with Config.Coordinate, the coordinator's too, read before
// the statement's transaction opens), its answer a parameter of the statement. Outside
// a transaction the statement gets one of its own. text is the statement as the
// program sent it; paramOIDs its parameters' types, as it was described.
func (cn *conn) runPre(ctx context.Context, plan *sqlplan.Plan, text string, refused error, a sqlplan.Args, paramOIDs []uint32) (*sqlexec.Result, error) {
	if !plan.Pre.AsWritten {
		// A plan of the normalised text: the subqueries keep the program's literals in
		// the plan of its own text.
		own, err := cn.c.planner.Prepare(cn.planContext(ctx), text)
		if err != nil {
			return nil, err
		}
		if own.Pre == nil {
			return nil, refused
		}
		plan = own
	}
	if err := sqlexec.SeveralStepsAllowed(plan); err != nil {
		return nil, err
	}
	own := !cn.s.InTransaction()
	steps := sqlexec.PreSteps{
		Prepare:      cn.prepare,
		Rows:         cn.subqueryRows,
		OwnCollation: cn.c.catalog.OwnCollation,
		Domains:      cn.c.catalog.Domains,
		Execute: func(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, formats []int16) (*sqlexec.Result, error) {
			return cn.c.engine.Execute(ctx, b, args, formats, cn.s)
		},
		Failure: func(ctx context.Context, err error) error {
			return sqlexec.PreFailure(refused, err, func(ds int, sql string) error {
				if own && cn.s.InTransaction() {
					// The failure aborted the statement's own transaction, which fails
					// anyway: its connections go back before one describes.
					cn.s.Rollback(context.WithoutCancel(ctx))
					cn.endTx()
				}
				if ds == sqlplan.CoordinatorSource(cn.c.cfg.Rules) {
					// No one data source holds its tables: the coordinator describes it,
					// or without one nothing does (and the statement is refused).
					if cn.c.coord == nil {
						return errors.New("no data source describes the statement")
					}
					if err := cn.readyCoordinator(ctx, plan.Refused); err != nil {
						return err
					}
				}
				return runOn(ctx, cn.c.pools, ds, func(pc *pgconn.PgConn) error {
					_, err := pc.Prepare(ctx, "", sql, paramOIDs)
					return err
				})
			}, plan)
		},
	}
	if own {
		steps.Begin = func() error { return cn.s.Begin("BEGIN") }
		steps.End = func(ctx context.Context, commit bool) error {
			if !cn.s.InTransaction() {
				return nil // rolled back already (Failure)
			}
			defer cn.endTx()
			if !commit {
				return cn.s.Rollback(context.WithoutCancel(ctx))
			}
			return cn.s.Commit(ctx)
		}
	}
	return cn.c.engine.RunPre(ctx, plan, refused, a, paramOIDs, nil, steps)
}

// subqueryRows reads a subquery's answer whole, in binary, within Config.MaxHeld: its
// column types and its rows (the first only, with first).
func (cn *conn) subqueryRows(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, first bool) ([]uint32, [][][]byte, error) {
	limit := cn.c.engine.MaxHeld()
	var size int64
	var out [][][]byte
	var rows *sqlexec.Rows
	fail := func(err error) error { return err }
	if b.Coordinated() {
		if cn.c.coord == nil {
			return nil, nil, b.Refused
		}
		streaming := cn.streaming
		cn.streaming = true
		_, err := cn.coordinated(ctx, b, args, []int16{1})
		cn.streaming = streaming
		rows, fail = cn.streamed, cn.streamFail
		cn.streamed, cn.streamFail = nil, nil
		if err != nil {
			return nil, nil, err
		}
	} else {
		var err error
		if rows, err = cn.c.engine.Query(ctx, b, args, []int16{1}, cn.s); err != nil {
			return nil, nil, err
		}
	}
	defer rows.Close()
	for rows.Next() {
		if first && len(out) > 0 {
			continue
		}
		row := rows.Values()
		kept := make([][]byte, len(row))
		size += 24 + 24*int64(len(row)) // the row's and its values' slice headers
		for i, v := range row {
			size += int64(len(v))
			if v != nil {
				kept[i] = append(make([]byte, 0, len(v)), v...)
			}
		}
		if limit >= 0 && size > limit {
			rows.Abort()
			return nil, nil, sqlexec.HeldError(limit)
		}
		out = append(out, kept)
	}
	if _, err := rows.Close(); err != nil {
		return nil, nil, fail(err)
	}
	fields := rows.Fields()
	oids := make([]uint32, len(fields))
	for i, f := range fields {
		oids[i] = f.DataTypeOID
	}
	return oids, out, nil
}

// preRefused reports whether err is the refusal of a statement whose subqueries can run
// first (plan.Pre), on PostgreSQL data sources.
func (cn *conn) preRefused(plan *sqlplan.Plan, err error) bool {
	return err != nil && cn.sq == nil && plan.Pre != nil && errors.Is(err, sqlplan.ErrUnsupported)
}
