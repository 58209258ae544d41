package loadgen_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardlab/shardlab/lab/loadgen"
)

// draw returns how often each key index came up in samples draws.
func draw(t *testing.T, dist string, n, samples int) []int {
	t.Helper()
	kc, err := loadgen.NewKeyChooser(dist, n)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	counts := make([]int, n)
	for range samples {
		k := kc.Next(rng)
		if k < 0 || k >= n {
			t.Fatalf("%s over %d keys drew %d", dist, n, k)
		}
		counts[k]++
	}
	return counts
}

func TestUniformCoversTheRange(t *testing.T) {
	const n, samples = 100, 100_000
	counts := draw(t, loadgen.DistUniform, n, samples)
	for k, c := range counts {
		// Expected 1000 per key with a standard deviation of about 31.
		if c < 800 || c > 1200 {
			t.Errorf("key %d drawn %d times, want about %d", k, c, samples/n)
		}
	}
}

func TestZipfianIsSkewedAsTheFormulaSays(t *testing.T) {
	const n, samples = 1000, 200_000
	theta := loadgen.ZipfianConstant
	zeta := 0.0
	for i := 1; i <= n; i++ {
		zeta += 1 / math.Pow(float64(i), theta)
	}
	// P(rank i) = (1/(i+1)^theta) / zeta(n, theta).
	want := func(rank int) float64 { return 1 / math.Pow(float64(rank+1), theta) / zeta }
	counts := draw(t, loadgen.DistZipfian, n, samples)
	share := func(k int) float64 { return float64(counts[k]) / samples }

	for _, rank := range []int{0, 1, 2, 9} {
		if got, w := share(rank), want(rank); math.Abs(got-w) > 0.25*w {
			t.Errorf("rank %d gets %.4f of the draws, formula says %.4f", rank, got, w)
		}
	}
	if share(0) < 0.10 {
		t.Errorf("rank 0 gets only %.3f of the draws; zipfian(0.99) over 1000 keys gives it about %.3f", share(0), want(0))
	}
	top10, bottomHalf := 0, 0
	for k, c := range counts {
		if k < 10 {
			top10 += c
		}
		if k >= n/2 {
			bottomHalf += c
		}
	}
	wantTop10 := 0.0
	for k := range 10 {
		wantTop10 += want(k)
	}
	if got := float64(top10) / samples; math.Abs(got-wantTop10) > 0.15*wantTop10 || got < 0.3 {
		t.Errorf("top 1%% of keys get %.3f of the draws, formula says %.3f", got, wantTop10)
	}
	if got := float64(bottomHalf) / samples; got > 0.15 {
		t.Errorf("the less popular half of the keys gets %.3f of the draws; that is not heavily skewed", got)
	}
}

func TestHotspotSends80PercentToTheFirst20Percent(t *testing.T) {
	const n, samples = 1000, 100_000
	counts := draw(t, loadgen.DistHotspot, n, samples)
	hot, coldSeen := 0, 0
	for k, c := range counts {
		if k < n/5 {
			hot += c
		} else if c > 0 {
			coldSeen++
		}
	}
	if share := float64(hot) / samples; share < 0.78 || share > 0.82 {
		t.Errorf("the first 20%% of the keys get %.3f of the draws, want 0.80", share)
	}
	if coldSeen < n*4/5-5 {
		t.Errorf("only %d of the %d cold keys were ever drawn", coldSeen, n*4/5)
	}
}

func TestNewKeyChooserEdges(t *testing.T) {
	for _, dist := range loadgen.Dists() {
		counts := draw(t, dist, 1, 100)
		if counts[0] != 100 {
			t.Errorf("%s over one key: %v", dist, counts)
		}
		counts = draw(t, dist, 2, 1000)
		if counts[0] == 0 || counts[1] == 0 {
			t.Errorf("%s over two keys never drew one of them: %v", dist, counts)
		}
		if _, err := loadgen.NewKeyChooser(dist, 0); err == nil {
			t.Errorf("%s over 0 keys accepted", dist)
		}
	}
	if _, err := loadgen.NewKeyChooser("pareto", 10); err == nil {
		t.Error("unknown distribution accepted")
	}
}

func validConfig() loadgen.Config {
	return loadgen.Config{Target: "http://127.0.0.1:1", Ops: 10, Concurrency: 1, WriteRatio: 0.5, Keys: 10}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *loadgen.Config)
	}{
		{"empty target", func(c *loadgen.Config) { c.Target = "" }},
		{"ftp target", func(c *loadgen.Config) { c.Target = "ftp://127.0.0.1" }},
		{"target without host", func(c *loadgen.Config) { c.Target = "http://" }},
		{"target without scheme", func(c *loadgen.Config) { c.Target = "127.0.0.1:8080" }},
		{"negative duration", func(c *loadgen.Config) { c.Duration = -time.Second }},
		{"no ops and no duration", func(c *loadgen.Config) { c.Ops = 0 }},
		{"negative ops", func(c *loadgen.Config) { c.Ops = -1 }},
		{"zero concurrency", func(c *loadgen.Config) { c.Concurrency = 0 }},
		{"too much concurrency", func(c *loadgen.Config) { c.Concurrency = 10001 }},
		{"negative write ratio", func(c *loadgen.Config) { c.WriteRatio = -0.1 }},
		{"write ratio over 1", func(c *loadgen.Config) { c.WriteRatio = 1.01 }},
		{"NaN write ratio", func(c *loadgen.Config) { c.WriteRatio = math.NaN() }},
		{"zero keys", func(c *loadgen.Config) { c.Keys = 0 }},
		{"unknown distribution", func(c *loadgen.Config) { c.Dist = "pareto" }},
		{"negative warmup", func(c *loadgen.Config) { c.Warmup = -time.Second }},
		{"negative data size", func(c *loadgen.Config) { c.DataSize = -1 }},
		{"data size over the server's limit", func(c *loadgen.Config) { c.DataSize = 60001 }},
		{"negative rate", func(c *loadgen.Config) { c.Rate = -1 }},
		{"NaN rate", func(c *loadgen.Config) { c.Rate = math.NaN() }},
		{"infinite rate", func(c *loadgen.Config) { c.Rate = math.Inf(1) }},
		{"unknown arrival", func(c *loadgen.Config) { c.Arrival = "burst" }},
		{"negative timeout", func(c *loadgen.Config) { c.Timeout = -time.Second }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.change(&c)
			if err := c.Validate(); !errors.Is(err, loadgen.ErrBadConfig) {
				t.Errorf("Validate = %v, want ErrBadConfig", err)
			}
			if _, err := loadgen.Run(context.Background(), c); !errors.Is(err, loadgen.ErrBadConfig) {
				t.Errorf("Run = %v, want ErrBadConfig", err)
			}
		})
	}

	c := validConfig()
	c.Target = "http://127.0.0.1:1/"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Target != "http://127.0.0.1:1" || c.Dist != loadgen.DistUniform || c.DataSize != 100 ||
		c.Arrival != loadgen.ArrivalConstant || c.Timeout != 30*time.Second {
		t.Errorf("defaults not filled in: %+v", c)
	}
}

// fakeAPI answers /insert and /get like the demo-server, from a map, and counts what it saw.
type fakeAPI struct {
	mu                          sync.Mutex
	data                        map[string]string
	inserts, gets, hits, misses int
	failWrites                  bool
}

func newFakeAPI(t *testing.T) (*fakeAPI, string) {
	f := &fakeAPI{data: map[string]string{}}
	ts := httptest.NewServer(f)
	t.Cleanup(ts.Close)
	return f, ts.URL
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/insert":
		f.inserts++
		if f.failWrites {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"shard 0 unavailable"}`))
			return
		}
		var req struct {
			UserID string `json:"user_id"`
			Data   string `json:"data"`
		}
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&req) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		f.data[req.UserID] = req.Data
		w.Write([]byte(`{"status":"stored"}`))
	case "/get":
		f.gets++
		v, ok := f.data[r.URL.Query().Get("user_id")]
		if !ok {
			f.misses++
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":"user_id not found"}`))
			return
		}
		f.hits++
		json.NewEncoder(w).Encode(map[string]string{"data": v})
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func TestClosedLoopCountsExactly(t *testing.T) {
	api, url := newFakeAPI(t)
	var outcomes atomic.Int64
	res, err := loadgen.Run(context.Background(), loadgen.Config{
		Target: url, Ops: 1500, Concurrency: 6, WriteRatio: 0.4, Keys: 300, Seed: 3, DataSize: 40,
		OnResult: func(o loadgen.Outcome) {
			outcomes.Add(1)
			if o.Write && (len(o.Data) != 40 || !strings.HasPrefix(o.Data, o.Key+":")) {
				t.Errorf("write of %q carries %q", o.Key, o.Data)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	if res.Ops != 1500 || outcomes.Load() != 1500 || int64(api.inserts+api.gets) != 1500 {
		t.Errorf("Ops %d, outcomes %d, server saw %d; want 1500", res.Ops, outcomes.Load(), api.inserts+api.gets)
	}
	if res.Writes != int64(api.inserts) || res.Reads != int64(api.gets) || res.Reads+res.Writes != res.Ops {
		t.Errorf("writes %d reads %d; server saw %d inserts %d gets", res.Writes, res.Reads, api.inserts, api.gets)
	}
	if res.ReadHits != int64(api.hits) || res.ReadMisses != int64(api.misses) || res.ReadHits == 0 || res.ReadMisses == 0 {
		t.Errorf("hits %d misses %d; server answered %d hits %d misses", res.ReadHits, res.ReadMisses, api.hits, api.misses)
	}
	if w := float64(res.Writes) / float64(res.Ops); w < 0.35 || w > 0.45 {
		t.Errorf("write share %.3f, want about 0.4", w)
	}
	if res.Errors != 0 || len(res.ErrorsByKind) != 0 || res.Late != 0 {
		t.Errorf("errors %d %v, late %d", res.Errors, res.ErrorsByKind, res.Late)
	}
	if got := res.Response.TotalCount(); got != 1500 {
		t.Errorf("response histogram holds %d values", got)
	}
	if len(res.Samples) == 0 {
		t.Fatal("no per-second samples")
	}
	var sampled int64
	for i, s := range res.Samples {
		if s.Second != i {
			t.Errorf("sample %d is for second %d", i, s.Second)
		}
		sampled += s.Ops
		if s.Ops > 0 && (s.P50Ms <= 0 || s.P99Ms < s.P50Ms || s.MaxMs < s.P99Ms*0.99) {
			t.Errorf("sample %+v has inconsistent percentiles", s)
		}
	}
	if sampled != res.Ops {
		t.Errorf("samples add up to %d ops, want %d", sampled, res.Ops)
	}
	if res.Throughput() <= 0 || res.Elapsed <= 0 {
		t.Errorf("throughput %.1f over %v", res.Throughput(), res.Elapsed)
	}
}

func TestPreloadMakesReadsHit(t *testing.T) {
	api, url := newFakeAPI(t)
	res, err := loadgen.Run(context.Background(), loadgen.Config{
		Target: url, Ops: 400, Concurrency: 4, WriteRatio: 0.2, Keys: 120, Preload: true, Dist: loadgen.DistZipfian,
	})
	if err != nil {
		t.Fatal(err)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.data) != 120 || api.inserts != 120+int(res.Writes) {
		t.Errorf("server holds %d keys after %d inserts; want all 120 preloaded plus %d writes", len(api.data), api.inserts, res.Writes)
	}
	if res.ReadHits != res.Reads || res.ReadHitRate() != 1 {
		t.Errorf("%d of %d reads hit after preload", res.ReadHits, res.Reads)
	}
}

func TestFailedRequestsAreCountedByKind(t *testing.T) {
	api, url := newFakeAPI(t)
	api.failWrites = true
	res, err := loadgen.Run(context.Background(), loadgen.Config{
		Target: url, Ops: 300, Concurrency: 3, WriteRatio: 0.5, Keys: 50,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every write failed: the failures are counted by kind and kept out of Ops, the
	// throughput and the latency histograms, which hold the successful reads only.
	if res.Errors == 0 || res.ErrorsByKind["http_503"] != res.Errors || res.Writes != 0 {
		t.Errorf("errors %d %v, successful writes %d; want only 503s and no write counted", res.Errors, res.ErrorsByKind, res.Writes)
	}
	if res.Ops != res.Reads || res.Ops+res.Errors != 300 || res.Response.TotalCount() != res.Ops {
		t.Errorf("ops %d (reads %d) + errors %d, histogram %d; want 300 in all and only successes in the histogram",
			res.Ops, res.Reads, res.Errors, res.Response.TotalCount())
	}

	// Nobody listens: every request is a connection error, and the run still ends.
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	res, err = loadgen.Run(context.Background(), loadgen.Config{Target: deadURL, Ops: 20, Concurrency: 2, WriteRatio: 0.5, Keys: 5})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 20 || res.ErrorsByKind["connection"] != 20 {
		t.Errorf("against a closed port: errors %d %v", res.Errors, res.ErrorsByKind)
	}
}

func TestOpenLoopKeepsItsRate(t *testing.T) {
	var served atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.Write([]byte(`{}`))
	}))
	t.Cleanup(ts.Close)
	tests := []struct {
		arrival string
		opsTol  float64 // the schedule fixes the count for constant spacing; Poisson varies it
	}{
		{loadgen.ArrivalConstant, 0.02},
		{loadgen.ArrivalPoisson, 0.15},
	}
	for _, tt := range tests {
		t.Run(tt.arrival, func(t *testing.T) {
			served.Store(0)
			const rate, dur = 500.0, 2 * time.Second
			res, err := loadgen.Run(context.Background(), loadgen.Config{
				Target: ts.URL, Rate: rate, Duration: dur, Arrival: tt.arrival, Concurrency: 4,
				WriteRatio: 0, Keys: 100, Seed: 9,
			})
			if err != nil {
				t.Fatal(err)
			}
			// A worker that falls behind near the end leaves the requests it is late
			// for unsent: they were due all the same.
			want := rate * dur.Seconds()
			if math.Abs(float64(res.Ops+res.Unsent)-want) > tt.opsTol*want || served.Load() != res.Ops {
				t.Errorf("%d ops done (%d served, %d unsent), want %.0f within %.0f%%", res.Ops, served.Load(), res.Unsent, want, tt.opsTol*100)
			}
			if res.Errors != 0 {
				t.Errorf("%d errors: %v", res.Errors, res.ErrorsByKind)
			}
			// Elapsed runs from the start to the last answer: it can only exceed the
			// duration by the last request's lateness plus its latency.
			if tp := res.Throughput(); tt.arrival == loadgen.ArrivalConstant && math.Abs(tp-rate) > 0.05*rate {
				t.Errorf("throughput %.1f ops/s over %v, want %.0f within 5%%", tp, res.Elapsed, rate)
			}
			if res.Elapsed < dur*9/10 || res.Elapsed > dur*3/2 {
				t.Errorf("a %v run took %v", dur, res.Elapsed)
			}
		})
	}
}

// stallServer answers at once, except that its trigger-th request starts a stall during
// which every request, including those already waiting, is held until the stall ends: a
// server-wide pause such as a checkpoint or a GC pause.
type stallServer struct {
	trigger int64
	stall   time.Duration
	count   atomic.Int64
	mu      sync.Mutex
	until   time.Time
}

func (s *stallServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	if s.count.Add(1) == s.trigger {
		s.until = time.Now().Add(s.stall)
	}
	until := s.until
	s.mu.Unlock()
	if d := time.Until(until); d > 0 {
		time.Sleep(d)
	}
	w.Write([]byte(`{}`))
}

// TestOpenLoopShowsAStallClosedLoopHides is the coordinated omission check. With 4
// workers, a 200 ms stall delays at most 4 of a closed-loop run's 2000 requests (0.2%),
// so its p99 stays low although its max shows the stall. An open-loop run at 1000 req/s
// has about 200 requests due during the stall, each late by up to 200 ms, and measuring
// from the intended start puts about 190 ms at its p99.
func TestOpenLoopShowsAStallClosedLoopHides(t *testing.T) {
	const stall = 200 * time.Millisecond
	run := func(cfg loadgen.Config, trigger int64) *loadgen.Result {
		t.Helper()
		s := &stallServer{trigger: trigger, stall: stall}
		ts := httptest.NewServer(s)
		defer ts.Close()
		cfg.Target, cfg.Concurrency, cfg.Keys, cfg.WriteRatio = ts.URL, 4, 100, 0
		res, err := loadgen.Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if res.Errors != 0 || s.count.Load() < trigger {
			t.Fatalf("errors %d, %d requests served (stall at %d)", res.Errors, s.count.Load(), trigger)
		}
		return res
	}
	closed := run(loadgen.Config{Ops: 2000}, 1000)
	open := run(loadgen.Config{Ops: 1000, Rate: 1000}, 300)

	ms := func(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
	closedP99, closedMax := ms(closed.Response.ValueAtQuantile(99)), ms(closed.Response.Max())
	openP99, openSvcP99 := ms(open.Response.ValueAtQuantile(99)), ms(open.Service.ValueAtQuantile(99))
	t.Logf("closed loop: p99 %v max %v; open loop: p99 %v (service p99 %v), late %d of %d",
		closedP99, closedMax, openP99, openSvcP99, open.Late, open.Ops)

	if closedMax < stall*95/100 {
		t.Errorf("closed loop max %v: the stall did not hit the closed-loop run", closedMax)
	}
	if closedP99 > stall/2 {
		t.Errorf("closed loop p99 %v; only 4 of 2000 requests were stalled, it should stay well below %v", closedP99, stall/2)
	}
	if openP99 < stall*8/10 {
		t.Errorf("open loop p99 %v does not reflect the %v stall", openP99, stall)
	}
	// The service time is measured from the actual send, so it hides the stall as the
	// closed loop does: the gap between the two is the coordinated omission.
	if openSvcP99 > openP99/2 {
		t.Errorf("open loop service-time p99 %v is close to its response-time p99 %v; requests sent after the stall were served fast", openSvcP99, openP99)
	}
	if open.Late == 0 || closed.Late != 0 {
		t.Errorf("late: open loop %d (want > 0), closed loop %d (want 0)", open.Late, closed.Late)
	}
}

func TestCancelStopsTheRun(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{}`)) }))
	t.Cleanup(ts.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	res, err := loadgen.Run(ctx, loadgen.Config{Target: ts.URL, Duration: time.Minute, Concurrency: 2, Keys: 10, Rate: 200})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run = %v, want the context's error", err)
	}
	if res == nil || res.Ops == 0 || res.Errors != 0 {
		t.Fatalf("cancelled run result %+v", res)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("a cancelled one-minute run took %v", took)
	}
}

// TestOpenLoopStopsAtItsDuration: an open-loop run asked for more than the server can
// serve stops at its duration instead of sending its backlog, and counts the requests
// it never sent.
func TestOpenLoopStopsAtItsDuration(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(5 * time.Millisecond) // at most 200 requests a second per worker
		w.Write([]byte(`{}`))
	}))
	t.Cleanup(ts.Close)
	const rate, duration = 2000, 300 * time.Millisecond
	start := time.Now()
	res, err := loadgen.Run(context.Background(), loadgen.Config{Target: ts.URL, Duration: duration, Concurrency: 1, Keys: 10, Rate: rate})
	if err != nil {
		t.Fatal(err)
	}
	// Sending the backlog would take 600 requests x 5 ms = 3 s.
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("the %v run took %v: it sent its backlog past its end", duration, d)
	}
	due := int64(rate * duration.Seconds())
	if res.Unsent == 0 || res.Ops+res.Errors+res.Unsent < due*9/10 || res.Ops+res.Errors+res.Unsent > due+1 {
		t.Errorf("%d sent and %d unsent of the %d requests due", res.Ops+res.Errors, res.Unsent, due)
	}
	if res.RateReached(rate) {
		t.Errorf("the run counts as having reached %d requests a second with %d sent in %v", rate, res.Ops, res.Elapsed)
	}
}
