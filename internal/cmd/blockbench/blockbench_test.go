package blockbench_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/internal/cmd/blockbench"
)

func run(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var o, e bytes.Buffer
	err = blockbench.Run(context.Background(), args, &o, &e)
	return o.String(), e.String(), err
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"sweep", "-h"}, {"chart", "-help"}, {"help"}} {
		out, errOut, err := run(t, args...)
		if err != nil {
			t.Errorf("%v: %v", args, err)
		}
		if !strings.Contains(out+errOut, "Usage:") {
			t.Errorf("%v: no usage text", args)
		}
	}
}

func TestBadFlagsAreRefused(t *testing.T) {
	tests := []struct {
		args  []string
		usage bool
		want  string
	}{
		{[]string{"--bogus"}, true, "-bogus"},
		{[]string{"--threshold", "-5"}, true, "--threshold -5 is negative"},
		{[]string{"--threshold", "lots"}, true, "invalid value"},
		{[]string{"--sync", "maybe"}, true, `sync mode "maybe"`},
		{[]string{"ingest", "extra"}, true, `unexpected argument "extra"`},
		{[]string{"frobnicate"}, true, `unknown command "frobnicate"`},
		{[]string{"sweep", "--thresholds", "1,x"}, true, `threshold "x"`},
		{[]string{"sweep", "--rounds", "0"}, true, "--rounds 0"},
		{[]string{"--target-blocks", "0"}, true, "target blocks 0 must be positive"},
		{[]string{"--max-duration", "-1s"}, true, "max duration -1s must be positive"},
		{[]string{"--files-per-batch", "0"}, true, "files per batch (0)"},
		{[]string{"--lookups", "-1"}, true, "lookups -1 is negative"},
		{[]string{"--max-level", "99", "--threshold", "10"}, true, "max level 99"},
		{[]string{"--concurrency", "-1"}, true, "concurrency -1"},
		{[]string{"sweep", "--target-blocks", "0", "--results", "RESULTS"}, true, "target blocks 0 must be positive"},
		{[]string{"sweep", "--concurrency", "-1", "--results", "RESULTS"}, true, "concurrency -1"},
	}
	results := t.TempDir()
	for _, tt := range tests {
		args := slices.Clone(tt.args)
		for i := range args {
			args[i] = strings.ReplaceAll(args[i], "RESULTS", results)
		}
		_, _, err := run(t, args...)
		if err == nil {
			t.Errorf("%v: accepted", tt.args)
			continue
		}
		// cmd/blockbench prefixes the message with "blockbench: " itself.
		if strings.Contains(err.Error(), "blockbench:") {
			t.Errorf("%v: error %q repeats the command name", tt.args, err)
		}
		if errors.Is(err, blockbench.ErrUsage) != tt.usage || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %q (usage error: %v), want one mentioning %q (usage error: %v)",
				tt.args, err, errors.Is(err, blockbench.ErrUsage), tt.want, tt.usage)
		}
	}
}

func TestIngestWritesOneRowPerBatch(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "ingest.csv")
	// 500 blocks per batch, level capacities 500, 1000, 2000.
	_, errOut, err := run(t, "--threshold", "500", "--target-blocks", "3000", "--files-per-batch", "5",
		"--blocks-per-file", "100", "--data", filepath.Join(dir, "store"), "--out", out, "--lookups", "50", "--progress", "0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut, "done: threshold=500 reached_target=true") || !strings.Contains(errOut, "batch_rate=") {
		t.Errorf("stderr lacks progress or summary:\n%s", errOut)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	// The CSV columns are a published format.
	if got := strings.Join(recs[0], ","); got != "time_s,files,blocks,files_per_s,blocks_per_s,shards,level" {
		t.Fatalf("header %q", got)
	}
	rows, err := blockbench.ReadIngestCSV(out)
	if err != nil {
		t.Fatal(err)
	}
	var files, blocks []int64
	var shards, levels []int
	for _, r := range rows {
		files = append(files, r.Files)
		blocks = append(blocks, r.Blocks)
		shards = append(shards, r.Shards)
		levels = append(levels, r.Level)
		if r.BlocksPerS <= 0 || r.FilesPerS <= 0 || r.TimeS <= 0 {
			t.Errorf("row %+v has a non-positive rate or time", r)
		}
	}
	want := struct {
		files, blocks  []int64
		shards, levels []int
	}{
		[]int64{5, 10, 15, 20, 25, 30},
		[]int64{500, 1000, 1500, 2000, 2500, 3000},
		[]int{1, 3, 3, 7, 7, 7},
		[]int{0, 1, 1, 2, 2, 2},
	}
	if !slices.Equal(files, want.files) || !slices.Equal(blocks, want.blocks) ||
		!slices.Equal(shards, want.shards) || !slices.Equal(levels, want.levels) {
		t.Errorf("files %v blocks %v shards %v levels %v, want %+v", files, blocks, shards, levels, want)
	}
	// The store is kept when --data is given, and a second run refuses it
	// without touching the CSV of the first.
	before, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = run(t, "--threshold", "500", "--target-blocks", "500", "--files-per-batch", "5",
		"--blocks-per-file", "100", "--data", filepath.Join(dir, "store"), "--out", out)
	if !errors.Is(err, blockbench.ErrDataDirNotEmpty) {
		t.Errorf("second run on the same data dir: %v, want ErrDataDirNotEmpty", err)
	}
	if after, err := os.ReadFile(out); err != nil || !bytes.Equal(after, before) {
		t.Errorf("refused run changed --out: %d bytes before, %d after (%v)", len(before), len(after), err)
	}
}

// A refused sweep leaves the CSVs of an earlier sweep as they were.
func TestRefusedSweepKeepsEarlierResults(t *testing.T) {
	results := t.TempDir()
	files := map[string]string{"summary.csv": "earlier summary\n", blockbench.IngestCSVName(300, 1): "earlier run\n"}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(results, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range [][]string{{"--target-blocks", "0"}, {"--max-level", "99"}} {
		args := append([]string{"sweep", "--thresholds", "300", "--results", results, "--data-root", t.TempDir()}, bad...)
		if _, _, err := run(t, args...); !errors.Is(err, blockbench.ErrUsage) {
			t.Errorf("%v: %v, want a usage error", bad, err)
		}
	}
	entries, err := os.ReadDir(results)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(files) {
		t.Errorf("results dir has %d entries, want %d", len(entries), len(files))
	}
	for name, body := range files {
		if got, err := os.ReadFile(filepath.Join(results, name)); err != nil || string(got) != body {
			t.Errorf("%s: %q, %v; want %q", name, got, err, body)
		}
	}
}

// An interrupted run says so, rather than reporting whatever query the
// cancellation happened to abort.
func TestInterruptedRunSaysInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, args := range [][]string{
		{"--threshold", "100", "--data", filepath.Join(t.TempDir(), "store")},
		{"sweep", "--thresholds", "100", "--results", t.TempDir(), "--data-root", t.TempDir()},
	} {
		var o, e bytes.Buffer
		err := blockbench.Run(ctx, args, &o, &e)
		if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "interrupted") {
			t.Errorf("%v: %v, want an error starting with \"interrupted\" that wraps context.Canceled", args, err)
		}
		if !strings.Contains(e.String(), "interrupted") {
			t.Errorf("%v: stderr %q does not say interrupted", args, e.String())
		}
	}
}

func TestSweepWritesSummaryAndCharts(t *testing.T) {
	results := t.TempDir()
	_, _, err := run(t, "sweep", "--thresholds", "never,300", "--rounds", "2", "--target-blocks", "1200",
		"--files-per-batch", "4", "--blocks-per-file", "100", "--lookups", "20", "--results", results, "--data-root", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(results, "summary.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(recs[0], blockbench.SummaryHeader) || len(recs) != 1+4 {
		t.Fatalf("summary has %d rows, header %v", len(recs), recs[0])
	}
	// Round 2 runs the thresholds in rotated order.
	var order []string
	for _, r := range recs[1:] {
		order = append(order, r[0]+"/"+r[1])
		if r[2] != "true" || r[5] != "1200" {
			t.Errorf("row %v: target not reached", r)
		}
	}
	if want := []string{"0/1", "300/1", "300/2", "0/2"}; !slices.Equal(order, want) {
		t.Errorf("run order %v, want %v", order, want)
	}
	for _, name := range []string{"ingest-Tnever-r1.csv", "ingest-T300-r2.csv", "ingest_rate.png", "ingest_rate.svg",
		"ingest_progress.png", "time_to_target.png", "time_to_target.svg", "lookup_latency.png"} {
		b, err := os.ReadFile(filepath.Join(results, name))
		if err != nil {
			t.Error(err)
			continue
		}
		if strings.HasSuffix(name, ".png") && !bytes.HasPrefix(b, []byte("\x89PNG")) {
			t.Errorf("%s is not a PNG", name)
		}
	}
	// The charts can be redrawn from the CSVs alone.
	if _, _, err := run(t, "chart", "--results", results); err != nil {
		t.Errorf("chart: %v", err)
	}
	if _, _, err := run(t, "chart", "--results", t.TempDir()); err == nil {
		t.Error("chart of an empty directory succeeded")
	}
}

// TestSweepDefaultsToARunDirectory: without --results a sweep writes into a new run
// directory under results/runs and points results/latest at it, so that it never
// overwrites published results; refused flags create nothing.
func TestSweepDefaultsToARunDirectory(t *testing.T) {
	t.Chdir(t.TempDir())
	if _, _, err := run(t, "sweep", "--target-blocks", "0"); !errors.Is(err, blockbench.ErrUsage) {
		t.Fatalf("--target-blocks 0: %v, want a usage error", err)
	}
	if _, err := os.Stat("results"); !os.IsNotExist(err) {
		t.Errorf("a refused sweep created results/ (%v)", err)
	}
	_, errOut, err := run(t, "sweep", "--thresholds", "300", "--target-blocks", "400", "--files-per-batch", "2",
		"--blocks-per-file", "100", "--lookups", "5", "--data-root", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := filepath.Glob("results/runs/blockbench-*")
	if err != nil || len(dirs) != 1 {
		t.Fatalf("run directories %v (%v), want one", dirs, err)
	}
	if !strings.Contains(errOut, "writing to "+dirs[0]) {
		t.Errorf("the sweep did not say where it writes:\n%s", errOut)
	}
	if _, err := os.Stat(filepath.Join("results", "latest", "summary.csv")); err != nil {
		t.Errorf("results/latest does not lead to the summary: %v", err)
	}
	if _, _, err := run(t, "chart"); !errors.Is(err, blockbench.ErrUsage) {
		t.Errorf("chart without --results: %v, want a usage error", err)
	}
}

func TestEnv(t *testing.T) {
	out, _, err := run(t, "env")
	if err != nil || !strings.Contains(out, "sqlite: 3.") || !strings.Contains(out, "num_cpu: ") {
		t.Errorf("env printed %q, %v", out, err)
	}
}

func TestParseThresholds(t *testing.T) {
	got, err := blockbench.ParseThresholds("never, 0,250k,1M,42")
	if err != nil || !slices.Equal(got, []int64{0, 0, 250_000, 1_000_000, 42}) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "-1", "1.5M", "k"} {
		if _, err := blockbench.ParseThresholds(bad); !errors.Is(err, blockbench.ErrUsage) {
			t.Errorf("ParseThresholds(%q) = %v", bad, err)
		}
	}
}

// Every bit of the seed changes the data, including those above bit 31.
func TestSeedUsesAll64Bits(t *testing.T) {
	seen := map[string]uint64{}
	for _, seed := range []uint64{1, 1 | 1<<32, 1 | 1<<40, 1 | 1<<63, 2} {
		h := string(blockbench.FirstHash(seed))
		if prev, ok := seen[h]; ok {
			t.Errorf("seeds %#x and %#x give the same data", prev, seed)
		}
		seen[h] = seed
	}
	if !bytes.Equal(blockbench.FirstHash(7), blockbench.FirstHash(7)) {
		t.Error("the same seed gives different data")
	}
}
