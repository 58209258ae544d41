package loadgen_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/lab/loadgen"
)

// TestHTTPRequestsAreTheDemoServersAPI pins what the HTTP target sends, byte for byte:
// the requests the demo-server has always received from loadgen.
func TestHTTPRequestsAreTheDemoServersAPI(t *testing.T) {
	type seen struct{ method, uri, contentType, body string }
	var mu sync.Mutex
	var got []seen
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, seen{r.Method, r.URL.RequestURI(), r.Header.Get("Content-Type"), string(body)})
		mu.Unlock()
		w.Write([]byte(`{}`))
	}))
	defer ts.Close()
	target, err := loadgen.NewHTTPTarget(ts.URL+"/", loadgen.NewHTTPClient(1, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := target.Write(ctx, `user7 "é"`, "v\n1"); err != nil {
		t.Fatal(err)
	}
	if found, err := target.Read(ctx, "user 7&x=1"); !found || err != nil {
		t.Fatalf("Read = %v, %v", found, err)
	}
	want := []seen{
		{"POST", "/insert", "application/json", `{"user_id":"user7 \"é\"","data":"v\n1"}`},
		{"GET", "/get?user_id=user+7%26x%3D1", "", ""},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("requests:\n%q\nwant:\n%q", got, want)
	}
	for _, bad := range []string{"", "ftp://h", "http://", "localhost:8080"} {
		if _, err := loadgen.NewHTTPTarget(bad, http.DefaultClient); !errors.Is(err, loadgen.ErrBadConfig) {
			t.Errorf("NewHTTPTarget(%q) = %v, want ErrBadConfig", bad, err)
		}
	}
}

// TestHTTPTimeoutIsClassified: a server slower than the per-request timeout is a
// "timeout", not a connection error.
func TestHTTPTimeoutIsClassified(t *testing.T) {
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer ts.Close()
	defer close(release)
	res, err := loadgen.Run(context.Background(), loadgen.Config{Target: ts.URL, Ops: 4, Concurrency: 2, Keys: 3, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 4 || res.ErrorsByKind["timeout"] != 4 {
		t.Errorf("errors %d %v, want 4 timeouts", res.Errors, res.ErrorsByKind)
	}
}

// mapTarget is a Target that is neither a Replier nor an ErrorClassifier: the engine
// must work with the bare interface.
type mapTarget struct {
	mu   sync.Mutex
	data map[string]string
	fail error
}

func (m *mapTarget) Read(ctx context.Context, key string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.data[key]
	return ok, nil
}

func (m *mapTarget) Write(ctx context.Context, key, value string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	m.data[key] = value
	return nil
}

func TestRunTargetWithTheBareInterface(t *testing.T) {
	m := &mapTarget{data: map[string]string{}}
	var outcomes []loadgen.Outcome
	var mu sync.Mutex
	cfg := loadgen.Config{Target: "not a URL: RunTarget ignores it", Ops: 300, Concurrency: 3, WriteRatio: 0.5, Keys: 40, Preload: true,
		OnResult: func(o loadgen.Outcome) { mu.Lock(); outcomes = append(outcomes, o); mu.Unlock() }}
	res, err := loadgen.RunTarget(context.Background(), m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops != 300 || res.Errors != 0 || res.ReadHits != res.Reads || len(m.data) != 40 || len(outcomes) != 300 {
		t.Errorf("ops %d errors %d hits %d/%d, %d keys stored, %d outcomes", res.Ops, res.Errors, res.ReadHits, res.Reads, len(m.data), len(outcomes))
	}
	for _, o := range outcomes {
		if o.Status != 0 || o.Body != nil || o.Err != nil || (!o.Write && !o.Found) {
			t.Errorf("outcome %+v: a bare target has no status or body, and every read found its key", o)
			break
		}
	}
	m.fail = errors.New("disk full")
	res, err = loadgen.RunTarget(context.Background(), m, loadgen.Config{Ops: 100, Concurrency: 2, WriteRatio: 1, Keys: 5})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 100 || res.ErrorsByKind["other"] != 100 {
		t.Errorf("errors %d %v, want 100 of kind other", res.Errors, res.ErrorsByKind)
	}
	if _, err := loadgen.RunTarget(context.Background(), nil, cfg); !errors.Is(err, loadgen.ErrBadConfig) {
		t.Errorf("nil target: %v", err)
	}
	if _, err := loadgen.RunTarget(context.Background(), m, loadgen.Config{Ops: 1, Concurrency: 0, Keys: 1}); !errors.Is(err, loadgen.ErrBadConfig) {
		t.Errorf("bad config: %v", err)
	}
}

func TestPostgresKVRefusesOddTableNames(t *testing.T) {
	for _, ok := range []string{"kv", "loadgen_kv", "My_Table2", "app.kv"} {
		if _, _, err := loadgen.PostgresKV(ok); err != nil {
			t.Errorf("PostgresKV(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1kv", "kv;drop table x", `"kv"`, "a.b.c", "kv kv", strings.Repeat("k", 64)} {
		if _, _, err := loadgen.PostgresKV(bad); !errors.Is(err, loadgen.ErrBadConfig) {
			t.Errorf("PostgresKV(%q) = %v, want ErrBadConfig", bad, err)
		}
	}
}

// openKV opens a fresh PostgreSQL database through database/sql (pgx's stdlib driver)
// with a key-value table, and the SQL target on it.
func openKV(t *testing.T, conns int) (*sql.DB, *loadgen.SQLTarget) {
	t.Helper()
	db, err := sql.Open("pgx", pgtest.NewDatabase(t, "loadgen_sql"))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(conns)
	t.Cleanup(func() { db.Close() }) // registered after the drop, so it runs before it
	create, st, err := loadgen.PostgresKV("kv")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), create); err != nil {
		t.Fatal(err)
	}
	target, err := loadgen.NewSQLTarget(t.Context(), db, st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := target.Close(); err != nil {
			t.Errorf("close target: %v", err)
		}
	})
	return db, target
}

// TestSQLTargetAcknowledgedWritesAreReadable drives real PostgreSQL through
// database/sql and checks every acknowledged write: the value stored under each key is
// one the target acknowledged, and the last one when a single worker wrote the key.
func TestSQLTargetAcknowledgedWritesAreReadable(t *testing.T) {
	db, target := openKV(t, 8)
	var mu sync.Mutex
	acked := map[string][]string{} // key -> acknowledged values, in each worker's order
	writers := map[string]map[string]bool{}
	var reads, found int
	res, err := loadgen.RunTarget(t.Context(), target, loadgen.Config{
		Ops: 3000, Concurrency: 8, WriteRatio: 0.6, Keys: 400, Preload: true, Seed: 11, DataSize: 48,
		OnResult: func(o loadgen.Outcome) {
			mu.Lock()
			defer mu.Unlock()
			if o.Err != nil {
				t.Errorf("%s failed: %v", o.Key, o.Err)
				return
			}
			if !o.Write {
				reads++
				if o.Found {
					found++
				}
				return
			}
			acked[o.Key] = append(acked[o.Key], o.Data)
			if writers[o.Key] == nil {
				writers[o.Key] = map[string]bool{}
			}
			writers[o.Key][strings.SplitN(o.Data, ":", 3)[1]] = true
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops != 3000 || res.Errors != 0 || res.Reads != int64(reads) || res.ReadHits != int64(found) || found != reads {
		t.Fatalf("ops %d errors %d %v; reads %d (outcomes %d), hits %d (outcomes %d); after preload every read hits",
			res.Ops, res.Errors, res.ErrorsByKind, res.Reads, reads, res.ReadHits, found)
	}
	if res.Writes < 1500 || len(acked) < 300 {
		t.Fatalf("only %d writes over %d keys", res.Writes, len(acked))
	}
	for key, values := range acked {
		var stored string
		if err := db.QueryRowContext(t.Context(), `SELECT value FROM kv WHERE key = $1`, key).Scan(&stored); err != nil {
			t.Fatalf("%s: acknowledged but not readable: %v", key, err)
		}
		ok := false
		for _, v := range values {
			ok = ok || v == stored
		}
		if !ok {
			t.Errorf("%s holds %q, which was never acknowledged", key, stored)
		}
		if len(writers[key]) == 1 && stored != values[len(values)-1] {
			t.Errorf("%s holds %q; its only writer's last acknowledged value was %q", key, stored, values[len(values)-1])
		}
		if found, err := target.Read(t.Context(), key); !found || err != nil {
			t.Errorf("Read(%s) through the target = %v, %v", key, found, err)
		}
	}
	var rows int
	if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM kv`).Scan(&rows); err != nil || rows != 400 {
		t.Errorf("table holds %d rows, %v; want the 400 preloaded keys", rows, err)
	}
	if found, err := target.Read(t.Context(), "nobody"); found || err != nil {
		t.Errorf("Read of a missing key = %v, %v; want a miss", found, err)
	}
}

// TestSQLTargetClassifiesBySQLState: a statement PostgreSQL refuses is counted under its
// SQLSTATE, and a missing table fails before the run.
func TestSQLTargetClassifiesBySQLState(t *testing.T) {
	db, _ := openKV(t, 2)
	plainInsert, err := loadgen.NewSQLTarget(t.Context(), db, loadgen.SQLStatements{
		Read:  `SELECT value FROM kv WHERE key = $1`,
		Write: `INSERT INTO kv (key, value) VALUES ($1, $2)`, // no upsert: a second write of a key fails
	})
	if err != nil {
		t.Fatal(err)
	}
	defer plainInsert.Close()
	res, err := loadgen.RunTarget(t.Context(), plainInsert, loadgen.Config{Ops: 50, Concurrency: 2, WriteRatio: 1, Keys: 5})
	if err != nil {
		t.Fatal(err)
	}
	if res.Writes > 5 || res.ErrorsByKind["sqlstate_23505"] != res.Errors || res.Errors < 45 {
		t.Errorf("writes %d, errors %d %v; want at most 5 inserts and unique violations (23505) for the rest", res.Writes, res.Errors, res.ErrorsByKind)
	}
	if _, err := loadgen.NewSQLTarget(t.Context(), db, loadgen.SQLStatements{Read: `SELECT value FROM nowhere WHERE key = $1`, Write: `SELECT $1, $2`}); err == nil {
		t.Error("a target on a missing table was made")
	}
	if _, err := loadgen.NewSQLTarget(t.Context(), db, loadgen.SQLStatements{Read: "SELECT 1"}); !errors.Is(err, loadgen.ErrBadConfig) {
		t.Errorf("no write statement: %v", err)
	}
}
