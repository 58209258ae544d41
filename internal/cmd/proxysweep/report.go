package proxysweep

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/shardlab/shardlab/lab/charts"
	"github.com/shardlab/shardlab/lab/report"
)

// ReadRows reads results.csv.
func ReadRows(r io.Reader) ([]Row, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	recs, err := cr.ReadAll()
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 || !slices.Equal(recs[0][:min(len(recs[0]), 13)], CSVHeader[:13]) {
		return nil, fmt.Errorf("proxysweep: results.csv does not start with the header %v", CSVHeader)
	}
	var rows []Row
	for i, rec := range recs[1:] {
		if len(rec) < 13 {
			return nil, fmt.Errorf("proxysweep: results.csv line %d has %d fields", i+2, len(rec))
		}
		var row Row
		row.Status = "ok"
		if len(rec) > 13 {
			row.Status = rec[13]
		}
		// Optional columns, which older runs lack: NaN when absent or empty.
		for j, dst := range []*float64{&row.MiddlewareCPU, &row.MiddlewareRunQueue, &row.MachineIdle} {
			*dst = math.NaN()
			if len(rec) > 14+j && rec[14+j] != "" {
				v, err := strconv.ParseFloat(rec[14+j], 64)
				if err != nil {
					return nil, fmt.Errorf("proxysweep: results.csv line %d, %s: %w", i+2, CSVHeader[14+j], err)
				}
				*dst = v
			}
		}
		var errs [9]error
		row.Trial, errs[0] = strconv.Atoi(rec[0])
		row.Suite, row.Workload, row.Target = rec[1], rec[2], rec[4]
		row.Threads, errs[1] = strconv.Atoi(rec[3])
		row.TPS, errs[2] = strconv.ParseFloat(rec[5], 64)
		row.QPS, errs[3] = strconv.ParseFloat(rec[6], 64)
		row.P95, errs[4] = strconv.ParseFloat(rec[7], 64)
		row.P99, errs[5] = strconv.ParseFloat(rec[8], 64)
		row.Errors, errs[6] = strconv.ParseFloat(rec[9], 64)
		row.Latencies, errs[7] = strconv.Atoi(rec[10])
		row.DurationS, _ = strconv.ParseFloat(rec[11], 64)
		row.PeakBackends, errs[8] = strconv.Atoi(rec[12])
		for _, err := range errs {
			if err != nil {
				return nil, fmt.Errorf("proxysweep: results.csv line %d: %w", i+2, err)
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

type key struct {
	suite, workload string
	threads         int
	target          string
}

// table indexes rows by what they measured.
type table struct {
	by map[key][]Row
}

func index(rows []Row) *table {
	t := &table{by: map[key][]Row{}}
	for _, r := range rows {
		k := key{r.Suite, r.Workload, r.Threads, r.Target}
		t.by[k] = append(t.by[k], r)
	}
	return t
}

// metric is the figure a workload is judged by: queries per second for point selects
// (as seed 001), transactions per second otherwise.
func metric(suite, workload string) (name string, get func(Row) float64) {
	if suite == SuiteSysbench && workload == "oltp_point_select" {
		return "QPS", func(r Row) float64 { return r.QPS }
	}
	return "TPS", func(r Row) float64 { return r.TPS }
}

func (t *table) median(k key, get func(Row) float64) (float64, bool) {
	rows := t.by[k]
	if len(rows) == 0 {
		return math.NaN(), false
	}
	xs := make([]float64, 0, len(rows))
	for _, r := range rows {
		if v := get(r); !math.IsNaN(v) {
			xs = append(xs, v)
		}
	}
	if len(xs) == 0 {
		return math.NaN(), true // runs that measured nothing of this
	}
	return report.Median(xs), true
}

func (t *table) peak(k key) int {
	p := -1
	for _, r := range t.by[k] {
		p = max(p, r.PeakBackends)
	}
	return p
}

// ratio is the median over trials of a/b measured in the same trial (side by side),
// with the spread of those per-trial ratios.
func (t *table) ratio(a, b key, get func(Row) float64) (med, lo, hi float64, n int) {
	base := map[int]float64{}
	for _, r := range t.by[b] {
		base[r.Trial] = get(r)
	}
	var rs []float64
	for _, r := range t.by[a] {
		if d, ok := base[r.Trial]; ok && d > 0 && !math.IsNaN(get(r)) {
			rs = append(rs, get(r)/d)
		}
	}
	if len(rs) == 0 {
		return math.NaN(), math.NaN(), math.NaN(), 0
	}
	return report.Median(rs), slices.Min(rs), slices.Max(rs), len(rs)
}

func (t *table) values(suite string) (workloads []string, threads map[string][]int) {
	threads = map[string][]int{}
	for k := range t.by {
		if k.suite != suite {
			continue
		}
		if !slices.Contains(workloads, k.workload) {
			workloads = append(workloads, k.workload)
		}
		if !slices.Contains(threads[k.workload], k.threads) {
			threads[k.workload] = append(threads[k.workload], k.threads)
		}
	}
	order := map[string]int{"oltp_point_select": 0, "oltp_write_only": 1, "oltp_read_write": 2, "select-only/extended": 3, "select-only/simple": 4}
	slices.SortFunc(workloads, func(a, b string) int { return order[a] - order[b] })
	for _, w := range workloads {
		slices.Sort(threads[w])
	}
	return workloads, threads
}

// ReportConfig says what the report needs beyond the rows.
type ReportConfig struct {
	Dir        string // the run directory: results.csv in, report.md, summary.csv and charts out
	PoolSize   int
	Shards     int
	ProxyProcs int // the proxy's --procs (0: Go's choice, one thread per CPU)
	// Where is the run's placement, when it was not all on this host: the sweep's
	// --server and what the lab says of its hosts. Empty: the sweep's own cluster.
	Where string
}

// Targets the issue sets, as ratios measured in one run.
const (
	PassthroughTarget = 1.0 // proxy passthrough / pgbouncer transaction mode, pgbench -S
	ShardedTarget     = 0.8 // 4 schema shards / direct, sysbench oltp_point_select at 32 threads
)

// WriteReport writes report.md, summary.csv and the charts of the run in cfg.Dir.
func WriteReport(cfg ReportConfig) error {
	f, err := os.Open(filepath.Join(cfg.Dir, "results.csv"))
	if err != nil {
		return err
	}
	rows, err := ReadRows(f)
	f.Close()
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		return fmt.Errorf("proxysweep: %s/results.csv holds no run", cfg.Dir)
	}
	t := index(rows)
	var b strings.Builder
	b.WriteString("# shard-proxy sweep (seed 001's experiment)\n\n")
	if info, err := report.ReadRunInfo(filepath.Join(cfg.Dir, "run.txt")); err == nil {
		fmt.Fprintf(&b, "- command: `%s`\n- commit %s, %d CPUs (%s), started %s", info.Command, info.GitCommit, info.CPUs, info.CPUModel, info.Started)
		if info.Finished != "" {
			fmt.Fprintf(&b, ", finished %s", info.Finished)
		}
		if len(info.LoadStart) > 0 {
			fmt.Fprintf(&b, "; load average at the start %.2f", info.LoadStart[0])
		}
		if info.WallS > 0 && info.MachineCPUS > 0 {
			fmt.Fprintf(&b, "; the machine was busy %.0f%% of its CPU time, %.0f%% of it this run's own clients",
				100*info.MachineCPUS/(info.WallS*float64(max(info.CPUs, 1))), 100*info.LabCPUS/info.MachineCPUS)
		}
		b.WriteString("\n")
	}
	trials := 0
	for _, r := range rows {
		trials = max(trials, r.Trial)
	}
	fmt.Fprintf(&b, "- %d client runs, %d interleaved trials (targets in rotating order); medians over trials, ratios the median of per-trial ratios [min-max]\n", len(rows), trials)
	server := "the sweep's own PostgreSQL cluster"
	if cfg.Where != "" {
		server = cfg.Where
	}
	fmt.Fprintf(&b, "- proxy: %d shards that are schemas of one database on %s, `--pool-size %d`, "+
		"`proxy` one pool per shard, `proxy-aggregate` with `--aggregate` (one pool); `direct` the unsharded database; "+
		"`pgbouncer-session` pgbouncer 1.18 in session mode with a pool as large as the thread count, since 1.18 cannot keep sysbench's "+
		"named prepared statements in transaction mode; `pgbouncer-transaction` transaction mode, pool %d, for pgbench -S; "+
		"`proxy-passthrough` the proxy over the direct database, one shard, no rules; "+
		"`go-relay` a byte relay in Go (`proxysweep relay`: no decoding, no pool, a server connection per client, the proxy's raw system calls and `--procs`), "+
		"the floor of a Go middleware's CPU per transaction, for scale\n", cfg.Shards, server, cfg.PoolSize, cfg.PoolSize)
	if cfg.ProxyProcs > 0 {
		fmt.Fprintf(&b, "- shard-proxy ran with `--procs %d` (GOMAXPROCS): %d OS thread(s) running its Go code; pgbouncer runs one thread\n", cfg.ProxyProcs, cfg.ProxyProcs)
	} else {
		b.WriteString("- shard-proxy ran with Go's default GOMAXPROCS (one OS thread per CPU running its Go code); pgbouncer runs one thread\n")
	}
	b.WriteString("- middleware CPU: the user and system CPU time of the proxy's or pgbouncer's processes during the measured part, per transaction " +
		"(from /proc), which the client and the server could not use on a shared machine; " +
		"waiting for a CPU: the time its threads were runnable but not running (the run delay in /proc/PID/task/TID/schedstat), per transaction. " +
		"Summed over the middleware's threads: for pgbouncer and for Go with one thread running its code (`--procs 1`) " +
		"it is nearly that thread's busy time per transaction, which bounds throughput when the thread is never idle; " +
		"machine idle: the share of the machine's CPU time left idle during the measured part (/proc/stat)\n")
	b.WriteString("- peak backends: the most client backends pg_stat_activity showed, sampled every 100 ms during the run\n\n")

	var summary [][]string
	summary = append(summary, []string{"suite", "workload", "threads", "target", "metric", "median", "p95_ms", "p99_ms", "peak_backends", "ratio_to_direct", "trials"})
	for _, suite := range []string{SuiteSysbench, SuitePgbench} {
		workloads, threads := t.values(suite)
		targets := SysbenchTargets
		if suite == SuitePgbench {
			targets = PgbenchTargets
		}
		for _, w := range workloads {
			mname, get := metric(suite, w)
			title := w
			if suite == SuitePgbench {
				title = "pgbench -S -M " + strings.TrimPrefix(w, "select-only/")
			}
			fmt.Fprintf(&b, "## %s (%s)\n\n| threads |", title, mname)
			for _, tg := range targets {
				fmt.Fprintf(&b, " %s | conns |", tg)
			}
			for _, tg := range targets[1:] {
				fmt.Fprintf(&b, " %s / direct |", tg)
			}
			if suite == SuiteSysbench {
				b.WriteString(" aggregate / proxy |")
			} else {
				b.WriteString(" passthrough / pgbouncer |")
			}
			b.WriteString("\n|---|" + strings.Repeat("---|---|", len(targets)) + strings.Repeat("---|", len(targets)) + "\n")
			for _, th := range threads[w] {
				fmt.Fprintf(&b, "| %d |", th)
				for _, tg := range targets {
					k := key{suite, w, th, tg}
					v, ok := t.median(k, get)
					if !ok {
						b.WriteString(" - | - |")
						continue
					}
					fmt.Fprintf(&b, " %.0f | %d |", v, t.peak(k))
					p95, _ := t.median(k, func(r Row) float64 { return r.P95 })
					p99, _ := t.median(k, func(r Row) float64 { return r.P99 })
					rm, _, _, n := t.ratio(k, key{suite, w, th, TargetDirect}, get)
					summary = append(summary, []string{suite, w, strconv.Itoa(th), tg, mname, fmtF(v), fmtF(p95), fmtF(p99),
						strconv.Itoa(t.peak(k)), fmtF(rm), strconv.Itoa(n)})
				}
				for _, tg := range targets[1:] {
					b.WriteString(" " + ratioCell(t.ratio(key{suite, w, th, tg}, key{suite, w, th, TargetDirect}, get)) + " |")
				}
				if suite == SuiteSysbench {
					b.WriteString(" " + ratioCell(t.ratio(key{suite, w, th, TargetProxyAgg}, key{suite, w, th, TargetProxy}, get)) + " |")
				} else {
					b.WriteString(" " + ratioCell(t.ratio(key{suite, w, th, TargetProxyPass}, key{suite, w, th, TargetBouncerTx}, get)) + " |")
				}
				b.WriteString("\n")
			}
			b.WriteString("\nLatency p95 / p99 (ms), medians:\n\n| threads |")
			for _, tg := range targets {
				fmt.Fprintf(&b, " %s |", tg)
			}
			b.WriteString("\n|---|" + strings.Repeat("---|", len(targets)) + "\n")
			for _, th := range threads[w] {
				fmt.Fprintf(&b, "| %d |", th)
				for _, tg := range targets {
					k := key{suite, w, th, tg}
					p95, ok := t.median(k, func(r Row) float64 { return r.P95 })
					p99, _ := t.median(k, func(r Row) float64 { return r.P99 })
					if !ok {
						b.WriteString(" - |")
						continue
					}
					fmt.Fprintf(&b, " %.2f / %.2f |", p95, p99)
				}
				b.WriteString("\n")
			}
			b.WriteString(cpuTable(t, suite, w, threads[w], targets))
			var failed []string
			for _, th := range threads[w] {
				for _, tg := range targets {
					for _, r := range t.by[key{suite, w, th, tg}] {
						if r.Status != "ok" {
							failed = append(failed, fmt.Sprintf("- trial %d, %d threads, %s: %.0f %s measured before it failed: %s", r.Trial, th, tg, get(r), mname, r.Status))
						}
					}
				}
			}
			if len(failed) > 0 {
				b.WriteString("\nFailed runs (their figures count in the medians as measured):\n\n" + strings.Join(failed, "\n") + "\n")
			}
			errs := 0.0
			for _, th := range threads[w] {
				for _, tg := range targets {
					for _, r := range t.by[key{suite, w, th, tg}] {
						errs += r.Errors
					}
				}
			}
			if errs > 0 {
				fmt.Fprintf(&b, "\n%.0f errors in all (sysbench's ignored errors: deadlock retries; pgbench's failed transactions).\n", errs)
			}
			slug := strings.ReplaceAll(w, "/", "_")
			if err := chart(t, suite, w, threads[w], targets, mname, get, filepath.Join(cfg.Dir, suite+"_"+slug+".png")); err == nil {
				fmt.Fprintf(&b, "\n![%s](%s_%s.png)\n", title, suite, slug)
			}
			b.WriteString("\n")
		}
	}
	b.WriteString(targetsSection(t, cfg))
	if err := os.WriteFile(filepath.Join(cfg.Dir, "report.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	sf, err := os.Create(filepath.Join(cfg.Dir, "summary.csv"))
	if err != nil {
		return err
	}
	w := csv.NewWriter(sf)
	w.WriteAll(summary)
	if err := w.Error(); err != nil {
		sf.Close()
		return err
	}
	return sf.Close()
}

func fmtF(x float64) string {
	if math.IsNaN(x) {
		return ""
	}
	return strconv.FormatFloat(x, 'f', 3, 64)
}

func ratioCell(med, lo, hi float64, n int) string {
	if n == 0 {
		return "-"
	}
	if n == 1 {
		return fmt.Sprintf("%.2fx", med)
	}
	return fmt.Sprintf("%.2fx [%.2f-%.2f]", med, lo, hi)
}

// targetsSection checks the targets.
func targetsSection(t *table, cfg ReportConfig) string {
	var b strings.Builder
	b.WriteString("## Targets\n\n| target | measured | met |\n|---|---|---|\n")
	verdict := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "**no**"
	}
	_, tps := metric(SuitePgbench, "")
	for _, mode := range []string{"extended", "simple"} {
		for _, c := range []int{8, 32} {
			w := "select-only/" + mode
			m, lo, hi, n := t.ratio(key{SuitePgbench, w, c, TargetProxyPass}, key{SuitePgbench, w, c, TargetBouncerTx}, tps)
			if n == 0 {
				continue
			}
			fmt.Fprintf(&b, "| passthrough pgbench -S -M %s, %d clients, >= %.1fx pgbouncer (transaction) | %s | %s |\n",
				mode, c, PassthroughTarget, ratioCell(m, lo, hi, n), verdict(m >= PassthroughTarget))
		}
	}
	_, qps := metric(SuiteSysbench, "oltp_point_select")
	for _, tg := range []string{TargetProxy, TargetProxyAgg} {
		m, lo, hi, n := t.ratio(key{SuiteSysbench, "oltp_point_select", 32, tg}, key{SuiteSysbench, "oltp_point_select", 32, TargetDirect}, qps)
		if n == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %d shards (%s), sysbench oltp_point_select 32 threads, >= %.1fx direct | %s | %s |\n",
			cfg.Shards, tg, ShardedTarget, ratioCell(m, lo, hi, n), verdict(m >= ShardedTarget))
	}
	cpuLine := func(what string, a, bk key) {
		cpu := func(r Row) float64 { return r.MiddlewareCPU }
		m, lo, hi, n := t.ratio(a, bk, cpu)
		if n == 0 || math.IsNaN(m) {
			return
		}
		va, _ := t.median(a, cpu)
		vb, _ := t.median(bk, cpu)
		fmt.Fprintf(&b, "| (for scale, not a target) %s: middleware CPU per transaction, %s / %s | %.1f / %.1f µs: %s | |\n",
			what, a.target, bk.target, va, vb, ratioCell(m, lo, hi, n))
	}
	for _, mode := range []string{"extended", "simple"} {
		for _, c := range []int{8, 32} {
			w := "select-only/" + mode
			cpuLine(fmt.Sprintf("pgbench -S -M %s, %d clients", mode, c), key{SuitePgbench, w, c, TargetProxyPass}, key{SuitePgbench, w, c, TargetBouncerTx})
			cpuLine(fmt.Sprintf("pgbench -S -M %s, %d clients", mode, c), key{SuitePgbench, w, c, TargetProxyPass}, key{SuitePgbench, w, c, TargetRelay})
			cpuLine(fmt.Sprintf("pgbench -S -M %s, %d clients", mode, c), key{SuitePgbench, w, c, TargetRelay}, key{SuitePgbench, w, c, TargetBouncerTx})
		}
	}
	busyLine := func(what string, keys ...key) {
		var cells []string
		for _, k := range keys {
			c, _ := t.median(k, func(r Row) float64 { return r.MiddlewareCPU })
			w, _ := t.median(k, func(r Row) float64 { return r.MiddlewareRunQueue })
			idle, _ := t.median(k, func(r Row) float64 { return r.MachineIdle })
			if math.IsNaN(c) || math.IsNaN(w) {
				continue
			}
			cell := fmt.Sprintf("%s %.1f + %.1f µs", k.target, c, w)
			if !math.IsNaN(idle) {
				cell += fmt.Sprintf(", machine %.0f%% idle", idle)
			}
			cells = append(cells, cell)
		}
		if len(cells) > 0 {
			fmt.Fprintf(&b, "| (for scale, not a target) %s: middleware CPU + waiting for a CPU per transaction, summed over its threads | %s | |\n",
				what, strings.Join(cells, "; "))
		}
	}
	for _, mode := range []string{"extended", "simple"} {
		for _, c := range []int{8, 32} {
			w := "select-only/" + mode
			busyLine(fmt.Sprintf("pgbench -S -M %s, %d clients", mode, c),
				key{SuitePgbench, w, c, TargetProxyPass}, key{SuitePgbench, w, c, TargetBouncerTx}, key{SuitePgbench, w, c, TargetRelay})
			m, lo, hi, n := t.ratio(key{SuitePgbench, w, c, TargetBouncerTx}, key{SuitePgbench, w, c, TargetDirect}, tps)
			if n > 0 {
				fmt.Fprintf(&b, "| (for scale, not a target) pgbench -S -M %s, %d clients: pgbouncer (transaction) / direct | %s | |\n",
					mode, c, ratioCell(m, lo, hi, n))
			}
		}
	}
	cpuLine("sysbench oltp_point_select, 32 threads", key{SuiteSysbench, "oltp_point_select", 32, TargetProxyAgg}, key{SuiteSysbench, "oltp_point_select", 32, TargetBouncerSess})
	peak, runs := -1, 0
	for k := range t.by {
		if k.target == TargetProxyAgg {
			peak = max(peak, t.peak(k))
			runs += len(t.by[k])
		}
	}
	if runs > 0 {
		fmt.Fprintf(&b, "| with --aggregate, backend connections <= --pool-size %d, every thread count | peak %d over %d runs | %s |\n",
			cfg.PoolSize, peak, runs, verdict(peak <= cfg.PoolSize))
	}
	return b.String()
}

// chart draws a workload's metric against threads, one line per target.
func chart(t *table, suite, w string, threads []int, targets []string, mname string, get func(Row) float64, path string) error {
	p := plot.New()
	p.Title.Text = w
	p.X.Label.Text = "threads (clients)"
	p.Y.Label.Text = mname
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = threadTicks(threads)
	p.Y.Tick.Marker = charts.PlainTicks{}
	p.Y.Min = 0
	any := false
	for i, tg := range targets {
		var pts plotter.XYs
		for _, th := range threads {
			if v, ok := t.median(key{suite, w, th, tg}, get); ok {
				pts = append(pts, plotter.XY{X: float64(th), Y: v})
			}
		}
		if len(pts) == 0 {
			continue
		}
		l, s, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		l.Color, s.Color = charts.Color(i), charts.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l, s)
		p.Legend.Add(tg, l, s)
		any = true
	}
	if !any {
		return charts.ErrNoData
	}
	return charts.SavePlot(p, 7*vg.Inch, 4*vg.Inch, path)
}

// threadTicks labels the thread counts measured.
type threadTicks []int

func (tt threadTicks) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for _, t := range tt {
		out = append(out, plot.Tick{Value: float64(t), Label: strconv.Itoa(t)})
	}
	return out
}

// cpuTable lists the middleware's CPU time per transaction (medians) for the targets
// that have a middleware; "" when none of the runs measured it.
func cpuTable(t *table, suite, w string, threads []int, targets []string) string {
	cpu := func(r Row) float64 { return r.MiddlewareCPU }
	var mw []string
	for _, tg := range targets {
		if tg == TargetDirect {
			continue
		}
		for _, th := range threads {
			if v, ok := t.median(key{suite, w, th, tg}, cpu); ok && !math.IsNaN(v) {
				mw = append(mw, tg)
				break
			}
		}
	}
	if len(mw) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\nMiddleware CPU per transaction (µs), medians:\n\n| threads |")
	for _, tg := range mw {
		fmt.Fprintf(&b, " %s |", tg)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(mw)) + "\n")
	for _, th := range threads {
		fmt.Fprintf(&b, "| %d |", th)
		for _, tg := range mw {
			v, ok := t.median(key{suite, w, th, tg}, cpu)
			if !ok || math.IsNaN(v) {
				b.WriteString(" - |")
				continue
			}
			fmt.Fprintf(&b, " %.1f |", v)
		}
		b.WriteString("\n")
	}
	return b.String()
}
