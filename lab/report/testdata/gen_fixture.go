//go:build ignore

// gen_fixture writes results.csv and the per-second sample files used by the report's
// golden test. The numbers are invented but shaped like real runs (a USL curve with
// noise for the sweep). Regenerate with:
//
//	cd report/testdata && rm -rf results.csv timeseries && go run gen_fixture.go
package main

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/shardlab/shardlab/lab/resultscsv"
)

func main() {
	base := resultscsv.Row{
		Backend: "sqlite", Router: "crc32", Sync: "normal", PoolSize: 4, Keys: 100000,
		Dist: "uniform", DurationS: 20, Seed: 42, GitCommit: "0123abcd", GoVersion: "go1.26.0",
		CPUs: 2, CPUModel: "Example CPU @ 2.20GHz", SQLiteVer: "3.50.4", ReadHitRate: 0.98,
	}
	t0 := time.Date(2026, 11, 20, 21, 0, 0, 0, time.UTC)
	var rows []resultscsv.Row
	add := func(run, scenario, mode string, shards, trial int, conc int, wr, tput, avg, p99 float64, errs int64) {
		r := base
		t0 = t0.Add(25 * time.Second)
		r.Timestamp, r.RunID, r.Scenario, r.Mode, r.Shards, r.Trial = t0, run, scenario, mode, shards, trial
		r.Concurrency, r.WriteRatio, r.ThroughputOpsS, r.AvgMs, r.P99Ms, r.Errors = conc, wr, tput, avg, p99, errs
		r.Ops = int64(tput * r.DurationS)
		r.P50Ms, r.P95Ms, r.P999Ms, r.MaxMs = avg*0.8, p99*0.7, p99*1.6, p99*2.5
		r.SvcP50Ms, r.SvcP99Ms = r.P50Ms, r.P99Ms
		rows = append(rows, r)
	}

	// Run A (older): one trial each, and a scenario without a single baseline.
	add("run-a", "read_heavy_cachelike", "single", 1, 1, 64, 0.1, 7983, 7.0, 21.5, 0)
	add("run-a", "read_heavy_cachelike", "sharded", 3, 1, 64, 0.1, 15538, 4.34, 12.1, 0)
	add("run-a", "sustained_stress", "sharded", 3, 1, 200, 0.3, 9608, 19.68, 61.0, 3)

	// Run B (newest): six interleaved trials of three scenarios: a clear gain, a small
	// one that the test cannot tell from noise, and one measured too briefly to say
	// anything; then a sweep of three trials.
	t0 = time.Date(2026, 11, 21, 22, 0, 0, 0, time.UTC)
	spread := []float64{-0.02, 0, 0.02, -0.01, 0.01, 0.015}
	for trial := 1; trial <= 6; trial++ {
		d := spread[trial-1]
		add("run-b", "read_heavy_cachelike", "single", 1, trial, 64, 0.1, 7900*(1+d), 7.9*(1-d), 22+float64(trial), 0)
		add("run-b", "read_heavy_cachelike", "sharded", 3, trial, 64, 0.1, 15300*(1-d), 4.2*(1+d), 12+float64(trial), 0)
		add("run-b", "write_heavy_ingest", "single", 1, trial, 64, 0.9, 4519*(1+3*d), 8.27, 30, 0)
		errs := int64(0)
		if trial == 2 {
			errs = 12
		}
		add("run-b", "write_heavy_ingest", "sharded", 3, trial, 64, 0.9, 4901*(1-3*d), 9.31, 33, errs)
		base.DurationS = 0.5
		add("run-b", "brief", "single", 1, trial, 8, 0.5, 3000*(1+d), 2.1, 9, 0)
		add("run-b", "brief", "sharded", 3, trial, 8, 0.5, 6000*(1-d), 1.2, 5, 0)
		base.DurationS = 20
	}
	usl := func(n float64) float64 { return 5000 * n / (1 + 0.1*(n-1) + 0.03*n*(n-1)) }
	noise := []float64{-0.015, 0.01, 0.02}
	for trial := 1; trial <= 3; trial++ {
		for _, n := range []int{1, 2, 3, 4, 5, 6, 8} {
			mode := "sharded"
			if n == 1 {
				mode = "single"
			}
			x := usl(float64(n)) * (1 + noise[(trial+n)%3])
			add("run-b", "shard_scaling_base", mode, n, trial, 128, 0.5, x, 128/x*1000, 3*128/x*1000, 0)
		}
	}
	if err := resultscsv.Append("results.csv", rows...); err != nil {
		log.Fatal(err)
	}

	// Per-second samples for run B's read_heavy_cachelike (trials 1 and 2 of single,
	// trial 1 of sharded), as loadgen writes them.
	dir := filepath.Join("timeseries", "run-b")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Fatal(err)
	}
	for _, f := range []struct {
		name string
		tput float64
		p99  float64
	}{
		{"read_heavy_cachelike_single_1_t1.csv", 7900, 23},
		{"read_heavy_cachelike_single_1_t2.csv", 7700, 24},
		{"read_heavy_cachelike_sharded_3_t1.csv", 15300, 13},
	} {
		s := "t_s,ops,errors,throughput_ops_s,p50_ms,p99_ms,max_ms\n"
		for t := 1; t <= 20; t++ {
			x := f.tput * (1 + 0.03*float64(t%4-2))
			p := f.p99 * (1 + 0.1*float64(t%3-1))
			s += fmt.Sprintf("%d,%.0f,0,%.1f,%.3f,%.3f,%.3f\n", t, x, x, p/3, p, p*2)
		}
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(s), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}
