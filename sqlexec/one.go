package sqlexec

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlplan"
)

// oneRead is the answer of a SELECT on one target, read from its connection in the
// caller's goroutine as the caller asks for rows: no goroutine, no batch and no copy
// stand between the server's rows and the caller, so that the statement most programs
// run most often costs less than reading it whole, and its answer's size bounds nothing.
// It needs connections that stay the session's until Release (a Session's do).
type oneRead struct {
	e     *Engine
	s     *Session
	ds    int
	conn  *pgconn.PgConn
	rr    *pgconn.ResultReader // nil once the answer ended
	first bool                 // the first row is read and not handed out yet
}

// queryOne starts a one-target SELECT on s. The statement runs, and its first row (or
// its end) is read, inside the session's Run, so that a failure there (a lock wait
// the deadlock detector ends, a stale prepared statement, any error before the first
// row) is handled as every statement's; later rows come as Rows.Next asks.
func (e *Engine) queryOne(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, formats []int16, s *Session) (*Rows, error) {
	t := b.Targets[0]
	r := &Rows{one: oneRead{e: e, s: s, ds: t.DataSource}}
	o := &r.one
	err := s.Run(ctx, t.DataSource, func(conn *pgconn.PgConn) error {
		values, oids, pformats := TargetParams(t, args)
		reuse := b.Plan.Reusable()
		for attempt := 0; ; attempt++ {
			var rr *pgconn.ResultReader
			if reuse {
				desc, err := prepared(ctx, conn, t.SQL, oids)
				if err != nil {
					return err
				}
				rr = conn.ExecStatement(ctx, desc, values, pformats, formats)
			} else {
				rr = conn.ExecParams(ctx, t.SQL, values, oids, pformats, formats)
			}
			r.fields = slices.Clone(rr.FieldDescriptions())
			if rr.NextRow() {
				o.conn, o.rr, o.first = conn, rr, true
				return nil
			}
			tag, err := rr.Close()
			if err != nil && reuse && attempt == 0 && stale(err) && conn.TxStatus() == 'I' {
				forget(conn, t.SQL, oids)
				continue
			}
			r.tag = tag
			return err
		}
	})
	if err != nil {
		s.Release(t.DataSource, err)
		return nil, e.shardErr(t.DataSource, err)
	}
	if o.rr == nil {
		s.Release(t.DataSource, nil)
	}
	return r, nil
}

// abortWait bounds the cancel request of an aborted answer.
const abortWait = 5 * time.Second

// errAborted marks a connection whose answer was aborted, so that it is not reused.
var errAborted = errors.New("sqlexec: the answer was aborted")

// next returns the next row, valid until the next call (ok false at the end).
func (o *oneRead) next() (row [][]byte, ok bool, err error) {
	if o.rr == nil {
		return nil, false, nil
	}
	if o.first {
		o.first = false
		return o.rr.Values(), true, nil
	}
	if o.rr.NextRow() {
		return o.rr.Values(), true, nil
	}
	return nil, false, o.end(false)
}

// end reads the rest of the answer and drops it (abort: asks the server to cancel the
// statement first), then gives the connection back. An error there counts as one
// inside the session's Run (Session.statementError): it fails the caller's
// transaction, and a deadlock victim's cancel reads 40P01.
func (o *oneRead) end(abort bool) error {
	if o.rr == nil {
		return nil
	}
	if abort {
		ctx, cancel := context.WithTimeout(context.Background(), abortWait)
		o.conn.CancelRequest(ctx)
		cancel()
	}
	_, err := o.rr.Close()
	if abort && err == nil {
		// The statement ended before the cancel request came: one sent late could
		// reach the connection's next statement.
		err = errAborted
	}
	o.rr = nil
	o.s.Release(o.ds, err)
	if err = o.s.statementError(o.ds, err); err != nil {
		return o.e.shardErr(o.ds, err)
	}
	return nil
}
