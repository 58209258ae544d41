package postgresdb

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrBadOptions is wrapped by errors about invalid Options.
var ErrBadOptions = errors.New("postgres: invalid options")

// Defaults applied by Open to zero Options fields.
const (
	DefaultPoolSize       = 8
	DefaultConnectTimeout = 5 * time.Second
	DefaultQueryTimeout   = 10 * time.Second
	// MaxPoolSize bounds Options.PoolSize; PostgreSQL's own default max_connections is 100.
	MaxPoolSize = 1000
)

// Options tunes a pool. The zero value is usable: it gets the defaults above.
type Options struct {
	// PoolSize is the most connections the shard's pool opens (pgxpool MaxConns);
	// default DefaultPoolSize. Idle connections are kept, none are opened in advance.
	PoolSize int32
	// ConnectTimeout bounds dialling one host, including TLS and authentication.
	// Zero means the DSN's connect_timeout if it has one, else DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// QueryTimeout bounds every call (Put, Get, Count, Ping), waiting for a pooled
	// connection included, on top of the caller's context; default DefaultQueryTimeout.
	// It is what keeps a frozen server from hanging requests whose context has no
	// deadline.
	QueryTimeout time.Duration
	// Lazy makes Open succeed without reaching the server, so a set can start with a
	// shard down. See the package documentation.
	Lazy bool
	// RuntimeParams are settings every connection starts with (its startup packet).
	RuntimeParams map[string]string
}

// WithDefaults returns o with the defaults above filled in, or an error wrapping
// ErrBadOptions. A zero ConnectTimeout stays zero: it means the DSN's connect_timeout,
// which only PoolConfig can read.
func (o Options) WithDefaults() (Options, error) { return o.withDefaults() }

func (o Options) withDefaults() (Options, error) {
	if o.PoolSize == 0 {
		o.PoolSize = DefaultPoolSize
	}
	if o.PoolSize < 1 || o.PoolSize > MaxPoolSize {
		return o, fmt.Errorf("%w: pool size must be 1..%d, got %d", ErrBadOptions, MaxPoolSize, o.PoolSize)
	}
	if o.ConnectTimeout < 0 {
		return o, fmt.Errorf("%w: connect timeout must not be negative, got %v", ErrBadOptions, o.ConnectTimeout)
	}
	if o.QueryTimeout == 0 {
		o.QueryTimeout = DefaultQueryTimeout
	}
	if o.QueryTimeout < 0 {
		return o, fmt.Errorf("%w: query timeout must not be negative, got %v", ErrBadOptions, o.QueryTimeout)
	}
	return o, nil
}

// PoolConfig parses dsn, a postgres:// URL or a keyword/value string, and applies opts:
// it is the one place where shardlab turns Options into a pgx pool configuration, so
// the shards, the counters and the benchmarks get the same pool size and timeouts.
//
// The pool opens at most opts.PoolSize connections and none in advance; each dial,
// TLS and authentication included, is bounded by opts.ConnectTimeout, else the DSN's
// connect_timeout, else DefaultConnectTimeout. Other DSN parameters (sslmode,
// default_query_exec_mode, ...) are honoured, but the pool size always comes from opts.
// The query timeout is not a property of a pool: callers bound each call with
// opts.QueryTimeout (see Options.WithDefaults), as Store does. Errors wrap ErrBadDSN or
// ErrBadOptions.
func PoolConfig(dsn string, opts Options) (*pgxpool.Config, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(dsn) == "" {
		return nil, fmt.Errorf("%w: empty DSN (want e.g. postgres://user@host:5432/db)", ErrBadDSN)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadDSN, err)
	}
	cfg.MaxConns = o.PoolSize
	cfg.MinConns = 0
	cfg.MinIdleConns = 0
	if o.ConnectTimeout > 0 {
		cfg.ConnConfig.ConnectTimeout = o.ConnectTimeout
	} else if cfg.ConnConfig.ConnectTimeout <= 0 {
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	maps.Copy(cfg.ConnConfig.RuntimeParams, o.RuntimeParams)
	return cfg, nil
}

// NewPool returns a pgx pool on the database dsn names, configured by PoolConfig. Unless
// opts.Lazy is set it makes one round trip, bounded by ctx and opts.QueryTimeout, and
// fails naming the server (password redacted) when it cannot; cancelling ctx abandons
// that check. The caller closes the pool.
func NewPool(ctx context.Context, dsn string, opts Options) (*pgxpool.Pool, error) {
	cfg, err := PoolConfig(dsn, opts)
	if err != nil {
		return nil, err
	}
	o, _ := opts.withDefaults() // PoolConfig checked them
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %s: %w", RedactDSN(dsn), err)
	}
	if o.Lazy {
		return pool, nil
	}
	pctx, cancel := context.WithTimeout(ctx, o.QueryTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %s: %w", RedactDSN(dsn), err)
	}
	return pool, nil
}

// IsAlreadyExists reports whether err is PostgreSQL saying a concurrent session created
// the object first: CREATE ... IF NOT EXISTS is not atomic against another session.
func IsAlreadyExists(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "42P07", // duplicate_table
		"42P04", // duplicate_database
		"23505": // unique_violation, on the catalog's unique index
		return true
	}
	return false
}
