package loadgen_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	loadgencmd "github.com/shardlab/shardlab/internal/cmd/loadgen"
	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/lab/resultscsv"
	"github.com/shardlab/shardlab/lab/server"
	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/lab/shardset/sqlite"
	"github.com/shardlab/shardlab/routing"
)

// demoServer serves the real API over n real SQLite shards on loopback.
func demoServer(t *testing.T, n int) string {
	t.Helper()
	stores, err := sqlite.OpenShards(context.Background(), t.TempDir(), n, sqlite.Options{ReadConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	backends := make([]shardset.Backend, n)
	for i, s := range stores {
		backends[i] = s
	}
	router, _ := routing.NewCRC32(n)
	set, err := shardset.New(router, backends)
	if err != nil {
		t.Fatal(err)
	}
	mode := "sharded"
	if n == 1 {
		mode = "single"
	}
	srv, err := server.New(server.Config{Set: set, Mode: mode, Backend: "sqlite", Sync: "normal", PoolSize: 2, SQLiteVersion: "3.test"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		set.Close()
	})
	return ts.URL
}

func run(args ...string) (stdout, stderr string, err error) {
	var o, e bytes.Buffer
	err = loadgencmd.Run(context.Background(), args, &o, &e)
	return o.String(), e.String(), err
}

func TestRunWritesResultRowAndTimeseries(t *testing.T) {
	target := demoServer(t, 2)
	dir := t.TempDir()
	out := filepath.Join(dir, "results", "r.csv")
	tsPath := filepath.Join(dir, "ts", "t.csv")
	stdout, stderr, err := run("--target", target, "--ops", "400", "--concurrency", "4", "--writeRatio", "0.5",
		"--keys", "100", "--preload", "--scenario", "unit", "--run-id", "run1", "--trial", "2", "--seed", "5",
		"--git-commit", "abc123", "--out", out, "--timeseries", tsPath)
	if err != nil {
		t.Fatalf("Run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	for _, want := range []string{"ops          400", "throughput", "p99", "errors       0 (none)", "read hits    100.00%"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("summary lacks %q:\n%s", want, stdout)
		}
	}

	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	header, _, _ := strings.Cut(string(raw), "\n")
	if header != strings.Join(resultscsv.Columns(), ",") {
		t.Errorf("CSV header %q, want the documented columns", header)
	}
	rows, err := resultscsv.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("%d rows, want 1", len(rows))
	}
	r := rows[0]
	if r.Scenario != "unit" || r.Mode != "sharded" || r.Shards != 2 || r.Ops != 400 || r.Concurrency != 4 ||
		r.WriteRatio != 0.5 || r.Errors != 0 || r.RunID != "run1" || r.Trial != 2 || r.Seed != 5 ||
		r.GitCommit != "abc123" || r.Backend != "sqlite" || r.Router != "crc32" || r.Sync != "normal" ||
		r.PoolSize != 2 || r.SQLiteVer != "3.test" || r.Keys != 100 || r.Dist != "uniform" || r.Rate != 0 ||
		r.ReadHitRate != 1 || r.CPUs < 1 || r.GoVersion == "" || r.Timestamp.IsZero() {
		t.Errorf("row %+v", r)
	}
	if r.ThroughputOpsS <= 0 || r.DurationS <= 0 || r.P50Ms <= 0 || r.P50Ms > r.P95Ms || r.P95Ms > r.P99Ms || r.P99Ms > r.P999Ms || r.P999Ms > r.MaxMs*1.001 {
		t.Errorf("inconsistent measurements in row %+v", r)
	}

	f, err := os.Open(tsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"t_s", "ops", "errors", "throughput_ops_s", "p50_ms", "p99_ms", "max_ms"}
	if len(recs) < 2 || !slices.Equal(recs[0], want) || !slices.Equal(loadgencmd.TimeseriesColumns(), want) {
		t.Fatalf("timeseries file:\n%v", recs)
	}
	var total int64
	for i, rec := range recs[1:] {
		if rec[0] != strconv.Itoa(i) {
			t.Errorf("row %d is for second %s", i, rec[0])
		}
		n, err := strconv.ParseInt(rec[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if total != 400 {
		t.Errorf("timeseries holds %d ops, want 400", total)
	}

	// A second run appends one row under the same header.
	if _, _, err := run("--target", target, "--ops", "50", "--concurrency", "2", "--quiet", "--out", out, "--mode", "single", "--shards", "1"); err != nil {
		t.Fatal(err)
	}
	rows, err = resultscsv.ReadFile(out)
	if err != nil || len(rows) != 2 || rows[1].Mode != "single" || rows[1].Shards != 1 || rows[1].Ops != 50 {
		t.Fatalf("after a second run: %d rows, %v", len(rows), err)
	}
}

func TestHelpAndUsageErrors(t *testing.T) {
	_, stderr, err := run("--help")
	if !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr, "Usage: loadgen") || !strings.Contains(stderr, "-rate") {
		t.Errorf("--help: %v\n%s", err, stderr)
	}
	for _, args := range [][]string{
		{"--no-such-flag"},
		{"--ops", "many"},
		{"--ops", "0"},
		{"--concurrency", "0"},
		{"--writeRatio", "2"},
		{"--dist", "pareto"},
		{"--target", "ftp://127.0.0.1"},
		{"--rate", "-5"},
		{"--arrival", "burst"},
		{"--mode", "both"},
		{"--shards", "-1"},
		{"--trial", "0"},
		{"--data-size", "70000"},
		{"stray-argument"},
	} {
		_, _, err := run(args...)
		if !errors.Is(err, loadgencmd.ErrUsage) {
			t.Errorf("%v: %v, want ErrUsage", args, err)
		}
		if errors.Is(err, flag.ErrHelp) {
			t.Errorf("%v: a mistake is not a help request", args)
		}
	}
}

func TestUnreachableTarget(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	url := dead.URL
	dead.Close()
	_, _, err := run("--target", url, "--ops", "10")
	if err == nil || !strings.Contains(err.Error(), "cannot reach the demo-server at "+url) {
		t.Errorf("unreachable target: %v", err)
	}
	_, _, err = run("--target", url, "--ops", "10", "--wait-ready", "200ms")
	if err == nil || !strings.Contains(err.Error(), "not ready after 200ms") {
		t.Errorf("--wait-ready on an unreachable target: %v", err)
	}
}

// failingServer answers /stats like the demo-server and refuses every write with a 503.
func failingServer(t *testing.T) string {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"mode":"single","backend":"sqlite","router":"crc32","shards":1}`))
	})
	mux.HandleFunc("POST /insert", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":"shard 0 unavailable"}`))
	})
	mux.HandleFunc("GET /get", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":"user_id not found"}`))
	})
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts.URL
}

func TestFailedRequests(t *testing.T) {
	target := failingServer(t)
	out := filepath.Join(t.TempDir(), "r.csv")
	stdout, _, err := run("--target", target, "--ops", "100", "--concurrency", "2", "--writeRatio", "0.5", "--out", out)
	if !errors.Is(err, loadgencmd.ErrRequestsFailed) {
		t.Fatalf("Run = %v, want ErrRequestsFailed", err)
	}
	if !strings.Contains(stdout, "http_503=") {
		t.Errorf("summary does not break errors down by kind:\n%s", stdout)
	}
	rows, err := resultscsv.ReadFile(out)
	if err != nil || len(rows) != 1 || rows[0].Errors == 0 {
		t.Fatalf("the failed run must still be recorded: %v %+v", err, rows)
	}
	if _, _, err := run("--target", target, "--ops", "100", "--concurrency", "2", "--writeRatio", "0.5", "--allow-errors"); err != nil {
		t.Errorf("--allow-errors: %v", err)
	}
	// Reads that miss are answers, not failures.
	if _, _, err := run("--target", target, "--ops", "50", "--writeRatio", "0"); err != nil {
		t.Errorf("read-only run against misses: %v", err)
	}
}

func TestOpenLoopSummary(t *testing.T) {
	target := demoServer(t, 1)
	stdout, _, err := run("--target", target, "--rate", "200", "--duration", "500ms", "--concurrency", "2", "--keys", "50")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"open loop at 200 req/s", "service ms", "late starts"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("open-loop summary lacks %q:\n%s", want, stdout)
		}
	}
	stdout, _, err = run("--target", target, "--ops", "20", "--quiet", "--scenario", "q")
	if err != nil || strings.Count(stdout, "\n") != 1 || !strings.HasPrefix(stdout, "q: ") {
		t.Errorf("--quiet prints %q, %v; want one summary line", stdout, err)
	}
}

// TestInterruptedRunWritesNoRow: a run stopped early measured less than it was asked to,
// so it must not be appended as if it were complete.
func TestInterruptedRunWritesNoRow(t *testing.T) {
	url := demoServer(t, 1)
	out := filepath.Join(t.TempDir(), "results.csv")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var stdout, stderr strings.Builder
	err := loadgencmd.Run(ctx, []string{"--target", url, "--duration", "30s", "--concurrency", "2", "--out", out}, &stdout, &stderr)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's error", err)
	}
	if _, statErr := os.Stat(out); !errors.Is(statErr, os.ErrNotExist) {
		t.Errorf("an interrupted run wrote %s (stat: %v)", out, statErr)
	}
	if !strings.Contains(stderr.String(), "no row appended") {
		t.Errorf("stderr does not say the row was skipped: %q", stderr.String())
	}
}

// slowServer answers /stats like the demo-server and every read after delay.
func slowServer(t *testing.T, delay time.Duration) string {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"mode":"single","backend":"sqlite","router":"crc32","shards":1}`))
	})
	mux.HandleFunc("GET /get", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(delay)
		w.Write([]byte(`{"data":"x"}`))
	})
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts.URL
}

// TestRateNotReachedIsSaid: an open-loop run whose workers cannot keep the asked-for
// rate says so on a line of its own; one that keeps it says nothing.
func TestRateNotReachedIsSaid(t *testing.T) {
	// Two workers against 20 ms answers manage about 100 requests/s, not 400.
	slow := slowServer(t, 20*time.Millisecond)
	args := []string{"--target", slow, "--rate", "400", "--duration", "300ms", "--concurrency", "2", "--writeRatio", "0", "--keys", "10"}
	stdout, _, err := run(args...)
	if err != nil {
		t.Fatal(err)
	}
	var line string
	for l := range strings.SplitSeq(stdout, "\n") {
		if strings.HasPrefix(l, "target rate 400/s not reached: achieved ") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no line saying the rate was missed:\n%s", stdout)
	}
	var achieved float64
	if _, err := fmt.Sscanf(strings.TrimPrefix(line, "target rate 400/s not reached: achieved "), "%f/s", &achieved); err != nil || achieved <= 0 || achieved > 150 {
		t.Errorf("%q: achieved %v (%v), want about 100", line, achieved, err)
	}
	// Under --quiet stdout stays the one summary line scripts parse; the notice goes to stderr.
	stdout, stderr, err := run(append(args, "--quiet")...)
	if err != nil || strings.Count(stdout, "\n") != 1 || !strings.Contains(stderr, "target rate 400/s not reached") {
		t.Errorf("--quiet: %v\nstdout %q\nstderr %q", err, stdout, stderr)
	}

	fast := slowServer(t, 0)
	stdout, _, err = run("--target", fast, "--rate", "100", "--duration", "1s", "--concurrency", "4", "--writeRatio", "0", "--keys", "10")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stdout, "not reached") {
		t.Errorf("a run that kept its rate says it did not:\n%s", stdout)
	}
}

// TestPostgresTarget drives a PostgreSQL table directly: same summary, same CSV row,
// and the table holds what was written.
func TestPostgresTarget(t *testing.T) {
	dsn := pgtest.NewDatabase(t, "loadgencli_sql")
	out := filepath.Join(t.TempDir(), "r.csv")
	stdout, stderr, err := run("--target", dsn, "--table", "kv", "--ops", "400", "--concurrency", "4", "--writeRatio", "0.5",
		"--keys", "60", "--preload", "--scenario", "sql", "--out", out)
	if err != nil {
		t.Fatalf("Run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	for _, want := range []string{"table kv (database/sql, pgx)", "ops          400", "errors       0 (none)", "read hits    100.00%"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("summary lacks %q:\n%s", want, stdout)
		}
	}
	rows, err := resultscsv.ReadFile(out)
	if err != nil || len(rows) != 1 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	if r := rows[0]; r.Backend != "postgres" || r.Mode != "single" || r.Shards != 1 || r.PoolSize != 4 || r.Ops != 400 || r.ReadHitRate != 1 || r.Scenario != "sql" {
		t.Errorf("row %+v", r)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM kv WHERE value <> ''`).Scan(&n); err != nil || n != 60 {
		t.Errorf("kv holds %d rows, %v; want the 60 preloaded keys", n, err)
	}
}

func TestPostgresTargetUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--table", "kv"}, // the default target is a demo-server
		{"--target", "postgres://u@127.0.0.1:1/db", "--table", "kv; DROP TABLE x"},
		{"--target", "postgres://u@127.0.0.1:1/db", "--concurrency", "0"},
	} {
		if _, _, err := run(args...); !errors.Is(err, loadgencmd.ErrUsage) {
			t.Errorf("%v: %v, want ErrUsage", args, err)
		}
	}
	_, _, err := run("--target", "postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=2", "--ops", "10")
	if err == nil || !strings.Contains(err.Error(), "cannot reach the database at postgres://u:xxxxx@127.0.0.1:1/db") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("unreachable database: %v", err)
	}
}
