package counters_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardlab/shardlab/counters"
	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/internal/postgresdb"
)

// backend opens counters on one database; each test gets its own database.
type backend struct {
	name string
	open func(t *testing.T, o counters.Options) counters.Counter
}

// backends returns SQLite and, when SHARDLAB_PG_DSN is set, PostgreSQL. Without it the
// PostgreSQL cases are left out with a note, unless SHARDLAB_REQUIRE_PG is set (as in
// CI): then the missing server fails the test.
func backends(t *testing.T) []backend {
	t.Helper()
	bs := []backend{{name: "sqlite", open: sqliteOpener(t)}}
	if os.Getenv(pgtest.EnvDSN) == "" && os.Getenv(pgtest.EnvRequire) == "" {
		t.Logf("%s is unset: PostgreSQL cases left out", pgtest.EnvDSN)
		return bs
	}
	return append(bs, backend{name: "postgres", open: postgresOpener(t)})
}

func sqliteOpener(t *testing.T) func(*testing.T, counters.Options) counters.Counter {
	path := filepath.Join(t.TempDir(), "counters.db")
	return func(t *testing.T, o counters.Options) counters.Counter {
		t.Helper()
		c, err := counters.OpenSQLite(t.Context(), path, o, counters.SQLiteOptions{})
		if err != nil {
			t.Fatalf("OpenSQLite(%v): %v", o, err)
		}
		t.Cleanup(func() { closeTwice(t, c) })
		return c
	}
}

// pgPool creates a fresh database for the test, dropped in t.Cleanup, and
// a pool of 16 connections on it.
func pgPool(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := pgtest.NewDatabase(t, "shardlab_counters")
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // registered after Drop, so it runs before it
	return pool, dsn
}

func postgresOpener(t *testing.T) func(*testing.T, counters.Options) counters.Counter {
	pool, _ := pgPool(t)
	return func(t *testing.T, o counters.Options) counters.Counter {
		t.Helper()
		c, err := counters.NewPostgres(t.Context(), pool, o)
		if err != nil {
			t.Fatalf("NewPostgres(%v): %v", o, err)
		}
		t.Cleanup(func() { closeTwice(t, c) })
		return c
	}
}

func closeTwice(t *testing.T, c counters.Counter) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// allOptions is every strategy, with a worker pool smaller than the number
// of writers (so that writers must wait for a bucket) and one larger. Each
// gets its own table prefix, since bucket strategies share a table.
func allOptions(prefix string) []counters.Options {
	opts := []counters.Options{
		{Strategy: counters.StrategyRow},
		{Strategy: counters.StrategyAppend},
		{Strategy: counters.StrategyBucket, Buckets: 7, BucketBy: counters.BucketRandom},
		{Strategy: counters.StrategyBucket, Buckets: 7, BucketBy: counters.BucketTime},
		{Strategy: counters.StrategyBucket, Buckets: 3, BucketBy: counters.BucketWorker},
		{Strategy: counters.StrategyBucket, Buckets: 64, BucketBy: counters.BucketWorker},
	}
	for i := range opts {
		opts[i].TablePrefix = fmt.Sprintf("%s%d_", prefix, i)
	}
	return opts
}

// TestExactUnderConcurrency hammers two keys from 16 goroutines with random
// increments and checks that the count read back is exactly the sum of the
// acknowledged increments, for every strategy on every backend.
func TestExactUnderConcurrency(t *testing.T) {
	const (
		goroutines = 16
		perG       = 25
	)
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			for _, o := range allOptions("exact_") {
				t.Run(strings.ReplaceAll(o.String(), "/", "_"), func(t *testing.T) {
					c := b.open(t, o)
					ctx := t.Context()
					keys := []string{"hot", "other"}
					var sums [2]atomic.Int64
					start := time.Now().Add(-time.Millisecond)
					var wg sync.WaitGroup
					errs := make(chan error, goroutines)
					for g := range goroutines {
						wg.Go(func() {
							for i := range perG {
								k := (g + i) % 4 / 3 // mostly "hot"
								by := rand.Int64N(5) + 1
								if err := c.Incr(ctx, keys[k], by); err != nil {
									errs <- err
									return
								}
								sums[k].Add(by)
							}
						})
					}
					wg.Wait()
					close(errs)
					for err := range errs {
						t.Fatalf("Incr: %v", err)
					}
					end := time.Now().Add(time.Millisecond)
					for k, key := range keys {
						v, err := c.Get(ctx, key)
						if err != nil {
							t.Fatalf("Get(%q): %v", key, err)
						}
						if want := sums[k].Load(); v.Count != want || v.Key != key {
							t.Errorf("Get(%q) = %+v, want count %d", key, v, want)
						}
						if v.LastSeen.Before(start) || v.LastSeen.After(end) {
							t.Errorf("Get(%q).LastSeen = %v, want within [%v, %v]", key, v.LastSeen, start, end)
						}
					}
					if _, err := c.Get(ctx, "never"); !errors.Is(err, counters.ErrNotFound) {
						t.Errorf("Get(never) error = %v, want ErrNotFound", err)
					}
				})
			}
		})
	}
}

// TestBadInput checks that invalid keys and increments are rejected with
// the sentinel errors and leave no trace.
func TestBadInput(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			for _, o := range allOptions("bad_") {
				t.Run(strings.ReplaceAll(o.String(), "/", "_"), func(t *testing.T) {
					c := b.open(t, o)
					ctx := t.Context()
					cases := []struct {
						key  string
						by   int64
						want error
					}{
						{"", 1, counters.ErrInvalidKey},
						{strings.Repeat("k", counters.MaxKeyLen+1), 1, counters.ErrInvalidKey},
						{"nul\x00byte", 1, counters.ErrInvalidKey},
						{"bad\xffutf8", 1, counters.ErrInvalidKey},
						{"k", 0, counters.ErrInvalidBy},
						{"k", -3, counters.ErrInvalidBy},
						{"k", counters.MaxBy + 1, counters.ErrInvalidBy},
					}
					for _, tc := range cases {
						if err := c.Incr(ctx, tc.key, tc.by); !errors.Is(err, tc.want) {
							t.Errorf("Incr(%q, %d) = %v, want %v", tc.key, tc.by, err, tc.want)
						}
					}
					if _, err := c.Get(ctx, "k"); !errors.Is(err, counters.ErrNotFound) {
						t.Errorf("Get(k) after rejected increments: %v, want ErrNotFound", err)
					}
					if _, err := c.Get(ctx, ""); !errors.Is(err, counters.ErrInvalidKey) {
						t.Errorf("Get(\"\") = %v, want ErrInvalidKey", err)
					}
					// The limits themselves are accepted.
					long := strings.Repeat("é", counters.MaxKeyLen/2)
					if err := c.Incr(ctx, long, counters.MaxBy); err != nil {
						t.Fatalf("Incr(max key, MaxBy): %v", err)
					}
					if v, err := c.Get(ctx, long); err != nil || v.Count != counters.MaxBy {
						t.Errorf("Get(max key) = %+v, %v; want count %d", v, err, counters.MaxBy)
					}
					if err := c.Close(); err != nil {
						t.Fatal(err)
					}
					if err := c.Incr(ctx, "k", 1); !errors.Is(err, counters.ErrClosed) {
						t.Errorf("Incr after Close = %v, want ErrClosed", err)
					}
					if _, err := c.Get(ctx, "k"); !errors.Is(err, counters.ErrClosed) {
						t.Errorf("Get after Close = %v, want ErrClosed", err)
					}
				})
			}
		})
	}
}

// TestReopenKeepsCounts reopens the same tables with another bucket count
// and chooser: reads sum whatever buckets exist, so counts carry over.
// Different prefixes never see each other's counts.
func TestReopenKeepsCounts(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := t.Context()
			first := b.open(t, counters.Options{Strategy: counters.StrategyBucket, Buckets: 10, BucketBy: counters.BucketRandom, TablePrefix: "re_"})
			for range 20 {
				if err := first.Incr(ctx, "k", 2); err != nil {
					t.Fatal(err)
				}
			}
			second := b.open(t, counters.Options{Strategy: counters.StrategyBucket, Buckets: 1000, BucketBy: counters.BucketWorker, TablePrefix: "re_"})
			if err := second.Incr(ctx, "k", 1); err != nil {
				t.Fatal(err)
			}
			if v, err := second.Get(ctx, "k"); err != nil || v.Count != 41 {
				t.Errorf("Get after reopen = %+v, %v; want 41", v, err)
			}
			other := b.open(t, counters.Options{Strategy: counters.StrategyBucket, Buckets: 10, BucketBy: counters.BucketRandom, TablePrefix: "other_"})
			if _, err := other.Get(ctx, "k"); !errors.Is(err, counters.ErrNotFound) {
				t.Errorf("Get with another prefix = %v, want ErrNotFound", err)
			}
		})
	}
}

// TestIncrCancelled checks that a cancelled context fails the call instead
// of hanging, including a worker-bucket wait.
func TestIncrCancelled(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t, counters.Options{Strategy: counters.StrategyBucket, Buckets: 1, BucketBy: counters.BucketWorker, TablePrefix: "cancel_"})
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			if err := c.Incr(ctx, "k", 1); !errors.Is(err, context.Canceled) {
				t.Errorf("Incr with cancelled context = %v, want context.Canceled", err)
			}
		})
	}
}

// TestOpenPostgresOwnsPool uses the DSN constructor, whose Close closes the
// pool it made, sized as the shards' pools are.
func TestOpenPostgresOwnsPool(t *testing.T) {
	_, dsn := pgPool(t)
	c, err := counters.OpenPostgres(t.Context(), dsn, counters.Options{Strategy: counters.StrategyRow}, postgresdb.Options{PoolSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Stat().MaxConns(); got != 3 {
		t.Errorf("pool of %d connections, want the 3 asked for", got)
	}
	if err := c.Incr(t.Context(), "k", 3); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(t.Context(), "k"); err != nil || v.Count != 3 {
		t.Errorf("Get = %+v, %v; want 3", v, err)
	}
	closeTwice(t, c)
	if _, err := counters.OpenPostgres(t.Context(), "postgres://nobody@127.0.0.1:1/x?connect_timeout=1", counters.Options{}, postgresdb.Options{}); !errors.Is(err, counters.ErrInvalidOptions) {
		t.Errorf("OpenPostgres with zero Options = %v, want ErrInvalidOptions", err)
	}
	if _, err := counters.OpenPostgres(t.Context(), dsn, counters.Options{Strategy: counters.StrategyRow}, postgresdb.Options{PoolSize: -1}); !errors.Is(err, counters.ErrInvalidOptions) || !errors.Is(err, postgresdb.ErrBadOptions) {
		t.Errorf("OpenPostgres with a negative pool size = %v, want ErrInvalidOptions wrapping postgresdb.ErrBadOptions", err)
	}
	c, err = counters.OpenPostgres(t.Context(), dsn, counters.Options{Strategy: counters.StrategyRow}, postgresdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Stat().MaxConns(); got != postgresdb.DefaultPoolSize {
		t.Errorf("default pool of %d connections, want postgresdb.DefaultPoolSize %d", got, postgresdb.DefaultPoolSize)
	}
	closeTwice(t, c)
}
