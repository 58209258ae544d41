package counterbench

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/shardlab/shardlab/counters"
	"github.com/shardlab/shardlab/internal/rundir"
	"github.com/shardlab/shardlab/lab/charts"
)

// ContentionColumns are the columns of contention_<backend>.csv, one row
// per case, aggregated over trials.
var ContentionColumns = []string{
	"backend", "strategy", "buckets", "bucket_by", "workers", "pool", "trials",
	"ops", "ops_s", "ops_s_min", "ops_s_max", "p50_ms", "p99_ms",
	"ratio_vs_append", "ratio_min", "ratio_max", "errors", "exact",
}

// TrialColumns are the columns of contention_<backend>_trials.csv, one row
// per run.
var TrialColumns = []string{
	"backend", "trial", "strategy", "buckets", "bucket_by", "ops", "errors",
	"elapsed_s", "ops_s", "p50_ms", "p99_ms", "p999_ms", "acknowledged", "counted", "exact",
}

// ReadColumns are the columns of read_<backend>.csv.
var ReadColumns = []string{
	"backend", "strategy", "buckets", "bucket_by", "increments", "samples",
	"p50_ms", "p99_ms", "mean_ms",
}

// resolveOut makes the output directory: the one --out names, or else a new run
// directory under results/runs, so that a run never overwrites the published results
// in results/counters (scripts/promote.sh publishes a run on purpose).
func resolveOut(cfg *Config, stderr io.Writer) error {
	if cfg.Out != "" {
		return os.MkdirAll(cfg.Out, 0o755)
	}
	dir, err := rundir.New(rundir.DefaultRuns, "counters-", time.Now())
	if err != nil {
		return err
	}
	cfg.Out = dir
	fmt.Fprintf(stderr, "counterbench: writing to %s\n", dir)
	return nil
}

func f2(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }
func f3(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) }

func writeCSV(path string, header []string, rows [][]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write(header)
	_ = w.WriteAll(rows) // WriteAll flushes
	if err := w.Error(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

func writeContentionCSV(cfg Config, runs []runResult, sums []caseSummary) error {
	var rows [][]string
	for _, s := range sums {
		b, by := bucketCols(s.opts)
		ratio, rmin, rmax := "", "", ""
		if s.hasRatio {
			ratio, rmin, rmax = f3(s.ratio), f3(s.ratioMin), f3(s.ratioMax)
		}
		rows = append(rows, []string{
			cfg.Backend, string(s.opts.Strategy), b, by, strconv.Itoa(cfg.Workers), strconv.Itoa(cfg.Pool),
			strconv.Itoa(s.trials), strconv.FormatInt(s.ops, 10), f2(s.opsS), f2(s.opsSMin), f2(s.opsSMax),
			f3(s.p50), f3(s.p99), ratio, rmin, rmax, strconv.FormatInt(s.errors, 10), strconv.FormatBool(s.exact),
		})
	}
	if err := writeCSV(filepath.Join(cfg.Out, "contention_"+cfg.Backend+".csv"), ContentionColumns, rows); err != nil {
		return err
	}
	rows = rows[:0]
	for _, r := range runs {
		b, by := bucketCols(r.opts)
		rows = append(rows, []string{
			cfg.Backend, strconv.Itoa(r.trial), string(r.opts.Strategy), b, by,
			strconv.FormatInt(r.ops, 10), strconv.FormatInt(r.errors, 10), f3(r.elapsed.Seconds()), f2(r.opsPerSec()),
			f3(quantileMs(r.hist, 50)), f3(quantileMs(r.hist, 99)), f3(quantileMs(r.hist, 99.9)),
			strconv.FormatInt(r.acked, 10), strconv.FormatInt(r.counted, 10), strconv.FormatBool(r.exact()),
		})
	}
	return writeCSV(filepath.Join(cfg.Out, "contention_"+cfg.Backend+"_trials.csv"), TrialColumns, rows)
}

// savePlot writes p as PNG and SVG next to each other, with the lab's chart layout
// (legend outside the data, package charts).
func savePlot(p *plot.Plot, w, h vg.Length, base string) error {
	if err := charts.SavePlot(p, w, h, base+".png", base+".svg"); err != nil {
		return fmt.Errorf("save %s: %w", base, err)
	}
	return nil
}

// plotContention draws median ops/s per case as bars, the min-max of the
// trials as error bars, and the ratio to append above each bar.
func plotContention(cfg Config, sums []caseSummary) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("One hot key, %d workers, pool %d (%s): median and min-max of %d trial(s)\n%% above a bar: its ratio to append (insert-only) in the same trial, median",
		cfg.Workers, cfg.Pool, cfg.Backend, cfg.Trials)
	p.Y.Label.Text = "increments/s"
	p.Y.Min = 0
	vals := make(plotter.Values, len(sums))
	names := make([]string, len(sums))
	xys := make(plotter.XYs, len(sums))
	errs := make(plotter.YErrors, len(sums))
	labels := make([]string, len(sums))
	top := 0.0
	for i, s := range sums {
		vals[i] = s.opsS
		names[i] = s.opts.String()
		xys[i] = plotter.XY{X: float64(i), Y: s.opsS}
		errs[i] = struct{ Low, High float64 }{s.opsS - s.opsSMin, s.opsSMax - s.opsS}
		top = max(top, s.opsSMax)
		if s.hasRatio {
			labels[i] = fmt.Sprintf("%.0f%%", 100*s.ratio)
		}
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(28))
	if err != nil {
		return err
	}
	bars.Color = charts.Color(0)
	bars.LineStyle.Width = 0
	eb, err := plotter.NewYErrorBars(struct {
		plotter.XYs
		plotter.YErrors
	}{xys, errs})
	if err != nil {
		return err
	}
	lxys := make(plotter.XYs, len(sums))
	for i := range sums {
		lxys[i] = plotter.XY{X: float64(i) - 0.15, Y: sums[i].opsSMax + top*0.02}
	}
	lab, err := plotter.NewLabels(plotter.XYLabels{XYs: lxys, Labels: labels})
	if err != nil {
		return err
	}
	p.Add(bars, eb, lab)
	p.Y.Max = top * 1.12
	p.NominalX(names...)
	// Half a category either side: gonum sizes the axis to the bar centres, which cut the
	// first and last bars in half.
	p.X.Min, p.X.Max = -0.5, float64(len(sums))-0.5
	p.X.Tick.Label.Rotation = math.Pi / 8
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YCenter
	return savePlot(p, 10*vg.Inch, 5.5*vg.Inch, filepath.Join(cfg.Out, "contention_"+cfg.Backend))
}

// readSeries is the read latency of one case at growing sizes.
type readSeries struct {
	opts   counters.Options
	points []readPoint
}

type readPoint struct {
	increments int64
	samples    int
	p50, p99   float64 // ms
	mean       float64 // ms
}

func writeReadCSV(cfg Config, series []readSeries) error {
	var rows [][]string
	for _, s := range series {
		b, by := bucketCols(s.opts)
		for _, pt := range s.points {
			rows = append(rows, []string{
				cfg.Backend, string(s.opts.Strategy), b, by, strconv.FormatInt(pt.increments, 10),
				strconv.Itoa(pt.samples), f3(pt.p50), f3(pt.p99), f3(pt.mean),
			})
		}
	}
	return writeCSV(filepath.Join(cfg.Out, "read_"+cfg.Backend+".csv"), ReadColumns, rows)
}

// plotRead draws read latency against increments, both on log scales: p50
// as solid lines, p99 dashed.
func plotRead(cfg Config, series []readSeries) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Reading one counter as it grows (%s)", cfg.Backend)
	p.X.Label.Text = "increments of the key"
	p.Y.Label.Text = "read latency, ms (solid p50, dashed p99)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	for i, s := range series {
		p50 := make(plotter.XYs, len(s.points))
		p99 := make(plotter.XYs, len(s.points))
		for j, pt := range s.points {
			// Log scales cannot show 0; the histogram resolution is 1 µs.
			p50[j] = plotter.XY{X: float64(pt.increments), Y: max(pt.p50, 0.001)}
			p99[j] = plotter.XY{X: float64(pt.increments), Y: max(pt.p99, 0.001)}
		}
		l50, pts, err := plotter.NewLinePoints(p50)
		if err != nil {
			return err
		}
		l99, err := plotter.NewLine(p99)
		if err != nil {
			return err
		}
		c := charts.Color(i)
		l50.Color, pts.Color, l99.Color = c, c, c
		pts.Shape = plotutil.Shape(i)
		l99.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l50, pts, l99)
		p.Legend.Add(s.opts.String(), l50, pts)
	}
	return savePlot(p, 8*vg.Inch, 5*vg.Inch, filepath.Join(cfg.Out, "read_"+cfg.Backend))
}
