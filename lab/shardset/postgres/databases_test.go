package postgres_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/lab/shardset/postgres"
)

func databaseExists(t *testing.T, baseDSN, name string) bool {
	t.Helper()
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, baseDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	return exists
}

func TestCreateShardDatabasesIsIdempotentAndKeepsData(t *testing.T) {
	ctx := testCtx(t)
	base := pgtest.DSN(t)
	prefix := pgtest.UniqueName("create") + "_s"
	const n = 3
	t.Cleanup(func() {
		ctx, cancel := cleanupCtx()
		defer cancel()
		if err := postgres.DropShardDatabasesWithPrefix(ctx, base, prefix, n); err != nil {
			t.Error(err)
		}
	})

	dsns, err := postgres.CreateShardDatabasesWithPrefix(ctx, base, prefix, n)
	if err != nil {
		t.Fatal(err)
	}
	if len(dsns) != n {
		t.Fatalf("got %d DSNs, want %d", len(dsns), n)
	}
	for i, dsn := range dsns {
		name := postgres.ShardDatabaseName(prefix, i)
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil || cfg.Database != name {
			t.Errorf("DSN %d = %q names database %q (%v), want %q", i, dsn, cfg.Database, err, name)
		}
		if !databaseExists(t, base, name) {
			t.Errorf("database %s was not created", name)
		}
	}
	stores, err := postgres.OpenShards(ctx, dsns, postgres.Options{PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range stores {
		if err := st.Put(ctx, "k", []byte(fmt.Sprint("shard ", i))); err != nil {
			t.Fatal(err)
		}
		st.Close()
	}

	// Again, and from several processes at once: same DSNs, data kept.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	again := make([][]string, 4)
	for i := range errs {
		wg.Go(func() { again[i], errs[i] = postgres.CreateShardDatabasesWithPrefix(ctx, base, prefix, n) })
	}
	wg.Wait()
	for i := range errs {
		if errs[i] != nil {
			t.Fatalf("CreateShardDatabases again: %v", errs[i])
		}
		if fmt.Sprint(again[i]) != fmt.Sprint(dsns) {
			t.Errorf("CreateShardDatabases again = %v, first time %v", again[i], dsns)
		}
	}
	for i, dsn := range dsns {
		st := open(t, dsn, postgres.Options{PoolSize: 1})
		if got, err := st.Get(ctx, "k"); err != nil || string(got) != fmt.Sprint("shard ", i) {
			t.Errorf("shard %d after second create: Get = %q, %v", i, got, err)
		}
	}
}

func TestCreateShardDatabasesConcurrentFirstTime(t *testing.T) {
	ctx := testCtx(t)
	base := pgtest.DSN(t)
	prefix := pgtest.UniqueName("race") + "_s"
	const n = 2
	t.Cleanup(func() {
		ctx, cancel := cleanupCtx()
		defer cancel()
		if err := postgres.DropShardDatabasesWithPrefix(ctx, base, prefix, n); err != nil {
			t.Error(err)
		}
	})
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { _, errs[i] = postgres.CreateShardDatabasesWithPrefix(ctx, base, prefix, n) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent CreateShardDatabases: %v", err)
	}
}

func TestDropShardDatabases(t *testing.T) {
	ctx := testCtx(t)
	base := pgtest.DSN(t)
	prefix := pgtest.UniqueName("drop") + "_s"
	dsns, err := postgres.CreateShardDatabasesWithPrefix(ctx, base, prefix, 2)
	if err != nil {
		t.Fatal(err)
	}
	// A session still connected does not stop the drop.
	st := open(t, dsns[0], postgres.Options{})
	if err := postgres.DropShardDatabasesWithPrefix(ctx, base, prefix, 2); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if name := postgres.ShardDatabaseName(prefix, i); databaseExists(t, base, name) {
			t.Errorf("database %s still exists", name)
		}
	}
	if err := st.Ping(ctx); err == nil {
		t.Error("Ping on a dropped database succeeded")
	}
	if err := postgres.DropShardDatabasesWithPrefix(ctx, base, prefix, 2); err != nil {
		t.Errorf("dropping again: %v", err)
	}
}

// TestDefaultShardDatabaseNames uses a cluster of its own, since shardlab_shard_N on
// the shared server may be a real lab's data.
func TestDefaultShardDatabaseNames(t *testing.T) {
	ctx := testCtx(t)
	cluster := pgtest.StartCluster(t)
	dsns, err := postgres.CreateShardDatabases(ctx, cluster.DSN(), 2)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/shardlab_shard_1?sslmode=disable", cluster.Port())
	if dsns[1] != want {
		t.Errorf("DSN of shard 1 = %q, want %q", dsns[1], want)
	}
	if !databaseExists(t, cluster.DSN(), "shardlab_shard_0") {
		t.Error("shardlab_shard_0 was not created")
	}
	if err := postgres.DropShardDatabases(ctx, cluster.DSN(), 2); err != nil {
		t.Fatal(err)
	}
	if databaseExists(t, cluster.DSN(), "shardlab_shard_1") {
		t.Error("shardlab_shard_1 still exists")
	}
}

func TestShardDatabasesBadArguments(t *testing.T) {
	ctx := testCtx(t)
	const base = "postgres://nobody@127.0.0.1:1/postgres" // never dialled
	for _, c := range []struct {
		prefix string
		n      int
	}{
		{"ok_", 0},
		{"ok_", -1},
		{"ok_", 1 << 20},
		{"", 2},
		{"Upper", 2},
		{"9lives", 2},
		{`x"; DROP DATABASE postgres; --`, 2},
	} {
		if _, err := postgres.CreateShardDatabasesWithPrefix(ctx, base, c.prefix, c.n); !errors.Is(err, postgres.ErrBadOptions) {
			t.Errorf("Create(%q, %d) error = %v, want ErrBadOptions", c.prefix, c.n, err)
		}
		if err := postgres.DropShardDatabasesWithPrefix(ctx, base, c.prefix, c.n); !errors.Is(err, postgres.ErrBadOptions) {
			t.Errorf("Drop(%q, %d) error = %v, want ErrBadOptions", c.prefix, c.n, err)
		}
	}
}

// TestCreateMissingShardDatabasesSaysWhatItCreated: only databases this call made are
// listed, so a caller that backs out drops those and nothing it found.
func TestCreateMissingShardDatabasesSaysWhatItCreated(t *testing.T) {
	ctx := testCtx(t)
	base := pgtest.DSN(t)
	prefix := pgtest.UniqueName("missing") + "_s"
	t.Cleanup(func() {
		ctx, cancel := cleanupCtx()
		defer cancel()
		if err := postgres.DropShardDatabasesWithPrefix(ctx, base, prefix, 3); err != nil {
			t.Error(err)
		}
	})
	_, created, err := postgres.CreateMissingShardDatabases(ctx, base, prefix, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{prefix + "0", prefix + "1"}; fmt.Sprint(created) != fmt.Sprint(want) {
		t.Errorf("first call created %v, want %v", created, want)
	}
	dsns, created, err := postgres.CreateMissingShardDatabases(ctx, base, prefix, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(dsns) != 3 || len(created) != 1 || created[0] != prefix+"2" {
		t.Errorf("second call: %d DSNs, created %v; want 3 and only %s2", len(dsns), created, prefix)
	}
	if _, created, err := postgres.CreateMissingShardDatabases(ctx, base, prefix, 3); err != nil || len(created) != 0 {
		t.Errorf("third call created %v, %v; want nothing", created, err)
	}
}
