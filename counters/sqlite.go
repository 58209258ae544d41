package counters

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shardlab/shardlab/internal/sqlitedb"
)

// SQLiteCounter is a [Counter] stored in one SQLite file.
//
// SQLite has a single writer, so the file is opened with [sqlitedb.OpenDB]: a
// write pool of exactly one connection, whose transactions begin with BEGIN
// IMMEDIATE, so increments from this process queue in Go instead of failing
// with SQLITE_BUSY; and a read pool, which in WAL mode reads concurrently with
// the writer. A WAL file belongs to the process that opened it while it is
// open (see [sqlitedb.DB]); busy_timeout covers writers in other processes for
// the rollback journal.
type SQLiteCounter struct {
	db     *sqlitedb.DB
	opts   Options
	picker bucketPicker

	incrSQL, incrManySQL, getSQL string

	mu struct {
		sync.Mutex
		closed bool
		err    error
	}
}

var _ Counter = (*SQLiteCounter)(nil)

// SQLiteOptions tunes [OpenSQLite]: the options every SQLite file of shardlab is
// opened with. The zero value is fine. A counter fills zero fields with its own
// defaults, which differ from package sqlite's: Sync defaults to
// [sqlitedb.SyncFull] (an acknowledged increment survives power loss unless the
// caller chooses otherwise), BusyTimeout to 10 seconds and ReadConns to 4.
type SQLiteOptions = sqlitedb.Options

// OpenSQLite opens (creating if needed) the SQLite database at path in WAL
// mode and returns a counter on it, creating its tables if they do not
// exist. Cancelling ctx aborts the schema creation.
func OpenSQLite(ctx context.Context, path string, opts Options, so SQLiteOptions) (*SQLiteCounter, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, fmt.Errorf("%w: empty SQLite path", ErrInvalidOptions)
	}
	if so.Sync == "" {
		so.Sync = sqlitedb.SyncFull
	}
	if so.BusyTimeout <= 0 {
		so.BusyTimeout = 10 * time.Second
	}
	if so.ReadConns <= 0 {
		so.ReadConns = 4
	}
	db, err := sqlitedb.OpenDB(ctx, path, so)
	if err != nil {
		if errors.Is(err, sqlitedb.ErrBadOptions) {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
		}
		return nil, fmt.Errorf("counters: %w", err)
	}
	c := &SQLiteCounter{db: db, opts: opts}
	if opts.Strategy == StrategyBucket {
		c.picker = newBucketPicker(opts)
	}
	c.prepareSQL()
	if err := c.createSchema(ctx); err != nil {
		return nil, errors.Join(err, db.Close())
	}
	return c, nil
}

// DB returns the counter's database, for inspection (its settings, its file).
// Writing to the counter's tables behind its back is not supported.
func (c *SQLiteCounter) DB() *sqlitedb.DB { return c.db }

func (c *SQLiteCounter) prepareSQL() {
	t := c.opts.tables()
	switch c.opts.Strategy {
	case StrategyRow:
		c.incrSQL = fmt.Sprintf(`INSERT INTO %s (key, count, last_seen) VALUES (?, ?, ?)
ON CONFLICT (key) DO UPDATE SET count = count + excluded.count, last_seen = max(last_seen, excluded.last_seen)`, t.row)
		c.getSQL = fmt.Sprintf(`SELECT count, last_seen FROM %s WHERE key = ?`, t.row)
	case StrategyAppend:
		c.incrSQL = fmt.Sprintf(`INSERT INTO %s (key, seen_at) VALUES (?, ?)`, t.append)
		c.incrManySQL = fmt.Sprintf(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
INSERT INTO %s (key, seen_at) SELECT ?, ? FROM n`, t.append)
		c.getSQL = fmt.Sprintf(`SELECT count(*), max(seen_at) FROM %s WHERE key = ?`, t.append)
	case StrategyBucket:
		c.incrSQL = fmt.Sprintf(`INSERT INTO %s (key, bucket, count, last_seen) VALUES (?, ?, ?, ?)
ON CONFLICT (key, bucket) DO UPDATE SET count = count + excluded.count, last_seen = max(last_seen, excluded.last_seen)`, t.bucket)
		c.getSQL = fmt.Sprintf(`SELECT sum(count), max(last_seen) FROM %s WHERE key = ?`, t.bucket)
	}
}

// Timestamps are stored as integer microseconds since the Unix epoch, which
// sort and max() correctly and round-trip exactly.
func toMicros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func (c *SQLiteCounter) createSchema(ctx context.Context) error {
	t := c.opts.tables()
	var ddl []string
	switch c.opts.Strategy {
	case StrategyRow:
		ddl = []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	key TEXT PRIMARY KEY,
	count INTEGER NOT NULL,
	last_seen INTEGER NOT NULL)`, t.row)}
	case StrategyAppend:
		ddl = []string{
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	key TEXT NOT NULL,
	seen_at INTEGER NOT NULL)`, t.append),
			fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %[1]s_key_seen_at ON %[1]s (key, seen_at)`, t.append),
		}
	case StrategyBucket:
		ddl = []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	key TEXT NOT NULL,
	bucket INTEGER NOT NULL,
	count INTEGER NOT NULL,
	last_seen INTEGER NOT NULL,
	PRIMARY KEY (key, bucket))`, t.bucket)}
	}
	err := c.inTx(ctx, func(tx *sql.Tx) error {
		for _, q := range ddl {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("counters: create %s schema: %w", c.opts.Strategy, err)
	}
	return nil
}

// inTx runs fn in a write transaction (BEGIN IMMEDIATE, thanks to _txlock).
func (c *SQLiteCounter) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := c.db.Writer().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func (c *SQLiteCounter) checkOpen() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed {
		return ErrClosed
	}
	return nil
}

// Incr implements [Counter.Incr].
func (c *SQLiteCounter) Incr(ctx context.Context, key string, by int64) error {
	if err := checkIncr(key, by); err != nil {
		return err
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	ts := toMicros(now())
	var err error
	switch c.opts.Strategy {
	case StrategyRow:
		err = c.inTx(ctx, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, c.incrSQL, key, by, ts)
			return err
		})
	case StrategyAppend:
		err = c.inTx(ctx, func(tx *sql.Tx) error {
			var err error
			if by == 1 {
				_, err = tx.ExecContext(ctx, c.incrSQL, key, ts)
			} else {
				_, err = tx.ExecContext(ctx, c.incrManySQL, by, key, ts)
			}
			return err
		})
	case StrategyBucket:
		bucket, release, perr := c.picker.pick(ctx)
		if perr != nil {
			return fmt.Errorf("counters: incr %q: wait for a bucket: %w", key, perr)
		}
		err = c.inTx(ctx, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, c.incrSQL, key, bucket, by, ts)
			return err
		})
		release()
	}
	if err != nil {
		return fmt.Errorf("counters: incr %q: %w", key, err)
	}
	return nil
}

// Get implements [Counter.Get].
func (c *SQLiteCounter) Get(ctx context.Context, key string) (Value, error) {
	if err := ValidateKey(key); err != nil {
		return Value{}, err
	}
	if err := c.checkOpen(); err != nil {
		return Value{}, err
	}
	var count, lastSeen sql.NullInt64
	err := c.db.Reader().QueryRowContext(ctx, c.getSQL, key).Scan(&count, &lastSeen)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && (!count.Valid || count.Int64 == 0 || !lastSeen.Valid)) {
		return Value{}, fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	if err != nil {
		return Value{}, fmt.Errorf("counters: get %q: %w", key, err)
	}
	return Value{Key: key, Count: count.Int64, LastSeen: fromMicros(lastSeen.Int64)}, nil
}

// Close implements [Counter.Close]: it closes both pools, waiting for the
// statements in flight, and returns the first error. Later calls return the
// same result.
func (c *SQLiteCounter) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed {
		return c.mu.err
	}
	c.mu.closed = true
	c.mu.err = c.db.Close()
	return c.mu.err
}
