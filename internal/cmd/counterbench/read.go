package counterbench

import (
	"context"
	"fmt"
	"io"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/shardlab/shardlab/counters"
)

// load adds n increments to key through the public API, in batches of at
// most counters.MaxBy and in at least minCalls calls (so that a bucketed key
// gets most of its buckets), with up to par calls in flight.
func load(ctx context.Context, c counters.Counter, key string, n int64, minCalls int64, par int) error {
	calls := max((n+counters.MaxBy-1)/counters.MaxBy, min(minCalls, n))
	by, extra := n/calls, n%calls
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(par)
	for i := range calls {
		inc := by
		if i < extra {
			inc++
		}
		g.Go(func() error { return c.Incr(gctx, key, inc) })
	}
	return g.Wait()
}

// runRead grows one key per case to each of cfg.ReadSizes and measures
// cfg.ReadSamples sequential reads at each size.
func runRead(ctx context.Context, cfg Config, tg target, stdout, stderr io.Writer) error {
	var series []readSeries
	for _, o := range cfg.ReadCases {
		s, err := readCase(ctx, cfg, tg, o, stderr)
		if err != nil {
			return err
		}
		series = append(series, s)
	}
	if err := writeReadCSV(cfg, series); err != nil {
		return err
	}
	if err := plotRead(cfg, series); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\n%s: read latency of one key, %d sequential reads per size\n\n", cfg.Backend, cfg.ReadSamples)
	fmt.Fprintln(stdout, "| strategy | increments | p50 ms | p99 ms | mean ms |")
	fmt.Fprintln(stdout, "|---|---:|---:|---:|---:|")
	for _, s := range series {
		for _, pt := range s.points {
			fmt.Fprintf(stdout, "| %s | %d | %.3f | %.3f | %.3f |\n", s.opts, pt.increments, pt.p50, pt.p99, pt.mean)
		}
	}
	return nil
}

func readCase(ctx context.Context, cfg Config, tg target, o counters.Options, stderr io.Writer) (s readSeries, err error) {
	s.opts = o
	c, err := tg.open(ctx, o)
	if err != nil {
		return s, fmt.Errorf("open %s: %w", o, err)
	}
	defer func() {
		if cerr := c.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	minCalls := int64(1)
	if o.Strategy == counters.StrategyBucket {
		minCalls = 3 * int64(o.Buckets)
	}
	var have int64
	for _, size := range cfg.ReadSizes {
		t0 := time.Now()
		if err := load(ctx, c, hotKey, size-have, minCalls, cfg.Pool); err != nil {
			return s, fmt.Errorf("%s: load to %d: %w", o, size, err)
		}
		have = size
		loaded := time.Since(t0)
		v, err := c.Get(ctx, hotKey)
		if err != nil {
			return s, fmt.Errorf("%s: read at %d: %w", o, size, err)
		}
		if v.Count != size {
			fmt.Fprintf(stderr, "counterbench: !!! %s: count %d != acknowledged increments %d !!!\n", o, v.Count, size)
			return s, fmt.Errorf("%w: %s read experiment counted %d, acknowledged %d", ErrNotExact, o, v.Count, size)
		}
		h := newHist()
		var sum time.Duration
		for range cfg.ReadSamples {
			t := time.Now()
			if _, err := c.Get(ctx, hotKey); err != nil {
				return s, fmt.Errorf("%s: read at %d: %w", o, size, err)
			}
			d := time.Since(t)
			sum += d
			_ = h.RecordValue(d.Microseconds())
		}
		pt := readPoint{
			increments: size, samples: cfg.ReadSamples,
			p50: quantileMs(h, 50), p99: quantileMs(h, 99),
			mean: sum.Seconds() * 1000 / float64(cfg.ReadSamples),
		}
		s.points = append(s.points, pt)
		fmt.Fprintf(stderr, "counterbench: read %-20s %9d increments (loaded in %s): p50 %.3f ms p99 %.3f ms\n",
			o, size, loaded.Round(time.Millisecond), pt.p50, pt.p99)
	}
	return s, nil
}
