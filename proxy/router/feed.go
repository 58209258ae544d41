package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

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

// severalStepsAllowed refuses a statement of several steps that may change what its
// server connections' sessions hold (an advisory lock, a setting, sequence state,
// temporary objects): its steps run as statements of their own on connections the
// session does not follow for them.
func severalStepsAllowed(plan *sqlplan.Plan) error {
	if plan.Session != 0 {
		return sqlplan.Unsupported("a %s over several shards that runs in steps (its query or subqueries first) and calls functions that may change its server connections' session state (advisory locks, set_config, sequence functions, temporary objects)", plan.Kind)
	}
	return nil
}

// insertSelect runs an INSERT ... SELECT into a sharded table (sqlplan.Feed): its query
// through the usual paths (one shard, the merge, or the coordinator database), its
// rows read whole into a spool, then inserted in batches on the client's own shard
// connections, each row on the shard its key names. Outside a transaction block the
// statement gets a transaction of its own, committed by the committer (two-phase with
// --two-phase): a failure anywhere leaves no row written. paramOIDs are the types of the
// client's parameters, as the statement was described.
func (s *Session) insertSelect(ctx context.Context, plan *sqlplan.Plan, args sqlplan.Args, paramOIDs []uint32, resultFormats []int16) (res *sqlexec.Result, err error) {
	f := plan.Feed
	qp, err := s.r.planner.Prepare(s.planContext(ctx), f.Query)
	if err != nil {
		return nil, err
	}
	if qp.Kind != sqlplan.KindSelect && qp.Kind != sqlplan.KindCoordinator {
		return nil, sqlplan.Unsupported("INSERT ... SELECT into sharded table %s whose query is planned as %s", f.Table, qp.Kind)
	}
	qargs := firstArgs(args, paramOIDs, qp.NumParams)
	qb, err := qp.Bind(qargs)
	if err != nil {
		return nil, err
	}
	spool := sqlexec.NewSpool(s.spoolLimit())
	defer spool.Close()
	own := !s.explicit && !s.implicit
	var fields []pgconn.FieldDescription
	if qb.Coordinated() {
		// The coordinator reads only outside a transaction block, before the writes
		// (which then cannot feed back into the read).
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
	return s.insertBatches(ctx, f, args, paramOIDs, oids, spool, resultFormats)
}

// insertBatches inserts a spool's rows, in batches of Feed.RowsPerBatch rows.
func (s *Session) insertBatches(ctx context.Context, f *sqlplan.Feed, args sqlplan.Args, paramOIDs, oids []uint32, spool *sqlexec.Spool, resultFormats []int16) (*sqlexec.Result, error) {
	out := &sqlexec.Result{}
	if spool.Rows() == 0 {
		// No row: the statement still checks as one database's would, and says what
		// RETURNING would have returned.
		return s.describeEmptyFeed(ctx, f, args, paramOIDs, oids, out)
	}
	var n, held int64
	limit := s.r.engine.MaxHeld()
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
		bp, err := s.r.planner.Prepare(s.planContext(ctx), sql)
		if err != nil {
			return nil, err
		}
		bargs := batchArgs(f, args, paramOIDs, oids, rows)
		if bp.Keys != nil {
			if bargs.Keys, err = s.drawKeys(ctx, bp.Keys); err != nil {
				return nil, err
			}
		}
		b, err := bp.Bind(bargs)
		if err != nil {
			return nil, err
		}
		r, err := s.engineExecute(ctx, b, bargs, resultFormats)
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
			// and its transaction with it, rather than the proxy's memory.
			return nil, sqlexec.HeldError(limit)
		}
		out.Rows = append(out.Rows, r.Rows...)
		n += r.Tag.RowsAffected()
	}
	out.Tag = pgconn.NewCommandTag("INSERT 0 " + strconv.FormatInt(n, 10))
	return out, nil
}

// describeEmptyFeed answers an INSERT ... SELECT whose query returned no row: the tag,
// and for RETURNING the columns, as one batch statement would describe them.
func (s *Session) describeEmptyFeed(ctx context.Context, f *sqlplan.Feed, args sqlplan.Args, paramOIDs, oids []uint32, out *sqlexec.Result) (*sqlexec.Result, error) {
	out.Tag = pgconn.NewCommandTag("INSERT 0 0")
	sql, err := f.Batch(1, len(oids))
	if err != nil {
		return nil, err
	}
	bp, err := s.r.planner.Prepare(s.planContext(ctx), sql)
	if err != nil {
		return nil, err
	}
	ds, dsql := bp.DescribeSQL()
	types := batchArgs(f, args, paramOIDs, oids, [][][]byte{make([][]byte, len(oids))}).OIDs
	var described []pgproto3.FieldDescription
	err = s.onDataSource(ctx, ds, func(c *backend.Conn) error {
		var err error
		_, described, err = c.Describe(ctx, dsql, types)
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(described) > 0 {
		out.Fields = make([]pgconn.FieldDescription, len(described))
		for i, fd := range described {
			out.Fields[i] = pgconn.FieldDescription{Name: string(fd.Name), TableOID: fd.TableOID, TableAttributeNumber: fd.TableAttributeNumber,
				DataTypeOID: fd.DataTypeOID, DataTypeSize: fd.DataTypeSize, TypeModifier: fd.TypeModifier}
		}
	}
	return out, nil
}

// spoolRows reads a query's rows, in binary, into spool, on the client's connections
// (in its transaction: the query sees the client's own writes).
func (s *Session) spoolRows(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, spool *sqlexec.Spool) ([]pgconn.FieldDescription, error) {
	defer s.multiTarget(b)()
	rows, err := s.r.engine.Query(ctx, b, args, []int16{1}, &s.conns)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		if err := spool.Append(rows.Values()); err != nil {
			rows.Abort()
			return nil, err
		}
	}
	if _, err := rows.Close(); err != nil {
		return nil, err
	}
	return rows.Fields(), nil
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

// firstArgs are the client's first n parameters, typed as described: a query that
// names fewer of them than the INSERT does.
func firstArgs(args sqlplan.Args, oids []uint32, n int) sqlplan.Args {
	out := sqlplan.Args{ForeignText: args.ForeignText}
	n = min(n, len(args.Values))
	out.Values = args.Values[:n]
	out.OIDs = make([]uint32, n)
	for i := range n {
		out.OIDs[i] = paramOID(args, oids, i)
		out.Formats = append(out.Formats, format(args.Formats, i))
	}
	return out
}

// batchArgs are a batch statement's parameters: the client's, then each row's values,
// in binary, typed as the query's columns; an untyped literal's value (Feed.Untyped),
// text, goes as text of no declared type.
func batchArgs(f *sqlplan.Feed, args sqlplan.Args, paramOIDs, oids []uint32, rows [][][]byte) sqlplan.Args {
	out := firstArgs(args, paramOIDs, len(args.Values))
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
