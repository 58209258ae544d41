package resultscsv_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardlab/shardlab/lab/resultscsv"
)

func TestAppendWritesHeaderOnceAndRoundTrips(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.csv")
	a := resultscsv.Row{
		Timestamp: time.Date(2026, 11, 22, 1, 2, 3, 0, time.UTC), Scenario: "read_heavy_cachelike",
		Mode: "sharded", Shards: 3, Ops: 20000, Concurrency: 64, WriteRatio: 0.05,
		ThroughputOpsS: 12345.6, AvgMs: 1.5, P50Ms: 1.2, P95Ms: 3.4, P99Ms: 5.6, MaxMs: 40.1,
		Errors: 2, P999Ms: 9.9, RunID: "r1", Trial: 2, Backend: "sqlite", Router: "crc32",
		Sync: "normal", PoolSize: 4, Keys: 10000, Dist: "zipfian", Rate: 0, ReadHitRate: 0.98,
		DurationS: 1.62, Seed: 7, GitCommit: "abc", GoVersion: "go1.26", CPUs: 2,
		CPUModel: "Some CPU, 2 GHz", SQLiteVer: "3.50.0", RequestedOps: 20000, WarmupS: 1.5,
		Preload: true, Arrival: "poisson", DataSize: 100, Command: `scripts/run_scenario.sh --scenario "x y"`,
	}
	b := a
	b.Mode, b.Shards, b.Trial = "single", 1, 1
	if err := resultscsv.Append(path, a); err != nil {
		t.Fatal(err)
	}
	if err := resultscsv.Append(path, b); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != 3 {
		t.Fatalf("want header + 2 rows, got %d lines:\n%s", len(lines), raw)
	}
	if want := strings.Join(resultscsv.Columns(), ","); lines[0] != want {
		t.Fatalf("header = %q, want %q", lines[0], want)
	}
	// The header is pinned letter for letter: renaming or reordering a column breaks every
	// results file written before. Add new columns at the end, and update docs/results-csv.md.
	const golden = "timestamp,scenario,mode,shards,ops,concurrency,write_ratio,throughput_ops_s,avg_ms,p50_ms,p95_ms,p99_ms,max_ms,errors," +
		"p999_ms,run_id,trial,backend,router,sync,pool_size,keys,dist,rate,late,svc_p50_ms,svc_p99_ms,read_hit_rate,duration_s,seed," +
		"git_commit,go_version,cpus,cpu_model,sqlite_version," +
		"requested_ops,requested_duration_s,warmup_s,preload,arrival,data_size,command"
	if lines[0] != golden {
		t.Fatalf("header changed:\n got %s\nwant %s", lines[0], golden)
	}
	rows, err := resultscsv.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0] != a || rows[1] != b {
		t.Fatalf("round trip mismatch:\n got %+v\nwant %+v %+v", rows, a, b)
	}
}

func TestAppendRefusesForeignHeader(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.csv")
	if err := os.WriteFile(path, []byte("a,b,c\n1,2,3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := resultscsv.Append(path, resultscsv.Row{Scenario: "x"})
	if !errors.Is(err, resultscsv.ErrHeaderMismatch) {
		t.Fatalf("err = %v, want ErrHeaderMismatch", err)
	}
	raw, _ := os.ReadFile(path)
	if string(raw) != "a,b,c\n1,2,3\n" {
		t.Fatalf("file was changed: %q", raw)
	}
}

func TestReadOlderFileWithSeedColumnsOnly(t *testing.T) {
	in := "timestamp,scenario,mode,shards,ops,concurrency,write_ratio,throughput_ops_s,avg_ms,p50_ms,p95_ms,p99_ms,max_ms,errors\n" +
		"2026-01-01T00:00:00Z,sustained_stress,single,1,1000,10,0.5,5348.0,35.57,30,60,80,120,0\n"
	rows, err := resultscsv.Read(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ThroughputOpsS != 5348 || rows[0].AvgMs != 35.57 || rows[0].Backend != "" {
		t.Fatalf("got %+v", rows)
	}
}

func TestReadErrors(t *testing.T) {
	for name, in := range map[string]string{
		"missing column": "scenario,mode,shards\nx,single,1\n",
		"bad number":     "scenario,mode,shards,throughput_ops_s\nx,single,one,5\n",
		"empty":          "",
	} {
		if _, err := resultscsv.Read(strings.NewReader(in)); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
	if !slices.Contains(resultscsv.Columns(), "run_id") {
		t.Fatal("run_id column missing")
	}
}

// TestConcurrentAppendsKeepEveryRow: writers appending to one file at once must neither
// overwrite each other's rows nor write the header twice.
func TestConcurrentAppendsKeepEveryRow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.csv")
	const writers, each = 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				errs <- resultscsv.Append(path, resultscsv.Row{Scenario: fmt.Sprintf("w%d-%d", w, i), Mode: "single", Shards: 1})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	rows, err := resultscsv.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range rows {
		seen[r.Scenario] = true
	}
	if len(rows) != writers*each || len(seen) != writers*each {
		t.Fatalf("%d rows (%d distinct), want %d", len(rows), len(seen), writers*each)
	}
}
