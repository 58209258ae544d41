package sqlexec

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlplan"
)

// INSERT ... SELECT into a sharded table (sqlplan.Feed), the part both adapters share:
// the query's rows, read by the adapter into a Spool (on its own connections, or the
// coordinator's), are inserted in batches, each row on the shard its key names, by
// statements the adapter plans and runs on its session (FeedSteps). The wire proxy
// and the database/sql driver differ only in how they read the query and hold the
// transaction.

// FeedSteps are what an adapter lends InsertSpooled.
type FeedSteps struct {
	// Prepare plans a batch statement in the session's view of the schema.
	Prepare func(ctx context.Context, sql string) (*sqlplan.Plan, error)
	// DrawKeys draws the keys a batch leaves to its key's sequence (plan.Keys).
	DrawKeys func(ctx context.Context, plan *sqlplan.Plan) ([]string, error)
	// Execute runs a bound batch in the session's transaction.
	Execute func(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, resultFormats []int16) (*Result, error)
	// Describe describes sql on data source ds with parameters of types oids, for the
	// RETURNING columns of a statement that inserted no row.
	Describe func(ctx context.Context, ds int, sql string, oids []uint32) ([]pgconn.FieldDescription, error)
}

// FeedQuery plans and binds the query of an INSERT ... SELECT into a sharded table
// (f.Query) with prepare, given the statement's parameters (typed paramOIDs as it was
// described): the query names the first of them. The adapter then reads its rows into
// a spool, on its own connections or the coordinator's.
func FeedQuery(ctx context.Context, prepare func(context.Context, string) (*sqlplan.Plan, error), f *sqlplan.Feed, args sqlplan.Args, paramOIDs []uint32) (*sqlplan.Bound, sqlplan.Args, error) {
	qp, err := prepare(ctx, f.Query)
	if err != nil {
		return nil, sqlplan.Args{}, err
	}
	if qp.Kind != sqlplan.KindSelect && qp.Kind != sqlplan.KindCoordinator {
		return nil, sqlplan.Args{}, sqlplan.Unsupported("INSERT ... SELECT into sharded table %s whose query is planned as %s", f.Table, qp.Kind)
	}
	qargs := FirstArgs(args, paramOIDs, qp.NumParams)
	qb, err := qp.Bind(qargs)
	return qb, qargs, err
}

// InsertSpooled inserts the rows of spool, the answer of f's query whose columns are
// of types oids, in batches of f.NextBatch rows, and answers as the INSERT would: the
// tag, and RETURNING's rows (held within the engine's MaxHeld: past it the statement
// fails with 54000, and its transaction with it). args are the statement's own
// parameters, typed paramOIDs as it was described.
func (e *Engine) InsertSpooled(ctx context.Context, f *sqlplan.Feed, args sqlplan.Args, paramOIDs, oids []uint32, spool *Spool, resultFormats []int16, steps FeedSteps) (*Result, error) {
	out := &Result{}
	if spool.Rows() == 0 {
		// No row: the statement still checks as one database's would, and says what
		// RETURNING would have returned.
		return describeEmptyFeed(ctx, f, args, paramOIDs, oids, out, steps)
	}
	var n, held int64
	limit := e.MaxHeld()
	for left := spool.Rows(); left > 0; {
		rows, err := spool.Next(f.NextBatch(len(oids), left))
		if err != nil {
			return nil, err
		}
		if len(rows) == 0 {
			return nil, fmt.Errorf("shardlab: %d spooled rows missing", left)
		}
		left -= int64(len(rows))
		sql, err := f.Batch(len(rows), len(oids))
		if err != nil {
			return nil, err
		}
		bp, err := steps.Prepare(ctx, sql)
		if err != nil {
			return nil, err
		}
		bargs := batchArgs(f, args, paramOIDs, oids, rows)
		if bp.Keys != nil {
			if bargs.Keys, err = steps.DrawKeys(ctx, bp); err != nil {
				return nil, err
			}
		}
		b, err := bp.Bind(bargs)
		if err != nil {
			return nil, err
		}
		r, err := steps.Execute(ctx, b, bargs, resultFormats)
		if err != nil {
			return nil, err
		}
		if out.Fields == nil {
			out.Fields = r.Fields
		}
		for _, row := range r.Rows {
			for _, v := range row {
				held += int64(len(v)) + 4
			}
		}
		if limit >= 0 && held > limit {
			// RETURNING rows are held until the statement ends: the statement fails,
			// and its transaction with it, rather than the process's memory.
			return nil, HeldError(limit)
		}
		out.Rows = append(out.Rows, r.Rows...)
		n += r.Tag.RowsAffected()
	}
	out.Tag = pgconn.NewCommandTag("INSERT 0 " + strconv.FormatInt(n, 10))
	return out, nil
}

// describeEmptyFeed answers an INSERT ... SELECT whose query returned no row: the tag,
// and for RETURNING the columns, as one batch statement would describe them.
func describeEmptyFeed(ctx context.Context, f *sqlplan.Feed, args sqlplan.Args, paramOIDs, oids []uint32, out *Result, steps FeedSteps) (*Result, error) {
	out.Tag = pgconn.NewCommandTag("INSERT 0 0")
	sql, err := f.Batch(1, len(oids))
	if err != nil {
		return nil, err
	}
	bp, err := steps.Prepare(ctx, sql)
	if err != nil {
		return nil, err
	}
	ds, dsql := bp.DescribeSQL()
	types := batchArgs(f, args, paramOIDs, oids, [][][]byte{make([][]byte, len(oids))}).OIDs
	fields, err := steps.Describe(ctx, ds, dsql, types)
	if err != nil {
		return nil, err
	}
	if len(fields) > 0 {
		out.Fields = fields
	}
	return out, nil
}

// FirstArgs are a statement's first n parameters, typed as described (oids where args
// leave a type out): the part a query of several steps names, when it names fewer
// than the whole statement does.
func FirstArgs(args sqlplan.Args, oids []uint32, n int) sqlplan.Args {
	out := sqlplan.Args{ForeignText: args.ForeignText}
	n = min(n, len(args.Values))
	out.Values = args.Values[:n]
	out.OIDs = make([]uint32, n)
	for i := range n {
		out.OIDs[i] = paramOID(args, oids, i)
		out.Formats = append(out.Formats, ParamFormat(args.Formats, i))
	}
	return out
}

// batchArgs are a batch statement's parameters: the client's, then each row's values,
// in binary, typed as the query's columns; an untyped literal's value (Feed.Untyped),
// text, goes as text of no declared type.
func batchArgs(f *sqlplan.Feed, args sqlplan.Args, paramOIDs, oids []uint32, rows [][][]byte) sqlplan.Args {
	out := FirstArgs(args, paramOIDs, len(args.Values))
	for _, row := range rows {
		out.Values = append(out.Values, row...)
		for i := range row {
			if f.Untyped(i) {
				out.OIDs = append(out.OIDs, 0)
				out.Formats = append(out.Formats, 0)
				continue
			}
			out.OIDs = append(out.OIDs, oids[i])
			out.Formats = append(out.Formats, 1)
		}
	}
	return out
}

func paramOID(args sqlplan.Args, described []uint32, i int) uint32 {
	if i < len(args.OIDs) && args.OIDs[i] != 0 {
		return args.OIDs[i]
	}
	if i < len(described) {
		return described[i]
	}
	return 0
}

// ParamFormat is parameter (or column) i's format code as the protocol's Bind gives
// them: none for all text, one for all, or one each.
func ParamFormat(formats []int16, i int) int16 {
	switch len(formats) {
	case 0:
		return 0
	case 1:
		return formats[0]
	}
	if i < len(formats) {
		return formats[i]
	}
	return 0
}

// SeveralStepsAllowed refuses a statement of several steps that may change what its
// server connections' sessions hold (an advisory lock, a setting, sequence state,
// temporary objects): its steps run as statements of their own on connections the
// session does not follow for them.
func SeveralStepsAllowed(plan *sqlplan.Plan) error {
	if plan.Session != 0 {
		return sqlplan.Unsupported("a %s over several shards that runs in steps (its query or subqueries first) and calls functions that may change its server connections' session state (advisory locks, set_config, sequence functions, temporary objects)", plan.Kind)
	}
	return nil
}
