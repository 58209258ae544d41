package netprobe_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/lab/netprobe"
)

func TestQuantile(t *testing.T) {
	s := []time.Duration{ms(1), ms(2), ms(3), ms(4), ms(5), ms(6), ms(7), ms(8), ms(9), ms(10)}
	for _, tt := range []struct {
		q    float64
		want time.Duration
	}{{0.5, ms(5)}, {0.55, ms(6)}, {0.99, ms(10)}, {1, ms(10)}, {0.01, ms(1)}} {
		if got := netprobe.Quantile(s, tt.q); got != tt.want {
			t.Errorf("Quantile(%v) = %v, want %v", tt.q, got, tt.want)
		}
	}
}

// TestSlowestOf checks the model against cases worked by hand and against the slowest of
// random draws.
func TestSlowestOf(t *testing.T) {
	one := []time.Duration{ms(1), ms(2), ms(3), ms(4)}
	// One server: its own quantiles.
	for _, q := range []float64{0.25, 0.5, 0.75, 1} {
		got, err := netprobe.SlowestOf([][]time.Duration{one}, q)
		if err != nil || got != netprobe.Quantile(one, q) {
			t.Errorf("SlowestOf(one, %v) = %v, %v; want %v", q, got, err, netprobe.Quantile(one, q))
		}
	}
	// Two such servers: P(max <= t) = (t/4)^2 for t = 1..4 ms, so the median is 3 ms
	// (9/16 >= 0.5 > 4/16) and the 0.25-quantile 2 ms (4/16).
	for _, tt := range []struct {
		q    float64
		want time.Duration
	}{{0.25, ms(2)}, {0.5, ms(3)}, {0.57, ms(4)}, {1, ms(4)}} {
		got, err := netprobe.SlowestOf([][]time.Duration{one, one}, tt.q)
		if err != nil || got != tt.want {
			t.Errorf("SlowestOf(two, %v) = %v, %v; want %v", tt.q, got, err, tt.want)
		}
	}
	// A slow server dominates: every draw of the other is faster.
	slow := []time.Duration{ms(10), ms(20)}
	if got, _ := netprobe.SlowestOf([][]time.Duration{one, slow}, 0.5); got != ms(10) {
		t.Errorf("SlowestOf(one, slow, 0.5) = %v, want 10ms", got)
	}
	if _, err := netprobe.SlowestOf([][]time.Duration{one, {ms(2), ms(1)}}, 0.5); err == nil {
		t.Errorf("SlowestOf took unsorted samples")
	}
	if _, err := netprobe.SlowestOf([][]time.Duration{one, nil}, 0.5); err == nil {
		t.Errorf("SlowestOf took an empty set")
	}

	// Against simulation: eight servers with exponential-ish samples; the slowest of a
	// draw from each, many times over, has about the model's quantiles.
	rng := rand.New(rand.NewPCG(1, 2))
	sets := make([][]time.Duration, 8)
	for i := range sets {
		for range 2000 {
			sets[i] = append(sets[i], time.Duration((1+rng.ExpFloat64())*float64(time.Millisecond)))
		}
		slices.Sort(sets[i])
	}
	var sim []time.Duration
	for range 200000 {
		var m time.Duration
		for _, s := range sets {
			m = max(m, s[rng.IntN(len(s))])
		}
		sim = append(sim, m)
	}
	slices.Sort(sim)
	for _, q := range []float64{0.5, 0.9, 0.99} {
		model, err := netprobe.SlowestOf(sets, q)
		if err != nil {
			t.Fatal(err)
		}
		got := netprobe.Quantile(sim, q)
		if d := float64(model-got) / float64(got); d < -0.03 || d > 0.03 {
			t.Errorf("q=%v: model %v, simulation %v", q, model, got)
		}
	}
}

func TestLatencies(t *testing.T) {
	dsn := pgtest.DSN(t)
	ctx := context.Background()
	_, err := netprobe.Latencies(ctx, dsn, netprobe.Paced{Query: "SELECT $1::int", KeyMax: 10, N: 0})
	if err == nil {
		t.Errorf("Latencies took N = 0")
	}
	samples, err := netprobe.Latencies(ctx, dsn, netprobe.Paced{Query: "SELECT $1::int", KeyMax: 10, N: 50, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != 50 {
		t.Fatalf("%d samples, want 50", len(samples))
	}
	// A statement slower than the pace: the sends behind it are late, and their
	// latencies say so (each counted from when it was due, not when it went).
	samples, err = netprobe.Latencies(ctx, dsn, netprobe.Paced{Query: "SELECT pg_sleep(0.02)", N: 10, Interval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if last := samples[len(samples)-1]; last < 100*time.Millisecond {
		t.Errorf("the tenth of ten 20 ms statements paced 5 ms apart took %v from when it was due; want at least 100 ms (the queue behind the slow ones)", last)
	}
	if _, err := netprobe.Latencies(ctx, dsn, netprobe.Paced{Query: "SELECT nonsense", N: 1}); err == nil {
		t.Errorf("a failing statement gave no error")
	}
}
