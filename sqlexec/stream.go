package sqlexec

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlplan"
)

// A read over several shards whose merge is a concatenation, or a merge of streams the
// shards sort (ORDER BY without aggregation or DISTINCT), is answered as its rows
// arrive: each data source's rows come through a small buffer of batches, and the
// caller reads them one at a time (Engine.Query). The answer's size then bounds
// neither the engine's memory nor the time to its first row: a concatenation holds a
// few batches per target, a sort merge one row per target beside them. A data source
// whose rows are not read yet waits, its server held back by the connection's flow
// control. Other statements (aggregation, DISTINCT, writes, text ranked under a
// collation that does not compare bytes) are answered whole, as Execute answers them.

// Batches: a data source's reader hands over rows in batches of at most batchRows rows
// or batchBytes bytes, and at most streamBatches wait per target.
const (
	batchRows     = 256
	batchBytes    = 64 << 10
	streamBatches = 2
	firstBuffer   = 512 // bytes of a target's first row buffer
)

// Rows is the answer to a statement, read row by row (Engine.Query). Close must be
// called, and ends the shards' work on the answer.
type Rows struct {
	fields []pgconn.FieldDescription
	row    [][]byte
	n      int64
	tag    pgconn.CommandTag
	err    error
	closed bool

	buf [][][]byte // an answer read whole
	st  *stream    // or one read as it arrives
	one oneRead    // or one target's, read in the caller's goroutine (one.rr set)
}

// RowsOf returns a gathered answer, to be read row by row.
func RowsOf(res *Result) *Rows { return &Rows{fields: res.Fields, buf: res.Rows, tag: res.Tag} }

// Fields describes the answer's columns.
func (r *Rows) Fields() []pgconn.FieldDescription { return r.fields }

// Next moves to the next row, and reports whether there is one. After false, Close
// tells whether the answer ended or failed.
func (r *Rows) Next() bool {
	if r.closed || r.err != nil {
		return false
	}
	if r.one.rr != nil {
		row, ok, err := r.one.next()
		if err != nil {
			r.err = err
		}
		if !ok {
			r.tag = CommandTag(sqlplan.KindSelect, r.n, pgconn.CommandTag{})
			return false
		}
		r.row = row
		r.n++
		return true
	}
	if r.st == nil {
		if len(r.buf) == 0 {
			return false
		}
		r.row, r.buf = r.buf[0], r.buf[1:]
		r.n++
		return true
	}
	row, ok, err := r.st.next()
	if err != nil {
		r.err = err
		return false
	}
	if !ok {
		return false
	}
	r.row = row
	r.n++
	return true
}

// Values returns the current row's values, valid until the next call of Next.
func (r *Rows) Values() [][]byte { return r.row }

// FetchHint tells an answer read in parts (Engine.QueryInParts) how many rows the
// caller reads next (0: not known): its shards are asked for no more at a time, so
// that they compute no row far past what the caller wants, as one server would not.
func (r *Rows) FetchHint(n uint32) {
	st := r.st
	if st == nil || st.parts == nil {
		return
	}
	switch {
	case n == 0 || st.final != nil:
		st.parts.hint = 0 // groups gathered to be sorted: every row is read anyway
	case st.grouped:
		// A shard sends one row a group; the merge reads one more to close the last
		// group, after the rows an OFFSET still skips.
		st.parts.hint = uint32(min(int64(n)+min(st.skip, partsRows)+1, partsRows))
	default:
		// The rows an OFFSET still skips pass through the merge first.
		st.parts.hint = uint32(min(int64(n)+min(st.skip, partsRows), partsRows))
	}
}

// Close ends the answer and releases its connections. Rows not read yet are read and
// dropped, so that the connections stay usable (a caller's transaction on them goes
// on); the time that takes is the time the rest of the answer would have taken, its
// memory one batch per data source. It returns the command tag, or the error that
// ended the answer. It may be called more than once.
func (r *Rows) Close() (pgconn.CommandTag, error) { return r.end(false) }

// Abort ends the answer at once: a data source still sending rows is cancelled, and
// its connection is not reused. For a caller that will use none of them again (its
// client is gone).
func (r *Rows) Abort() { r.end(true) }

func (r *Rows) end(abort bool) (pgconn.CommandTag, error) {
	if r.closed {
		return r.tag, r.err
	}
	r.closed = true
	r.row, r.buf = nil, nil
	if r.one.rr != nil {
		if err := r.one.end(abort); err != nil && r.err == nil {
			r.err = err
		}
		r.tag = CommandTag(sqlplan.KindSelect, r.n, pgconn.CommandTag{})
	}
	if r.st != nil {
		// After an error the targets still answering are cancelled, except inside a
		// transaction, where that would break their connections (stream.stop).
		if err := r.st.close(abort || r.err != nil && !r.st.conns.InTransaction()); err != nil && r.err == nil {
			r.err = err
		}
		r.st = nil
		r.tag = CommandTag(sqlplan.KindSelect, r.n, pgconn.CommandTag{})
	}
	return r.tag, r.err
}

// Buffer reads the rest of a streamed answer into memory and releases its
// connections, for a caller that must run another statement on them before it reads
// on (database/sql allows one while rows are open). Next then hands out what it read.
func (r *Rows) Buffer() error {
	var next func() ([][]byte, bool, error)
	var end func(abort bool) error
	var held *heldBudget
	keep := false // the targets still answering after an error answer to the end (stream.stop)
	switch {
	case r.closed:
		return nil
	case r.one.rr != nil:
		// A one-target answer's rows live in the connection's buffer: copied out.
		next = func() ([][]byte, bool, error) {
			row, ok, err := r.one.next()
			if ok {
				row = cloneRow(row)
			}
			return row, ok, err
		}
		end, held = r.one.end, r.one.e.budget()
	case r.st != nil:
		st := r.st
		r.st = nil
		next, end, held = st.next, st.close, st.e.budget()
		keep = st.conns.InTransaction()
	default:
		return nil
	}
	var rest [][][]byte
	over := false
	for {
		row, ok, err := next()
		if err != nil {
			r.err = err
			break
		}
		if !ok {
			break
		}
		if !held.take(rowsSize([][][]byte{row})) {
			r.err, rest, over = heldError(held.limit), nil, true
			break
		}
		rest = append(rest, row)
	}
	// Past the bound the rest is read and dropped: the connections stay usable. A data
	// source's error met on the way wins over the bound's: the caller's transaction
	// failed there.
	if err := end(r.err != nil && !over && !keep); err != nil && (r.err == nil || over) {
		r.err = err
	}
	// The tag counts what the caller read before and what it will read now.
	r.tag = CommandTag(sqlplan.KindSelect, r.n+int64(len(rest)), pgconn.CommandTag{})
	r.buf = rest
	return r.err
}

// Query runs a bound statement as Execute does, and returns its answer to be read row
// by row: streamed where the merge allows it (see above), read whole otherwise.
func (e *Engine) Query(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, resultFormats []int16, conns Conns) (*Rows, error) {
	if s, ok := conns.(*Session); ok && oneTarget(b) {
		return e.queryOne(ctx, b, args, resultFormats, s)
	}
	return e.query(ctx, b, args, resultFormats, conns, false)
}

// QueryInParts is Query for an answer read in parts between which the caller runs
// other statements on the same connections, inside a transaction (a portal executed
// with a row limit, Execute after Execute). Each target runs as a portal on its data
// source's server, and the merge fetches its rows in batches when it needs them, each
// batch its own round trip: between two calls of Next that do not need a batch, no
// connection is busy, and what the server has not sent waits there. Rows read ahead
// are at most a batch per target. ctx must last as long as the Rows. An answer that
// cannot be streamed (see streamable) is read whole, as Query reads it.
func (e *Engine) QueryInParts(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, resultFormats []int16, conns Conns) (*Rows, error) {
	if !conns.InTransaction() {
		return nil, errors.New("sqlexec: an answer read in parts needs a transaction: its portals end with it")
	}
	return e.query(ctx, b, args, resultFormats, conns, true)
}

func (e *Engine) query(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, resultFormats []int16, conns Conns, inParts bool) (*Rows, error) {
	if !streamable(b) {
		res, err := e.Execute(ctx, b, args, resultFormats, conns)
		if err != nil {
			return nil, err
		}
		return RowsOf(res), nil
	}
	var shardFormats []int16
	if b.Merge != nil {
		shardFormats = b.Merge.ShardFormats(resultFormats)
	} else {
		shardFormats = resultFormats
	}
	// The collation text is compared under, asked before the stream holds a connection
	// of every data source (the catalog may draw on the same pools); it matters only
	// if the columns turn out to include text.
	var coll string
	var collErr error
	if b.Merge != nil && b.Merge.ComparesValues() {
		// A grouping merge has no COLLATE clause (sqlplan.MergeSpec.GroupOrder): its keys
		// sort under the tables' collations, which textCollation then tells.
		coll, collErr = e.textCollation(ctx, b)
	}
	var st *stream
	if inParts {
		st = e.startParts(ctx, b, args, shardFormats, conns)
		if err := st.parts.bind(st); err != nil {
			st.close(true)
			return nil, err
		}
	} else {
		st = e.startStream(ctx, b, args, shardFormats, conns)
	}
	st.client = resultFormats
	whole, err := st.prime(coll, collErr)
	if err != nil {
		st.close(!conns.InTransaction()) // inside a transaction the others answer to the end (stop)
		return nil, err
	}
	if whole {
		// Text ranked under a collation: the ranks need every value first. The
		// connections go back before the ranks are asked for.
		results, err := st.readAll()
		if cerr := st.close(err != nil && !conns.InTransaction()); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		res, err := e.merge(ctx, b, results, resultFormats, CombineOptions{})
		if err != nil {
			return nil, err
		}
		return RowsOf(res), nil
	}
	return &Rows{fields: st.fields, st: st}, nil
}

// streamable reports whether a bound statement's answer can be read as it arrives: a
// SELECT over several targets whose merge concatenates, merge-sorts streams that come
// one per data source, combines a plain aggregate's one row per target, or meets the
// rows of each group (or each set of equal rows, for DISTINCT) one after another in
// streams sorted by the group (MergeSpec.GroupOrder) that come one per data source.
func streamable(b *sqlplan.Bound) bool {
	if b.Plan.Kind != sqlplan.KindSelect || b.Plan.Write || !b.MultiTarget() || b.Broadcast {
		return false
	}
	m := b.Merge
	switch {
	case m == nil:
		return true
	case m.Aggregate && m.Distinct:
		return false
	case m.Aggregate && len(m.GroupOrder) == 0 && hasGroupKeys(m):
		return false
	case m.Distinct && len(m.GroupOrder) == 0:
		return false
	case !m.Aggregate && !m.Distinct && len(m.OrderBy) == 0:
		return true
	}
	// A sort merge, and a grouping one, needs the head of every target at once:
	// targets that share a connection would wait on each other.
	seen := map[int]bool{}
	for _, t := range b.Targets {
		if seen[t.DataSource] {
			return false
		}
		seen[t.DataSource] = true
	}
	return true
}

// oneTarget reports whether a bound statement is a SELECT on one data source's target
// as it is, whose rows the caller can read straight from the connection (queryOne).
func oneTarget(b *sqlplan.Bound) bool {
	return (b.Plan.Kind == sqlplan.KindSelect || b.Plan.Kind == sqlplan.KindCoordinator) && !b.Plan.Write && len(b.Targets) == 1 &&
		b.Merge == nil && !b.Broadcast
}

// batch is a part of one target's answer.
type batch struct {
	fields []pgconn.FieldDescription // in a target's first batch
	rows   [][][]byte
	tag    pgconn.CommandTag
	end    bool // the target's last batch
}

// cursor reads one target's batches.
type cursor struct {
	target int
	ch     chan batch
	fields []pgconn.FieldDescription
	rows   [][][]byte
	pos    int
	ended  bool
	tag    pgconn.CommandTag
	n      int64 // rows pulled
}

// stream is a statement's answer on its way from the data sources.
type stream struct {
	e      *Engine
	b      *sqlplan.Bound
	conns  Conns
	cancel context.CancelFunc
	wg     sync.WaitGroup
	order  []int   // the data sources, each read by a goroutine
	errs   []error // by data source, set before its targets' channels close
	curs   []*cursor

	fields  []pgconn.FieldDescription // the client's columns
	first   []pgconn.FieldDescription // the shards' columns, as the first target sent them
	outputs int
	sorted  bool
	keys    []sortCol
	cols    []colType
	h       *rowHeap
	cur     int // the target a concatenation reads
	skip    int64
	left    int64 // rows still to hand out (-1: no limit)
	done    bool  // every row the client gets has been handed out

	// Grouping (see groups): the rows of a group arrive one after another.
	grouped    bool
	agg        *aggregator // combines a group's rows (nil for DISTINCT: it keeps the first)
	pending    [][]byte    // the next group's first row, read ahead
	pendingKey []value     // and its group key
	client     []int16     // the client's result formats
	ended      bool        // the sources are read to their end
	final      []sortCol   // the client's order over the merged rows, when the groups need sorting
	mcols      []colType   // the merged rows' column types
	sorting    bool        // the groups are being gathered for the final sort
	gathered   [][][]byte  // the sorted groups, handed out from the front

	parts *parts // the targets' portals, when the answer is read in parts (nil: readers)

	// refill is 1 + the target whose head a sort merge handed out last (0: none): its
	// next row is pulled when the merge next needs a row, not before, so that a
	// shard is asked for no row the caller may never want.
	refill int
}

// startStream starts reading every target: one goroutine per data source runs its
// targets in order on its connection.
func (e *Engine) startStream(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, formats []int16, conns Conns) *stream {
	ctx, cancel := context.WithCancel(ctx)
	st := &stream{e: e, b: b, conns: conns, cancel: cancel, errs: make([]error, e.rules.NumDataSources()+1), // + the coordinator's
		skip: 0, left: -1}
	if m := b.Merge; m != nil {
		st.skip, st.left = max(b.Offset, 0), b.Limit
	}
	byDS := map[int][]int{}
	for i, t := range b.Targets {
		if _, ok := byDS[t.DataSource]; !ok {
			st.order = append(st.order, t.DataSource)
		}
		byDS[t.DataSource] = append(byDS[t.DataSource], i)
		st.curs = append(st.curs, &cursor{target: i, ch: make(chan batch, streamBatches)})
	}
	reuse := b.Plan.Reusable()
	for _, ds := range st.order {
		st.wg.Add(1)
		go func(ds int, targets []int) {
			defer st.wg.Done()
			err := conns.Run(ctx, ds, func(conn *pgconn.PgConn) error {
				for _, i := range targets {
					if err := streamTarget(ctx, conn, b.Targets[i], args, formats, reuse, st.curs[i].ch); err != nil {
						return err
					}
				}
				return nil
			})
			st.errs[ds] = err
			for _, i := range targets {
				close(st.curs[i].ch)
			}
		}(ds, byDS[ds])
	}
	return st
}

// streamTarget runs one target's statement on conn and sends its answer in batches to
// out. A prepared statement the server finds stale is prepared again, as in
// execTarget, if no batch has gone yet.
func streamTarget(ctx context.Context, conn *pgconn.PgConn, t sqlplan.Target, args sqlplan.Args, formats []int16, reuse bool, out chan<- batch) error {
	values, oids, pformats := TargetParams(t, args)
	if !reuse {
		_, err := sendResult(ctx, conn.ExecParams(ctx, t.SQL, values, oids, pformats, formats), out)
		return err
	}
	for attempt := 0; ; attempt++ {
		desc, err := prepared(ctx, conn, t.SQL, oids)
		if err != nil {
			return err
		}
		sent, err := sendResult(ctx, conn.ExecStatement(ctx, desc, values, pformats, formats), out)
		if err != nil && !sent && attempt == 0 && stale(err) && conn.TxStatus() == 'I' {
			forget(conn, t.SQL, oids)
			continue
		}
		return err
	}
}

// sendResult reads a result and sends it in batches, copying the rows out of the
// connection's buffer; sent reports whether a batch went.
func sendResult(ctx context.Context, rr *pgconn.ResultReader, out chan<- batch) (sent bool, err error) {
	b := batch{fields: slices.Clone(rr.FieldDescriptions())}
	var buf []byte
	size := 0
	send := func() error {
		select {
		case out <- b:
			sent = true
			b, size = batch{}, 0
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for rr.NextRow() {
		row, need := copyRow(&buf, rr.Values())
		b.rows = append(b.rows, row)
		size += need
		// The first row goes at once: the time to an answer's first row does not wait
		// for a batch to fill.
		if len(b.rows) >= batchRows || size >= batchBytes || !sent {
			if err := send(); err != nil {
				rr.Close()
				return sent, err
			}
		}
	}
	tag, err := rr.Close()
	if err != nil {
		return sent, err
	}
	b.tag, b.end = tag, true
	return sent, send()
}

// copyRow copies a row's values out of the connection's buffer into *buf, which it
// replaces by a larger one when they do not fit; need is their size.
func copyRow(buf *[]byte, src [][]byte) (row [][]byte, need int) {
	for _, v := range src {
		need += len(v)
	}
	if cap(*buf)-len(*buf) < need {
		// Buffers grow from small to a batch's size, so that a short answer (one row,
		// most often) does not cost a batch's allocation.
		*buf = make([]byte, 0, max(need, min(batchBytes, max(firstBuffer, 2*cap(*buf)))))
	}
	row = make([][]byte, len(src))
	for i, v := range src {
		if v != nil {
			start := len(*buf)
			*buf = append(*buf, v...)
			row[i] = (*buf)[start:len(*buf):len(*buf)]
		}
	}
	return row, need
}

// fill makes the cursor hold an unread row, or end; a target whose data source failed
// reports its error.
func (st *stream) fill(c *cursor) error {
	for c.pos >= len(c.rows) && !c.ended {
		ds := st.b.Targets[c.target].DataSource
		var bt batch
		if st.parts != nil {
			var err error
			if bt, err = st.parts.fetch(st, c); err != nil {
				return st.e.shardErr(ds, err)
			}
		} else {
			var open bool
			if bt, open = <-c.ch; !open {
				err := st.errs[ds]
				if errors.Is(err, ErrTxAborted) {
					ds, err = st.cause(ds, err)
				}
				if err == nil {
					err = fmt.Errorf("sqlexec: the answer ended before its end")
				}
				return st.e.shardErr(ds, err)
			}
		}
		if bt.fields != nil && c.fields == nil {
			c.fields = bt.fields
			if st.first == nil {
				st.first = c.fields
			} else if err := sameShape(st.first, c.fields); err != nil {
				return st.e.shardErr(ds, err)
			}
		}
		c.rows, c.pos, c.ended, c.tag = bt.rows, 0, bt.end, bt.tag
	}
	return nil
}

// pull returns the cursor's next row (ok false at its end).
func (st *stream) pull(c *cursor) ([][]byte, bool, error) {
	if err := st.fill(c); err != nil {
		return nil, false, err
	}
	if c.pos >= len(c.rows) {
		return nil, false, nil
	}
	row := c.rows[c.pos]
	c.rows[c.pos] = nil
	c.pos++
	c.n++
	return row, true, nil
}

// errShardOrder refuses a merge of streams that a shard did not sort as the merge
// compares: merged on, they would interleave wrongly (a group met twice, rows out of
// order).
var errShardOrder = unsupported("merging rows that a shard sorted otherwise than the merge compares them: " +
	"a sort or group key under a collation the merge cannot tell from the tables' (a COLLATE clause in a subquery, a domain's), " +
	"or whose type sorts otherwise than its values compare; add COLLATE \"C\" to the key or pin the statement to one shard")

// prime waits for the first rows: those of the first target for a concatenation, of
// every target for a sort merge. It settles the columns, and reports whether the
// answer must be read whole (text compared under coll, a collation that does not
// compare bytes; collErr refuses comparing text at all).
func (st *stream) prime(coll string, collErr error) (whole bool, err error) {
	m := st.b.Merge
	st.grouped = m != nil && (m.Aggregate || m.Distinct)
	if st.grouped {
		st.sorted = len(m.GroupOrder) > 0
	} else {
		st.sorted = m != nil && len(m.OrderBy) > 0
	}
	primed := st.curs[:1]
	if st.sorted || st.grouped {
		primed = st.curs // a group's rows may come from any target (one per data source: see streamable)
	}
	for _, c := range primed {
		if err := st.fill(c); err != nil {
			return false, err
		}
	}
	hidden := 0
	if m != nil {
		hidden = m.Hidden
	}
	st.outputs = len(st.first) - hidden
	st.fields = st.first[:st.outputs]
	if st.grouped {
		if whole, err := st.primeGroups(coll, collErr); whole || err != nil {
			return whole, err
		}
	}
	if !st.sorted {
		return false, nil
	}
	if st.cols == nil {
		for _, f := range st.first {
			st.cols = append(st.cols, colType{oid: f.DataTypeOID, format: f.Format})
		}
	}
	if !st.grouped && len(textColumns(m, st.first)) > 0 {
		if collErr != nil {
			return false, collErr
		}
		if coll != "" {
			return true, nil
		}
	}
	if !st.grouped {
		st.keys = make([]sortCol, len(m.OrderBy))
		for i, k := range m.OrderBy {
			st.keys[i] = sortCol{col: m.SortColumn(k, len(st.cols)), desc: k.Desc, nullsFirst: k.NullsFirst}
			if !comparable(st.cols[st.keys[i].col].oid) {
				return false, errNoOrder(st.cols[st.keys[i].col].oid)
			}
		}
	}
	st.h = &rowHeap{keys: st.keys}
	for i, c := range st.curs {
		row, ok, err := st.pull(c)
		if err != nil {
			return false, err
		}
		if !ok {
			continue
		}
		key, err := decodeCols(row, st.keys, st.cols)
		if err != nil {
			return false, err
		}
		heap.Push(st.h, &keyedRow{row: row, key: key, stream: i})
	}
	return false, nil
}

// next returns the next row the client gets.
func (st *stream) next() ([][]byte, bool, error) {
	for !st.done {
		if st.left == 0 {
			st.done = true
			break
		}
		var row [][]byte
		var ok bool
		var err error
		if st.grouped {
			row, ok, err = st.nextGroup()
		} else {
			row, _, ok, err = st.source()
		}
		if err != nil {
			return nil, false, err
		}
		if !ok {
			st.done = true
			break
		}
		if st.skip > 0 {
			st.skip--
			continue
		}
		if st.left > 0 {
			st.left--
		}
		return row[:st.outputs], true, nil
	}
	return nil, false, nil
}

// source returns the shards' next row: from the target read in turn for a
// concatenation, the least of the targets' heads for a sort merge (with its sort key).
func (st *stream) source() (row [][]byte, key []value, ok bool, err error) {
	if st.sorted {
		if st.refill > 0 {
			// The head handed out last is still on top: its target's next row
			// replaces it.
			st.refill = 0
			top := st.h.items[0]
			nr, ok, err := st.pull(st.curs[top.stream])
			if err != nil {
				return nil, nil, false, err
			}
			if ok {
				nk, err := decodeCols(nr, st.keys, st.cols)
				if err != nil {
					return nil, nil, false, err
				}
				switch c := cmpKeys(nk, top.key, st.keys); {
				case c < 0:
					return nil, nil, false, errShardOrder
				case c == 0 && st.agg != nil:
					// A shard answers one row per group: two are a set-returning
					// function beside the aggregates, which folding would miscount.
					return nil, nil, false, errGroupRows
				}
				top.row, top.key = nr, nk
				heap.Fix(st.h, 0)
			} else {
				heap.Pop(st.h)
			}
		}
		if st.h.Len() == 0 {
			return nil, nil, false, nil
		}
		top := st.h.items[0]
		st.refill = 1 + top.stream
		return top.row, top.key, true, nil
	}
	for st.cur < len(st.curs) {
		row, ok, err := st.pull(st.curs[st.cur])
		if err != nil || ok {
			return row, nil, ok, err
		}
		st.cur++
	}
	return nil, nil, false, nil
}

// readAll reads the rest of every target, for a merge of the whole answers.
func (st *stream) readAll() ([]targetResult, error) {
	held := st.e.budget()
	results := make([]targetResult, len(st.curs))
	for i, c := range st.curs {
		for {
			if err := st.fill(c); err != nil {
				return nil, err
			}
			if !held.take(rowsSize(c.rows[c.pos:])) {
				return nil, heldError(held.limit)
			}
			results[i].rows = append(results[i].rows, c.rows[c.pos:]...)
			c.pos = len(c.rows)
			if c.ended {
				break
			}
		}
		results[i].fields, results[i].tag = c.fields, c.tag
	}
	return results, nil
}

// close ends the stream. Unless abort, the targets' remaining rows are read and
// dropped, so that the connections stay usable; with abort (or when a target failed)
// the targets are cancelled. It waits for the readers and releases the connections.
func (st *stream) close(abort bool) error {
	if st.parts != nil {
		return st.parts.close(st)
	}
	var err error
	if !abort {
		for _, c := range st.curs {
			for !c.ended {
				c.pos = len(c.rows)
				if err = st.fill(c); err != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
	}
	if abort || err != nil {
		st.stop(abort)
	}
	st.wg.Wait()
	st.cancel()
	for _, ds := range st.order {
		st.conns.Release(ds, st.errs[ds])
	}
	return err
}

// stop ends the targets still answering, and drops what they send. Inside the
// caller's transaction, unless abort, they answer to the end: cancelling a statement
// breaks its connection (the deadline that interrupts it leaves the protocol
// mid-message), and with it that data source's part of the transaction, which a
// ROLLBACK TO SAVEPOINT after the error (psql's ON_ERROR_ROLLBACK) must find as one
// database would. Outside one, or with abort, they are cancelled.
func (st *stream) stop(abort bool) {
	if abort || !st.conns.InTransaction() {
		st.cancel()
	}
	// Every target at once: a data source closes its targets' channels when it has
	// run them all, so draining them one after another would wait on the first while
	// the data source waits to send the second's rows.
	var wg sync.WaitGroup
	for _, c := range st.curs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range c.ch {
			}
		}()
	}
	wg.Wait()
}

// cause returns the error that aborted the transaction under data source ds's err
// (ErrTxAborted): another data source's, met at the same time. It stops the stream
// and waits for every data source to end, which the caller's close then finds done.
func (st *stream) cause(ds int, err error) (int, error) {
	st.stop(false)
	st.wg.Wait()
	for _, other := range st.order {
		if e := st.errs[other]; e != nil && !errors.Is(e, ErrTxAborted) {
			return other, e
		}
	}
	return ds, err
}

// rowsSize is what rows hold, as heldBudget counts it.
func rowsSize(rows [][][]byte) int {
	n := 0
	for _, row := range rows {
		n += 24 * len(row)
		for _, v := range row {
			n += len(v)
		}
	}
	return n
}
