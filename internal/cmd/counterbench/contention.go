package counterbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"golang.org/x/sync/errgroup"

	"github.com/shardlab/shardlab/counters"
)

// hotKey is the one key every worker increments.
const hotKey = "192.168.0.1"

// runResult is one measured run of one case.
type runResult struct {
	opts    counters.Options
	trial   int
	ops     int64 // acknowledged increments in the measured phase
	errors  int64 // failed increments in the measured phase
	elapsed time.Duration
	hist    *hdrhistogram.Histogram // latency of successful increments, µs
	acked   int64                   // acknowledged increments, warm-up included
	counted int64                   // what Get returned afterwards
}

func (r runResult) opsPerSec() float64 { return float64(r.ops) / r.elapsed.Seconds() }
func (r runResult) exact() bool        { return r.counted == r.acked }

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, 60_000_000, 3) }

func quantileMs(h *hdrhistogram.Histogram, q float64) float64 {
	return float64(h.ValueAtQuantile(q)) / 1000
}

// phase is one loop of all workers over the counter.
type phase struct {
	ops, errors int64
	elapsed     time.Duration
	hist        *hdrhistogram.Histogram
}

// hammer runs cfg.Workers goroutines that increment hotKey by 1 until ops
// increments have been started (if ops > 0) or d has passed (if d > 0).
// An increment in flight when time runs out is allowed to finish, so that
// every increment is either acknowledged or counted as an error.
func hammer(ctx context.Context, c counters.Counter, workers int, ops int64, d time.Duration) (phase, error) {
	var budget atomic.Int64
	budget.Store(ops)
	start := time.Now()
	deadline := start.Add(d)
	hists := make([]*hdrhistogram.Histogram, workers)
	var acked, failed atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for w := range workers {
		hists[w] = newHist()
		g.Go(func() error {
			h := hists[w]
			for gctx.Err() == nil {
				if ops > 0 && budget.Add(-1) < 0 {
					return nil
				}
				t0 := time.Now()
				if d > 0 && !t0.Before(deadline) {
					return nil
				}
				// A parent cancellation (Ctrl-C) aborts the statement; the
				// run is then discarded, so its exactness does not matter.
				if err := c.Incr(gctx, hotKey, 1); err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					if failed.Add(1) > 100 {
						return fmt.Errorf("more than 100 failed increments, the last: %w", err)
					}
					continue
				}
				_ = h.RecordValue(time.Since(t0).Microseconds())
				acked.Add(1)
			}
			return gctx.Err()
		})
	}
	err := g.Wait()
	p := phase{ops: acked.Load(), errors: failed.Load(), elapsed: time.Since(start), hist: newHist()}
	for _, h := range hists {
		p.hist.Merge(h)
	}
	return p, err
}

// runCase opens fresh tables for o, warms up, measures, and checks that the
// count is exact.
func runCase(ctx context.Context, cfg Config, tg target, o counters.Options, trial int) (res runResult, err error) {
	c, err := tg.open(ctx, o)
	if err != nil {
		return res, fmt.Errorf("open %s: %w", o, err)
	}
	defer func() {
		if cerr := c.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	res = runResult{opts: o, trial: trial}
	if cfg.Warmup > 0 {
		w, err := hammer(ctx, c, cfg.Workers, 0, cfg.Warmup)
		if err != nil {
			return res, fmt.Errorf("%s warm-up: %w", o, err)
		}
		res.acked += w.ops
	}
	m, err := hammer(ctx, c, cfg.Workers, cfg.Ops, cfg.Duration)
	if err != nil {
		return res, fmt.Errorf("%s: %w", o, err)
	}
	res.acked += m.ops
	res.ops, res.errors, res.elapsed, res.hist = m.ops, m.errors, m.elapsed, m.hist
	v, err := c.Get(ctx, hotKey)
	switch {
	case errors.Is(err, counters.ErrNotFound):
		res.counted = 0
	case err != nil:
		return res, fmt.Errorf("%s: read back: %w", o, err)
	default:
		res.counted = v.Count
	}
	return res, nil
}

// caseSummary aggregates the trials of one case.
type caseSummary struct {
	opts                      counters.Options
	trials                    int
	ops                       int64 // median per trial
	opsS, opsSMin, opsSMax    float64
	p50, p99                  float64 // median over trials, ms
	ratio, ratioMin, ratioMax float64 // ops/s over append's ops/s in the same trial; NaN without append
	exact                     bool
	errors                    int64
	hasRatio                  bool
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func summarize(cases []counters.Options, runs []runResult) []caseSummary {
	// append's ops/s per trial, the denominator of every ratio.
	appendOps := map[int]float64{}
	for _, r := range runs {
		if r.opts.Strategy == counters.StrategyAppend {
			appendOps[r.trial] = r.opsPerSec()
		}
	}
	out := make([]caseSummary, 0, len(cases))
	for _, o := range cases {
		s := caseSummary{opts: o, exact: true}
		var opsS, p50, p99, ratios, ops []float64
		for _, r := range runs {
			if r.opts != o {
				continue
			}
			s.trials++
			ops = append(ops, float64(r.ops))
			opsS = append(opsS, r.opsPerSec())
			p50 = append(p50, quantileMs(r.hist, 50))
			p99 = append(p99, quantileMs(r.hist, 99))
			if a, ok := appendOps[r.trial]; ok && a > 0 {
				ratios = append(ratios, r.opsPerSec()/a)
			}
			s.exact = s.exact && r.exact()
			s.errors += r.errors
		}
		if s.trials == 0 {
			continue
		}
		s.ops = int64(median(ops))
		s.opsS, s.opsSMin, s.opsSMax = median(opsS), slices.Min(opsS), slices.Max(opsS)
		s.p50, s.p99 = median(p50), median(p99)
		if len(ratios) > 0 {
			s.hasRatio = true
			s.ratio, s.ratioMin, s.ratioMax = median(ratios), slices.Min(ratios), slices.Max(ratios)
		}
		out = append(out, s)
	}
	return out
}

// rotate returns cases starting at index k, so that each trial runs the
// cases in a different order and none is always first or last.
func rotate(cases []counters.Options, k int) []counters.Options {
	k %= len(cases)
	return append(slices.Clone(cases[k:]), cases[:k]...)
}

func runContention(ctx context.Context, cfg Config, tg target, stdout, stderr io.Writer) error {
	var runs []runResult
	var inexact []string
	total := cfg.Trials * len(cfg.Cases)
	for trial := 1; trial <= cfg.Trials; trial++ {
		for _, o := range rotate(cfg.Cases, trial-1) {
			r, err := runCase(ctx, cfg, tg, o, trial)
			if err != nil {
				return err
			}
			runs = append(runs, r)
			status := "exact"
			if !r.exact() {
				status = fmt.Sprintf("NOT EXACT: counted %d, acknowledged %d", r.counted, r.acked)
				inexact = append(inexact, fmt.Sprintf("%s trial %d: %s", o, trial, status))
				fmt.Fprintf(stderr, "counterbench: !!! %s trial %d: count %d != acknowledged increments %d !!!\n", o, trial, r.counted, r.acked)
			}
			fmt.Fprintf(stderr, "counterbench: [%d/%d] trial %d %-20s %8d ops %9.0f ops/s p50 %.2f ms p99 %.2f ms errors %d, %s\n",
				len(runs), total, trial, o, r.ops, r.opsPerSec(), quantileMs(r.hist, 50), quantileMs(r.hist, 99), r.errors, status)
		}
	}
	sums := summarize(cfg.Cases, runs)
	if err := writeContentionCSV(cfg, runs, sums); err != nil {
		return err
	}
	if err := plotContention(cfg, sums); err != nil {
		return err
	}
	printContention(stdout, cfg, sums)
	if len(inexact) > 0 {
		return fmt.Errorf("%w: %q", ErrNotExact, inexact)
	}
	return nil
}

func printContention(w io.Writer, cfg Config, sums []caseSummary) {
	fmt.Fprintf(w, "\n%s: %d workers, pool %d, %d trial(s), median [min-max]\n\n", cfg.Backend, cfg.Workers, cfg.Pool, cfg.Trials)
	fmt.Fprintln(w, "| strategy | buckets | bucket_by | ops/s | p50 ms | p99 ms | vs append | exact |")
	fmt.Fprintln(w, "|---|---:|---|---:|---:|---:|---:|---|")
	for _, s := range sums {
		ratio := "-"
		if s.hasRatio {
			ratio = fmt.Sprintf("%.0f%% [%.0f-%.0f]", 100*s.ratio, 100*s.ratioMin, 100*s.ratioMax)
		}
		exact := "yes"
		if !s.exact {
			exact = "**NO**"
		}
		b, by := bucketCols(s.opts)
		fmt.Fprintf(w, "| %s | %s | %s | %.0f [%.0f-%.0f] | %.2f | %.2f | %s | %s |\n",
			s.opts.Strategy, b, by, s.opsS, s.opsSMin, s.opsSMax, s.p50, s.p99, ratio, exact)
	}
}

func bucketCols(o counters.Options) (string, string) {
	if o.Strategy != counters.StrategyBucket {
		return "", ""
	}
	return fmt.Sprint(o.Buckets), string(o.BucketBy)
}
