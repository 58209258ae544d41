package demoserver

import (
	"io"
	"path/filepath"
	"testing"

	"github.com/shardlab/shardlab/counters"
	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/lab/shardset/sqlite"
)

// openForTest parses args and opens the shards and the counter store as Run does.
func openForTest(t *testing.T, args ...string) counters.Counter {
	t.Helper()
	c, err := parse(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	shards, err := openShards(t.Context(), c, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shards.Close() })
	counter, err := openCounter(t.Context(), c, shards)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { counter.Close() })
	return counter
}

// TestSyncReachesTheCounterDatabase: --sync governs counters.db as it does the shards,
// read back from the connection that commits the increments. (Before, counters.db ran
// with the driver's default, full, whatever --sync said.)
func TestSyncReachesTheCounterDatabase(t *testing.T) {
	for _, mode := range []string{sqlite.SyncNormal, sqlite.SyncFull} {
		t.Run(mode, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			c := openForTest(t, "--data", dir, "--sync", mode, "--counter", "bucket", "--buckets", "4")
			sc, ok := c.(*counters.SQLiteCounter)
			if !ok {
				t.Fatalf("counter store is a %T", c)
			}
			if sc.DB().Path() != filepath.Join(dir, "counters.db") {
				t.Errorf("counter database at %s", sc.DB().Path())
			}
			if got, err := sc.DB().Synchronous(t.Context()); err != nil || got != mode {
				t.Errorf("counters.db synchronous = %q, %v; want %q", got, err, mode)
			}
		})
	}
}

// TestPoolReachesTheCounterPool: --pool sizes the counter store's pool as it does the
// shards'. (Before, the counter pool had pgxpool's default size whatever --pool said.)
func TestPoolReachesTheCounterPool(t *testing.T) {
	dsn := pgtest.NewDatabase(t, "demoserver_pool")
	c := openForTest(t, "--backend", "postgres", "--dsn", dsn, "--pool", "3", "--counter", "row")
	pc, ok := c.(*counters.PostgresCounter)
	if !ok {
		t.Fatalf("counter store is a %T", c)
	}
	if got := pc.Stat().MaxConns(); got != 3 {
		t.Errorf("counter pool of %d connections, want --pool 3", got)
	}
}
