package report_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	uslcmd "github.com/shardlab/shardlab/internal/cmd/usl"
	"github.com/shardlab/shardlab/lab/report"
	"github.com/shardlab/shardlab/lab/resultscsv"
)

// markdown analyses rows and returns the report's text.
func markdown(t *testing.T, rows []resultscsv.Row) string {
	t.Helper()
	a, err := report.Analyze(rows, "")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := a.WriteMarkdown(&b, report.MarkdownOptions{CSVName: "results.csv"}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// section returns the text of the markdown section that starts with heading.
func section(md, heading string) string {
	i := strings.Index(md, heading)
	if i < 0 {
		return ""
	}
	rest := md[i+len(heading):]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// sweepRows is a sweep of one scenario over shard counts 1 (single) to 8, trials
// interleaved, with throughput x(n, trial).
func sweepRows(x func(n, trial int) float64) []resultscsv.Row {
	var rows []resultscsv.Row
	for trial := 1; trial <= 2; trial++ {
		for _, n := range []int{1, 2, 3, 4, 5, 6, 8} {
			mode := "sharded"
			if n == 1 {
				mode = "single"
			}
			rows = append(rows, row("sw", "sweep", mode, n, trial, x(n, trial)))
		}
	}
	return rows
}

func TestSweepSigmaAboveOne(t *testing.T) {
	md := markdown(t, sweepRows(func(n, _ int) float64 {
		return 1000 * float64(n) / (1 + 1.5*float64(n-1))
	}))
	if strings.Contains(md, "keeps rising") {
		t.Errorf("a falling curve is said to keep rising:\n%s", section(md, "## Conclusions"))
	}
	if !strings.Contains(section(md, "## Conclusions"), "more shards only lower throughput") {
		t.Errorf("conclusions do not say more shards lower throughput:\n%s", section(md, "## Conclusions"))
	}
	if !strings.Contains(section(md, "## Scalability"), "| 1 | 1.000 |") {
		t.Errorf("USL table does not show N* = 1:\n%s", section(md, "## Scalability"))
	}
}

func TestSweepLowR2NoRecommendation(t *testing.T) {
	noise := []float64{100, 80, 120, 90, 115, 85, 110}
	md := markdown(t, sweepRows(func(n, trial int) float64 {
		return noise[(n+trial)%len(noise)]
	}))
	concl := section(md, "## Conclusions")
	if !strings.Contains(concl, "the USL fit does not describe these points (R² = ") || !strings.Contains(concl, "no recommendation") {
		t.Errorf("conclusions:\n%s", concl)
	}
	// The usl command warns about the same points in the same words.
	var points strings.Builder
	points.WriteString("n,throughput\n")
	for _, r := range sweepRows(func(n, trial int) float64 { return noise[(n+trial)%len(noise)] }) {
		fmt.Fprintf(&points, "%d,%g\n", r.Shards, r.ThroughputOpsS)
	}
	var out, errOut bytes.Buffer
	if err := uslcmd.Run(context.Background(), []string{"-"}, strings.NewReader(points.String()), &out, &errOut); err != nil {
		t.Fatal(err)
	}
	warning := strings.TrimSpace(strings.TrimPrefix(errOut.String(), "usl: warning: standard input: "))
	if !strings.HasPrefix(errOut.String(), "usl: warning: ") || warning == "" || !strings.Contains(concl, warning) {
		t.Errorf("usl warns %q; the report's conclusions do not say the same:\n%s", errOut.String(), concl)
	}
	if strings.Contains(concl, "N* =") || strings.Contains(concl, "peak") {
		t.Errorf("conclusions draw on a meaningless fit:\n%s", concl)
	}
	usl := section(md, "## Scalability")
	if !strings.Contains(usl, "| - | ") {
		t.Errorf("USL table marks an N*:\n%s", usl)
	}

	// Nor does the chart.
	dir := t.TempDir()
	csvPath := filepath.Join(dir, "results.csv")
	if err := resultscsv.Append(csvPath, sweepRows(func(n, trial int) float64 { return noise[(n+trial)%len(noise)] })...); err != nil {
		t.Fatal(err)
	}
	if _, err := report.Generate(context.Background(), report.Config{CSVPath: csvPath, OutPath: filepath.Join(dir, "report.md")}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "charts", "scaling_sweep.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("N* =")) || !bytes.Contains(b, []byte("does not describe")) {
		t.Error("scaling chart marks N* or does not say the fit is meaningless")
	}
}

func TestTrialPairingByNumber(t *testing.T) {
	rows := []resultscsv.Row{
		row("r", "s", "single", 1, 1, 100),
		row("r", "s", "single", 1, 2, 200),
		row("r", "s", "single", 1, 3, 400),
		// Trial 1 of sharded is missing: trial 2 must meet single's trial 2, not trial 1.
		row("r", "s", "sharded", 3, 2, 300),
		row("r", "s", "sharded", 3, 3, 600),
	}
	a, err := report.Analyze(rows, "")
	if err != nil {
		t.Fatal(err)
	}
	f := a.Findings[1]
	if f.Ratio.N != 2 || f.Ratio.Min != 1.5 || f.Ratio.Max != 1.5 {
		t.Errorf("ratio %+v, want 1.5 for both paired trials", f.Ratio)
	}
	if len(f.Unpaired) != 1 || f.Unpaired[0] != 1 {
		t.Errorf("Unpaired = %v, want [1]", f.Unpaired)
	}
	concl := section(markdown(t, rows), "## Conclusions")
	if !strings.Contains(concl, "left out of the ratio") || !strings.Contains(concl, "trial 1") {
		t.Errorf("conclusions do not name the unpaired trial:\n%s", concl)
	}
	// Complete pairs: no remark.
	rows = append(rows, row("r", "s", "sharded", 3, 1, 150))
	if concl := section(markdown(t, rows), "## Conclusions"); strings.Contains(concl, "left out of the ratio") {
		t.Errorf("remark without a missing trial:\n%s", concl)
	}
}

func TestShortMeasuredPhaseFlagged(t *testing.T) {
	rows := []resultscsv.Row{row("r", "s", "single", 1, 1, 100), row("r", "s", "sharded", 3, 1, 150)}
	rows[0].DurationS, rows[1].DurationS = 20, 0.42
	concl := section(markdown(t, rows), "## Conclusions")
	if !strings.Contains(strings.ToLower(concl), "measured phase under 1 s: too short to compare") || !strings.Contains(concl, "s sharded x3 trial 1 (0.42 s)") {
		t.Errorf("conclusions:\n%s", concl)
	}
	if strings.Contains(concl, "single trial 1 (") {
		t.Errorf("a 20 s run is flagged:\n%s", concl)
	}
	rows[1].DurationS = 20
	if concl := section(markdown(t, rows), "## Conclusions"); strings.Contains(concl, "under 1 s") {
		t.Errorf("flag without a short run:\n%s", concl)
	}
}

func TestFailedRequestsWording(t *testing.T) {
	rows := []resultscsv.Row{row("r", "s", "single", 1, 1, 100)}
	rows[0].Errors, rows[0].Ops = 3, 2000
	md := markdown(t, rows)
	if strings.Contains(md, "completed") || !strings.Contains(md, "3 failed requests (2000 successful)") {
		t.Errorf("report:\n%s", md)
	}
}

// newRow is a row written by a script since the CSV records what the run was asked to do.
func newRow(mode string, shards, trial int, command string) resultscsv.Row {
	r := row("r", "adhoc", mode, shards, trial, 1000*float64(shards))
	r.Timestamp = time.Date(2026, 1, 1, 0, trial, shards, 0, time.UTC)
	r.Concurrency, r.WriteRatio, r.Keys, r.Dist = 50, 0.5, 10000, "uniform"
	r.Router, r.Sync, r.Seed = "crc32", "normal", 1
	r.RequestedOps, r.Ops, r.DurationS, r.DataSize = 10000, 9990, 5, 100
	r.Command = command
	return r
}

// rerun returns the shell block of the report's Parameters section and the text before it.
func rerun(t *testing.T, rows []resultscsv.Row) (intro, block string) {
	t.Helper()
	params := section(markdown(t, rows), "## Parameters")
	i := strings.Index(params, "```sh\n")
	if i < 0 {
		t.Fatalf("no shell block:\n%s", params)
	}
	j := strings.Index(params[i+6:], "```")
	return params[:i], params[i+6 : i+6+j]
}

func TestRerunCommand(t *testing.T) {
	quick := "scripts/run_all_scenarios.sh --quick --only read_heavy_cachelike"
	t.Run("shared command verbatim", func(t *testing.T) {
		rows := []resultscsv.Row{newRow("single", 1, 1, quick), newRow("sharded", 3, 1, quick)}
		intro, block := rerun(t, rows)
		if block != quick+"\n" {
			t.Errorf("block %q, want %q", block, quick)
		}
		if strings.Contains(intro, "approximate") {
			t.Errorf("exact command labelled approximate:\n%s", intro)
		}
	})
	t.Run("ad-hoc run_scenario rows", func(t *testing.T) {
		single := newRow("single", 1, 1, "")
		sharded := newRow("sharded", 4, 1, "")
		sharded.RequestedOps, sharded.RequestedDurationS = 0, 30
		sharded.WarmupS, sharded.Preload, sharded.Rate, sharded.Arrival = 2, true, 500, "poisson"
		sharded.Dist, sharded.Router, sharded.Seed = "zipfian", "jump", 7
		_, block := rerun(t, []resultscsv.Row{single, sharded})
		want := []string{
			"scripts/run_scenario.sh --scenario adhoc --ops 10000 --concurrency 50 --writeRatio 0.5 --keys 10000 --dist uniform --shards 1 --sync normal --router crc32 --backend sqlite --seed 1",
			"scripts/run_scenario.sh --scenario adhoc --duration 30s --concurrency 50 --writeRatio 0.5 --keys 10000 --dist zipfian --shards 4 --preload --warmup 2s --rate 500 --arrival poisson --sync normal --router jump --backend sqlite --seed 7",
		}
		for _, w := range want {
			if !strings.Contains(block, w) {
				t.Errorf("block lacks\n%s\ngot:\n%s", w, block)
			}
		}
		if strings.Contains(block, "--only") || strings.Contains(block, "run_all_scenarios") {
			t.Errorf("block guesses a script:\n%s", block)
		}
	})
	t.Run("interleaved trials with seed = trial", func(t *testing.T) {
		var rows []resultscsv.Row
		for trial := 1; trial <= 3; trial++ {
			for _, n := range []int{1, 3} {
				mode := map[int]string{1: "single", 3: "sharded"}[n]
				r := newRow(mode, n, trial, "")
				r.Seed = int64(trial)
				rows = append(rows, r)
			}
		}
		_, block := rerun(t, rows)
		for _, w := range []string{
			"for trial in 1 2 3; do",
			"--shards 1 --sync normal --router crc32 --backend sqlite --seed \"$trial\" --first-trial \"$trial\" --run-id \"$run_id\"",
			"--shards 3 --sync normal --router crc32 --backend sqlite --seed \"$trial\" --first-trial \"$trial\" --run-id \"$run_id\"",
		} {
			if !strings.Contains(block, w) {
				t.Errorf("block lacks %q:\n%s", w, block)
			}
		}
	})
	t.Run("fixed seed keeps the interleaving", func(t *testing.T) {
		rows := []resultscsv.Row{newRow("single", 1, 1, ""), newRow("sharded", 2, 1, ""), newRow("single", 1, 2, ""), newRow("sharded", 2, 2, "")}
		_, block := rerun(t, rows)
		if !strings.Contains(block, "for trial in 1 2; do\n") || !strings.Contains(block, "--shards 2 --sync normal --router crc32 --backend sqlite --seed 1 --first-trial \"$trial\" --run-id \"$run_id\"\n") {
			t.Errorf("block:\n%s", block)
		}
	})
	t.Run("missing trial: one line per configuration and seed", func(t *testing.T) {
		var rows []resultscsv.Row
		for _, r := range []resultscsv.Row{newRow("single", 1, 1, ""), newRow("sharded", 3, 1, ""), newRow("single", 1, 2, "")} {
			r.Seed = int64(r.Trial)
			rows = append(rows, r)
		}
		_, block := rerun(t, rows)
		want := "run_id=rerun-$(date -u +%Y%m%dT%H%M%SZ)\n" +
			"scripts/run_scenario.sh --scenario adhoc --ops 10000 --concurrency 50 --writeRatio 0.5 --keys 10000 --dist uniform --shards 1 --sync normal --router crc32 --backend sqlite --seed 1 --run-id \"$run_id\"\n" +
			"scripts/run_scenario.sh --scenario adhoc --ops 10000 --concurrency 50 --writeRatio 0.5 --keys 10000 --dist uniform --shards 3 --sync normal --router crc32 --backend sqlite --seed 1 --run-id \"$run_id\"\n" +
			"scripts/run_scenario.sh --scenario adhoc --ops 10000 --concurrency 50 --writeRatio 0.5 --keys 10000 --dist uniform --shards 1 --sync normal --router crc32 --backend sqlite --seed 2 --first-trial 2 --run-id \"$run_id\"\n"
		if block != want {
			t.Errorf("block:\n%s\nwant:\n%s", block, want)
		}
	})
	t.Run("odd values are quoted", func(t *testing.T) {
		r := newRow("single", 1, 1, "")
		r.Scenario = "x; rm -rf /"
		if _, block := rerun(t, []resultscsv.Row{r}); !strings.Contains(block, "--scenario 'x; rm -rf /' ") {
			t.Errorf("block:\n%s", block)
		}
	})
	t.Run("old rows", func(t *testing.T) {
		r := row("r", "adhoc", "single", 1, 1, 100)
		r.Ops = 5000
		intro, block := rerun(t, []resultscsv.Row{r})
		if !strings.Contains(intro, "cannot be reconstructed exactly") || !strings.Contains(block, "approximate") {
			t.Errorf("intro:\n%s\nblock:\n%s", intro, block)
		}
		if !strings.Contains(block, "scripts/run_scenario.sh --scenario adhoc --ops 5000") {
			t.Errorf("block:\n%s", block)
		}
	})
}

// TestSweepFlatIsAFinding: throughput that does not move with the shard count (within a
// few percent of noise) has a near-zero R² by construction, yet the fit passes close to
// every point: the report must call it flat, not meaningless, and recommend no sharding.
func TestSweepFlatIsAFinding(t *testing.T) {
	wobble := []float64{1.00, 0.98, 1.02, 0.99, 1.01, 0.97, 1.03}
	md := markdown(t, sweepRows(func(n, trial int) float64 {
		return 20000 * wobble[(n+trial)%len(wobble)]
	}))
	concl := section(md, "## Conclusions")
	if !strings.Contains(concl, "flat:") || !strings.Contains(concl, "more shards do not pay") {
		t.Errorf("a flat sweep is not called flat:\n%s", concl)
	}
	if strings.Contains(concl, "does not describe these points") {
		t.Errorf("a flat sweep is called meaningless:\n%s", concl)
	}
}
