// Package postgres is the PostgreSQL shard backend: one database per shard, reached
// through a pgx v5 connection pool (pgxpool). The shards of a set may live on one
// server or on many hosts, which is how the lab grows past one machine.
//
// A server is wired up with OpenShards (one DSN per shard), optionally preceded by
// CreateShardDatabases (one base DSN, databases shardlab_shard_0..N-1 made if absent
// and reused with their data if present) and followed by CheckLayouts (which refuses
// databases made for another shard index, count or router). The Stores are then
// handed to shardset.New.
//
// Every pgx pool of shardlab is made by package postgresdb from Options (pool size,
// connect timeout; the query timeout is applied per call), so the shards' pools, the
// hot-row counters' pool and the benchmarks' pools behave alike.
//
// # A shard that is down
//
// Open checks that the shard answers and fails, naming the shard's host, when it does
// not: a server configured with a dead shard refuses to start and says which one,
// instead of starting with holes in the key space nobody notices. Options.Lazy turns
// that check off so a server can start degraded; the table is then created by the
// first connection that succeeds.
//
// Once open, a shard that goes down fails only its own calls: a refused connection
// fails at once, a host that does not answer fails after Options.ConnectTimeout, and a
// server that stops answering in the middle of a query fails after
// Options.QueryTimeout (or the caller's context, whichever ends first). Nothing needs
// restarting when the server comes back: when a pooled connection turns out dead, the
// pool drops its idle connections and the call is retried once on a fresh one, so the
// first call after a restart already succeeds.
//
// # Schema
//
// Each shard database holds one table:
//
//	records(user_id text COLLATE "C" PRIMARY KEY, data bytea NOT NULL, updated_at timestamptz NOT NULL)
//
// created if absent. The "C" collation makes the primary key compare bytes, which is
// all an equality lookup needs and is the same on every host whatever its locale.
// CheckLayout adds a one-row table, shardlab_layout.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardlab/shardlab/internal/fanout"
	"github.com/shardlab/shardlab/internal/postgresdb"
	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/routing"
)

// ErrInvalidKey is wrapped by Put's error for a key PostgreSQL cannot store in a text
// column: one that is not valid UTF-8 or contains a NUL byte. It is the client's
// mistake, not the shard's. Get answers shardset.ErrNotFound for such a key, since no
// record can exist under it.
var ErrInvalidKey = errors.New("postgres: key must be valid UTF-8 without NUL bytes")

// Options tunes one shard's pool (see postgresdb.Options).
type Options = postgresdb.Options

// Defaults and bounds of Options (see package postgresdb).
const (
	DefaultPoolSize       = postgresdb.DefaultPoolSize
	DefaultConnectTimeout = postgresdb.DefaultConnectTimeout
	DefaultQueryTimeout   = postgresdb.DefaultQueryTimeout
	MaxPoolSize           = postgresdb.MaxPoolSize
)

// ErrBadOptions is wrapped by errors about invalid Options (postgresdb.ErrBadOptions).
var ErrBadOptions = postgresdb.ErrBadOptions

// ErrBadDSN is wrapped by errors about a connection string that cannot be used
// (postgresdb.ErrBadDSN).
var ErrBadDSN = postgresdb.ErrBadDSN

// Store is one shard: a database reached through its own connection pool.
type Store struct {
	pool *pgxpool.Pool
	dsn  string // redacted
	opts Options

	// schemaReady is set once the records table is known to exist; until then every
	// new connection tries to create it (see ensureSchema).
	schemaReady atomic.Bool
	schemaMu    sync.Mutex

	closed    atomic.Bool
	closeOnce sync.Once
}

var _ shardset.Backend = (*Store)(nil)

const schema = `CREATE TABLE IF NOT EXISTS records (
	user_id    text COLLATE "C" PRIMARY KEY,
	data       bytea NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now()
)`

const (
	putSQL = `INSERT INTO records (user_id, data, updated_at) VALUES ($1, $2, now())
		ON CONFLICT (user_id) DO UPDATE SET data = excluded.data, updated_at = excluded.updated_at`
	getSQL   = `SELECT data FROM records WHERE user_id = $1`
	countSQL = `SELECT count(*) FROM records`
)

// Open returns the shard stored in the database named by dsn, through a pool configured
// by postgresdb.PoolConfig. Unless opts.Lazy is set, Open connects, creating the records table if
// absent, and fails, naming the server, when it cannot; cancelling ctx abandons that
// check. Errors show the DSN with its password redacted.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	o, err := opts.WithDefaults()
	if err != nil {
		return nil, err
	}
	cfg, err := postgresdb.PoolConfig(dsn, o)
	if err != nil {
		return nil, err
	}
	o.ConnectTimeout = cfg.ConnConfig.ConnectTimeout

	s := &Store{dsn: postgresdb.RedactDSN(dsn), opts: o}
	cfg.AfterConnect = s.ensureSchema
	if s.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, fmt.Errorf("postgres: %s: %w", s.dsn, err)
	}
	if o.Lazy {
		return s, nil
	}
	if err := s.ping(ctx); err != nil {
		s.pool.Close()
		return nil, fmt.Errorf("postgres: %s: %w", s.dsn, err)
	}
	return s, nil
}

// ensureSchema runs on every new connection (pgxpool AfterConnect) until the table
// exists once; after that it costs an atomic load.
func (s *Store) ensureSchema(ctx context.Context, c *pgx.Conn) error {
	if s.schemaReady.Load() {
		return nil
	}
	s.schemaMu.Lock()
	defer s.schemaMu.Unlock()
	if s.schemaReady.Load() {
		return nil
	}
	// The pool dials in the background with a context that the caller's cancellation
	// does not reach, so bound the statement here.
	ctx, cancel := context.WithTimeout(ctx, s.opts.QueryTimeout)
	defer cancel()
	if _, err := c.Exec(ctx, schema); err != nil && !postgresdb.IsAlreadyExists(err) {
		return fmt.Errorf("create records table: %w", err)
	}
	s.schemaReady.Store(true)
	return nil
}

// DSN returns the shard's connection string with its password redacted.
func (s *Store) DSN() string { return s.dsn }

// Options returns the options in effect, defaults filled in; the lab records
// PoolSize in its results.
func (s *Store) Options() Options { return s.opts }

// Stat returns a snapshot of the shard's pool counters.
func (s *Store) Stat() *pgxpool.Stat { return s.pool.Stat() }

// do runs fn on a pooled connection, bounded by ctx and the query timeout.
//
// When the connection died under fn (its server stopped, restarted or ended the
// session), the other idle connections are almost certainly dead too, so the pool is
// reset and fn is tried once more on a fresh connection: after a restart the first
// call succeeds instead of tripping over a stale connection, and while the server is
// down the retry fails at once with the dial error.
//
// Reads are always safe to run twice. A write is retried only when pgx says nothing of
// it reached the server (pgconn.SafeToRetry): had the first attempt committed before the
// connection died, running it again could overwrite a newer write from another client.
func (s *Store) do(ctx context.Context, write bool, fn func(ctx context.Context, c *pgxpool.Conn) error) error {
	if s.closed.Load() {
		return shardset.ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.QueryTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		err = fn(ctx, c)
		// A connection cancelled by its context is closed too; that says nothing
		// about the others.
		dead := err != nil && c.Conn().IsClosed() && ctx.Err() == nil
		c.Release()
		if !dead {
			return err
		}
		s.pool.Reset()
		if attempt == 2 || (write && !pgconn.SafeToRetry(err)) {
			return err
		}
	}
}

func validKey(key string) bool {
	return utf8.ValidString(key) && strings.IndexByte(key, 0) < 0
}

// Put implements shardset.Backend: one upsert, committed (with the server's
// synchronous_commit setting) when it returns nil. Cancelling ctx abandons the
// statement; whether it committed is then unknown.
func (s *Store) Put(ctx context.Context, key string, data []byte) error {
	if !validKey(key) {
		return fmt.Errorf("postgres: put %q: %w", key, ErrInvalidKey)
	}
	if data == nil {
		data = []byte{} // the column is NOT NULL; an empty value is still a value
	}
	err := s.do(ctx, true, func(ctx context.Context, c *pgxpool.Conn) error {
		_, err := c.Exec(ctx, putSQL, key, data)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: put: %w", err)
	}
	return nil
}

// Get implements shardset.Backend.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if !validKey(key) {
		return nil, shardset.ErrNotFound
	}
	var data []byte
	err := s.do(ctx, false, func(ctx context.Context, c *pgxpool.Conn) error {
		return c.QueryRow(ctx, getSQL, key).Scan(&data)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, shardset.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("postgres: get: %w", err)
	}
	if data == nil {
		data = []byte{}
	}
	return data, nil
}

// Count implements shardset.Backend. It scans the table, so it is for reports and
// tests, not for hot paths.
func (s *Store) Count(ctx context.Context) (int64, error) {
	var n int64
	err := s.do(ctx, false, func(ctx context.Context, c *pgxpool.Conn) error {
		return c.QueryRow(ctx, countSQL).Scan(&n)
	})
	if err != nil {
		return 0, fmt.Errorf("postgres: count: %w", err)
	}
	return n, nil
}

// Ping implements shardset.Backend: it gets a connection (dialling one if needed) and
// makes a round trip, bounded by ctx and the query timeout.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.ping(ctx); err != nil {
		return fmt.Errorf("postgres: ping: %w", err)
	}
	return nil
}

func (s *Store) ping(ctx context.Context) error {
	return s.do(ctx, false, func(ctx context.Context, c *pgxpool.Conn) error {
		return c.Ping(ctx)
	})
}

// ServerVersion returns the shard server's version, e.g. "15.20 (Debian 15.20-0+deb12u1)".
func (s *Store) ServerVersion(ctx context.Context) (string, error) {
	var v string
	err := s.do(ctx, false, func(ctx context.Context, c *pgxpool.Conn) error {
		return c.QueryRow(ctx, "SHOW server_version").Scan(&v)
	})
	if err != nil {
		return "", fmt.Errorf("postgres: server version: %w", err)
	}
	return v, nil
}

// Close closes the pool, waiting for connections in use to be released. Later calls
// on the Store return shardset.ErrClosed; a second Close returns nil.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.pool.Close()
	})
	return nil
}

// OpenShards opens one Store per DSN, shard i at dsns[i], concurrently (fanout.Do, at
// most fanout.DefaultLimit dials at a time) so that a few unreachable hosts cost one
// connect timeout, not one each. When any shard fails, the others are closed and the
// error names every failed shard: "open shard 1: postgres: postgres://u:xxxxx@host:5432/db: ...".
func OpenShards(ctx context.Context, dsns []string, opts Options) ([]*Store, error) {
	if len(dsns) == 0 {
		return nil, fmt.Errorf("%w: no DSNs", ErrBadDSN)
	}
	if _, err := opts.WithDefaults(); err != nil {
		return nil, err
	}
	stores := make([]*Store, len(dsns))
	err := fanout.Do(ctx, routing.DestinationAll{}, len(dsns), func(ctx context.Context, i int) error {
		st, err := Open(ctx, dsns[i], opts)
		if err != nil {
			return err
		}
		stores[i] = st
		return nil
	})
	if err != nil {
		for _, st := range stores {
			if st != nil {
				st.Close()
			}
		}
		var errs shardset.Errors
		if !errors.As(err, &errs) {
			return nil, err
		}
		failed := make([]error, len(errs))
		for i, se := range errs {
			failed[i] = fmt.Errorf("open shard %d: %w", se.Shard, se.Err)
		}
		return nil, errors.Join(failed...)
	}
	return stores, nil
}
