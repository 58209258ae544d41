// Package loadgen is the loadgen command: flags, the printed summary, the results CSV
// row and the per-second samples file. It lives apart from cmd/loadgen so tests can run it
// in-process.
package loadgen

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver for postgres:// targets
	"golang.org/x/term"

	"github.com/shardlab/shardlab/internal/postgresdb"
	"github.com/shardlab/shardlab/lab/loadgen"
	"github.com/shardlab/shardlab/lab/resultscsv"
)

// ErrUsage marks a command-line mistake; the command exits with status 2 for it.
var ErrUsage = errors.New("usage")

// ErrRequestsFailed is returned when some requests failed, so scripts notice.
var ErrRequestsFailed = errors.New("some requests failed")

const usageHead = `loadgen simulates concurrent users against a demo-server and reports throughput
and latency percentiles (HDR histograms). Closed loop by default; --rate R makes it
open loop, measuring each latency from the request's intended start.

With --target postgres://..., the same engine reads and upserts a key-value table
(--table, created if absent) directly through database/sql, with pgx's driver.

Usage: loadgen [flags]

Flags:
`

type options struct {
	cfg                             loadgen.Config
	table                           string // SQL target: the key-value table
	out, timeseries, scenario, mode string
	runID, gitCommit, command       string
	shards, trial                   int
	waitReady                       time.Duration
	allowErrors, quiet, progress    bool
}

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageHead)
		fs.PrintDefaults()
	}
	c := &o.cfg
	fs.StringVar(&c.Target, "target", "http://127.0.0.1:8080", "demo-server base URL, or a postgres:// URL to load a table directly (see --table)")
	fs.StringVar(&o.table, "table", "", "with a postgres:// target: the key-value table (key text primary key, value text), created if absent (default "+defaultTable+")")
	fs.Int64Var(&c.Ops, "ops", 10000, "requests in the measured phase (ignored when --duration is set)")
	fs.DurationVar(&c.Duration, "duration", 0, "length of the measured phase, e.g. 30s (instead of --ops)")
	fs.IntVar(&c.Concurrency, "concurrency", 50, "concurrent workers (simulated users)")
	fs.Float64Var(&c.WriteRatio, "writeRatio", 0.5, "share of requests that are writes, 0..1")
	fs.IntVar(&c.Keys, "keys", 10000, "key-space size (user0 .. user{keys-1})")
	fs.StringVar(&c.Dist, "dist", loadgen.DistUniform, "key distribution: "+strings.Join(loadgen.Dists(), ", ")+" (zipfian uses YCSB's 0.99)")
	fs.BoolVar(&c.Preload, "preload", false, "write every key once before measuring, so reads hit")
	fs.DurationVar(&c.Warmup, "warmup", 0, "unmeasured closed-loop load before the measured phase, e.g. 2s")
	fs.Int64Var(&c.Seed, "seed", 1, "random seed")
	fs.IntVar(&c.DataSize, "data-size", 100, "bytes of data per write")
	fs.Float64Var(&c.Rate, "rate", 0, "open loop: target requests/s (0 = closed loop)")
	fs.StringVar(&c.Arrival, "arrival", loadgen.ArrivalConstant, "open loop spacing: constant or poisson")
	fs.DurationVar(&c.Timeout, "timeout", 30*time.Second, "per-request timeout")
	fs.StringVar(&o.out, "out", "", "append one row to this results CSV (header written when new)")
	fs.StringVar(&o.timeseries, "timeseries", "", "write per-second samples to this CSV")
	fs.StringVar(&o.scenario, "scenario", "adhoc", "scenario label for the CSV")
	fs.StringVar(&o.mode, "mode", "", "mode label for the CSV (default: what the server's /stats says)")
	fs.IntVar(&o.shards, "shards", 0, "shard count label for the CSV (default: what the server's /stats says)")
	fs.StringVar(&o.runID, "run-id", "", "groups rows of one experiment in the CSV (default: a timestamp)")
	fs.IntVar(&o.trial, "trial", 1, "trial number within the run, for the CSV")
	fs.StringVar(&o.gitCommit, "git-commit", "", "commit of the lab, for the CSV (default: from the build)")
	fs.StringVar(&o.command, "command", "", "the script command line that ran this, for the CSV")
	fs.BoolVar(&o.allowErrors, "allow-errors", false, "exit 0 even when some requests failed")
	fs.BoolVar(&o.quiet, "quiet", false, "print only the summary line")
	fs.DurationVar(&o.waitReady, "wait-ready", 0, "wait up to this long for the server's /healthz to answer 200 before starting")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	}
	if o.mode != "" && o.mode != "single" && o.mode != "sharded" {
		return nil, fmt.Errorf("%w: --mode must be single or sharded, got %q", ErrUsage, o.mode)
	}
	if o.shards < 0 {
		return nil, fmt.Errorf("%w: --shards must not be negative", ErrUsage)
	}
	if o.trial < 1 {
		return nil, fmt.Errorf("%w: --trial must be at least 1", ErrUsage)
	}
	if o.sqlTarget() {
		if o.table == "" {
			o.table = defaultTable
		}
		if _, _, err := loadgen.PostgresKV(o.table); err != nil {
			return nil, fmt.Errorf("%w: --table: %v", ErrUsage, err)
		}
		if err := c.ValidateLoad(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
	} else {
		if o.table != "" {
			return nil, fmt.Errorf("%w: --table needs a postgres:// --target", ErrUsage)
		}
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
	}
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) && !o.quiet {
		o.progress = true
	}
	return o, nil
}

// Run runs loadgen with args. It returns an error wrapping ErrUsage for command-line
// mistakes, flag.ErrHelp for --help, and ErrRequestsFailed when requests failed (unless
// --allow-errors). Cancelling ctx stops the load; what was measured is still reported.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	var (
		info   serverInfo
		target loadgen.Target
	)
	if o.sqlTarget() {
		t, closeTarget, err := openSQLTarget(ctx, o)
		if err != nil {
			return err
		}
		defer closeTarget()
		target = t
		// No server to ask: the row records what loadgen itself knows.
		info = serverInfo{Mode: "single", Backend: "postgres", Shards: 1, PoolSize: o.cfg.Concurrency}
	} else {
		if o.waitReady > 0 {
			if err := waitReady(ctx, o.cfg.Target, o.waitReady); err != nil {
				return err
			}
		}
		var err error
		if info, err = fetchStats(ctx, o.cfg.Target); err != nil {
			return fmt.Errorf("cannot reach the demo-server at %s: %w", o.cfg.Target, err)
		}
	}
	if o.progress {
		o.cfg.Progress = progressBar(stderr, o.cfg)
	}
	if !o.quiet {
		if o.sqlTarget() {
			fmt.Fprintf(stdout, "loadgen: %s against %s, table %s (database/sql, pgx)\n", describe(o.cfg), postgresdb.RedactDSN(o.cfg.Target), o.table)
		} else {
			fmt.Fprintf(stdout, "loadgen: %s against %s (%s, %d shard(s), %s)\n", describe(o.cfg), o.cfg.Target, info.Mode, info.Shards, info.Backend)
		}
	}
	var res *loadgen.Result
	var runErr error
	if target != nil {
		res, runErr = loadgen.RunTarget(ctx, target, o.cfg)
	} else {
		res, runErr = loadgen.Run(ctx, o.cfg)
	}
	if o.progress {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if res == nil {
		return runErr
	}
	printSummary(stdout, o, res)
	if o.cfg.Rate > 0 && !res.RateReached(o.cfg.Rate) {
		// On a line of its own, on stdout with the summary or on stderr under --quiet
		// (whose stdout is one line that scripts parse): latencies measured below the
		// asked-for rate describe a lighter load than the one asked for.
		w := stdout
		if o.quiet {
			w = stderr
		}
		fmt.Fprintf(w, "target rate %.0f/s not reached: achieved %.0f/s\n", o.cfg.Rate, res.AchievedRate())
	}
	if runErr != nil {
		// An interrupted run measured less than it was asked to: reporting it as a normal
		// row would put a partial measurement beside complete ones.
		if o.out != "" {
			fmt.Fprintf(stderr, "loadgen: run interrupted (%v): no row appended to %s\n", runErr, o.out)
		}
		return runErr
	}
	row := buildRow(o, info, res)
	if o.out != "" {
		if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
			return err
		}
		if err := resultscsv.Append(o.out, row); err != nil {
			return err
		}
	}
	if o.timeseries != "" {
		if err := writeTimeseries(o.timeseries, res.Samples); err != nil {
			return fmt.Errorf("write --timeseries: %w", err)
		}
	}
	if res.Errors > 0 && !o.allowErrors {
		return fmt.Errorf("%w: %d of %d", ErrRequestsFailed, res.Errors, res.Ops+res.Errors)
	}
	return nil
}

// defaultTable is the key-value table of a postgres:// target when --table is not given.
const defaultTable = "loadgen_kv"

// sqlTarget reports whether --target names a PostgreSQL database rather than a demo-server.
func (o *options) sqlTarget() bool {
	return strings.HasPrefix(o.cfg.Target, "postgres://") || strings.HasPrefix(o.cfg.Target, "postgresql://")
}

// openSQLTarget connects to the database of --target through database/sql (pgx's stdlib
// driver) with one connection per worker, waits for it under --wait-ready, creates the
// table if absent and prepares the target's statements.
func openSQLTarget(ctx context.Context, o *options) (loadgen.Target, func(), error) {
	where := postgresdb.RedactDSN(o.cfg.Target)
	db, err := sql.Open("pgx", o.cfg.Target)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: --target %s: %v", ErrUsage, where, err)
	}
	db.SetMaxOpenConns(o.cfg.Concurrency)
	db.SetMaxIdleConns(o.cfg.Concurrency)
	fail := func(err error) (loadgen.Target, func(), error) {
		db.Close()
		return nil, nil, err
	}
	if err := waitDB(ctx, db, o.waitReady); err != nil {
		return fail(fmt.Errorf("cannot reach the database at %s: %w", where, err))
	}
	create, st, err := loadgen.PostgresKV(o.table)
	if err != nil {
		return fail(fmt.Errorf("%w: --table: %v", ErrUsage, err))
	}
	if _, err := db.ExecContext(ctx, create); err != nil {
		return fail(fmt.Errorf("create table %s at %s: %w", o.table, where, err))
	}
	t, err := loadgen.NewSQLTarget(ctx, db, st)
	if err != nil {
		return fail(err)
	}
	return t, func() { t.Close(); db.Close() }, nil
}

// waitDB pings db, retrying for up to wait (at least once).
func waitDB(ctx context.Context, db *sql.DB, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := db.PingContext(pctx)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func describe(c loadgen.Config) string {
	amount := fmt.Sprintf("%d ops", c.Ops)
	if c.Duration > 0 {
		amount = c.Duration.String()
	}
	loop := "closed loop"
	if c.Rate > 0 {
		loop = fmt.Sprintf("open loop at %.0f req/s (%s)", c.Rate, c.Arrival)
	}
	return fmt.Sprintf("%s, %d workers, write ratio %.2f, %d keys %s, %s", amount, c.Concurrency, c.WriteRatio, c.Keys, c.Dist, loop)
}

// serverInfo is the part of the demo-server's /stats that a CSV row records.
type serverInfo struct {
	Mode      string `json:"mode"`
	Backend   string `json:"backend"`
	Router    string `json:"router"`
	Shards    int    `json:"shards"`
	Sync      string `json:"sync"`
	PoolSize  int    `json:"pool_size"`
	SQLiteVer string `json:"sqlite_version"`
}

func fetchStats(ctx context.Context, target string) (serverInfo, error) {
	var info serverInfo
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(target, "/")+"/stats", nil)
	if err != nil {
		return info, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return info, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return info, fmt.Errorf("/stats answered %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return info, fmt.Errorf("decode /stats: %w", err)
	}
	return info, nil
}

// waitReady polls /healthz until it answers 200 or the timeout passes.
func waitReady(ctx context.Context, target string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	url := strings.TrimRight(target, "/") + "/healthz"
	for {
		reqCtx, cancel := context.WithTimeout(ctx, time.Second)
		req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, url, nil)
		if err != nil {
			cancel()
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("/healthz answered %s", resp.Status)
			}
			return fmt.Errorf("server at %s not ready after %s: %w", target, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func progressBar(w io.Writer, c loadgen.Config) func(int64, time.Duration) {
	return func(done int64, elapsed time.Duration) {
		frac := 0.0
		if c.Duration > 0 {
			frac = elapsed.Seconds() / c.Duration.Seconds()
		} else if c.Ops > 0 {
			frac = float64(done) / float64(c.Ops)
		}
		frac = min(max(frac, 0), 1)
		const width = 30
		n := int(frac * width)
		rate := float64(done) / max(elapsed.Seconds(), 1e-9)
		fmt.Fprintf(w, "\r\033[K[%s%s] %3.0f%% %d ops %.0f ops/s", strings.Repeat("#", n), strings.Repeat(".", width-n), frac*100, done, rate)
	}
}

func printSummary(w io.Writer, o *options, r *loadgen.Result) {
	h := r.Response
	if !o.quiet {
		fmt.Fprintf(w, "ops          %d successful in %.2fs (%d reads, %d writes), %d failed\n", r.Ops, r.Elapsed.Seconds(), r.Reads, r.Writes, r.Errors)
		fmt.Fprintf(w, "throughput   %.1f successful ops/s\n", r.Throughput())
		fmt.Fprintf(w, "latency ms   avg %.3f  p50 %.3f  p95 %.3f  p99 %.3f  p99.9 %.3f  max %.3f\n",
			h.Mean()/1000, loadgen.Ms(h.ValueAtQuantile(50)), loadgen.Ms(h.ValueAtQuantile(95)),
			loadgen.Ms(h.ValueAtQuantile(99)), loadgen.Ms(h.ValueAtQuantile(99.9)), loadgen.Ms(h.Max()))
		if o.cfg.Rate > 0 {
			s := r.Service
			fmt.Fprintf(w, "service ms   p50 %.3f  p99 %.3f  (from actual send; the line above is from intended start)\n",
				loadgen.Ms(s.ValueAtQuantile(50)), loadgen.Ms(s.ValueAtQuantile(99)))
			fmt.Fprintf(w, "late starts  %d of %d requests began over %s after their intended time\n", r.Late, r.Ops, loadgen.LateThreshold)
			if r.Unsent > 0 {
				fmt.Fprintf(w, "unsent       %d requests fell due before the end but were never sent: the run fell behind the rate\n", r.Unsent)
			}
		}
		if r.Reads > 0 {
			fmt.Fprintf(w, "read hits    %.2f%% (%d found, %d not found)\n", r.ReadHitRate()*100, r.ReadHits, r.ReadMisses)
		}
		kinds := make([]string, 0, len(r.ErrorsByKind))
		for k := range r.ErrorsByKind {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		parts := make([]string, len(kinds))
		for i, k := range kinds {
			parts[i] = fmt.Sprintf("%s=%d", k, r.ErrorsByKind[k])
		}
		errLine := "none"
		if len(parts) > 0 {
			errLine = strings.Join(parts, " ")
		}
		fmt.Fprintf(w, "errors       %d (%s)\n", r.Errors, errLine)
		return
	}
	fmt.Fprintf(w, "%s: %.1f ops/s, p50 %.3f ms, p99 %.3f ms, errors %d\n", o.scenario, r.Throughput(),
		loadgen.Ms(h.ValueAtQuantile(50)), loadgen.Ms(h.ValueAtQuantile(99)), r.Errors)
}

func buildRow(o *options, info serverInfo, r *loadgen.Result) resultscsv.Row {
	h, s := r.Response, r.Service
	mode, shards := o.mode, o.shards
	if mode == "" {
		mode = info.Mode
	}
	if shards == 0 {
		shards = info.Shards
	}
	runID := o.runID
	if runID == "" {
		runID = time.Now().UTC().Format("20060102T150405Z")
	}
	commit := o.gitCommit
	if commit == "" {
		commit = buildCommit()
	}
	return resultscsv.Row{
		Timestamp: time.Now().UTC(), Scenario: o.scenario, Mode: mode, Shards: shards,
		Ops: r.Ops, Concurrency: o.cfg.Concurrency, WriteRatio: o.cfg.WriteRatio,
		ThroughputOpsS: r.Throughput(), AvgMs: h.Mean() / 1000,
		P50Ms: loadgen.Ms(h.ValueAtQuantile(50)), P95Ms: loadgen.Ms(h.ValueAtQuantile(95)),
		P99Ms: loadgen.Ms(h.ValueAtQuantile(99)), MaxMs: loadgen.Ms(h.Max()), Errors: r.Errors,
		P999Ms: loadgen.Ms(h.ValueAtQuantile(99.9)), RunID: runID, Trial: o.trial,
		Backend: info.Backend, Router: info.Router, Sync: info.Sync, PoolSize: info.PoolSize,
		Keys: o.cfg.Keys, Dist: o.cfg.Dist, Rate: o.cfg.Rate, Late: r.Late,
		SvcP50Ms: loadgen.Ms(s.ValueAtQuantile(50)), SvcP99Ms: loadgen.Ms(s.ValueAtQuantile(99)),
		ReadHitRate: r.ReadHitRate(), DurationS: r.Elapsed.Seconds(), Seed: o.cfg.Seed,
		GitCommit: commit, GoVersion: runtime.Version(), CPUs: runtime.NumCPU(),
		CPUModel: cpuModel(), SQLiteVer: info.SQLiteVer,
		RequestedOps: requestedOps(o.cfg), RequestedDurationS: o.cfg.Duration.Seconds(),
		WarmupS: o.cfg.Warmup.Seconds(), Preload: o.cfg.Preload, Arrival: arrival(o.cfg),
		DataSize: o.cfg.DataSize, Command: o.command,
	}
}

func requestedOps(c loadgen.Config) int64 {
	if c.Duration > 0 {
		return 0
	}
	return c.Ops
}

func arrival(c loadgen.Config) string {
	if c.Rate == 0 {
		return ""
	}
	return c.Arrival
}

func buildCommit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return s.Value[:12]
			}
		}
	}
	return "unknown"
}

// cpuModel returns the CPU model name from /proc/cpuinfo, or runtime.GOARCH elsewhere.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

// TimeseriesColumns returns the header of the per-second samples CSV.
func TimeseriesColumns() []string {
	return []string{"t_s", "ops", "errors", "throughput_ops_s", "p50_ms", "p99_ms", "max_ms"}
}

func writeTimeseries(path string, samples []loadgen.Sample) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := csv.NewWriter(f)
	w.Write(TimeseriesColumns())
	ff := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	for _, s := range samples {
		w.Write([]string{strconv.Itoa(s.Second), strconv.FormatInt(s.Ops, 10), strconv.FormatInt(s.Errors, 10),
			ff(s.Throughput()), ff(s.P50Ms), ff(s.P99Ms), ff(s.MaxMs)})
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return err
	}
	return f.Close()
}
