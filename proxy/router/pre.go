package router

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// runPre runs an UPDATE or DELETE that Bind refused (refused) over several shards,
// whose subqueries over sharded tables are evaluated first (sqlplan.Pre): each alone,
// through the usual paths, its answer then a parameter of the statement, which runs
// without them. Outside a transaction block the statement gets a transaction of its
// own, as INSERT ... SELECT does; subqueries that only the coordinator answers are read
// before it opens (inside a client's transaction block, only where the coordinator may
// read there: see readsCommitted).
//
// text is the statement as the client sent it: a plan of a simple-protocol statement is
// shared by every text of its shape (its SQL is the first one's).
func (s *Session) runPre(ctx context.Context, plan *sqlplan.Plan, text string, refused error, args sqlplan.Args, paramOIDs []uint32, resultFormats []int16) (res *sqlexec.Result, err error) {
	if !plan.Pre.AsWritten {
		// A plan of the normalised text: the subqueries keep the client's literals in
		// the plan of its own text.
		own, err := s.r.planner.Prepare(s.planContext(ctx), text)
		if err != nil {
			return nil, err
		}
		if own.Pre == nil {
			return nil, refused
		}
		plan = own
	}
	steps := sqlexec.PreSteps{
		Prepare:      s.prepare,
		Rows:         s.subqueryRows,
		OwnCollation: s.r.catalog.OwnCollation,
		Domains:      s.r.catalog.Domains,
		Execute:      s.engineExecute,
		Failure: func(ctx context.Context, err error) error {
			return s.preFailure(ctx, plan, refused, paramOIDs, err)
		},
	}
	if !s.explicit && !s.implicit {
		steps.Begin = func() error { s.beginImplicit(); return nil }
		steps.End = s.endImplicit
	}
	return s.r.engine.RunPre(ctx, plan, refused, args, paramOIDs, resultFormats, steps)
}

// subqueryRows reads a subquery's answer whole, in binary, within the bound on the rows
// a statement holds in memory (--max-held-memory): its column types and its rows. first
// keeps the first row only (EXISTS), reading the rest.
func (s *Session) subqueryRows(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, first bool) ([]uint32, [][][]byte, error) {
	limit := s.r.engine.MaxHeld()
	var size int64
	var rows [][][]byte
	keep := func(row [][]byte) error {
		if first && len(rows) > 0 {
			return nil
		}
		out := make([][]byte, len(row))
		size += 24 + 24*int64(len(row)) // the row's and its values' slice headers
		for i, v := range row {
			size += int64(len(v))
			if v != nil {
				out[i] = append(make([]byte, 0, len(v)), v...)
			}
		}
		if limit >= 0 && size > limit {
			return sqlexec.ErrSpoolFull
		}
		rows = append(rows, out)
		return nil
	}
	held := func(err error) error {
		if errors.Is(err, sqlexec.ErrSpoolFull) {
			return sqlexec.HeldError(limit)
		}
		return err
	}
	var fields []pgconn.FieldDescription
	if b.Coordinated() {
		sink := &rowSink{keep: keep}
		t := b.Targets[0]
		values, oids, formats := sqlexec.TargetParams(t, args)
		st := backend.Statement{SQL: t.SQL, ParamOIDs: oids, Values: values, ParamFormats: formats, ResultFormats: []int16{1}, Describe: true}
		err := s.runCoordinated(ctx, b, args.OIDs, false, func(c *backend.Conn) error {
			_, err := c.ExecAfter(ctx, nil, &st, sink)
			return err
		})
		if err == nil {
			err = sink.err
		}
		if err != nil {
			return nil, nil, held(err)
		}
		fields = sink.fields
	} else {
		defer s.multiTarget(b)()
		rs, err := s.r.engine.Query(ctx, b, args, []int16{1}, &s.conns)
		if err != nil {
			return nil, nil, err
		}
		defer rs.Close()
		for rs.Next() {
			if err := keep(rs.Values()); err != nil {
				rs.Abort()
				return nil, nil, held(err)
			}
		}
		if _, err := rs.Close(); err != nil {
			return nil, nil, err
		}
		fields = rs.Fields()
	}
	oids := make([]uint32, len(fields))
	for i, f := range fields {
		oids[i] = f.DataTypeOID
	}
	return oids, rows, nil
}

// preFailure decides what a client sees when a subquery evaluated alone failed. An
// error of its analysis (class 42) may say that it names the statement's columns
// (correlated): the whole statement is then described on a data source, whose error
// is one database's answer; when it has none, the statement is refused. A data error
// (a division by zero, class 22) could come from a subquery one database never
// evaluates (no row needs it): refused too. Other errors (a cancel, a lost
// connection, a deadlock) are the statement's.
func (s *Session) preFailure(ctx context.Context, plan *sqlplan.Plan, refused error, paramOIDs []uint32, err error) error {
	return sqlexec.PreFailure(refused, err, func(ds int, sql string) error {
		describe := func(c *backend.Conn) error {
			_, _, err := c.Describe(ctx, sql, paramOIDs)
			return err
		}
		if s.implicit {
			// The failure aborted the statement's transaction, which fails anyway.
			s.endImplicit(ctx, false)
		}
		if s.explicit {
			// The client's transaction failed with the subquery: the statement is
			// described on a connection of the router's own.
			return s.r.describeOwn(ctx, ds, describe)
		}
		return s.onDataSource(ctx, ds, describe)
	}, plan)
}

// rowSink keeps a coordinator's answer.
type rowSink struct {
	keep   func([][]byte) error
	fields []pgconn.FieldDescription
	err    error
}

func (k *rowSink) Send(msg pgproto3.BackendMessage) {
	switch m := msg.(type) {
	case *pgproto3.RowDescription:
		k.fields = make([]pgconn.FieldDescription, len(m.Fields))
		for i, fd := range m.Fields {
			k.fields[i] = pgconn.FieldDescription{Name: string(fd.Name), DataTypeOID: fd.DataTypeOID, Format: fd.Format}
		}
	case *pgproto3.DataRow:
		if k.err == nil {
			k.err = k.keep(m.Values)
		}
	}
}

// describeOwn runs fn on a connection of data source ds that serves no client, with the
// server's default settings.
func (r *Router) describeOwn(ctx context.Context, ds int, fn func(*backend.Conn) error) error {
	l, err := serverPool{r}.Acquire(ctx, ds)
	if err != nil {
		return err
	}
	lease := l.(serverLease)
	err = fn(lease.c)
	lease.Release(reusable(err))
	return err
}
