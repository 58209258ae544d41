package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/lab/shardset/postgres"
	"github.com/shardlab/shardlab/routing"
)

// hangLimit is how long a call may take before a test calls it hung. It is far above
// anything a healthy or a refused call needs, so it only catches real hangs.
const hangLimit = 30 * time.Second

// testCtx bounds a test's calls so that a bug fails the test rather than hanging it.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*hangLimit)
	t.Cleanup(cancel)
	return ctx
}

// cleanupCtx is testCtx for cleanup functions, which run after t.Context is cancelled.
func cleanupCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*hangLimit)
}

func open(t *testing.T, dsn string, opts postgres.Options) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(testCtx(t), dsn, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestRoundTrip(t *testing.T) {
	ctx := testCtx(t)
	s := open(t, pgtest.NewDatabase(t, "roundtrip"), postgres.Options{})

	allBytes := make([]byte, 256)
	for i := range allBytes {
		allBytes[i] = byte(i)
	}
	big := bytes.Repeat([]byte("0123456789abcdef\x00\xff"), 1<<16)
	cases := []struct {
		key  string
		data []byte
	}{
		{"user-1", []byte("hello")},
		{"user-binary", allBytes},
		{"user-empty", []byte{}},
		{"user-nil", nil}, // stored as an empty value
		{"user-big", big},
		{"", []byte("the empty key is a key")},
		{"ünïcødé ключ 🔑", []byte("unicode key")},
		{"user-1 ", []byte("trailing space is another key")},
	}
	for _, c := range cases {
		if err := s.Put(ctx, c.key, c.data); err != nil {
			t.Fatalf("Put(%q): %v", c.key, err)
		}
	}
	for _, c := range cases {
		got, err := s.Get(ctx, c.key)
		if err != nil {
			t.Fatalf("Get(%q): %v", c.key, err)
		}
		if got == nil || !bytes.Equal(got, c.data) {
			t.Errorf("Get(%q) = %d bytes (nil: %v), want the %d bytes put", c.key, len(got), got == nil, len(c.data))
		}
	}
	n, err := s.Count(ctx)
	if err != nil || n != int64(len(cases)) {
		t.Errorf("Count = %d, %v; want %d", n, err, len(cases))
	}

	// Overwrite.
	if err := s.Put(ctx, "user-1", []byte("second")); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "user-1"); err != nil || string(got) != "second" {
		t.Errorf("Get after overwrite = %q, %v; want \"second\"", got, err)
	}
	if n, _ := s.Count(ctx); n != int64(len(cases)) {
		t.Errorf("Count after overwrite = %d, want %d", n, len(cases))
	}

	if _, err := s.Get(ctx, "nobody"); !errors.Is(err, shardset.ErrNotFound) {
		t.Errorf("Get(missing) error = %v, want ErrNotFound", err)
	}
	for _, bad := range []string{"nul\x00inside", "bad utf8 \xff"} {
		if err := s.Put(ctx, bad, []byte("x")); !errors.Is(err, postgres.ErrInvalidKey) {
			t.Errorf("Put(%q) error = %v, want ErrInvalidKey", bad, err)
		}
		if _, err := s.Get(ctx, bad); !errors.Is(err, shardset.ErrNotFound) {
			t.Errorf("Get(%q) error = %v, want ErrNotFound", bad, err)
		}
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping: %v", err)
	}
	if v, err := s.ServerVersion(ctx); err != nil || v == "" {
		t.Errorf("ServerVersion = %q, %v", v, err)
	}
}

func TestConcurrentPuts(t *testing.T) {
	ctx := testCtx(t)
	s := open(t, pgtest.NewDatabase(t, "concurrent"), postgres.Options{PoolSize: 4})
	const workers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("w%d-k%d", w, i%10) // overwrites as well as inserts
				if err := s.Put(ctx, key, []byte(key)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Put: %v", err)
	}
	if n, err := s.Count(ctx); err != nil || n != workers*10 {
		t.Errorf("Count = %d, %v; want %d", n, err, workers*10)
	}
	if st := s.Stat(); st.MaxConns() != 4 {
		t.Errorf("pool MaxConns = %d, want 4", st.MaxConns())
	}
}

func TestReopenAndClose(t *testing.T) {
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t, "reopen")
	s, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "k", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.Put(ctx, "k", nil); !errors.Is(err, shardset.ErrClosed) {
		t.Errorf("Put after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Get(ctx, "k"); !errors.Is(err, shardset.ErrClosed) {
		t.Errorf("Get after Close = %v, want ErrClosed", err)
	}

	s2 := open(t, dsn, postgres.Options{})
	if got, err := s2.Get(ctx, "k"); err != nil || string(got) != "kept" {
		t.Errorf("Get after reopen = %q, %v; want \"kept\"", got, err)
	}
}

func TestBadOptions(t *testing.T) {
	ctx := testCtx(t)
	const dsn = "postgres://nobody@127.0.0.1:1/none?sslmode=disable" // never dialled
	for _, o := range []postgres.Options{
		{PoolSize: -1},
		{PoolSize: postgres.MaxPoolSize + 1},
		{ConnectTimeout: -time.Second},
		{QueryTimeout: -time.Second},
	} {
		if _, err := postgres.Open(ctx, dsn, o); !errors.Is(err, postgres.ErrBadOptions) {
			t.Errorf("Open(%+v) error = %v, want ErrBadOptions", o, err)
		}
		if _, err := postgres.OpenShards(ctx, []string{dsn}, o); !errors.Is(err, postgres.ErrBadOptions) {
			t.Errorf("OpenShards(%+v) error = %v, want ErrBadOptions", o, err)
		}
	}
	for _, bad := range []string{"", "  ", "postgres://u:secret@host:notaport/db", "host=h port=x"} {
		_, err := postgres.Open(ctx, bad, postgres.Options{Lazy: true})
		if !errors.Is(err, postgres.ErrBadDSN) {
			t.Errorf("Open(%q) error = %v, want ErrBadDSN", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q) error shows the password: %v", bad, err)
		}
	}
	if _, err := postgres.OpenShards(ctx, nil, postgres.Options{}); !errors.Is(err, postgres.ErrBadDSN) {
		t.Errorf("OpenShards(no DSNs) error = %v, want ErrBadDSN", err)
	}
}

// closedPortDSN returns a DSN for a loopback port nothing listens on, with a password
// that must never show up in an error.
func closedPortDSN(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return fmt.Sprintf("postgres://postgres:s3cret@127.0.0.1:%d/db?sslmode=disable", port)
}

func TestOpenShardsNamesDeadShards(t *testing.T) {
	ctx := testCtx(t)
	good := pgtest.NewDatabase(t, "openshards_good")
	dsns := []string{good, closedPortDSN(t), closedPortDSN(t)}

	start := time.Now()
	stores, err := postgres.OpenShards(ctx, dsns, postgres.Options{})
	if err == nil {
		t.Fatalf("OpenShards with two dead shards succeeded (%d stores)", len(stores))
	}
	if time.Since(start) > hangLimit {
		t.Errorf("OpenShards took %v to notice refused connections", time.Since(start))
	}
	msg := err.Error()
	t.Logf("OpenShards: %v", err)
	for _, want := range []string{"open shard 1:", "open shard 2:", "postgres:xxxxx@127.0.0.1"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "open shard 0") || strings.Contains(msg, "s3cret") {
		t.Errorf("error blames the good shard or shows the password:\n%s", msg)
	}

	// The good shard's pool was closed again: no session is left on its database.
	cfg, err := pgx.ParseConfig(good)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	deadline := time.Now().Add(hangLimit)
	for {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, cfg.Database).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions still open on the good shard after OpenShards failed", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestOpenShardsSet(t *testing.T) {
	ctx := testCtx(t)
	const shards = 3
	dsns := make([]string, shards)
	for i := range dsns {
		dsns[i] = pgtest.NewDatabase(t, fmt.Sprintf("set_shard%d", i))
	}
	stores, err := postgres.OpenShards(ctx, dsns, postgres.Options{PoolSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	set := newSet(t, stores)

	want := make([]int64, shards)
	for i := range 300 {
		key := fmt.Sprintf("user-%d", i)
		shard, err := set.Put(ctx, key, []byte(key))
		if err != nil {
			t.Fatalf("Put(%s): %v", key, err)
		}
		want[shard]++
	}
	counts, err := set.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range shards {
		if counts[i] != want[i] || want[i] == 0 {
			t.Errorf("shard %d holds %d records, the router sent it %d", i, counts[i], want[i])
		}
	}
	// Each store is its own database: a key lives only on the shard that owns it.
	for i, st := range stores {
		key := keysFor(set, 1)[(i+1)%shards][0]
		if _, err := st.Get(ctx, key); !errors.Is(err, shardset.ErrNotFound) {
			t.Errorf("shard %d answers for %s, owned by shard %d: %v", i, key, (i+1)%shards, err)
		}
	}
}

func newSet(t *testing.T, stores []*postgres.Store) *shardset.Set {
	t.Helper()
	r, err := routing.NewCRC32(len(stores))
	if err != nil {
		t.Fatal(err)
	}
	backends := make([]shardset.Backend, len(stores))
	for i, s := range stores {
		backends[i] = s
	}
	set, err := shardset.New(r, backends)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	return set
}

// keysFor returns, for every shard of set, n keys that the set routes to it.
func keysFor(set *shardset.Set, n int) [][]string {
	out := make([][]string, set.Shards())
	missing := set.Shards()
	for i := 0; missing > 0; i++ {
		key := fmt.Sprintf("user-%d", i)
		s := set.ShardFor(key)
		if len(out[s]) < n {
			out[s] = append(out[s], key)
			if len(out[s]) == n {
				missing--
			}
		}
	}
	return out
}
