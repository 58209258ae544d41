// Package loadgen drives a key-value target with simulated users and measures what they
// see. A Target is the demo-server's HTTP API (HTTPTarget, what Run drives), a
// database/sql handle (SQLTarget), or anything else that can read and write a key
// (RunTarget); one engine measures them all alike.
//
// Closed loop (the default, as in the seed lab): each of Concurrency workers sends a
// request, waits for the answer, and sends the next. Open loop (Rate > 0): requests are
// due on a fixed schedule (constant or Poisson spacing) whatever the server does, and
// each latency is measured from the request's intended start, as wrk2 does, so a server
// that stalls shows the stall in its tail instead of silently slowing the clients
// (coordinated omission). Latencies go into one HDR histogram per worker, merged at the end.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"golang.org/x/sync/errgroup"
)

// Arrival processes for open-loop load.
const (
	ArrivalConstant = "constant" // evenly spaced requests
	ArrivalPoisson  = "poisson"  // exponentially distributed gaps with the same mean
)

// LateThreshold is how far behind its intended start a request must begin to count as late.
const LateThreshold = time.Millisecond

// Histogram range: 1 microsecond to 60 seconds at 3 significant digits.
const (
	histMinUs = 1
	histMaxUs = 60_000_000
)

// ErrBadConfig is wrapped by the errors about a configuration: Config.Validate's and
// ValidateLoad's, and those of the target constructors.
var ErrBadConfig = errors.New("loadgen: invalid configuration")

// Config describes one load run.
type Config struct {
	Target      string        // Run: base URL of the demo-server, e.g. http://127.0.0.1:8080 (RunTarget ignores it)
	Ops         int64         // requests in the measured phase (used when Duration is 0)
	Duration    time.Duration // length of the measured phase (instead of Ops)
	Concurrency int           // workers (simulated users)
	WriteRatio  float64       // share of requests that are writes (HTTP: /insert), 0..1
	Keys        int           // key-space size: keys user0 .. user{Keys-1}
	Dist        string        // DistUniform, DistZipfian or DistHotspot
	Preload     bool          // write every key once before measuring, so reads hit
	Warmup      time.Duration // unmeasured closed-loop load before the measured phase
	Seed        int64         // random seed; the same seed gives the same request sequence per worker
	DataSize    int           // bytes of data per write
	Rate        float64       // open loop: target requests per second (0 = closed loop)
	Arrival     string        // open loop: ArrivalConstant or ArrivalPoisson
	Timeout     time.Duration // per-request timeout, applied to every call through its context
	Progress    func(done int64, elapsed time.Duration)

	// OnResult, when set, is called after every measured request with what the target
	// answered; tests use it to check that acknowledged writes are stored.
	OnResult func(Outcome)
}

// Outcome is one measured request as seen by the client.
type Outcome struct {
	Write bool
	Key   string
	Data  string // the value written (writes only)
	Found bool   // reads: the key was there
	Err   error  // the failure, nil when the target answered (a read's miss included)
	// Status and Body are the answer of a target that is a Replier (HTTP: the status,
	// 0 when the request failed before an answer, and the response body); zero for
	// other targets.
	Status int
	Body   []byte
}

// Validate checks c for Run, which drives the demo-server at c.Target, and fills
// defaults.
func (c *Config) Validate() error {
	u, err := url.Parse(c.Target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: target must be an http:// URL, got %q", ErrBadConfig, c.Target)
	}
	c.Target = strings.TrimRight(c.Target, "/")
	return c.ValidateLoad()
}

// ValidateLoad checks everything in c but Target, as RunTarget does, and fills defaults.
func (c *Config) ValidateLoad() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
	if c.Duration < 0 {
		return bad("duration must not be negative")
	}
	if c.Duration == 0 && c.Ops <= 0 {
		return bad("give a positive number of ops or a duration")
	}
	if c.Concurrency < 1 || c.Concurrency > 10000 {
		return bad("concurrency must be 1..10000, got %d", c.Concurrency)
	}
	if math.IsNaN(c.WriteRatio) || c.WriteRatio < 0 || c.WriteRatio > 1 {
		return bad("write ratio must be between 0 and 1, got %v", c.WriteRatio)
	}
	if c.Keys < 1 {
		return bad("keys must be at least 1, got %d", c.Keys)
	}
	if c.Dist == "" {
		c.Dist = DistUniform
	}
	if _, err := NewKeyChooser(c.Dist, 1); err != nil {
		return bad("%v", err)
	}
	if c.Warmup < 0 {
		return bad("warmup must not be negative")
	}
	if c.DataSize == 0 {
		c.DataSize = 100
	}
	if c.DataSize < 1 || c.DataSize > 60000 {
		return bad("data size must be 1..60000 bytes, got %d", c.DataSize)
	}
	if math.IsNaN(c.Rate) || c.Rate < 0 || math.IsInf(c.Rate, 0) {
		return bad("rate must be a non-negative number, got %v", c.Rate)
	}
	if c.Arrival == "" {
		c.Arrival = ArrivalConstant
	}
	if c.Arrival != ArrivalConstant && c.Arrival != ArrivalPoisson {
		return bad("arrival must be %s or %s, got %q", ArrivalConstant, ArrivalPoisson, c.Arrival)
	}
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
	if c.Timeout < 0 {
		return bad("timeout must be positive")
	}
	return nil
}

// Sample is one second of a run.
type Sample struct {
	Second int     // seconds since the measured phase started
	Span   float64 // seconds the sample covers: 1, less for the run's last, partial second
	Ops    int64   // successful requests completed in that second
	Errors int64   // failed requests in that second
	P50Ms  float64 // response-time percentiles of the second
	P99Ms  float64
	MaxMs  float64
}

// Result is what a run measured.
type Result struct {
	Ops          int64                   // successful requests in the measured phase (a read that misses is a success)
	Errors       int64                   // failed requests, kept out of Ops, the throughput and the histograms
	ErrorsByKind map[string]int64        // e.g. "http_503", "sqlstate_40001", "timeout", "connection"
	Reads        int64                   // successful reads
	ReadHits     int64                   // reads that found their key (HTTP 200)
	ReadMisses   int64                   // reads that did not (HTTP 404)
	Writes       int64                   // successful writes
	Elapsed      time.Duration           // length of the measured phase
	Response     *hdrhistogram.Histogram // microseconds from intended start to answer
	Service      *hdrhistogram.Histogram // microseconds from actual send to answer
	Late         int64                   // open loop: requests started over LateThreshold late
	// Unsent counts, in an open-loop run with a duration, the requests that fell due
	// before its end but were never sent, the workers being behind their schedule: the
	// run stops at its end instead of sending its backlog (an estimate for Poisson
	// arrivals: the gaps' mean over what was left).
	Unsent  int64
	Samples []Sample
}

// Throughput returns successful requests per second.
func (r *Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// AchievedRate returns the requests completed per second, failed ones included: in an
// open-loop run, how much of the target rate the run kept up.
func (r *Result) AchievedRate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops+r.Errors) / r.Elapsed.Seconds()
}

// RateReachedShare is the share of its target rate an open-loop run must complete to
// count as having reached it (see RateReached). The margin covers what costs a run that
// kept its schedule a little: the last request's latency at the end of the run.
const RateReachedShare = 0.95

// RateReached reports whether a run completed at least RateReachedShare of rate
// requests per second. A run that did not was limited by its workers or by the target,
// not by its schedule, and its latencies describe a lower load than the one asked for.
func (r *Result) RateReached(rate float64) bool {
	return r.AchievedRate() >= RateReachedShare*rate
}

// ReadHitRate returns the share of reads that found their key (0 when there were none).
func (r *Result) ReadHitRate() float64 {
	if r.Reads == 0 {
		return 0
	}
	return float64(r.ReadHits) / float64(r.Reads)
}

// Ms converts a histogram value in microseconds to milliseconds.
func Ms(us int64) float64 { return float64(us) / 1000 }

// Run drives the demo-server at cfg.Target (an HTTPTarget) with the load cfg describes:
// preload, warmup, then the measured phase. Cancelling ctx stops the run early; the
// result then covers what was measured so far and the error is ctx's.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	client := NewHTTPClient(cfg.Concurrency, cfg.Timeout)
	defer client.CloseIdleConnections()
	target, err := NewHTTPTarget(cfg.Target, client)
	if err != nil {
		return nil, err
	}
	return run(ctx, target, cfg)
}

// RunTarget is Run against any Target; cfg.Target is not used. The engine is the same:
// HDR histograms per worker, closed or open loop, warm-up, per-second samples, OnResult.
// The target stays open; the caller closes it.
func RunTarget(ctx context.Context, target Target, cfg Config) (*Result, error) {
	if target == nil {
		return nil, fmt.Errorf("%w: nil target", ErrBadConfig)
	}
	if err := cfg.ValidateLoad(); err != nil {
		return nil, err
	}
	return run(ctx, target, cfg)
}

func run(ctx context.Context, target Target, cfg Config) (*Result, error) {
	keys, err := NewKeyChooser(cfg.Dist, cfg.Keys)
	if err != nil {
		return nil, err
	}
	r := newRunner(cfg, target, keys)
	if cfg.Preload {
		if err := r.preload(ctx); err != nil {
			return nil, err
		}
	}
	if cfg.Warmup > 0 {
		warm := cfg
		warm.Rate, warm.Ops, warm.Duration, warm.OnResult, warm.Progress = 0, 0, cfg.Warmup, nil, nil
		if _, err := newRunner(warm, target, keys).measure(ctx, cfg.Seed+1_000_003); err != nil {
			return nil, fmt.Errorf("warmup: %w", err)
		}
	}
	return r.measure(ctx, cfg.Seed)
}

type runner struct {
	cfg     Config
	target  Target
	replier Replier // the target's, when OnResult wants its replies
	keys    KeyChooser
}

func newRunner(cfg Config, target Target, keys KeyChooser) *runner {
	r := &runner{cfg: cfg, target: target, keys: keys}
	if rp, ok := target.(Replier); ok && cfg.OnResult != nil {
		r.replier = rp
	}
	return r
}

// preload writes every key once, Concurrency requests at a time.
func (r *runner) preload(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	var next atomic.Int64
	data := strings.Repeat("p", r.cfg.DataSize)
	for range r.cfg.Concurrency {
		g.Go(func() error {
			for {
				i := next.Add(1) - 1
				if i >= int64(r.cfg.Keys) {
					return nil
				}
				if _, _, err := r.call(ctx, true, KeyName(int(i)), data); err != nil {
					return fmt.Errorf("preload %s: %w", KeyName(int(i)), err)
				}
			}
		})
	}
	return g.Wait()
}

// call runs one request against the target, bounded by the per-request timeout.
func (r *runner) call(ctx context.Context, write bool, key, value string) (found bool, reply Reply, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	switch {
	case r.replier != nil && write:
		reply, err = r.replier.WriteReply(ctx, key, value)
	case r.replier != nil:
		found, reply, err = r.replier.ReadReply(ctx, key)
	case write:
		err = r.target.Write(ctx, key, value)
	default:
		found, err = r.target.Read(ctx, key)
	}
	return found, reply, err
}

// worker holds one goroutine's measurements; nothing in it is shared.
type worker struct {
	response, service         *hdrhistogram.Histogram
	errs                      map[string]int64
	ops, errors, late, unsent int64
	reads, hits               int64
	misses, writes            int64

	// per-second samples: the histogram of the current second, flushed on rollover
	second     int
	secHist    *hdrhistogram.Histogram
	secOps     int64
	secErrors  int64
	timeseries *timeseries
}

func newHist(digits int) *hdrhistogram.Histogram {
	return hdrhistogram.New(histMinUs, histMaxUs, digits)
}

func clampUs(d time.Duration) int64 {
	return min(max(d.Microseconds(), histMinUs), histMaxUs)
}

func (w *worker) record(sinceStart time.Duration, response, service time.Duration, failed bool) {
	sec := int(sinceStart / time.Second)
	if sec != w.second {
		w.flushSecond()
		w.second = sec
	}
	if failed {
		w.secErrors++
		return
	}
	w.response.RecordValue(clampUs(response))
	w.service.RecordValue(clampUs(service))
	w.secHist.RecordValue(clampUs(response))
	w.secOps++
}

func (w *worker) flushSecond() {
	if w.secOps > 0 || w.secErrors > 0 {
		w.timeseries.add(w.second, w.secOps, w.secErrors, w.secHist)
	}
	w.secHist.Reset()
	w.secOps, w.secErrors = 0, 0
}

// timeseries merges the workers' per-second histograms.
type timeseries struct {
	mu   sync.Mutex
	secs map[int]*secondAgg
}

type secondAgg struct {
	ops, errors int64
	hist        *hdrhistogram.Histogram
}

func (t *timeseries) add(sec int, ops, errs int64, h *hdrhistogram.Histogram) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.secs[sec]
	if !ok {
		a = &secondAgg{hist: newHist(2)}
		t.secs[sec] = a
	}
	a.ops += ops
	a.errors += errs
	a.hist.Merge(h)
}

// Throughput returns the sample's completed requests per second of the time it covers.
func (s Sample) Throughput() float64 {
	if s.Span <= 0 {
		return 0
	}
	return float64(s.Ops) / s.Span
}

func (t *timeseries) samples(elapsed time.Duration) []Sample {
	t.mu.Lock()
	defer t.mu.Unlock()
	last := -1
	for s := range t.secs {
		last = max(last, s)
	}
	out := make([]Sample, 0, last+1)
	for s := 0; s <= last; s++ {
		smp := Sample{Second: s, Span: min(1, elapsed.Seconds()-float64(s))}
		if a, ok := t.secs[s]; ok {
			smp.Ops, smp.Errors = a.ops, a.errors
			smp.P50Ms = Ms(a.hist.ValueAtQuantile(50))
			smp.P99Ms = Ms(a.hist.ValueAtQuantile(99))
			smp.MaxMs = Ms(a.hist.Max())
		}
		out = append(out, smp)
	}
	return out
}

// measure runs the measured phase.
func (r *runner) measure(ctx context.Context, seed int64) (*Result, error) {
	cfg := r.cfg
	ts := &timeseries{secs: map[int]*secondAgg{}}
	workers := make([]*worker, cfg.Concurrency)
	for i := range workers {
		workers[i] = &worker{
			response: newHist(3), service: newHist(3), errs: map[string]int64{},
			secHist: newHist(2), timeseries: ts,
		}
	}
	var issued, completed atomic.Int64
	start := time.Now()
	deadline := time.Time{}
	if cfg.Duration > 0 {
		deadline = start.Add(cfg.Duration)
	}
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()

	stopProgress := make(chan struct{})
	var progressDone sync.WaitGroup
	if cfg.Progress != nil {
		progressDone.Add(1)
		go func() {
			defer progressDone.Done()
			t := time.NewTicker(500 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					cfg.Progress(completed.Load(), time.Since(start))
				case <-stopProgress:
					return
				}
			}
		}()
	}

	// Open loop: each worker owns an even share of the rate, its schedule offset so the
	// workers' requests interleave rather than arrive in bursts.
	perWorkerGap := time.Duration(0)
	if cfg.Rate > 0 {
		perWorkerGap = time.Duration(float64(time.Second) * float64(cfg.Concurrency) / cfg.Rate)
	}
	var wg sync.WaitGroup
	for wi, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(wi)))
			data := make([]byte, cfg.DataSize)
			for i := range data {
				data[i] = 'a' + byte(rng.IntN(26))
			}
			intended := start
			if cfg.Rate > 0 {
				intended = start.Add(time.Duration(float64(perWorkerGap) * float64(wi) / float64(cfg.Concurrency)))
			}
			var seq int64
			for runCtx.Err() == nil {
				if cfg.Rate > 0 && !deadline.IsZero() {
					if !intended.Before(deadline) {
						return
					}
					if time.Now().After(deadline) {
						w.unsent += 1 + int64(deadline.Sub(intended)-1)/int64(max(perWorkerGap, 1))
						return
					}
				}
				if cfg.Duration == 0 && issued.Add(1) > cfg.Ops {
					return
				}
				if cfg.Rate > 0 {
					if wait := time.Until(intended); wait > 0 {
						select {
						case <-time.After(wait):
						case <-runCtx.Done():
							return
						}
					}
				}
				write := rng.Float64() < cfg.WriteRatio
				key := KeyName(r.keys.Next(rng))
				value := ""
				if write {
					seq++
					// Unique per write, so a reader can tell which acknowledged write it sees.
					prefix := fmt.Sprintf("%s:%d:%d:", key, wi, seq)
					value = prefix + string(data[:max(0, cfg.DataSize-len(prefix))])
				}
				sent := time.Now()
				if cfg.Rate == 0 {
					intended = sent
				} else if sent.Sub(intended) > LateThreshold {
					w.late++
				}
				found, reply, err := r.call(runCtx, write, key, value)
				done := time.Now()
				if runCtx.Err() != nil && err != nil {
					return // stopped mid-request: neither a success nor a server error
				}
				failed := err != nil
				// Failed requests are counted apart and kept out of the latency histograms
				// and the throughput: a shard failing fast must not look like a fast shard.
				if failed {
					w.errors++
					w.errs[classify(r.target, err)]++
				} else {
					w.ops++
					if write {
						w.writes++
					} else {
						w.reads++
						if found {
							w.hits++
						} else {
							w.misses++
						}
					}
				}
				w.record(done.Sub(start), done.Sub(intended), done.Sub(sent), failed)
				completed.Add(1)
				if cfg.OnResult != nil {
					cfg.OnResult(Outcome{Write: write, Key: key, Data: value, Found: found, Err: err, Status: reply.Status, Body: reply.Body})
				}
				if cfg.Rate > 0 {
					gap := perWorkerGap
					if cfg.Arrival == ArrivalPoisson {
						gap = time.Duration(rng.ExpFloat64() * float64(perWorkerGap))
					}
					intended = intended.Add(gap)
				} else if !deadline.IsZero() && done.After(deadline) {
					return
				}
			}
		}()
	}
	if !deadline.IsZero() && cfg.Rate == 0 {
		// Closed loop with a duration: workers stop by themselves once the deadline passes.
		go func() {
			select {
			case <-time.After(time.Until(deadline) + cfg.Timeout):
				cancelRun() // a request hung past its timeout; stop waiting for it
			case <-runCtx.Done():
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stopProgress)
	progressDone.Wait()

	res := &Result{ErrorsByKind: map[string]int64{}, Elapsed: elapsed, Response: newHist(3), Service: newHist(3)}
	for _, w := range workers {
		w.flushSecond()
		res.Response.Merge(w.response)
		res.Service.Merge(w.service)
		res.Ops += w.ops
		res.Errors += w.errors
		res.Late += w.late
		res.Unsent += w.unsent
		res.Reads += w.reads
		res.ReadHits += w.hits
		res.ReadMisses += w.misses
		res.Writes += w.writes
		for k, v := range w.errs {
			res.ErrorsByKind[k] += v
		}
	}
	res.Samples = ts.samples(elapsed)
	return res, ctx.Err()
}
