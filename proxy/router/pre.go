package router

import (
	"context"
	"errors"
	"strings"

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
// before it opens, and inside a client's transaction block they are refused.
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
	pre := plan.Pre
	n := len(pre.Subqueries)
	bound := make([]*sqlplan.Bound, n)
	subArgs := make([]sqlplan.Args, n)
	for i, sub := range pre.Subqueries {
		qp, err := s.r.planner.Prepare(s.planContext(ctx), sub.SQL)
		if err != nil {
			return nil, s.preFailure(ctx, plan, refused, paramOIDs, err)
		}
		if qp.Kind != sqlplan.KindSelect && qp.Kind != sqlplan.KindCoordinator {
			return nil, refused
		}
		subArgs[i] = firstArgs(args, paramOIDs, qp.NumParams)
		if bound[i], err = qp.Bind(subArgs[i]); err != nil {
			return nil, s.preFailure(ctx, plan, refused, paramOIDs, err)
		}
	}
	values := make([][]byte, n)
	oids := make([]uint32, n)
	evaluate := func(i int) error {
		sub := pre.Subqueries[i]
		cols, rows, err := s.subqueryRows(ctx, bound[i], subArgs[i], sub.Kind == sqlplan.SubqueryExists)
		if err != nil {
			return s.preFailure(ctx, plan, refused, paramOIDs, err)
		}
		if sub.Kind != sqlplan.SubqueryExists && len(cols) == 1 && collatable(cols[0]) {
			// One database compares with the subquery column's collation when it has
			// one of its own; a parameter has its type's.
			own := sub.Collates
			if !own {
				if own, err = s.r.catalog.OwnCollation(ctx, bound[i].Plan.Tables); err != nil {
					return err
				}
			}
			if own {
				return sqlplan.Unsupported("%s; a subquery over sharded tables whose text column may carry a collation of its own (COLLATE, or a column's) is not evaluated first", strings.TrimPrefix(refusalMessage(refused), "shardlab: "))
			}
		}
		values[i], oids[i], err = subqueryValue(sub.Kind, cols, rows)
		return err
	}
	for i := range n {
		if bound[i].Coordinated() {
			if err := evaluate(i); err != nil {
				return nil, err
			}
		}
	}
	if !s.explicit && !s.implicit {
		s.beginImplicit()
		defer func() {
			if end := s.endImplicit(ctx, err == nil); err == nil && end != nil {
				res, err = nil, end
			}
		}()
	}
	for i := range n {
		if !bound[i].Coordinated() {
			if err := evaluate(i); err != nil {
				return nil, err
			}
		}
	}
	wargs := firstArgs(args, paramOIDs, len(args.Values))
	wargs.Values = append(wargs.Values, values...)
	wargs.OIDs = append(wargs.OIDs, oids...)
	for range values {
		wargs.Formats = append(wargs.Formats, 1)
	}
	wp, err := s.r.planner.Prepare(s.planContext(ctx), pre.SQL)
	if err != nil {
		return nil, err
	}
	b, err := wp.Bind(wargs)
	if err != nil {
		return nil, err
	}
	return s.engineExecute(ctx, b, wargs, resultFormats)
}

// collatable reports whether values of a built-in type compare under a collation of
// the default one (name's is C, as a parameter of type name's).
func collatable(oid uint32) bool {
	const oidText, oidVarchar, oidBpchar = 25, 1043, 1042
	return oid == oidText || oid == oidVarchar || oid == oidBpchar
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

// subqueryValue is what a subquery's answer becomes in the statement: a parameter's
// value, in binary, and its type.
func subqueryValue(kind sqlplan.SubqueryKind, cols []uint32, rows [][][]byte) ([]byte, uint32, error) {
	const oidBool = 16
	if kind == sqlplan.SubqueryExists {
		if len(rows) > 0 {
			return []byte{1}, oidBool, nil
		}
		return []byte{0}, oidBool, nil
	}
	if len(cols) != 1 {
		if kind == sqlplan.SubqueryScalar {
			return nil, 0, pgError("42601", "subquery must return only one column")
		}
		return nil, 0, pgError("42601", "subquery has too many columns")
	}
	if cols[0] >= 16384 {
		return nil, 0, sqlplan.Unsupported("a subquery over several shards whose column is of a type the database defines (OID %d), which other data sources number differently; cast it to a built-in type", cols[0])
	}
	if kind == sqlplan.SubqueryScalar {
		switch len(rows) {
		case 0:
			return nil, cols[0], nil
		case 1:
			return rows[0][0], cols[0], nil
		}
		// One database raises 21000 only if it evaluates the subquery, which it may
		// not (no row to update): refused rather than an error it might not raise.
		return nil, 0, sqlplan.Unsupported("a subquery over several shards used as an expression returned more than one row")
	}
	values := make([][]byte, len(rows))
	for i, r := range rows {
		values[i] = r[0]
	}
	array, oid, ok := sqlexec.BinaryArray(cols[0], values)
	if !ok {
		return nil, 0, sqlplan.Unsupported("a subquery over several shards compared with ANY, ALL or IN, of a type (OID %d) whose array the proxy does not write", cols[0])
	}
	return array, oid, nil
}

// preFailure decides what a client sees when a subquery evaluated alone failed. An
// error of its analysis (class 42) may say that it names the statement's columns
// (correlated): the whole statement is then described on a data source, whose error
// is one database's answer; when it has none, the statement is refused. A data error
// (a division by zero, class 22) could come from a subquery one database never
// evaluates (no row needs it): refused too. Other errors (a cancel, a lost
// connection, a deadlock) are the statement's.
func (s *Session) preFailure(ctx context.Context, plan *sqlplan.Plan, refused error, paramOIDs []uint32, err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	why := strings.TrimPrefix(refusalMessage(refused), "shardlab: ")
	switch {
	case pe.Code == "42P01" || pe.Code == "42703":
		// What a reference to the statement's tables or columns gives alone.
		ds, sql := plan.DescribeSQL()
		describe := func(c *backend.Conn) error {
			_, _, err := c.Describe(ctx, sql, paramOIDs)
			return err
		}
		if s.implicit {
			// The failure aborted the statement's transaction, which fails anyway.
			s.endImplicit(ctx, false)
		}
		var oneDB error
		if s.explicit {
			// The client's transaction failed with the subquery: the statement is
			// described on a connection of the router's own.
			oneDB = s.r.describeOwn(ctx, ds, describe)
		} else {
			oneDB = s.onDataSource(ctx, ds, describe)
		}
		var one *pgconn.PgError
		if errors.As(oneDB, &one) && one.Code != "42P18" {
			return oneDB
		}
		return sqlplan.Unsupported("%s; a subquery over sharded tables that names the statement's own columns (correlated) is not evaluated first", why)
	case strings.HasPrefix(pe.Code, "22") || pe.Code == "21000":
		return sqlplan.Unsupported("%s; a subquery over sharded tables evaluated first failed (%s: %s), where one database might not evaluate it", why, pe.Code, pe.Message)
	case pe.Code == "0A000":
		return sqlplan.Unsupported("%s; a subquery over sharded tables cannot be evaluated first: %s", why, strings.TrimPrefix(pe.Message, "shardlab: "))
	}
	return err
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
