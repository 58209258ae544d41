package report_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"flag"
	"image"
	_ "image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardlab/shardlab/lab/report"
	"github.com/shardlab/shardlab/lab/resultscsv"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// tempCSV copies the fixture CSV into a fresh directory, where the report is written too,
// so that the report's relative links do not depend on where the test runs.
func tempCSV(t *testing.T) (dir, csvPath string) {
	t.Helper()
	dir = t.TempDir()
	b, err := os.ReadFile("testdata/results.csv")
	if err != nil {
		t.Fatal(err)
	}
	csvPath = filepath.Join(dir, "results.csv")
	if err := os.WriteFile(csvPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, csvPath
}

func checkGolden(t *testing.T, got []byte, golden string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./report -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gl), len(wl)) {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("report differs from %s at line %d:\n got: %s\nwant: %s\n(run go test ./report -update if the change is intended)", golden, i+1, g, w)
			}
		}
	}
}

func checkChart(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 {
		t.Fatalf("%s is empty", path)
	}
	switch filepath.Ext(path) {
	case ".png":
		if _, _, err := image.Decode(bytes.NewReader(b)); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	case ".svg":
		dec := xml.NewDecoder(bytes.NewReader(b))
		for {
			_, err := dec.Token()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Errorf("%s: not XML: %v", path, err)
				break
			}
		}
		if !bytes.Contains(b, []byte("<svg")) {
			t.Errorf("%s: no <svg>", path)
		}
	default:
		t.Errorf("unexpected chart %s", path)
	}
}

func TestGenerateGolden(t *testing.T) {
	for _, tc := range []struct {
		name, runID, golden string
		charts              []string
	}{
		// The newest run: three trials, a clear gain, an overlap, failed requests, a sweep
		// with a USL fit, per-second samples, and a run.txt that says the machine was busy.
		{"newest run", "", "testdata/report.md", []string{
			"charts/scaling_shard_scaling_base", "charts/latency", "charts/timeline_read_heavy_cachelike",
		}},
		// An older run: one trial each and a scenario without a single baseline; the
		// run.txt is another run's, so its load is not recorded.
		{"one trial, no baseline", "run-a", "testdata/report_run-a.md", []string{"charts/latency"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, csvPath := tempCSV(t)
			out := filepath.Join(dir, "report.md")
			res, err := report.Generate(context.Background(), report.Config{
				CSVPath: csvPath, OutPath: out, RunID: tc.runID, TimeseriesDir: "testdata/timeseries",
				RunInfoPath: "testdata/run.txt",
			})
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, got, tc.golden)

			var want []string
			for _, c := range tc.charts {
				want = append(want, filepath.Join(dir, c+".png"), filepath.Join(dir, c+".svg"))
			}
			if strings.Join(res.Charts, "\n") != strings.Join(want, "\n") {
				t.Errorf("charts written:\n%s\nwant:\n%s", strings.Join(res.Charts, "\n"), strings.Join(want, "\n"))
			}
			for _, c := range res.Charts {
				checkChart(t, c)
				if rel, _ := filepath.Rel(dir, c); !bytes.Contains(got, []byte("("+filepath.ToSlash(rel)+")")) {
					t.Errorf("report does not link %s", rel)
				}
			}

			// Deterministic: a second run writes the same bytes, charts included.
			before := map[string][]byte{}
			for _, c := range res.Charts {
				before[c], _ = os.ReadFile(c)
			}
			if _, err := report.Generate(context.Background(), report.Config{
				CSVPath: csvPath, OutPath: out, RunID: tc.runID, TimeseriesDir: "testdata/timeseries",
				RunInfoPath: "testdata/run.txt",
			}); err != nil {
				t.Fatal(err)
			}
			if again, _ := os.ReadFile(out); !bytes.Equal(again, got) {
				t.Error("a second report differs from the first")
			}
			for _, c := range res.Charts {
				if again, _ := os.ReadFile(c); !bytes.Equal(again, before[c]) {
					t.Errorf("%s differs between two runs", filepath.Base(c))
				}
			}
		})
	}
}

func TestGenerateNoChartsHasNoChartSection(t *testing.T) {
	dir, csvPath := tempCSV(t)
	out := filepath.Join(dir, "sub", "report.md")
	res, err := report.Generate(context.Background(), report.Config{CSVPath: csvPath, OutPath: out, NoCharts: true})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(out)
	if len(res.Charts) != 0 || bytes.Contains(b, []byte("## Charts")) {
		t.Errorf("charts %v, report has a chart section: %v", res.Charts, bytes.Contains(b, []byte("## Charts")))
	}
	if !bytes.Contains(b, []byte("from `../results.csv`")) {
		t.Error("CSV is not named relative to the report")
	}
	if _, err := os.Stat(filepath.Join(dir, "sub", "charts")); !os.IsNotExist(err) {
		t.Errorf("charts directory created with NoCharts: %v", err)
	}
}

func TestGenerateErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.csv")
	if err := os.WriteFile(empty, []byte(strings.Join(resultscsv.Columns(), ",")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	zero := filepath.Join(dir, "zero.csv")
	if err := os.WriteFile(zero, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, csvPath := tempCSV(t)
	ctx := context.Background()
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		cfg  report.Config
		want error
	}{
		{"empty CSV", ctx, report.Config{CSVPath: empty, OutPath: filepath.Join(dir, "r.md")}, report.ErrNoRows},
		{"zero-byte CSV", ctx, report.Config{CSVPath: zero, OutPath: filepath.Join(dir, "r.md")}, report.ErrNoRows},
		{"missing CSV", ctx, report.Config{CSVPath: filepath.Join(dir, "nope.csv"), OutPath: filepath.Join(dir, "r.md")}, os.ErrNotExist},
		{"unknown run", ctx, report.Config{CSVPath: csvPath, OutPath: filepath.Join(dir, "r.md"), RunID: "run-z"}, report.ErrRunNotFound},
		{"cancelled", canceled, report.Config{CSVPath: csvPath, OutPath: filepath.Join(dir, "r.md")}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := report.Generate(tc.ctx, tc.cfg); !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if _, err := os.Stat(filepath.Join(dir, "r.md")); !os.IsNotExist(err) {
				t.Errorf("a report was written: %v", err)
			}
		})
	}
}

func TestBadSampleFileIsNoted(t *testing.T) {
	dir, csvPath := tempCSV(t)
	ts := filepath.Join(dir, "timeseries", "run-b")
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ts, "read_heavy_cachelike_single_1_t1.csv"), []byte("t_s,ops\n1,2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "report.md")
	if _, err := report.Generate(context.Background(), report.Config{CSVPath: csvPath, OutPath: out}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(out)
	if !bytes.Contains(b, []byte("> Per-second samples read_heavy_cachelike_single_1_t1.csv left out: bad per-second sample file: no column throughput_ops_s")) {
		t.Errorf("no note about the bad sample file:\n%s", b)
	}
	if bytes.Contains(b, []byte("timeline_")) {
		t.Error("timeline chart drawn from no good samples")
	}
}

// row builds a results row for Analyze tests.
func row(run, scenario, mode string, shards, trial int, tput float64) resultscsv.Row {
	return resultscsv.Row{
		Timestamp: time.Date(2026, 1, 1, 0, 0, trial, 0, time.UTC), RunID: run, Scenario: scenario,
		Mode: mode, Shards: shards, Trial: trial, ThroughputOpsS: tput, Backend: "sqlite",
	}
}

func TestAnalyzeVerdicts(t *testing.T) {
	var rows []resultscsv.Row
	short := map[string]bool{}
	add := func(scenario string, single, sharded []float64) {
		for i := range max(len(single), len(sharded)) {
			if i < len(single) {
				r := row("r", scenario, "single", 1, i+1, single[i])
				if short[scenario] {
					r.DurationS = 0.4
				}
				rows = append(rows, r)
			}
			if i < len(sharded) {
				rows = append(rows, row("r", scenario, "sharded", 3, i+1, sharded[i]))
			}
		}
	}
	six := []float64{100, 104, 98, 101, 103, 99}
	// The case the old min-max rule got wrong: three trials that do not overlap, 1.03x.
	add("3 trials, 1.03x", []float64{100, 101, 102}, []float64{103, 104, 105})
	add("6 trials, faster", six, []float64{120, 118, 125, 121, 119, 122})
	add("6 trials, slower", six, []float64{50, 60, 55, 52, 58, 51})
	add("6 trials, interleaved", six, []float64{102, 97, 105, 100, 99, 103})
	add("4 trials, faster", six[:4], []float64{110, 111, 112, 113})
	add("one trial", []float64{100}, []float64{300})
	short["too short"] = true
	add("too short", six, []float64{200, 201, 202, 203, 204, 205})
	add("no baseline", nil, []float64{300, 310})

	a, err := report.Analyze(rows, "")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		kind    report.Kind
		verdict string
		p       float64 // want Test.P, 0 for don't care
		minP    float64
		ratioCI bool
	}{
		"3 trials, 1.03x":       {report.KindTooFew, report.VerdictTooFew, 0.1, 0.1, false},
		"6 trials, faster":      {report.KindFaster, "1.20x faster", 2.0 / 924, 2.0 / 924, true},
		"6 trials, slower":      {report.KindSlower, "1.86x slower", 2.0 / 924, 2.0 / 924, true},
		"6 trials, interleaved": {report.KindNoDifference, report.VerdictNoDifference, 0, 2.0 / 924, true},
		"4 trials, faster":      {report.KindFaster, "1.11x faster", 2.0 / 70, 2.0 / 70, false},
		"one trial":             {report.KindTooFew, report.VerdictTooFew, 0, 1, false},
		"too short":             {report.KindTooShort, report.VerdictTooShort, 0, 2.0 / 924, true},
		"no baseline":           {report.KindNoBaseline, report.VerdictNoBaseline, 0, 0, false},
	}
	seen := 0
	for _, f := range a.Findings {
		if f.Mode == "single" {
			if f.Verdict != report.VerdictBaseline || f.Kind != report.KindBaseline {
				t.Errorf("%s single: verdict %q", f.Scenario, f.Verdict)
			}
			continue
		}
		w, ok := want[f.Scenario]
		if !ok {
			t.Fatalf("unexpected finding %+v", f.Key)
		}
		seen++
		if f.Kind != w.kind || f.Verdict != w.verdict {
			t.Errorf("%s: verdict %q (kind %d), want %q (kind %d); test %+v", f.Scenario, f.Verdict, f.Kind, w.verdict, w.kind, f.Test)
		}
		if w.p > 0 && abs(f.Test.P-w.p) > 1e-9 {
			t.Errorf("%s: p = %g, want %g", f.Scenario, f.Test.P, w.p)
		}
		if w.kind == report.KindNoDifference && f.Test.P <= report.Alpha {
			t.Errorf("%s: p = %g, want above %g", f.Scenario, f.Test.P, report.Alpha)
		}
		if abs(f.Test.MinP-w.minP) > 1e-9 {
			t.Errorf("%s: smallest possible p %g, want %g", f.Scenario, f.Test.MinP, w.minP)
		}
		if f.RatioCI.OK != w.ratioCI || f.RatioCI.OK && !(f.Ratio.Min <= f.RatioCI.Lo && f.RatioCI.Lo <= f.Ratio.Median &&
			f.Ratio.Median <= f.RatioCI.Hi && f.RatioCI.Hi <= f.Ratio.Max) {
			t.Errorf("%s: ratio CI %+v around %+v, want one (%v) between the extreme ratios", f.Scenario, f.RatioCI, f.Ratio, w.ratioCI)
		}
	}
	if seen != len(want) {
		t.Errorf("saw %d sharded findings, want %d", seen, len(want))
	}
	// With 6 trials the median has a 95% interval: order statistics 1 and 6, that is the
	// range; with 4 it has none.
	for _, f := range a.Findings {
		switch {
		case f.Scenario == "6 trials, faster" && f.Mode == "sharded":
			if ci := f.ThroughputCI; !ci.OK || ci.Lo != 118 || ci.Hi != 125 {
				t.Errorf("median CI of 6 trials: %+v, want [118, 125]", ci)
			}
		case f.Scenario == "4 trials, faster" && f.Mode == "sharded":
			if f.ThroughputCI.OK {
				t.Errorf("median CI of 4 trials: %+v, want none", f.ThroughputCI)
			}
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func TestAnalyzeRunSelectionAndSweep(t *testing.T) {
	var rows []resultscsv.Row
	for trial := 1; trial <= 2; trial++ {
		for _, n := range []int{1, 2, 3, 4, 5, 6} {
			x := 1000 * float64(n) / (1 + 0.05*float64(n-1) + 0.02*float64(n*(n-1)))
			rows = append(rows, row("sweep", "s", "sharded", n, trial, x))
		}
	}
	old := row("old", "s", "single", 1, 1, 10)
	old.Timestamp = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	rows = append(rows, old)

	a, err := report.Analyze(rows, "")
	if err != nil {
		t.Fatal(err)
	}
	if a.RunID != "sweep" || len(a.Rows) != 12 || len(a.Others) != 1 || a.Others[0].RunID != "old" {
		t.Fatalf("run %q, %d rows, others %+v", a.RunID, len(a.Rows), a.Others)
	}
	if len(a.Sweeps) != 1 || a.Sweeps[0].Err != nil {
		t.Fatalf("sweeps %+v", a.Sweeps)
	}
	m := a.Sweeps[0].Model
	if abs(m.Sigma-0.05) > 1e-4 || abs(m.Kappa-0.02) > 1e-5 || len(a.Sweeps[0].Points) != 12 {
		t.Errorf("model %v", m)
	}
	// With a sharded x1 present there is no single baseline: every comparison says so.
	for _, f := range a.Findings {
		if f.Verdict != report.VerdictNoBaseline {
			t.Errorf("%s: %q", f.Label(), f.Verdict)
		}
	}

	// Five shard counts: a sweep without a fit.
	a, err = report.Analyze(rows[:5], "sweep")
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Sweeps) != 1 || a.Sweeps[0].Err == nil {
		t.Errorf("sweeps %+v", a.Sweeps)
	}

	if _, err := report.Analyze(nil, ""); !errors.Is(err, report.ErrNoRows) {
		t.Errorf("err = %v", err)
	}
}
