package routerbench

import (
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/shardlab/shardlab/lab/charts"
	"github.com/shardlab/shardlab/lab/report"
)

// Summary is one configuration's result for one operation, over the trials.
type Summary struct {
	Config, Operation string
	Median            float64         // ops/s
	CI                report.Interval // of the median
	Ratio             float64         // median of per-trial ratios to the baseline
	RatioCI           report.Interval
	Test              report.Test // against the baseline's trials
	Trials            int
	P50, P95, P99     float64 // ms: medians over trials of each trial's percentile
}

func summarize(ms []Measurement, baseline string) []Summary {
	by := map[[2]string][]Measurement{}
	var keys [][2]string
	for _, m := range ms {
		k := [2]string{m.Config, m.Operation}
		if _, ok := by[k]; !ok {
			keys = append(keys, k)
		}
		by[k] = append(by[k], m)
	}
	var out []Summary
	for _, k := range keys {
		trials := by[k]
		base := by[[2]string{baseline, k[1]}]
		var xs, bs, ratios []float64
		var p50, p95, p99 []float64
		for _, t := range trials {
			xs = append(xs, t.OpsPerSec)
			p50, p95, p99 = append(p50, t.P50), append(p95, t.P95), append(p99, t.P99)
		}
		byTrial := map[int]float64{}
		for _, b := range base {
			bs = append(bs, b.OpsPerSec)
			byTrial[b.Trial] = b.OpsPerSec
		}
		for _, t := range trials {
			if b, ok := byTrial[t.Trial]; ok && b > 0 {
				ratios = append(ratios, t.OpsPerSec/b)
			}
		}
		s := Summary{Config: k[0], Operation: k[1], Median: report.Median(xs), CI: report.MedianCI(xs), Trials: len(xs),
			P50: report.Median(p50), P95: report.Median(p95), P99: report.Median(p99)}
		if len(ratios) > 0 {
			s.Ratio = report.Median(ratios)
			s.RatioCI = report.RatioCI(ratios)
		}
		if k[0] != baseline {
			s.Test = report.UTest(bs, xs)
		}
		out = append(out, s)
	}
	return out
}

func writeOutputs(cfg Config, ms []Measurement) error {
	if err := writeCSV(filepath.Join(cfg.Out, "trials.csv"),
		[]string{"experiment", "backend", "config", "operation", "trial", "ops_s", "p50_ms", "p95_ms", "p99_ms", "errors"},
		func(w func(...string)) {
			for _, m := range ms {
				w(cfg.Experiment, cfg.Backend, m.Config, m.Operation, strconv.Itoa(m.Trial), f1(m.OpsPerSec),
					f3(m.P50), f3(m.P95), f3(m.P99), strconv.FormatInt(m.Errors, 10))
			}
		}); err != nil {
		return err
	}
	sums := summarize(ms, "direct-1db-1t")
	switch cfg.Experiment {
	case ExperimentOverhead:
		err := writeCSV(filepath.Join(cfg.Out, "overhead.csv"),
			[]string{"operation", "direct_ops_s", "router_ops_s", "overhead_pct", "overhead_ci_lo_pct", "overhead_ci_hi_pct", "p_value", "trials"},
			func(w func(...string)) {
				for _, op := range Operations() {
					d, r := find(sums, "direct-1db-1t", op), find(sums, "router-1db-1t", op)
					lo, hi := "", ""
					if r.RatioCI.OK {
						lo, hi = f2(100*(1-r.RatioCI.Hi)), f2(100*(1-r.RatioCI.Lo))
					}
					w(op, f1(d.Median), f1(r.Median), f2(100*(1-r.Ratio)), lo, hi, f4(r.Test.P), strconv.Itoa(r.Trials))
				}
			})
		if err != nil {
			return err
		}
	case ExperimentLimit:
		err := writeCSV(filepath.Join(cfg.Out, "limit.csv"),
			[]string{"config", "operation", "ops_s", "ratio_vs_direct_1db_1t", "ratio_ci_lo", "ratio_ci_hi", "p_value", "trials"},
			func(w func(...string)) {
				for _, s := range sums {
					lo, hi := "", ""
					if s.RatioCI.OK {
						lo, hi = f3(s.RatioCI.Lo), f3(s.RatioCI.Hi)
					}
					w(s.Config, s.Operation, f1(s.Median), f3(s.Ratio), lo, hi, f4(s.Test.P), strconv.Itoa(s.Trials))
				}
			})
		if err != nil {
			return err
		}
	}
	if err := chart(cfg, sums); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(cfg.Out, "report.md"), []byte(markdown(cfg, sums)), 0o644)
}

func find(sums []Summary, config, op string) Summary {
	for _, s := range sums {
		if s.Config == config && s.Operation == op {
			return s
		}
	}
	return Summary{}
}

func writeCSV(path string, header []string, rows func(func(...string))) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	w.Write(header)
	rows(func(rec ...string) { w.Write(rec) })
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func f1(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }
func f2(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }
func f3(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) }
func f4(x float64) string { return strconv.FormatFloat(x, 'f', 4, 64) }

// chart draws the median throughput of every configuration, grouped by operation, with
// the confidence interval of each median.
func chart(cfg Config, sums []Summary) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("seed 004, %s experiment (%s, %d workers, %d trials)", cfg.Experiment, cfg.Backend, cfg.Concurrency, cfg.Trials)
	p.Y.Label.Text = "operations per second (median)"
	p.Y.Min = 0
	var configs []string
	for _, s := range sums {
		if !slices.Contains(configs, s.Config) {
			configs = append(configs, s.Config)
		}
	}
	ops := Operations()
	w := vg.Points(60 / float64(len(configs)))
	for i, c := range configs {
		vals := make(plotter.Values, len(ops))
		for j, op := range ops {
			vals[j] = find(sums, c, op).Median
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = charts.Color(i)
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(float64(i)-float64(len(configs)-1)/2)
		p.Add(bars)
		p.Legend.Add(c, bars)
	}
	p.NominalX(ops...)
	return charts.SavePlot(p, 7*vg.Inch, 4*vg.Inch,
		filepath.Join(cfg.Out, cfg.Experiment+".png"), filepath.Join(cfg.Out, cfg.Experiment+".svg"))
}

// markdown writes the run's report, generated from the measurements only.
func markdown(cfg Config, sums []Summary) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# seed 004 with shardlab's database/sql driver: the %s experiment\n\n", cfg.Experiment)
	fmt.Fprintf(&b, "Generated by `routerbench` on %s from the measurements in `trials.csv`.\n\n", time.Now().UTC().Format(time.RFC3339))
	info := readRunInfo(cfg)
	command := strings.Join(os.Args, " ")
	if info != nil && info.Command != "" {
		command = info.Command
	}
	fmt.Fprintf(&b, "- Command: `%s`\n", command)
	loop := "closed loop (each worker sends its next request when the last is answered: throughput at saturation)"
	if cfg.Rate > 0 {
		loop = fmt.Sprintf("open loop at %.0f requests/s (%s arrivals; latency timed from when each request should have started, so a stall is not hidden)", cfg.Rate, cfg.Arrival)
	}
	fmt.Fprintf(&b, "- Backend: %s; %d workers, %s; %v per measurement after %v of warm-up; %d interleaved trials (the order of the configurations alternates from trial to trial); %d orders loaded first.\n",
		cfg.Backend, cfg.Concurrency, loop, cfg.Duration, cfg.Warmup, cfg.Trials, cfg.Orders)
	loadStart := "unknown"
	if info != nil && len(info.LoadStart) == 3 {
		loadStart = fmt.Sprintf("%.2f %.2f %.2f", info.LoadStart[0], info.LoadStart[1], info.LoadStart[2])
	}
	fmt.Fprintf(&b, "- Machine: %s/%s, %d CPUs (%s), Go %s; load average at the start %s, at the end %s.\n\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), cpuModel(), runtime.Version(), loadStart, loadavg())
	if why := info.BusyReasons(); len(why) > 0 {
		fmt.Fprintf(&b, "> **Warning: the machine was busy** (%s). Other work shared the cores with this run; paired ratios are less affected than the absolute rates, but treat small differences with care.\n\n", strings.Join(why, "; "))
	}
	b.WriteString("Adaptations of the seed: the select joins the item table on the shared sharding key (the seed joins on `a.id%100=b.idm%100`, which spans shards), and the benchmark makes the 64-bit order ids itself, seeded (the seed's AUTO_INCREMENT ids would collide across shards).\n\n")
	switch cfg.Experiment {
	case ExperimentOverhead:
		b.WriteString("Plain database/sql (pgx's driver, or the SQLite driver) on one database and one table, against shardlab's driver on the same database and table through a one-shard rule. Overhead = 1 - the median of the per-trial ratios router/direct (trials are paired: the two ran side by side), so that a slow spell on the machine hits both sides of a ratio; the interval is a bootstrap over those ratios.\n\n")
		b.WriteString("| operation | direct ops/s (95% CI) | router ops/s (95% CI) | overhead | overhead 95% CI | Mann-Whitney p |\n|---|---|---|---|---|---|\n")
		for _, op := range Operations() {
			d, r := find(sums, "direct-1db-1t", op), find(sums, "router-1db-1t", op)
			ci := "too few trials"
			if r.RatioCI.OK {
				ci = fmt.Sprintf("%.1f%% .. %.1f%%", 100*(1-r.RatioCI.Hi), 100*(1-r.RatioCI.Lo))
			}
			fmt.Fprintf(&b, "| %s | %.0f %s | %.0f %s | %.1f%% | %s | %.3f |\n", op, d.Median, interval(d.CI), r.Median, interval(r.CI),
				100*(1-r.Ratio), ci, r.Test.P)
		}
		b.WriteString("\n")
		for _, op := range Operations() {
			r := find(sums, "router-1db-1t", op)
			fmt.Fprintf(&b, "- %s: %s\n", op, verdict(r))
		}
	case ExperimentLimit:
		b.WriteString("Throughput at saturation of each configuration, against plain database/sql on one database with one table (ratio of medians of paired trials).\n\n")
		b.WriteString("| configuration | operation | ops/s (95% CI) | vs direct-1db-1t | ratio 95% CI | Mann-Whitney p |\n|---|---|---|---|---|---|\n")
		for _, s := range sums {
			ci := "-"
			if s.RatioCI.OK {
				ci = fmt.Sprintf("%.2fx .. %.2fx", s.RatioCI.Lo, s.RatioCI.Hi)
			}
			p := "-"
			if s.Config != "direct-1db-1t" {
				p = fmt.Sprintf("%.3f", s.Test.P)
			}
			fmt.Fprintf(&b, "| %s | %s | %.0f %s | %.2fx | %s | %s |\n", s.Config, s.Operation, s.Median, interval(s.CI), s.Ratio, ci, p)
		}
		b.WriteString("\n")
		for _, s := range sums {
			if s.Config != "direct-1db-1t" {
				fmt.Fprintf(&b, "- %s %s: %s\n", s.Config, s.Operation, verdict(s))
			}
		}
	}
	if cfg.Rate > 0 {
		for _, s := range sums {
			if s.Median < 0.95*cfg.Rate {
				fmt.Fprintf(&b, "\n**%s %s did not reach the target rate**: %.0f of %.0f requests/s (median); its latencies include the queueing.\n", s.Config, s.Operation, s.Median, cfg.Rate)
			}
		}
	}
	b.WriteString("\nLatency (HDR histograms; the median over trials of each trial's percentile):\n\n| configuration | operation | p50 ms | p95 ms | p99 ms |\n|---|---|---|---|---|\n")
	for _, s := range sums {
		fmt.Fprintf(&b, "| %s | %s | %.3f | %.3f | %.3f |\n", s.Config, s.Operation, s.P50, s.P95, s.P99)
	}
	fmt.Fprintf(&b, "\n![chart](%s.png)\n", cfg.Experiment)
	return b.String()
}

func interval(i report.Interval) string {
	if !i.OK {
		return "(too few trials for a CI)"
	}
	return fmt.Sprintf("(%.0f..%.0f)", i.Lo, i.Hi)
}

// verdict says whether the configuration differs from the baseline, in the report's
// words.
func verdict(s Summary) string {
	switch {
	case !s.Test.Possible():
		return fmt.Sprintf("too few trials to tell (%d against %d: the smallest possible p is %.3f)", s.Test.N1, s.Test.N2, s.Test.MinP)
	case !s.Test.Significant():
		return fmt.Sprintf("no clear difference (p = %.3f, median ratio %.3fx)", s.Test.P, s.Ratio)
	case s.Ratio < 1:
		return fmt.Sprintf("slower: %.3fx (p = %.3f)", s.Ratio, s.Test.P)
	default:
		return fmt.Sprintf("faster: %.3fx (p = %.3f)", s.Ratio, s.Test.P)
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
