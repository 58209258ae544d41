package counters

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardlab/shardlab/internal/postgresdb"
)

// PostgresCounter is a [Counter] stored in PostgreSQL through a pgx pool.
// Every Incr is one autocommitted statement, so a row lock is held only for
// the duration of that statement.
type PostgresCounter struct {
	pool    *pgxpool.Pool
	ownPool bool
	opts    Options
	picker  bucketPicker
	// queryTimeout bounds every Incr and Get on top of the caller's context; 0 for a
	// borrowed pool, whose owner decides.
	queryTimeout time.Duration

	incrSQL, incrManySQL, getSQL string
	bumpSQL                      string // bucket: plain UPDATE of an existing bucket row

	mu struct {
		sync.Mutex
		closed bool
	}
}

var _ Counter = (*PostgresCounter)(nil)

// NewPostgres returns a counter that uses pool, creating its tables if they
// do not exist. The caller keeps ownership of pool: Close does not close
// it. Cancelling ctx aborts the schema creation.
func NewPostgres(ctx context.Context, pool *pgxpool.Pool, opts Options) (*PostgresCounter, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidOptions)
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	c := &PostgresCounter{pool: pool, opts: opts}
	if opts.Strategy == StrategyBucket {
		c.picker = newBucketPicker(opts)
	}
	c.prepareSQL()
	if err := c.createSchema(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// PostgresOptions tunes the pool a PostgreSQL counter store opens (pool size,
// timeouts; see OpenPostgres).
type PostgresOptions = postgresdb.Options

// OpenPostgres connects a new pool to dsn with po, exactly as the shards'
// pools are made (postgresdb.NewPool: po.PoolSize connections at most, the
// connect timeout), and returns a counter that owns it: Close closes the
// pool. Every Incr and Get is bounded by po.QueryTimeout on top of its own
// context. Cancelling ctx aborts connecting and schema creation.
func OpenPostgres(ctx context.Context, dsn string, opts Options, po PostgresOptions) (*PostgresCounter, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	eff, err := po.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	pool, err := postgresdb.NewPool(ctx, dsn, po)
	if err != nil {
		if errors.Is(err, postgresdb.ErrBadOptions) {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
		}
		return nil, fmt.Errorf("counters: connect to postgres: %w", err)
	}
	c, err := NewPostgres(ctx, pool, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	c.ownPool = true
	c.queryTimeout = eff.QueryTimeout
	return c, nil
}

// Stat returns a snapshot of the pool's counters, for instance to check its size.
func (c *PostgresCounter) Stat() *pgxpool.Stat { return c.pool.Stat() }

// bound applies the query timeout, if any, to ctx.
func (c *PostgresCounter) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.queryTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.queryTimeout)
}

func (c *PostgresCounter) prepareSQL() {
	t := c.opts.tables()
	switch c.opts.Strategy {
	case StrategyRow:
		c.incrSQL = fmt.Sprintf(`INSERT INTO %[1]s AS t (key, count, last_seen) VALUES ($1, $2, $3)
ON CONFLICT (key) DO UPDATE SET count = t.count + EXCLUDED.count, last_seen = GREATEST(t.last_seen, EXCLUDED.last_seen)`, t.row)
		c.getSQL = fmt.Sprintf(`SELECT count, last_seen FROM %s WHERE key = $1`, t.row)
	case StrategyAppend:
		c.incrSQL = fmt.Sprintf(`INSERT INTO %s (key, seen_at) VALUES ($1, $2)`, t.append)
		c.incrManySQL = fmt.Sprintf(`INSERT INTO %s (key, seen_at) SELECT $1, $2 FROM generate_series(1, $3::bigint)`, t.append)
		c.getSQL = fmt.Sprintf(`SELECT count(*), max(seen_at) FROM %s WHERE key = $1`, t.append)
	case StrategyBucket:
		c.incrSQL = fmt.Sprintf(`INSERT INTO %[1]s AS t (key, bucket, count, last_seen) VALUES ($1, $2, $3, $4)
ON CONFLICT (key, bucket) DO UPDATE SET count = t.count + EXCLUDED.count, last_seen = GREATEST(t.last_seen, EXCLUDED.last_seen)`, t.bucket)
		c.getSQL = fmt.Sprintf(`SELECT sum(count)::bigint, max(last_seen) FROM %s WHERE key = $1`, t.bucket)
		c.bumpSQL = fmt.Sprintf(`UPDATE %s SET count = count + $3, last_seen = GREATEST(last_seen, $4) WHERE key = $1 AND bucket = $2`, t.bucket)
	}
}

func (c *PostgresCounter) createSchema(ctx context.Context) error {
	t := c.opts.tables()
	var ddl []string
	switch c.opts.Strategy {
	case StrategyRow:
		ddl = []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	key text PRIMARY KEY,
	count bigint NOT NULL,
	last_seen timestamptz NOT NULL)`, t.row)}
	case StrategyAppend:
		// No surrogate id: the only index is the one the reads need, which
		// makes this insert-only baseline as cheap as it can be.
		ddl = []string{
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	key text NOT NULL,
	seen_at timestamptz NOT NULL)`, t.append),
			fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %[1]s_key_seen_at ON %[1]s (key, seen_at)`, t.append),
		}
	case StrategyBucket:
		ddl = []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	key text NOT NULL,
	bucket integer NOT NULL,
	count bigint NOT NULL,
	last_seen timestamptz NOT NULL,
	PRIMARY KEY (key, bucket))`, t.bucket)}
	}
	// CREATE TABLE IF NOT EXISTS is not safe against a concurrent twin
	// (both may try to create the row type), so serialise schema creation
	// per table prefix with a transaction-scoped advisory lock.
	h := fnv.New64a()
	h.Write([]byte("github.com/shardlab/shardlab/counters/" + c.opts.prefix()))
	lockID := int64(h.Sum64())
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockID); err != nil {
			return err
		}
		for _, q := range ddl {
			if _, err := tx.Exec(ctx, q); err != nil {
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

func (c *PostgresCounter) checkOpen() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed {
		return ErrClosed
	}
	return nil
}

// Incr implements [Counter.Incr].
func (c *PostgresCounter) Incr(ctx context.Context, key string, by int64) error {
	if err := checkIncr(key, by); err != nil {
		return err
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	var err error
	switch c.opts.Strategy {
	case StrategyRow:
		_, err = c.pool.Exec(ctx, c.incrSQL, key, by, now())
	case StrategyAppend:
		if by == 1 {
			_, err = c.pool.Exec(ctx, c.incrSQL, key, now())
		} else {
			_, err = c.pool.Exec(ctx, c.incrManySQL, key, now(), by)
		}
	case StrategyBucket:
		bucket, release, perr := c.picker.pick(ctx)
		if perr != nil {
			return fmt.Errorf("counters: incr %q: wait for a bucket: %w", key, perr)
		}
		// Once a bucket row exists (every call but the first per bucket), a plain
		// UPDATE by primary key does less work than INSERT ... ON CONFLICT, which
		// first tries the insert. When the row is missing the UPDATE touches nothing
		// and the upsert creates it, so the count stays exact either way.
		var tag pgconn.CommandTag
		t := now()
		tag, err = c.pool.Exec(ctx, c.bumpSQL, key, bucket, by, t)
		if err == nil && tag.RowsAffected() == 0 {
			_, err = c.pool.Exec(ctx, c.incrSQL, key, bucket, by, t)
		}
		release()
	}
	if err != nil {
		return fmt.Errorf("counters: incr %q: %w", key, err)
	}
	return nil
}

// Get implements [Counter.Get].
func (c *PostgresCounter) Get(ctx context.Context, key string) (Value, error) {
	if err := ValidateKey(key); err != nil {
		return Value{}, err
	}
	if err := c.checkOpen(); err != nil {
		return Value{}, err
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	var (
		count    *int64
		lastSeen *time.Time
	)
	err := c.pool.QueryRow(ctx, c.getSQL, key).Scan(&count, &lastSeen)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && (count == nil || *count == 0 || lastSeen == nil)) {
		return Value{}, fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	if err != nil {
		return Value{}, fmt.Errorf("counters: get %q: %w", key, err)
	}
	return Value{Key: key, Count: *count, LastSeen: lastSeen.UTC()}, nil
}

// Close implements [Counter.Close]. It closes the pool only if the counter
// was made by [OpenPostgres]; closing the pool waits for the connections in
// use to be released.
func (c *PostgresCounter) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed {
		return nil
	}
	c.mu.closed = true
	if c.ownPool {
		c.pool.Close()
	}
	return nil
}
