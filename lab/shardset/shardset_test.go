package shardset_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/lab/shardset/sqlite"
	"github.com/shardlab/shardlab/routing"
)

// sqliteSet opens n real SQLite shards in a fresh directory behind a CRC32 router.
func sqliteSet(t *testing.T, n int) (*shardset.Set, []*sqlite.Store) {
	t.Helper()
	stores, err := sqlite.OpenShards(context.Background(), t.TempDir(), n, sqlite.Options{ReadConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	router, err := routing.NewCRC32(n)
	if err != nil {
		t.Fatal(err)
	}
	set, err := shardset.New(router, backends(stores...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := set.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return set, stores
}

func backends(stores ...*sqlite.Store) []shardset.Backend {
	out := make([]shardset.Backend, len(stores))
	for i, s := range stores {
		out[i] = s
	}
	return out
}

// broken is a backend whose every call fails: it stands for a shard whose database is
// down, to test how the Set wraps and isolates the failure.
type broken struct{ err error }

func (b broken) Put(context.Context, string, []byte) error   { return b.err }
func (b broken) Get(context.Context, string) ([]byte, error) { return nil, b.err }
func (b broken) Count(context.Context) (int64, error)        { return 0, b.err }
func (b broken) Ping(context.Context) error                  { return b.err }
func (b broken) Close() error                                { return nil }

var _ shardset.Backend = broken{}

func TestNewRefusesBadArguments(t *testing.T) {
	router, _ := routing.NewCRC32(3)
	stores, err := sqlite.OpenShards(context.Background(), t.TempDir(), 2, sqlite.Options{ReadConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, s := range stores {
			s.Close()
		}
	}()
	tests := []struct {
		name     string
		router   routing.Router
		backends []shardset.Backend
		want     string
	}{
		{"fewer backends than shards", router, backends(stores...), "3 shards but 2 backends"},
		{"no backends", router, nil, "3 shards but 0 backends"},
		{"nil router", nil, backends(stores...), "nil router"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, err := shardset.New(tt.router, tt.backends)
			if err == nil || set != nil {
				t.Fatalf("New = %v, %v; want an error", set, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
		})
	}
}

// TestKeysGoToTheRoutersShard reads each shard's store directly: a key written through
// the set sits on the shard the router names and on no other.
func TestKeysGoToTheRoutersShard(t *testing.T) {
	ctx := context.Background()
	set, stores := sqliteSet(t, 3)
	if set.Shards() != 3 || set.Router().Name() != routing.StrategyCRC32 {
		t.Fatalf("Shards %d, router %s", set.Shards(), set.Router().Name())
	}
	used := map[int]int{}
	for i := range 60 {
		key := fmt.Sprintf("user%d", i)
		shard, err := set.Put(ctx, key, []byte("v"+key))
		if err != nil {
			t.Fatal(err)
		}
		want := set.Router().ShardFor(key)
		if shard != want || set.ShardFor(key) != want {
			t.Errorf("%s: Put says shard %d, ShardFor %d, router %d", key, shard, set.ShardFor(key), want)
		}
		used[want]++
		for j, st := range stores {
			_, err := st.Get(ctx, key)
			switch {
			case j == want && err != nil:
				t.Errorf("%s missing from its shard %d: %v", key, j, err)
			case j != want && !errors.Is(err, shardset.ErrNotFound):
				t.Errorf("%s found on shard %d too (%v)", key, j, err)
			}
		}
		data, shard, err := set.Get(ctx, key)
		if err != nil || shard != want || string(data) != "v"+key {
			t.Errorf("Get(%s) = %q, %d, %v", key, data, shard, err)
		}
	}
	if len(used) != 3 {
		t.Errorf("60 keys used only shards %v", used)
	}
	_, shard, err := set.Get(ctx, "nobody")
	if !errors.Is(err, shardset.ErrNotFound) || shard != set.ShardFor("nobody") {
		t.Errorf("Get of a missing key = shard %d, %v; want ErrNotFound from shard %d", shard, err, set.ShardFor("nobody"))
	}
	var se *shardset.ShardError
	if errors.As(err, &se) {
		t.Errorf("a missing key is not a shard failure: %v", err)
	}
	counts, err := set.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range counts {
		if n != int64(used[i]) {
			t.Errorf("Counts[%d] = %d, want %d", i, n, used[i])
		}
	}
}

// TestFailingShardIsIsolated: a shard that fails yields a *ShardError naming it, and the
// other shards keep working.
func TestFailingShardIsIsolated(t *testing.T) {
	ctx := context.Background()
	stores, err := sqlite.OpenShards(ctx, t.TempDir(), 3, sqlite.Options{ReadConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	down := errors.New("disk on fire")
	const bad = 1
	bs := backends(stores...)
	stores[bad].Close()
	bs[bad] = broken{err: down}
	router, _ := routing.NewCRC32(3)
	set, err := shardset.New(router, bs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })

	var badKey, goodKey string
	for i := 0; badKey == "" || goodKey == ""; i++ {
		k := fmt.Sprintf("k%d", i)
		if set.ShardFor(k) == bad {
			badKey = k
		} else {
			goodKey = k
		}
	}
	checkShardError := func(op string, shard int, err error) {
		t.Helper()
		var se *shardset.ShardError
		if !errors.As(err, &se) {
			t.Fatalf("%s: %v is not a *ShardError", op, err)
		}
		if se.Shard != bad || shard != bad || !errors.Is(err, down) || !strings.Contains(err.Error(), fmt.Sprintf("shard %d", bad)) {
			t.Errorf("%s: ShardError{Shard: %d} (returned shard %d): %v; want shard %d wrapping %v", op, se.Shard, shard, err, bad, down)
		}
	}
	shard, err := set.Put(ctx, badKey, []byte("x"))
	checkShardError("Put", shard, err)
	_, shard, err = set.Get(ctx, badKey)
	checkShardError("Get", shard, err)
	if errors.Is(err, shardset.ErrNotFound) {
		t.Error("a failing shard must not look like a missing key")
	}

	if _, err := set.Put(ctx, goodKey, []byte("fine")); err != nil {
		t.Fatalf("healthy shard: %v", err)
	}
	if data, _, err := set.Get(ctx, goodKey); err != nil || string(data) != "fine" {
		t.Fatalf("healthy shard: %q, %v", data, err)
	}

	counts, err := set.Counts(ctx)
	var se *shardset.ShardError
	if !errors.As(err, &se) || se.Shard != bad || !errors.Is(err, down) {
		t.Errorf("Counts error = %v; want a ShardError for shard %d", err, bad)
	}
	want := []int64{0, -1, 0}
	want[set.ShardFor(goodKey)] = 1
	for i := range want {
		if counts[i] != want[i] {
			t.Errorf("Counts = %v, want %v", counts, want)
			break
		}
	}

	health := set.Health(ctx)
	if len(health) != 3 {
		t.Fatalf("Health has %d entries", len(health))
	}
	for i, err := range health {
		if i == bad && !errors.Is(err, down) {
			t.Errorf("Health[%d] = %v, want %v", i, err, down)
		}
		if i != bad && err != nil {
			t.Errorf("Health[%d] = %v, want nil", i, err)
		}
	}
}

func TestEnsureLayout(t *testing.T) {
	base := shardset.Layout{Backend: "sqlite", Shards: 3, Router: "crc32"}
	dir := filepath.Join(t.TempDir(), "nested", "data")
	if err := shardset.EnsureLayout(dir, base); err != nil {
		t.Fatalf("first EnsureLayout: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, shardset.LayoutFile)); err != nil {
		t.Fatalf("layout file not written: %v", err)
	}
	if err := shardset.EnsureLayout(dir, base); err != nil {
		t.Fatalf("same layout refused: %v", err)
	}
	others := map[string]shardset.Layout{
		"shards":  {Backend: "sqlite", Shards: 4, Router: "crc32"},
		"router":  {Backend: "sqlite", Shards: 3, Router: "jump"},
		"backend": {Backend: "postgres", Shards: 3, Router: "crc32"},
	}
	for name, l := range others {
		t.Run("other "+name, func(t *testing.T) {
			err := shardset.EnsureLayout(dir, l)
			if !errors.Is(err, shardset.ErrLayoutMismatch) {
				t.Fatalf("EnsureLayout(%+v) = %v, want ErrLayoutMismatch", l, err)
			}
			if !strings.Contains(err.Error(), "3 shards") {
				t.Errorf("message does not say what the directory holds: %v", err)
			}
		})
	}
	// The refusals must not have overwritten the recorded layout.
	if err := shardset.EnsureLayout(dir, base); err != nil {
		t.Errorf("original layout refused after mismatches: %v", err)
	}
}

func TestEnsureLayoutCorruptFile(t *testing.T) {
	for name, content := range map[string]string{
		"truncated":  `{"backend": "sqlite", "sha`,
		"not JSON":   "shards=3\n",
		"wrong type": `{"backend": "sqlite", "shards": "three", "router": "crc32"}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, shardset.LayoutFile)
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			err := shardset.EnsureLayout(dir, shardset.Layout{Backend: "sqlite", Shards: 3, Router: "crc32"})
			if err == nil {
				t.Fatal("corrupt layout file accepted")
			}
			if errors.Is(err, shardset.ErrLayoutMismatch) || !strings.Contains(err.Error(), path) {
				t.Errorf("error %q should name %s as unreadable", err, path)
			}
			if raw, _ := os.ReadFile(path); string(raw) != content {
				t.Errorf("corrupt layout file was overwritten with %q", raw)
			}
		})
	}
}

// TestClosedSet: after Close every call reports ErrClosed instead of reaching a closed
// backend, and closing again is a no-op.
func TestClosedSet(t *testing.T) {
	ctx := context.Background()
	stores, err := sqlite.OpenShards(ctx, t.TempDir(), 2, sqlite.Options{ReadConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	router, _ := routing.NewCRC32(2)
	set, err := shardset.New(router, backends(stores...))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := set.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := set.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := set.Close(); err != nil {
		t.Errorf("second Close: %v, want nil", err)
	}
	if shard, err := set.Put(ctx, "k", []byte("w")); !errors.Is(err, shardset.ErrClosed) || shard != set.ShardFor("k") {
		t.Errorf("Put after Close = %d, %v; want ErrClosed for shard %d", shard, err, set.ShardFor("k"))
	}
	if _, _, err := set.Get(ctx, "k"); !errors.Is(err, shardset.ErrClosed) {
		t.Errorf("Get after Close = %v, want ErrClosed", err)
	}
	counts, err := set.Counts(ctx)
	if !errors.Is(err, shardset.ErrClosed) || len(counts) != 2 || counts[0] != -1 || counts[1] != -1 {
		t.Errorf("Counts after Close = %v, %v; want -1 each and ErrClosed", counts, err)
	}
	for i, err := range set.Health(ctx) {
		if !errors.Is(err, shardset.ErrClosed) {
			t.Errorf("Health[%d] after Close = %v, want ErrClosed", i, err)
		}
	}
}

// hanging answers nothing until its context ends, like a frozen database server.
type hanging struct{ broken }

func (hanging) Ping(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

func (hanging) Count(ctx context.Context) (int64, error) {
	<-ctx.Done()
	return 0, ctx.Err()
}

// TestHangingShardDoesNotTaintOthers: a shard that hangs must be the only one reported
// unhealthy, even though it uses up the whole deadline of the health check.
func TestHangingShardDoesNotTaintOthers(t *testing.T) {
	_, stores := sqliteSet(t, 2)
	router, err := routing.NewCRC32(3)
	if err != nil {
		t.Fatal(err)
	}
	set, err := shardset.New(router, []shardset.Backend{hanging{}, stores[0], stores[1]})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	health := set.Health(ctx)
	if health[0] == nil || health[1] != nil || health[2] != nil {
		t.Errorf("Health = %v, want only shard 0 unhealthy", health)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	counts, err := set.Counts(ctx2)
	if err == nil || counts[0] != -1 || counts[1] != 0 || counts[2] != 0 {
		t.Errorf("Counts = %v, %v; want [-1 0 0] and an error", counts, err)
	}
}
