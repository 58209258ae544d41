package report

import (
	"bytes"
	"cmp"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/shardlab/shardlab/lab/charts"
	"github.com/shardlab/shardlab/lab/resultscsv"
	"github.com/shardlab/shardlab/lab/usl"
)

// Config says what Generate reads and writes.
type Config struct {
	CSVPath string // results CSV, e.g. results/runs/<run-id>/results.csv
	OutPath string // report to write; empty means report.md next to CSVPath
	RunID   string // run to report; empty for the run of the newest row
	// RunInfoPath is the run.txt that the lab scripts write beside the CSV (command,
	// machine, load averages); empty means RunInfoName next to CSVPath. A missing file
	// leaves the load out of the report, which then says it was not recorded.
	RunInfoPath string

	// ChartsDir receives the charts; empty means "charts" next to OutPath.
	ChartsDir string
	// TimeseriesDir holds loadgen's per-second samples as
	// <run_id>/<scenario>_<mode>_<shards>_t<trial>.csv; empty means "timeseries" next to
	// CSVPath. A missing directory just leaves the over-time chart out.
	TimeseriesDir string
	// NoCharts skips rendering (and linking) charts.
	NoCharts bool
}

// Result is what Generate produced.
type Result struct {
	Analysis *Analysis
	Report   string   // path of the markdown written
	Charts   []string // paths of the chart files written
}

// Generate reads the CSV, analyses the selected run, renders the charts and writes the
// markdown report. Cancelling ctx stops it between charts; the report is then not
// (re)written.
func Generate(ctx context.Context, cfg Config) (*Result, error) {
	rows, err := resultscsv.ReadFile(cfg.CSVPath)
	if errors.Is(err, io.EOF) {
		// Not even a header: the scripts have not written anything yet.
		return nil, fmt.Errorf("%s: %w (the file is empty)", cfg.CSVPath, ErrNoRows)
	}
	if err != nil {
		return nil, err
	}
	a, err := Analyze(rows, cfg.RunID)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.CSVPath, err)
	}
	if cfg.OutPath == "" {
		cfg.OutPath = filepath.Join(filepath.Dir(cfg.CSVPath), "report.md")
	}
	outDir := filepath.Dir(cfg.OutPath)
	chartsDir := cmp.Or(cfg.ChartsDir, filepath.Join(outDir, "charts"))
	tsDir := cmp.Or(cfg.TimeseriesDir, filepath.Join(filepath.Dir(cfg.CSVPath), "timeseries"))
	res := &Result{Analysis: a, Report: cfg.OutPath}

	opt := MarkdownOptions{CSVName: relSlash(outDir, cfg.CSVPath)}
	infoPath := cmp.Or(cfg.RunInfoPath, filepath.Join(filepath.Dir(cfg.CSVPath), RunInfoName))
	switch info, err := ReadRunInfo(infoPath); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		opt.Notes = append(opt.Notes, fmt.Sprintf("The run's %s was left out: %v", RunInfoName, err))
	case info.RunID != "" && info.RunID != a.RunID:
		// A CSV gathered from several runs: this run.txt belongs to another.
	default:
		opt.RunInfo = info
	}
	if !cfg.NoCharts {
		if err := os.MkdirAll(chartsDir, 0o755); err != nil {
			return nil, fmt.Errorf("charts directory: %w", err)
		}
		plans, notes := planCharts(a, filepath.Join(tsDir, a.RunID))
		opt.Notes = append(opt.Notes, notes...)
		for _, pl := range plans {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			base := filepath.Join(chartsDir, pl.name)
			png, svg := base+".png", base+".svg"
			if err := charts.Save(pl.chart, png, svg); err != nil {
				return nil, fmt.Errorf("chart %s: %w", pl.name, err)
			}
			res.Charts = append(res.Charts, png, svg)
			opt.Charts = append(opt.Charts, ChartFile{
				Kind: pl.kind, Title: pl.title, PNG: relSlash(outDir, png), SVG: relSlash(outDir, svg),
			})
		}
	}

	var buf bytes.Buffer
	if err := a.WriteMarkdown(&buf, opt); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := writeAtomic(cfg.OutPath, buf.Bytes()); err != nil {
		return nil, err
	}
	return res, nil
}

// relSlash is target relative to dir with forward slashes (for markdown links), or
// target itself when no relative path exists.
func relSlash(dir, target string) string {
	rel, err := filepath.Rel(dir, target)
	if err != nil {
		rel = target
	}
	return filepath.ToSlash(rel)
}

// writeAtomic replaces path with data so that a reader never sees half a report.
func writeAtomic(path string, data []byte) error {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// plannedChart is a chart to render, under a file name without extension.
type plannedChart struct {
	kind, name, title string
	chart             charts.Chart
}

// safeName keeps a scenario name usable as a file name.
func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, s)
}

// planCharts lists the charts of a: one throughput-against-shards chart per sweep, one
// latency chart for the run, and one over-time chart (the first scenario that has
// per-second samples, every trial of each configuration) when samples exist in tsRunDir.
func planCharts(a *Analysis, tsRunDir string) (plans []plannedChart, notes []string) {
	multiBackend := a.MultiBackend
	for _, s := range a.Sweeps {
		c := usl.ScalingChart(s.Scenario+": throughput against shard count", s.Points, s.Model)
		if s.Err != nil {
			c.Curve, c.PeakN = nil, 0
		}
		c.YLabel = "throughput (ops/s)"
		c.XLabel = "shards"
		name := "scaling_" + safeName(s.Scenario)
		if multiBackend {
			name += "_" + safeName(s.Backend)
		}
		plans = append(plans, plannedChart{"scaling", name, s.Scenario + ": throughput against shard count", c})
	}

	lat := charts.LatencyChart{}
	groups := map[[2]string]int{}
	for _, f := range a.Findings {
		k := [2]string{f.Scenario, f.Backend}
		gi, ok := groups[k]
		if !ok {
			name := f.Scenario
			if multiBackend {
				name += " (" + f.Backend + ")"
			}
			gi = len(lat.Groups)
			groups[k] = gi
			lat.Groups = append(lat.Groups, charts.LatencyGroup{Name: name})
		}
		var p50, p95, p99, p999 []float64
		for _, r := range f.Trials {
			p50, p95, p99, p999 = append(p50, r.P50Ms), append(p95, r.P95Ms), append(p99, r.P99Ms), append(p999, r.P999Ms)
		}
		lat.Groups[gi].Series = append(lat.Groups[gi].Series, charts.LatencySeries{
			Label: f.Label(), P50: newStat(p50).Median, P95: newStat(p95).Median,
			P99: newStat(p99).Median, P999: newStat(p999).Median,
		})
	}
	plans = append(plans, plannedChart{"latency", "latency", "Response-time percentiles (median over trials)", lat})

	// Over time: the first scenario with samples.
	scenarioDone := map[string]bool{}
	for _, f := range a.Findings {
		if scenarioDone[f.Scenario] {
			continue
		}
		scenarioDone[f.Scenario] = true
		var tl charts.TimelineChart
		for _, g := range a.Findings {
			if g.Scenario != f.Scenario || (multiBackend && g.Backend != f.Backend) {
				continue
			}
			// Every trial: picking one to stand for the others would hide their spread.
			series := charts.Timeline{Label: g.Label()}
			for _, r := range g.Trials {
				file := fmt.Sprintf("%s_%s_%d_t%d.csv", r.Scenario, r.Mode, r.Shards, r.Trial)
				samples, err := readSampleFile(filepath.Join(tsRunDir, file))
				if errors.Is(err, os.ErrNotExist) {
					continue
				}
				if err != nil {
					notes = append(notes, fmt.Sprintf("Per-second samples %s left out: %v", file, err))
					continue
				}
				series.Trials = append(series.Trials, samples)
			}
			switch n := len(series.Trials); {
			case n == 0:
				continue
			case n < len(g.Trials):
				series.Label += fmt.Sprintf("\n(%d of %d trials)", n, len(g.Trials))
			case n > 1:
				series.Label += fmt.Sprintf("\n(%d trials)", n)
			}
			tl.Series = append(tl.Series, series)
		}
		if len(tl.Series) > 0 {
			tl.Title = f.Scenario + ": throughput and p99 per second, every trial"
			plans = append(plans, plannedChart{"timeline", "timeline_" + safeName(f.Scenario), tl.Title, tl})
			break
		}
	}
	return plans, notes
}

// ErrBadSamples is returned for a per-second sample file that cannot be read.
var ErrBadSamples = errors.New("bad per-second sample file")

// readSampleFile reads one per-second sample file.
func readSampleFile(path string) ([]charts.Sample, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadSamples(f)
}

// ReadSamples reads loadgen's per-second samples: CSV with the header
// t_s,ops,errors,throughput_ops_s,p50_ms,p99_ms,max_ms (columns matched by name; only
// t_s, throughput_ops_s and p99_ms are needed). It returns ErrBadSamples for anything
// else, including a file without samples.
func ReadSamples(r io.Reader) ([]charts.Sample, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrBadSamples, err)
	}
	idx := map[string]int{}
	for i, h := range header {
		idx[strings.TrimSpace(h)] = i
	}
	for _, c := range []string{"t_s", "throughput_ops_s", "p99_ms"} {
		if _, ok := idx[c]; !ok {
			return nil, fmt.Errorf("%w: no column %s", ErrBadSamples, c)
		}
	}
	var out []charts.Sample
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadSamples, err)
		}
		var v [3]float64
		for i, c := range []string{"t_s", "throughput_ops_s", "p99_ms"} {
			j := idx[c]
			if j >= len(rec) {
				return nil, fmt.Errorf("%w: line %d: no %s", ErrBadSamples, line, c)
			}
			if v[i], err = strconv.ParseFloat(strings.TrimSpace(rec[j]), 64); err != nil {
				return nil, fmt.Errorf("%w: line %d: %s: %v", ErrBadSamples, line, c, err)
			}
		}
		out = append(out, charts.Sample{T: v[0], Throughput: v[1], P99: v[2]})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no samples", ErrBadSamples)
	}
	return out, nil
}
