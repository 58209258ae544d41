package netprobe

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Paced describes a latency run: one statement sent over one connection at a fixed
// pace, each one timed from the moment the pace meant to send it.
type Paced struct {
	// Query is the statement, in the extended protocol. When KeyMax > 0 it takes one
	// parameter, $1, an integer drawn uniformly from 1 to KeyMax for each send.
	Query  string
	KeyMax int64
	// N is how many sends are timed, after a few untimed ones.
	N int
	// Interval is the pace: send i is meant for start + i x Interval. Zero sends each
	// as soon as the last answer is in (a closed loop).
	Interval time.Duration
	// Seed seeds the keys, so that two runs draw the same ones.
	Seed uint64
}

// Latencies opens one connection to dsn and runs p. Each latency runs from the moment
// its send was scheduled to the end of its answer, so a slow answer that delays the
// sends after it is charged to them as well (the correction wrk2 makes for coordinated
// omission); a run that cannot keep the pace therefore shows it in its latencies.
func Latencies(ctx context.Context, dsn string, p Paced) ([]time.Duration, error) {
	if p.N < 1 {
		return nil, fmt.Errorf("netprobe: %d sends: want at least 1", p.N)
	}
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("netprobe: connect: %w", err)
	}
	defer conn.Close(context.Background())
	rng := rand.New(rand.NewPCG(p.Seed, p.Seed^0x9e3779b97f4a7c15))
	var key [1][]byte
	send := func() error {
		var args [][]byte
		if p.KeyMax > 0 {
			key[0] = strconv.AppendInt(key[0][:0], 1+rng.Int64N(p.KeyMax), 10)
			args = key[:]
		}
		_, err := conn.ExecParams(ctx, p.Query, args, nil, nil, nil).Close()
		return err
	}
	for range warmup {
		if err := send(); err != nil {
			return nil, fmt.Errorf("netprobe: %s: %w", p.Query, err)
		}
	}
	samples := make([]time.Duration, 0, p.N)
	start := time.Now()
	for i := range p.N {
		due := time.Now()
		if p.Interval > 0 {
			due = start.Add(time.Duration(i) * p.Interval)
			if wait := time.Until(due); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
		}
		if err := send(); err != nil {
			return nil, fmt.Errorf("netprobe: %s: %w", p.Query, err)
		}
		samples = append(samples, time.Since(due))
	}
	return samples, nil
}

// Quantile returns the nearest-rank q-quantile of samples (0 < q <= 1): the smallest
// sample at or below which at least q of them lie. samples must be sorted.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(rank, len(sorted)-1))]
}

// SlowestOf returns the nearest-rank q-quantile of the slowest of independent draws,
// one from each of sets: the latency of a statement that waits for every one of
// len(sets) servers, when each answers as its own samples did and they do not depend on
// each other. It is exact for the samples' empirical distributions: the distribution
// of the slowest is the product of theirs, P(max <= t) = F1(t) x F2(t) x ... Each set
// must be sorted and non-empty.
func SlowestOf(sets [][]time.Duration, q float64) (time.Duration, error) {
	if len(sets) == 0 {
		return 0, ErrNoSamples
	}
	var all []time.Duration
	for _, s := range sets {
		if len(s) == 0 {
			return 0, ErrNoSamples
		}
		if !slices.IsSorted(s) {
			return 0, errors.New("netprobe: SlowestOf needs sorted samples")
		}
		all = append(all, s...)
	}
	slices.Sort(all)
	all = slices.Compact(all)
	cdf := func(t time.Duration) float64 {
		p := 1.0
		for _, s := range sets {
			n, _ := slices.BinarySearch(s, t+1) // samples <= t
			p *= float64(n) / float64(len(s))
		}
		return p
	}
	// The product is non-decreasing in t: the answer is the first value where it
	// reaches q. A hair of tolerance keeps q = 1 reachable despite rounding.
	i, _ := slices.BinarySearchFunc(all, q, func(t time.Duration, q float64) int {
		if cdf(t) >= q-1e-12 {
			return 1
		}
		return -1
	})
	return all[min(i, len(all)-1)], nil
}
