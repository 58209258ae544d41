package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"

	sqlite3 "github.com/mattn/go-sqlite3"

	"github.com/shardlab/shardlab/shardset"
)

// pointReader serves a Store's point reads on a fixed set of read-only connections that
// it holds below database/sql, each with the lookup prepared once. A profile of the
// demo-server under a read load showed where database/sql's path spends a point read's
// time beyond SQLite's own: the pool's locks, a Rows object and a copy of the value, and,
// because an HTTP request's context can be cancelled, two goroutines per read
// (database/sql's watcher of the context, and mattn/go-sqlite3's, which runs each step in
// a goroutine of its own). Here a read takes a connection, binds the key, steps once,
// copies the value out, resets the statement and hands the connection back, all on the
// caller's goroutine.
//
// A read that finds every connection busy waits in a queue. When a connection comes
// back, the read at the head of the queue is handed it and answers, in WAL mode, itself
// and every read queued at that moment from one read transaction (BEGIN, the lookups,
// COMMIT), so that WAL's shared-memory read lock, two fcntl system calls, is taken once
// per batch rather than once per read. That keeps every acknowledged write visible:
// each read of the batch was queued before the batch was taken, and the transaction's
// snapshot begins after that, at its first lookup; a read that arrives later waits for
// the next batch. A read that finds a free connection never waits for company. Under the
// rollback journal each read keeps its own transaction, since one held across a batch
// would lock a writer's commit out for longer.
//
// The connections are opened by DB.openReadConn with the settings of the DB's read pool
// (read-only, busy timeout, journal mode), lazily, when a read first takes an unopened
// one, so a Store that is never read opens none.
type pointReader struct {
	db    *DB
	sql   string
	batch bool // WAL: queued reads share a read transaction
	mu    struct {
		sync.Mutex
		idle  []*pointConn // connections no read holds, opened or not
		queue []*pointRead // reads waiting for a connection, oldest first
		held  int          // connections held by reads (or being handed to one)
		// closed refuses new reads; close then waits for held to fall to zero.
		closed  bool
		drained sync.Cond // signalled when held falls to zero after closed
	}
	batches      atomic.Int64 // read transactions that answered two reads or more
	batchedReads atomic.Int64 // the reads they answered

	// Tests' hooks into a batch, nil otherwise: after its BEGIN, and after its first
	// lookup, when its snapshot has begun.
	afterBegin, afterFirstLookup func()
}

// pointConn is one connection of a pointReader and its prepared statements, with the
// argument and result slices that every read on it reuses.
type pointConn struct {
	conn   *sqlite3.SQLiteConn
	stmt   driver.StmtQueryContext
	begin  driver.StmtExecContext // nil unless the reader batches
	commit driver.StmtExecContext
	args   []driver.NamedValue
	dest   []driver.Value
	batch  []*pointRead // reused by serveQueued
}

// pointRead is a read waiting in a pointReader's queue.
type pointRead struct {
	key  string
	val  []byte
	err  error
	conn *pointConn    // set when the read is handed a connection to answer the queue with
	done chan struct{} // receives once: answered, or handed conn
}

var pointReads = sync.Pool{New: func() any { return &pointRead{done: make(chan struct{}, 1)} }}

func newPointReader(db *DB, n int, query string, batch bool) *pointReader {
	p := &pointReader{db: db, sql: query, batch: batch}
	p.mu.drained.L = &p.mu.Mutex
	p.mu.idle = make([]*pointConn, n)
	for i := range p.mu.idle {
		p.mu.idle[i] = &pointConn{args: []driver.NamedValue{{Ordinal: 1}}, dest: make([]driver.Value, 1)}
	}
	return p
}

// readStats returns the batching counters.
func (p *pointReader) readStats() ReadStats {
	return ReadStats{Batches: p.batches.Load(), BatchedReads: p.batchedReads.Load()}
}

// get returns the first column of the row whose key is key, or an error wrapping
// shardset.ErrNotFound. A read whose ctx is already cancelled does not start, and
// cancelling ctx stops a read that waits for a free connection;
// a lookup already running in SQLite finishes first (a point read takes microseconds;
// under the rollback journal it may wait up to the busy timeout for a writer's commit).
func (p *pointReader) get(ctx context.Context, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil { // as database/sql does: a cancelled read does not start
		return nil, err
	}
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	if n := len(p.mu.idle); n > 0 {
		c := p.mu.idle[n-1]
		p.mu.idle = p.mu.idle[:n-1]
		p.mu.held++
		p.mu.Unlock()
		v, err := p.lookup(c, key)
		p.release(c)
		return v, err
	}
	r := pointReads.Get().(*pointRead)
	r.key = key
	p.mu.queue = append(p.mu.queue, r)
	p.mu.Unlock()
	select {
	case <-r.done:
	case <-ctx.Done():
		p.mu.Lock()
		if i := slices.Index(p.mu.queue, r); i >= 0 {
			p.mu.queue = slices.Delete(p.mu.queue, i, i+1)
			p.mu.Unlock()
			r.key = ""
			pointReads.Put(r)
			return nil, ctx.Err()
		}
		p.mu.Unlock()
		<-r.done // taken into a batch or handed a connection: it is answered in microseconds
	}
	if c := r.conn; c != nil {
		r.conn = nil
		p.serveQueued(c, r)
		p.release(c)
	}
	v, err := r.val, r.err
	*r = pointRead{done: r.done}
	pointReads.Put(r)
	return v, err
}

// release hands c to the read at the head of the queue, or makes it idle.
func (p *pointReader) release(c *pointConn) {
	p.mu.Lock()
	if len(p.mu.queue) > 0 {
		r := p.mu.queue[0]
		p.mu.queue = slices.Delete(p.mu.queue, 0, 1)
		r.conn = c
		p.mu.Unlock()
		r.done <- struct{}{}
		return
	}
	p.mu.idle = append(p.mu.idle, c)
	p.mu.held--
	if p.mu.closed && p.mu.held == 0 {
		p.mu.drained.Broadcast()
	}
	p.mu.Unlock()
}

// serveQueued answers lead, which has been handed c, and, if the reader batches, every
// read queued now, in one read transaction. Each read but lead is told on its done
// channel as soon as its lookup returns.
func (p *pointReader) serveQueued(c *pointConn, lead *pointRead) {
	batch := append(c.batch[:0], lead)
	if p.batch {
		p.mu.Lock()
		batch = append(batch, p.mu.queue...)
		clear(p.mu.queue)
		p.mu.queue = p.mu.queue[:0]
		p.mu.Unlock()
	}
	// Every read in batch was queued before this point, and the snapshot of the
	// transaction begun below starts at its first lookup, after it.
	inTx := false
	if len(batch) > 1 {
		if err := p.open(c); err == nil {
			_, err = c.begin.ExecContext(context.Background(), nil)
			inTx = err == nil // if BEGIN fails, each lookup runs in a transaction of its own
		}
	}
	if inTx && p.afterBegin != nil {
		p.afterBegin()
	}
	for i, r := range batch {
		r.val, r.err = p.lookup(c, r.key)
		if r != lead {
			r.done <- struct{}{}
		}
		if i == 0 && inTx && p.afterFirstLookup != nil {
			p.afterFirstLookup()
		}
	}
	if inTx {
		p.batches.Add(1)
		p.batchedReads.Add(int64(len(batch)))
		c.endReadTx()
	}
	clear(batch)
	c.batch = batch[:0]
}

// lookup opens c if it is not yet, then looks key up on it.
func (p *pointReader) lookup(c *pointConn, key string) ([]byte, error) {
	if err := p.open(c); err != nil {
		return nil, err
	}
	return c.lookup(key)
}

// open opens c's connection, if it is not open, and prepares its statements.
func (p *pointReader) open(c *pointConn) error {
	if c.conn != nil {
		return nil
	}
	conn, err := p.db.openReadConn()
	if err != nil {
		return err
	}
	sc, ok := conn.(*sqlite3.SQLiteConn)
	if !ok { // mattn/go-sqlite3's driver returns one; a driver change would land here
		return errors.Join(fmt.Errorf("sqlite: driver connection %T is not mattn/go-sqlite3's", conn), conn.Close())
	}
	stmts := []string{p.sql}
	if p.batch {
		stmts = append(stmts, "BEGIN", "COMMIT")
	}
	prepared := make([]*sqlite3.SQLiteStmt, 0, len(stmts))
	for _, q := range stmts {
		st, err := sc.Prepare(q)
		if err != nil {
			errs := []error{fmt.Errorf("sqlite: prepare %q on %s: %w", q, p.db.path, err)}
			for _, st := range prepared {
				errs = append(errs, st.Close())
			}
			return errors.Join(append(errs, sc.Close())...)
		}
		prepared = append(prepared, st.(*sqlite3.SQLiteStmt))
	}
	c.conn, c.stmt = sc, prepared[0]
	if p.batch {
		c.begin, c.commit = prepared[1], prepared[2]
	}
	return nil
}

// endReadTx ends the read transaction that BEGIN opened on c. A connection left inside
// one would answer later reads from an old snapshot, so if neither COMMIT nor ROLLBACK
// ends it, c is closed, to be opened again by its next read. (An error inside the
// transaction may already have ended it; the lookups after it then ran in transactions
// of their own, which begin later still.)
func (c *pointConn) endReadTx() {
	_, _ = c.commit.ExecContext(context.Background(), nil)
	if c.conn.AutoCommit() {
		return
	}
	_, _ = c.conn.ExecContext(context.Background(), "ROLLBACK", nil)
	if c.conn.AutoCommit() {
		return
	}
	_ = c.closeConn()
}

// lookup runs the prepared statement for key. The statement runs with a context that is
// never cancelled, which is what keeps mattn/go-sqlite3 from stepping it in a goroutine
// of its own.
func (c *pointConn) lookup(key string) ([]byte, error) {
	c.args[0].Value = key
	rows, err := c.stmt.QueryContext(context.Background(), c.args)
	c.args[0].Value = nil
	if err != nil {
		return nil, err
	}
	c.dest[0] = nil
	err = rows.Next(c.dest)
	v := c.dest[0]
	c.dest[0] = nil
	// Close resets the statement, which ends an implicit read transaction.
	if cerr := rows.Close(); err == nil || errors.Is(err, io.EOF) {
		if cerr != nil {
			return nil, cerr
		}
	}
	switch {
	case errors.Is(err, io.EOF):
		return nil, shardset.ErrNotFound
	case err != nil:
		return nil, err
	}
	switch v := v.(type) {
	case []byte: // the driver's own copy, BLOB or empty BLOB
		return v, nil
	case string: // a TEXT value written by something other than Store.Put
		return []byte(v), nil
	case nil:
		return nil, fmt.Errorf("sqlite: point read of %q: no value", key)
	default:
		return nil, fmt.Errorf("sqlite: point read of %q: value of type %T", key, v)
	}
}

// closeConn closes c's statements and connection, if open, and returns the first error.
func (c *pointConn) closeConn() error {
	if c.conn == nil {
		return nil
	}
	var first error
	for _, st := range []any{c.stmt, c.begin, c.commit} {
		if st, ok := st.(driver.Stmt); ok && st != nil {
			if err := st.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	if err := c.conn.Close(); err != nil && first == nil {
		first = err
	}
	c.conn, c.stmt, c.begin, c.commit = nil, nil, nil, nil
	return first
}

// close refuses new reads, answers the queued ones with ErrClosed, waits for the reads
// holding connections and closes every connection opened; it returns the first error.
// It must be called once.
func (p *pointReader) close() error {
	p.mu.Lock()
	p.mu.closed = true
	queued := slices.Clone(p.mu.queue)
	clear(p.mu.queue)
	p.mu.queue = p.mu.queue[:0]
	p.mu.Unlock()
	for _, r := range queued {
		r.err = ErrClosed
		r.done <- struct{}{}
	}
	p.mu.Lock()
	for p.mu.held > 0 {
		p.mu.drained.Wait()
	}
	idle := p.mu.idle
	p.mu.Unlock()
	var first error
	for _, c := range idle {
		if err := c.closeConn(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// openReadConn opens one read-only connection with the settings of the DB's read pool,
// through the driver directly rather than database/sql. The caller owns it and closes it
// before the DB. It is how a Store's point reads get their own connections while the
// file is still opened in one place, OpenDB, with one set of Options.
func (d *DB) openReadConn() (driver.Conn, error) {
	conn, err := (&sqlite3.SQLiteDriver{}).Open(uri(d.path, d.opts, true))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s for reading: %w", d.path, err)
	}
	return conn, nil
}
