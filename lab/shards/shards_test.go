package shards_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/counters"
	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/internal/sqlitedb"
	"github.com/shardlab/shardlab/lab/shards"
	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/lab/shardset/postgres"
	"github.com/shardlab/shardlab/lab/shardset/sqlite"
	"github.com/shardlab/shardlab/routing"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func open(t *testing.T, cfg shards.Config) *shards.Shards {
	t.Helper()
	s, err := shards.Open(testCtx(t), cfg)
	if err != nil {
		t.Fatalf("Open(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// roundTrip writes a key per shard through the set and reads it back.
func roundTrip(t *testing.T, set *shardset.Set, tag string) {
	t.Helper()
	ctx := testCtx(t)
	seen := map[int]bool{}
	for i := 0; len(seen) < set.Shards(); i++ {
		key := fmt.Sprintf("%s-%d", tag, i)
		shard, err := set.Put(ctx, key, []byte(key))
		if err != nil {
			t.Fatal(err)
		}
		seen[shard] = true
		if got, _, err := set.Get(ctx, key); err != nil || string(got) != key {
			t.Fatalf("Get(%s) = %q, %v", key, got, err)
		}
	}
}

func TestOpenSQLite(t *testing.T) {
	ctx := testCtx(t)
	dir := filepath.Join(t.TempDir(), "data")
	cfg := shards.Config{Shards: 3, Router: routing.StrategyJump, Dir: dir,
		SQLite: sqlite.Options{Sync: sqlite.SyncFull, ReadConns: 2}}
	s := open(t, cfg)
	if s.Set.Shards() != 3 || s.Set.Router().Name() != routing.StrategyJump || s.PoolSize != 2 {
		t.Errorf("%d shards, router %s, pool %d", s.Set.Shards(), s.Set.Router().Name(), s.PoolSize)
	}
	if want := (shardset.Layout{Backend: shards.BackendSQLite, Shards: 3, Router: routing.StrategyJump}); s.Layout != want {
		t.Errorf("Layout %+v, want %+v", s.Layout, want)
	}
	roundTrip(t, s.Set, "k")
	for _, f := range []string{sqlite.ShardFile(dir, 0), sqlite.ShardFile(dir, 2), filepath.Join(dir, shardset.LayoutFile)} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}

	// The counter database sits beside the shards and runs with their sync mode, read
	// back from the connection that commits its increments.
	c, err := s.OpenCounter(ctx, counters.Options{Strategy: counters.StrategyRow})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, ok := c.(*counters.SQLiteCounter)
	if !ok {
		t.Fatalf("OpenCounter gave a %T", c)
	}
	if sc.DB().Path() != filepath.Join(dir, shards.CounterFile) {
		t.Errorf("counter database at %s", sc.DB().Path())
	}
	if got, err := sc.DB().Synchronous(ctx); err != nil || got != sqlite.SyncFull {
		t.Errorf("counter synchronous = %q, %v; want full", got, err)
	}

	// Another layout on the same directory is refused; the same one reopens.
	for _, other := range []shards.Config{
		{Shards: 4, Router: routing.StrategyJump, Dir: dir},
		{Shards: 3, Router: routing.StrategyCRC32, Dir: dir},
	} {
		if s2, err := shards.Open(ctx, other); !errors.Is(err, shardset.ErrLayoutMismatch) {
			if s2 != nil {
				s2.Close()
			}
			t.Errorf("Open(%+v) = %v, want ErrLayoutMismatch", other, err)
		}
	}
}

// TestOpenSQLiteDefaults: with zero options the counter database takes the shards'
// default sync mode (normal), not the counters package's own default (full).
func TestOpenSQLiteDefaults(t *testing.T) {
	s := open(t, shards.Config{Dir: t.TempDir()})
	if s.Set.Shards() != 1 || s.Set.Router().Name() != routing.StrategyCRC32 || s.PoolSize != sqlitedb.DefaultReadConns() {
		t.Errorf("defaults: %d shards, router %s, pool %d", s.Set.Shards(), s.Set.Router().Name(), s.PoolSize)
	}
	c, err := s.OpenCounter(testCtx(t), counters.Options{Strategy: counters.StrategyRow})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := c.(*counters.SQLiteCounter).DB().Synchronous(testCtx(t)); err != nil || got != sqlite.SyncNormal {
		t.Errorf("counter synchronous = %q, %v; want normal like the shards", got, err)
	}
}

func TestOpenRefusesBadConfig(t *testing.T) {
	dir := t.TempDir()
	const dsn = "postgres://nobody@127.0.0.1:1/x?sslmode=disable" // never dialled
	tests := []struct {
		name string
		cfg  shards.Config
		want error
	}{
		{"unknown backend", shards.Config{Backend: "mysql", Dir: dir}, shards.ErrBadConfig},
		{"negative shards", shards.Config{Shards: -1, Dir: dir}, shards.ErrBadConfig},
		{"too many shards", shards.Config{Shards: routing.MaxShards + 1, Dir: dir}, shards.ErrBadConfig},
		{"unknown router", shards.Config{Router: "rendezvous", Dir: dir}, shards.ErrBadConfig},
		{"SQLite without a directory", shards.Config{}, shards.ErrBadConfig},
		{"SQLite with DSNs", shards.Config{Dir: dir, DSNs: []string{dsn}}, shards.ErrBadConfig},
		{"bad SQLite options", shards.Config{Dir: dir, SQLite: sqlite.Options{Sync: "sometimes"}}, sqlite.ErrBadOptions},
		{"fewer DSNs than shards", shards.Config{Backend: shards.BackendPostgres, Shards: 2, DSNs: []string{dsn}}, shards.ErrBadConfig},
		{"Create without a base DSN", shards.Config{Backend: shards.BackendPostgres, Shards: 2, Create: true, Reset: true}, shards.ErrBadConfig},
		{"Create over more servers than shards", shards.Config{Backend: shards.BackendPostgres, Shards: 1, Create: true, DSNs: []string{dsn, dsn}}, shards.ErrBadConfig},
		{"Reset without Create", shards.Config{Backend: shards.BackendPostgres, Reset: true, DSNs: []string{dsn}}, shards.ErrBadConfig},
		{"Reset with Lazy", shards.Config{Backend: shards.BackendPostgres, Create: true, Reset: true, DSNs: []string{dsn}, Postgres: postgres.Options{Lazy: true}}, shards.ErrBadConfig},
		{"bad pool size", shards.Config{Backend: shards.BackendPostgres, DSNs: []string{dsn}, Postgres: postgres.Options{PoolSize: -3}}, postgres.ErrBadOptions},
		{"bad DSN", shards.Config{Backend: shards.BackendPostgres, DSNs: []string{"postgres://h:notaport/x"}}, postgres.ErrBadDSN},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := shards.Open(testCtx(t), tt.cfg)
			if !errors.Is(err, tt.want) {
				if s != nil {
					s.Close()
				}
				t.Fatalf("Open = %v, want %v", err, tt.want)
			}
		})
	}
	// Refused options created nothing, not even the layout file.
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused configurations left %d files in the data directory", len(entries))
	}
}

func TestOpenPostgresDSNs(t *testing.T) {
	ctx := testCtx(t)
	dsns := []string{pgtest.NewDatabase(t, "lab_dsn0"), pgtest.NewDatabase(t, "lab_dsn1")}
	cfg := shards.Config{Backend: shards.BackendPostgres, Shards: 2, DSNs: dsns, Postgres: postgres.Options{PoolSize: 3}}
	s := open(t, cfg)
	if s.PoolSize != 3 {
		t.Errorf("PoolSize %d, want 3", s.PoolSize)
	}
	roundTrip(t, s.Set, "pg")

	// The counter pool is made with the shards' options: --pool reaches it.
	c, err := s.OpenCounter(ctx, counters.Options{Strategy: counters.StrategyRow})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.(*counters.PostgresCounter).Stat().MaxConns(); got != 3 {
		t.Errorf("counter pool of %d connections, want 3", got)
	}
	if err := c.Incr(ctx, "hot", 2); err != nil {
		t.Fatal(err)
	}

	swapped := cfg
	swapped.DSNs = []string{dsns[1], dsns[0]}
	_, err = shards.Open(ctx, swapped)
	var errs shardset.Errors
	if !errors.Is(err, shardset.ErrLayoutMismatch) || !errors.As(err, &errs) || len(errs) != 2 {
		t.Errorf("DSNs swapped: %v, want a layout mismatch on both shards", err)
	}
}

func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	return databaseExistsOn(t, pgtest.DSN(t), name)
}

// databaseExistsOn reports whether the server dsn points at has a database name.
func databaseExistsOn(t *testing.T, dsn, name string) bool {
	t.Helper()
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, dsn)
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

// TestOpenPostgresCreateRefusedLeavesNothingBehind: a start refused for its layout drops
// the database it had just created and keeps the ones it found.
func TestOpenPostgresCreateRefusedLeavesNothingBehind(t *testing.T) {
	ctx := testCtx(t)
	base := pgtest.DSN(t)
	prefix := pgtest.UniqueName("lab_create") + "_s"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := postgres.DropShardDatabasesWithPrefix(ctx, base, prefix, 3); err != nil {
			t.Error(err)
		}
	})
	two := shards.Config{Backend: shards.BackendPostgres, Shards: 2, DSNs: []string{base}, Create: true, DatabasePrefix: prefix}
	s, err := shards.Open(ctx, two)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, s.Set, "two")
	s.Close()

	three := two
	three.Shards = 3
	_, err = shards.Open(ctx, three)
	if !errors.Is(err, shardset.ErrLayoutMismatch) {
		t.Fatalf("Open with 3 shards over a 2-shard layout = %v, want ErrLayoutMismatch", err)
	}
	if databaseExists(t, prefix+"2") {
		t.Errorf("the refused start left %s2 behind", prefix)
	}
	if !databaseExists(t, prefix+"0") || !databaseExists(t, prefix+"1") {
		t.Fatal("the refused start dropped databases it had not created")
	}
	s = open(t, two) // the old layout, data and all, is still there
	if got, _, err := s.Set.Get(ctx, "two-0"); err != nil || string(got) != "two-0" {
		t.Errorf("after the refused start: %q, %v", got, err)
	}
	s.Close()

	three.Reset = true
	s = open(t, three)
	if _, _, err := s.Set.Get(ctx, "two-0"); !errors.Is(err, shardset.ErrNotFound) {
		t.Errorf("after Reset the old record is still there: %v", err)
	}
	roundTrip(t, s.Set, "three")
}

// TestOpenPostgresCreateOnSeveralServers: with a base DSN per server, Create puts shard
// i on server i mod servers, and Reset drops them there.
func TestOpenPostgresCreateOnSeveralServers(t *testing.T) {
	ctx := testCtx(t)
	main := pgtest.DSN(t)
	other := pgtest.StartCluster(t)
	prefix := pgtest.UniqueName("lab_spread") + "_s"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := postgres.DropShardDatabasesOn(ctx, []string{main, other.DSN()}, prefix, 3); err != nil {
			t.Error(err)
		}
	})
	cfg := shards.Config{Backend: shards.BackendPostgres, Shards: 3, DSNs: []string{main, other.DSN()}, Create: true, DatabasePrefix: prefix}
	s := open(t, cfg)
	roundTrip(t, s.Set, "spread")
	s.Close()
	on := func(dsn, name string) bool { return databaseExistsOn(t, dsn, name) }
	for i, want := range []string{main, other.DSN(), main} {
		name := fmt.Sprintf("%s%d", prefix, i)
		if !on(want, name) {
			t.Errorf("shard %d's database %s is not on its server %s", i, name, want)
		}
		if elsewhere := map[string]string{main: other.DSN(), other.DSN(): main}[want]; on(elsewhere, name) {
			t.Errorf("shard %d's database %s is on %s too", i, name, elsewhere)
		}
	}
	cfg.Reset = true
	s = open(t, cfg)
	if _, _, err := s.Set.Get(ctx, "spread-0"); !errors.Is(err, shardset.ErrNotFound) {
		t.Errorf("after Reset the old record is still there: %v", err)
	}
	s.Close()
}

// TestOpenPostgresLazy: a shard that does not answer fails Open, naming it, unless
// Lazy is set; then it is listed in Down and the others serve.
func TestOpenPostgresLazy(t *testing.T) {
	ctx := testCtx(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("postgres://postgres@%s/x?sslmode=disable&connect_timeout=2", l.Addr())
	l.Close()
	cfg := shards.Config{Backend: shards.BackendPostgres, Shards: 2, DSNs: []string{pgtest.NewDatabase(t, "lab_lazy"), dead},
		Postgres: postgres.Options{QueryTimeout: 3 * time.Second}}
	if _, err := shards.Open(ctx, cfg); err == nil || !strings.Contains(err.Error(), "shard 1") {
		t.Fatalf("Open with shard 1 down = %v, want an error naming shard 1", err)
	}
	cfg.Postgres.Lazy = true
	s := open(t, cfg)
	if len(s.Down) != 1 || s.Down[0].Shard != 1 {
		t.Fatalf("Down = %v, want shard 1", s.Down)
	}
	for i := 0; ; i++ {
		key := fmt.Sprint("lazy", i)
		if s.Set.ShardFor(key) == 0 {
			if _, err := s.Set.Put(ctx, key, []byte("v")); err != nil {
				t.Errorf("the live shard refused a write: %v", err)
			}
			break
		}
	}
}
