package counterbench_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/cmd/counterbench"
)

// readCSV returns the rows of a CSV file, header first.
func readCSV(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return rows
}

// checkOutputs checks the files of a full run: golden CSV headers, one row
// per case, every run exact, and both chart formats.
func checkOutputs(t *testing.T, out, backend string, cases, trials int) {
	t.Helper()
	for _, f := range []struct {
		name   string
		header []string
		rows   int
	}{
		{"contention_" + backend + ".csv", counterbench.ContentionColumns, cases},
		{"contention_" + backend + "_trials.csv", counterbench.TrialColumns, cases * trials},
		{"read_" + backend + ".csv", counterbench.ReadColumns, 2 * 2},
	} {
		rows := readCSV(t, filepath.Join(out, f.name))
		if !slices.Equal(rows[0], f.header) {
			t.Errorf("%s header = %q, want %q", f.name, rows[0], f.header)
		}
		if len(rows)-1 != f.rows {
			t.Errorf("%s has %d rows, want %d", f.name, len(rows)-1, f.rows)
		}
		if exact := slices.Index(rows[0], "exact"); exact >= 0 {
			for _, r := range rows[1:] {
				if r[exact] != "true" {
					t.Errorf("%s: run not exact: %q", f.name, r)
				}
			}
		}
	}
	for _, name := range []string{"contention_" + backend, "read_" + backend} {
		for _, ext := range []string{".png", ".svg"} {
			if st, err := os.Stat(filepath.Join(out, name+ext)); err != nil || st.Size() == 0 {
				t.Errorf("chart %s%s: %v", name, ext, err)
			}
		}
	}
}

// The header is a golden vector: docs and other tools read these columns.
func TestContentionColumns(t *testing.T) {
	want := "backend,strategy,buckets,bucket_by,workers,pool,trials,ops,ops_s,ops_s_min,ops_s_max,p50_ms,p99_ms,ratio_vs_append,ratio_min,ratio_max,errors,exact"
	if got := strings.Join(counterbench.ContentionColumns, ","); got != want {
		t.Errorf("ContentionColumns = %s, want %s", got, want)
	}
}

func smokeArgs(out string) []string {
	return []string{
		"--ops", "300", "--warmup", "0", "--workers", "8", "--pool", "4", "--trials", "2",
		"--read-sizes", "100,1000", "--read-samples", "5",
		"--read-cases", "append,bucket:10:random", "--out", out,
	}
}

func TestSmokeSQLite(t *testing.T) {
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := append(smokeArgs(out), "--backend", "sqlite", "--sqlite-dir", t.TempDir())
	if err := counterbench.Run(t.Context(), args, &stdout, &stderr); err != nil {
		t.Fatalf("Run: %v\nstderr:\n%s", err, stderr.String())
	}
	checkOutputs(t, out, "sqlite", 7, 2)
	if !strings.Contains(stdout.String(), "| bucket | 100 | worker |") {
		t.Errorf("summary table misses the worker row:\n%s", stdout.String())
	}
}

func TestSmokePostgres(t *testing.T) {
	dsn := os.Getenv("SHARDLAB_PG_DSN")
	if dsn == "" {
		t.Skip("SHARDLAB_PG_DSN is unset")
	}
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := append(smokeArgs(out), "--backend", "postgres", "--dsn", dsn)
	if err := counterbench.Run(t.Context(), args, &stdout, &stderr); err != nil {
		t.Fatalf("Run: %v\nstderr:\n%s", err, stderr.String())
	}
	checkOutputs(t, out, "postgres", 7, 2)
	// The benchmark drops the database it made.
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	name := strings.TrimSpace(strings.TrimPrefix(strings.SplitN(stderr.String(), "\n", 2)[0], "counterbench: created database "))
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 || !strings.HasPrefix(name, "shardlab_counterbench_") {
		t.Errorf("database %q: %d left after the run", name, n)
	}
}

// TestDefaultOutIsARunDir: without --out a run writes into a new run directory under
// results/runs and points results/latest at it, never into the published results.
func TestDefaultOutIsARunDir(t *testing.T) {
	t.Chdir(t.TempDir())
	var stdout, stderr bytes.Buffer
	args := []string{"--backend", "sqlite", "--sqlite-dir", t.TempDir(), "--ops", "50", "--warmup", "0",
		"--workers", "2", "--pool", "2", "--cases", "row,append", "--experiment", "contention"}
	if err := counterbench.Run(t.Context(), args, &stdout, &stderr); err != nil {
		t.Fatalf("Run: %v\nstderr:\n%s", err, stderr.String())
	}
	dirs, err := filepath.Glob(filepath.Join("results", "runs", "counters-*"))
	if err != nil || len(dirs) != 1 {
		t.Fatalf("run directories %v (%v), want one", dirs, err)
	}
	if !strings.Contains(stderr.String(), "writing to "+dirs[0]) {
		t.Errorf("counterbench did not say where it writes:\n%s", stderr.String())
	}
	for _, name := range []string{"contention_sqlite.csv", "meta_sqlite.txt"} {
		if _, err := os.Stat(filepath.Join("results", "latest", name)); err != nil {
			t.Errorf("results/latest/%s: %v", name, err)
		}
	}
}

func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := counterbench.Run(t.Context(), []string{"--help"}, &stdout, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("Run(--help) = %v, want flag.ErrHelp", err)
	}
	for _, f := range []string{"--dsn", "--workers", "--pool", "--ops", "--duration", "--out", "--backend", "--trials"} {
		if !strings.Contains(stderr.String(), f[1:]) {
			t.Errorf("usage does not mention %s", f)
		}
	}
}

func TestBadFlags(t *testing.T) {
	cases := [][]string{
		{"--no-such-flag"},
		{"--backend", "mysql"},
		{"--workers", "0"},
		{"--pool", "-1"},
		{"--trials", "0"},
		{"--ops", "-5"},
		{"--duration", "0s"},
		{"--cases", "row,bucket:0:random"},
		{"--cases", "bucket:100"},
		{"--cases", "bucket:100:sometimes"},
		{"--cases", "append:3"},
		{"--read-sizes", "100,10"},
		{"--read-sizes", "ten"},
		{"--experiment", "speed"},
		{"stray"},
	}
	for _, args := range cases {
		var stdout, stderr bytes.Buffer
		// The case's flags come last, so they override the defaults.
		full := append([]string{"--out", t.TempDir()}, args...)
		err := counterbench.Run(t.Context(), full, &stdout, &stderr)
		if err == nil || errors.Is(err, flag.ErrHelp) {
			t.Errorf("Run(%q) = %v, want an error", args, err)
		}
	}
}

func TestParseCase(t *testing.T) {
	o, err := counterbench.ParseCase("bucket:1000:time")
	if err != nil || o.String() != "bucket/1000/time" {
		t.Errorf("ParseCase = %v, %v", o, err)
	}
	if o, err := counterbench.ParseCase("append"); err != nil || o.String() != "append" {
		t.Errorf("ParseCase(append) = %v, %v", o, err)
	}
}
