package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/shardlab/shardlab/lab/shardset"
)

// pointReader serves a Store's point reads on a fixed set of read-only connections that
// it holds below database/sql, each with the lookup prepared once, handed out through a
// channel that works as the free list. A profile of the demo-server under a read load
// showed where database/sql's path spends a point read's time beyond SQLite's own: the
// pool's locks, a Rows object and a copy of the value, and, because an HTTP request's
// context can be cancelled, two goroutines per read (database/sql's watcher of the
// context, and mattn/go-sqlite3's, which runs each step in a goroutine of its own).
// Here a read takes a connection, binds the key, steps once, copies the value out,
// resets the statement and hands the connection back, all on the caller's goroutine.
//
// The connections are opened by DB.openReadConn with the settings of the DB's read pool
// (read-only, busy timeout, journal mode), lazily, when a read first finds an unopened
// one, so a Store that is never read opens none.
type pointReader struct {
	db   *DB
	sql  string
	free chan *pointConn // every connection, opened or not, is either here or held by one read
	n    int
	// closed refuses new reads once close has begun; the connections then return to free
	// one by one as the reads holding them finish, and close takes them all.
	closed atomic.Bool
}

// pointConn is one connection of a pointReader and its prepared statement, with the
// argument and result slices that every read on it reuses.
type pointConn struct {
	conn driver.Conn
	stmt driver.StmtQueryContext
	args []driver.NamedValue
	dest []driver.Value
}

func newPointReader(db *DB, n int, query string) *pointReader {
	p := &pointReader{db: db, sql: query, free: make(chan *pointConn, n), n: n}
	for range n {
		p.free <- &pointConn{args: []driver.NamedValue{{Ordinal: 1}}, dest: make([]driver.Value, 1)}
	}
	return p
}

// get returns the first column of the row whose key is key, or an error wrapping
// shardset.ErrNotFound. A read whose ctx is already cancelled does not start, and
// cancelling ctx stops a read that waits for a free connection;
// a lookup already running in SQLite finishes first (a point read takes microseconds;
// under the rollback journal it may wait up to the busy timeout for a writer's commit).
func (p *pointReader) get(ctx context.Context, key string) ([]byte, error) {
	if p.closed.Load() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil { // as database/sql does: a cancelled read does not start
		return nil, err
	}
	var c *pointConn
	select {
	case c = <-p.free:
	default:
		select {
		case c = <-p.free:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if c == nil { // free was closed: close has taken every connection
		return nil, ErrClosed
	}
	defer func() { p.free <- c }()
	if p.closed.Load() {
		return nil, ErrClosed
	}
	if c.stmt == nil {
		if err := p.open(c); err != nil {
			return nil, err
		}
	}
	return c.lookup(key)
}

// open opens c's connection and prepares the lookup on it.
func (p *pointReader) open(c *pointConn) error {
	conn, err := p.db.OpenReadConn()
	if err != nil {
		return err
	}
	st, err := conn.Prepare(p.sql)
	if err != nil {
		return errors.Join(fmt.Errorf("sqlite: prepare point read on %s: %w", p.db.Path(), err), conn.Close())
	}
	qc, ok := st.(driver.StmtQueryContext)
	if !ok { // mattn/go-sqlite3's statements implement it; a driver change would land here
		return errors.Join(fmt.Errorf("sqlite: driver statement %T cannot query", st), st.Close(), conn.Close())
	}
	c.conn, c.stmt = conn, qc
	return nil
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
	// Close resets the statement, which ends the read transaction.
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

// close refuses new reads, waits for the reads in flight and closes every connection
// opened; it returns the first error. It must be called once.
func (p *pointReader) close() error {
	p.closed.Store(true)
	var first error
	for range p.n {
		c := <-p.free
		if c.stmt != nil {
			if err := c.stmt.(driver.Stmt).Close(); err != nil && first == nil {
				first = err
			}
		}
		if c.conn != nil {
			if err := c.conn.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	close(p.free)
	return first
}
