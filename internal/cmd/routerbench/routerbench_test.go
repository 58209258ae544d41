package routerbench_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/csv"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/shardlab/shardlab/internal/cmd/routerbench"
	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/internal/postgresdb"
	"github.com/shardlab/shardlab/lab/report"
)

func readCSV(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// benchDatabases lists the benchmark's databases on the server at dsn.
func benchDatabases(t *testing.T, dsn string) []string {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var names []string
	rows, err := db.Query("SELECT datname FROM pg_database WHERE datname LIKE 'routerbench\\_%' ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	return names
}

// TestOverheadRun runs a tiny overhead experiment on PostgreSQL and checks its outputs:
// overhead.csv with the columns and one row per operation, raw trials, chart
// and report.
func TestOverheadRun(t *testing.T) {
	dsn := pgtest.DSN(t)
	before := benchDatabases(t, dsn) // another run's, kept with --keep-databases
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	err := routerbench.Main(context.Background(), []string{"--experiment", "overhead", "--dsn", dsn, "--duration", "200ms",
		"--warmup", "0s", "--trials", "2", "--orders", "200", "--concurrency", "4", "--out", out}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s%s", err, stdout.String(), stderr.String())
	}
	recs := readCSV(t, filepath.Join(out, "overhead.csv"))
	if !slices.Equal(recs[0][:4], []string{"operation", "direct_ops_s", "router_ops_s", "overhead_pct"}) || len(recs) != 4 {
		t.Errorf("overhead.csv: %v", recs)
	}
	for _, r := range recs[1:] {
		if r[1] == "0.0" || r[2] == "0.0" {
			t.Errorf("a configuration did nothing: %v", r)
		}
	}
	if n := len(readCSV(t, filepath.Join(out, "trials.csv"))); n != 1+2*3*2 {
		t.Errorf("trials.csv has %d lines, want 13", n)
	}
	for _, f := range []string{"overhead.png", "overhead.svg", "report.md"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	rep, _ := os.ReadFile(filepath.Join(out, "report.md"))
	if !strings.Contains(string(rep), "too few trials") {
		t.Errorf("2 trials must say they are too few:\n%s", rep)
	}
	for _, n := range benchDatabases(t, dsn) {
		if !slices.Contains(before, n) {
			t.Errorf("database %s left on the server after the run", n)
		}
	}
}

// TestLimitRunSQLite runs the limit experiment on SQLite files: every configuration
// answers.
func TestLimitRunSQLite(t *testing.T) {
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	err := routerbench.Main(context.Background(), []string{"--experiment", "limit", "--backend", "sqlite", "--duration", "150ms",
		"--warmup", "0s", "--trials", "1", "--orders", "200", "--concurrency", "4", "--out", out}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s%s", err, stdout.String(), stderr.String())
	}
	recs := readCSV(t, filepath.Join(out, "limit.csv"))
	if len(recs) != 1+5*3 {
		t.Errorf("limit.csv has %d lines, want 16: %v", len(recs), recs)
	}
	if _, err := os.Stat(filepath.Join(out, "data")); !os.IsNotExist(err) {
		t.Errorf("the SQLite files are left in the run directory (%v)", err)
	}
	// run.txt records the command (which scripts/promote.sh requires), the machine and
	// its load, and that the run finished.
	info, err := report.ReadRunInfo(filepath.Join(out, report.RunInfoName))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(info.Command, "go run ./cmd/routerbench --experiment limit --backend sqlite") ||
		info.Finished == "" || info.GitCommit == "" || info.GitCommit == "unknown" || info.CPUs < 1 || len(info.LoadStart) != 3 || len(info.LoadEnd) != 3 {
		t.Errorf("run.txt: %+v", info)
	}
}

// TestOpenLoopSQLite runs the overhead experiment open loop: the report says so and
// gives the latencies, and a rate within reach is not called missed.
func TestOpenLoopSQLite(t *testing.T) {
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	err := routerbench.Main(context.Background(), []string{"--experiment", "overhead", "--backend", "sqlite", "--duration", "500ms",
		"--warmup", "0s", "--trials", "1", "--orders", "100", "--concurrency", "4", "--rate", "100", "--out", out}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s%s", err, stdout.String(), stderr.String())
	}
	rep, _ := os.ReadFile(filepath.Join(out, "report.md"))
	if !strings.Contains(string(rep), "open loop at 100 requests/s") || !strings.Contains(string(rep), "| p50 ms | p95 ms | p99 ms |") {
		t.Errorf("the report does not describe the open loop or its latencies:\n%s", rep)
	}
	if strings.Contains(string(rep), "did not reach the target rate") {
		t.Errorf("100 requests/s called missed:\n%s", rep)
	}
}

// TestLimitRunTwoServers runs the limit experiment with --dsn naming two servers: each
// 2-database layout puts its second database on the second server, and every
// configuration answers.
func TestLimitRunTwoServers(t *testing.T) {
	first := pgtest.DSN(t)
	second := pgtest.StartCluster(t)
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	err := routerbench.Main(context.Background(), []string{"--experiment", "limit", "--dsn", first, "--dsn", second.DSN(),
		"--duration", "150ms", "--warmup", "0s", "--trials", "1", "--orders", "100", "--concurrency", "2", "--out", out,
		"--keep-databases"}, &stdout, &stderr)
	// Kept to check where they went; the second server goes with the test.
	t.Cleanup(func() {
		for _, n := range benchDatabases(t, first) {
			if err := postgresdb.DropDatabase(context.Background(), first, n); err != nil {
				t.Errorf("drop %s: %v", n, err)
			}
		}
	})
	if err != nil {
		t.Fatalf("%v\n%s%s", err, stdout.String(), stderr.String())
	}
	recs := readCSV(t, filepath.Join(out, "limit.csv"))
	if len(recs) != 1+5*3 {
		t.Fatalf("limit.csv has %d lines, want 16: %v", len(recs), recs)
	}
	for _, r := range recs[1:] {
		if r[2] == "0.0" {
			t.Errorf("a configuration did nothing: %v", r)
		}
	}
	names := benchDatabases(t, second.DSN())
	if len(names) == 0 {
		t.Fatal("no benchmark database on the second server")
	}
	for _, n := range names {
		if !strings.HasSuffix(n, "_1") {
			t.Errorf("database %s on the second server: only the second database of a layout belongs there", n)
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--experiment", "speed"}, {"--backend", "mysql"}, {"--concurrency", "0"}, {"--duration", "1ms"},
		{"--trials", "0"}, {"extra"}, {"--dsn", "a", "--dsn", "b", "--dsn", "c"}, {"--rate", "-1"}, {"--arrival", "burst"},
	} {
		var stdout, stderr bytes.Buffer
		err := routerbench.Main(context.Background(), append(args, "--out", t.TempDir()), &stdout, &stderr)
		if !errors.Is(err, routerbench.ErrUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	var stdout, stderr bytes.Buffer
	if err := routerbench.Main(context.Background(), []string{"--help"}, &stdout, &stderr); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr.String(), "-experiment") {
		t.Errorf("--help: %v\n%s", err, stderr.String())
	}
}
