package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/shardlab/shardlab/lab/resultscsv"
	"github.com/shardlab/shardlab/lab/usl"
)

// MinDurationS is the length of the measured phase, in seconds, under which the report
// flags a row as too short to compare: start-up, connection set-up and the first
// checkpoint weigh more than the steady state in such a run.
const MinDurationS = 1

// ChartFile is a chart written next to the report, for the markdown to link.
type ChartFile struct {
	Kind  string // "scaling", "latency" or "timeline"
	Title string
	PNG   string // path relative to the report, slash-separated
	SVG   string
}

// MarkdownOptions says where the report's inputs live, for its header and links.
type MarkdownOptions struct {
	CSVName string      // the CSV as the reader should find it, e.g. "results.csv"
	Charts  []ChartFile // charts to embed, in order
	Notes   []string    // remarks about the inputs, e.g. unreadable sample files
	// RunInfo is the run's run.txt (load averages, CPU used by other work), nil when
	// none was recorded.
	RunInfo *RunInfo
}

func ms(x float64) string    { return fmt.Sprintf("%.2f", x) }
func ratio(x float64) string { return fmt.Sprintf("%.2fx", x) }

// shardsText names a configuration in a sentence: "3 shards", "1 shard".
func shardsText(f *Finding) string {
	if f.Shards == 1 {
		return "1 shard"
	}
	return fmt.Sprintf("%d shards", f.Shards)
}

// ciText formats an interval as "[lo-hi]", or "[-]" when there is none.
func ciText(iv Interval, format func(float64) string) string {
	if !iv.OK {
		return "[-]"
	}
	return fmt.Sprintf("[%s-%s]", format(iv.Lo), format(iv.Hi))
}

// pText formats a p-value with three decimals, or as "< 0.001".
func pText(p float64) string {
	if p < 0.001 {
		return "< 0.001"
	}
	return fmt.Sprintf("%.3f", p)
}

// trialsText names the sample sizes of a test: "6 trials against 6".
func trialsText(t Test) string {
	word := "trials"
	if t.N2 == 1 {
		word = "trial"
	}
	return fmt.Sprintf("%d %s against %d", t.N2, word, t.N1)
}

// conclusion is a few computed sentences about f against its baseline: the ratio and
// its interval, the test and what it allows to say, the medians with their intervals.
func conclusion(f *Finding, multiBackend bool) string {
	name := f.Scenario
	if multiBackend {
		name += " (" + f.Backend + ")"
	}
	if f.Baseline == nil {
		return fmt.Sprintf("%s: %s at %s ops/s; %s, so no ratio.", name, shardsText(f), thousands(f.Throughput.Median), VerdictNoBaseline)
	}
	b := f.Baseline
	var s strings.Builder
	if f.Ratio.N == 0 {
		fmt.Fprintf(&s, "%s: %s at %s ops/s, single at %s ops/s; %s, so no ratio", name, shardsText(f),
			thousands(f.Throughput.Median), thousands(b.Throughput.Median), f.Verdict)
	} else {
		fmt.Fprintf(&s, "%s: %s %s single", name, shardsText(f), ratio(f.Ratio.Median))
		switch {
		case f.RatioCI.OK:
			fmt.Fprintf(&s, " (median of %d paired trials, 95%% bootstrap CI %s-%s)", f.Ratio.N, ratio(f.RatioCI.Lo), ratio(f.RatioCI.Hi))
		case f.Ratio.N > 1:
			fmt.Fprintf(&s, " (median of %d paired trials, %s-%s)", f.Ratio.N, ratio(f.Ratio.Min), ratio(f.Ratio.Max))
		default:
			fmt.Fprintf(&s, " (%s vs %s ops/s)", thousands(f.Throughput.Median), thousands(b.Throughput.Median))
		}
		t := f.Test
		switch f.Kind {
		case KindTooShort:
			fmt.Fprintf(&s, "; measured phases under %g s, mostly start-up and noise (a --quick run is a smoke test): no conclusion", float64(MinDurationS))
		case KindTooFew:
			fmt.Fprintf(&s, "; with %s the Mann-Whitney U test cannot reach p <= %g (its smallest possible p is %.3f), so no verdict either way: run at least %d trials a side (%d also give confidence intervals)",
				trialsText(t), Alpha, t.MinP, minTrialsForTest(), minTrialsForCI())
		case KindNoDifference:
			fmt.Fprintf(&s, "; Mann-Whitney U p = %s > %g over %s: no significant difference", pText(t.P), Alpha, trialsText(t))
		case KindFaster, KindSlower:
			fmt.Fprintf(&s, "; Mann-Whitney U p = %s <= %g over %s: **%s**", pText(t.P), Alpha, trialsText(t), f.Verdict)
		}
		if f.ThroughputCI.OK && b.ThroughputCI.OK {
			fmt.Fprintf(&s, "; median throughput %s %s vs %s %s ops/s (95%% CIs)", thousands(f.Throughput.Median),
				ciText(f.ThroughputCI, thousands), thousands(b.Throughput.Median), ciText(b.ThroughputCI, thousands))
		}
	}
	fmt.Fprintf(&s, "; p99 %s ms vs %s ms single", ms(f.P99Ms.Median), ms(b.P99Ms.Median))
	if len(f.Unpaired) > 0 {
		nums := make([]string, len(f.Unpaired))
		for i, t := range f.Unpaired {
			nums[i] = fmt.Sprint(t)
		}
		word := "trial"
		if len(nums) > 1 {
			word = "trials"
		}
		fmt.Fprintf(&s, "; %s %s measured on one side only (or twice), left out of the ratio", word, strings.Join(nums, ", "))
	}
	s.WriteString(".")
	return s.String()
}

// minTrialsForTest is the smallest number of trials per side with which the
// Mann-Whitney U test can reach p <= Alpha.
func minTrialsForTest() int {
	n := 1
	for minUTestP(n, n) > Alpha {
		n++
	}
	return n
}

// FlatShare is how far (as a share of one shard's throughput) the fitted curve may move
// over the measured shard counts for a sweep to be called flat.
const FlatShare = 0.10

// flatWithin returns the largest relative distance of the model's throughput from X(1)
// over 1..maxN.
func flatWithin(m usl.Model, maxN int) float64 {
	x1 := m.Throughput(1)
	if x1 <= 0 {
		return math.Inf(1)
	}
	worst := 0.0
	for n := 2; n <= maxN; n++ {
		worst = max(worst, math.Abs(m.Throughput(float64(n))/x1-1))
	}
	return worst
}

// sweepLine is one computed sentence about a sweep.
func sweepLine(s *Sweep) string {
	counts := make([]string, len(s.Counts))
	for i, c := range s.Counts {
		counts[i] = fmt.Sprint(c)
	}
	if s.Err != nil {
		return fmt.Sprintf("%s: measured at %s shards; the USL fit needs at least %d distinct shard counts (scripts/sweep.sh runs them).",
			s.Scenario, strings.Join(counts, ", "), 6)
	}
	if s.Short {
		return fmt.Sprintf("%s: measured phases under %g s: no conclusion from the USL fit (R² %.3f).", s.Scenario, float64(MinDurationS), s.Model.R2)
	}
	best, bestX := 0, 0.0
	for _, c := range s.Counts {
		var xs []float64
		for _, p := range s.Points {
			if int(p.N) == c {
				xs = append(xs, p.X)
			}
		}
		if m := newStat(xs).Median; m > bestX {
			best, bestX = c, m
		}
	}
	bestText := fmt.Sprintf("best measured %d shards at %s ops/s", best, thousands(bestX))
	m := s.Model
	if !m.Meaningful() {
		return fmt.Sprintf("%s: %s, so no recommendation; %s.", s.Scenario, m.PoorFit(), bestText)
	}
	var peak string
	n, ok := m.Peak()
	maxN := s.Counts[len(s.Counts)-1]
	switch {
	case flatWithin(m, maxN) <= FlatShare:
		peak = fmt.Sprintf("flat: from 1 to %d shards the fitted throughput stays within %.0f%% of one shard's, so more shards do not pay here",
			maxN, flatWithin(m, maxN)*100)
	case m.Sigma == 1 && m.Kappa == 0:
		peak = "sigma = 1: more shards do not raise throughput, so the peak is N* = 1"
	case m.Sigma >= 1:
		peak = "sigma >= 1: more shards only lower throughput, so the peak is N* = 1"
	case ok:
		peak = fmt.Sprintf("throughput peaks at N* = %d shards", n)
	default:
		peak = "no peak (kappa about 0): throughput keeps rising towards lambda/sigma"
	}
	return fmt.Sprintf("%s: USL sigma=%.4g (contention), kappa=%.4g (coherency), %s; %s (R² %.3f).",
		s.Scenario, m.Sigma, m.Kappa, peak, bestText, m.R2)
}

// WriteMarkdown writes the report for a to w.
func (a *Analysis) WriteMarkdown(w io.Writer, opt MarkdownOptions) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }

	runID := a.RunID
	if runID == "" {
		runID = "(none)"
	}
	p("# shardlab results: run %s\n\n", runID)
	p("Generated by `go run ./cmd/report` from `%s` (run `%s`, %d rows). Do not edit by hand: rerun the command.\n\n",
		opt.CSVName, runID, len(a.Rows))
	if why := opt.RunInfo.BusyReasons(); len(why) > 0 {
		p("> **Warning: the machine was busy.** %s. Other work competes with the lab's server and load generator ", capitalize(strings.Join(why, "; ")))
		p("for the same cores, so differences in this run may be its doing: rerun on a quiet machine before drawing conclusions.\n\n")
	}

	p("## Findings\n\n")
	p("| Scenario | Backend | Mode | Shards | Trials | Throughput ops/s [95%% CI] | Avg ms | p99 ms | vs single [95%% CI] | p | Verdict |\n")
	p("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, f := range a.Findings {
		vs, pv := "-", "-"
		if f.Baseline != nil && f.Ratio.N > 0 {
			vs = ratio(f.Ratio.Median)
			if f.Ratio.N > 1 {
				vs += " " + ciText(f.RatioCI, ratio)
			}
			pv = pText(f.Test.P)
		}
		tput := thousands(f.Throughput.Median)
		if f.Throughput.N > 1 {
			tput += " " + ciText(f.ThroughputCI, thousands)
		}
		p("| %s | %s | %s | %d | %d | %s | %s | %s | %s | %s | %s |\n",
			f.Scenario, f.Backend, f.Mode, f.Shards, f.Throughput.N, tput,
			ms(f.AvgMs.Median), ms(f.P99Ms.Median), vs, pv, f.Verdict)
	}
	p("\nThroughput: median of the trials and, in brackets, its 95%% confidence interval from order statistics ")
	p("(benchstat's; `[-]`: fewer than %d trials give none). Avg and p99: median over the trials. ", minTrialsForCI())
	p("vs single: throughput of trial k over that of single's trial k (matched by trial number), median over the pairs, ")
	p("with a 95%% bootstrap confidence interval (%s resamples of the pairs; `[-]` under %d pairs). ", thousands(BootstrapResamples), MinBootstrapPairs)
	p("p: two-sided Mann-Whitney U test of the trials' throughputs against single's (golang.org/x/perf/benchmath, as benchstat). ")
	p("A configuration is called faster or slower only when p <= %g; ", Alpha)
	p("with fewer than %d trials a side the test cannot get there, and the verdict says \"%s\" rather than guess; ", minTrialsForTest(), VerdictTooFew)
	p("a trial measured for under %g s gives no conclusion at all.\n\n", float64(MinDurationS))

	p("## Conclusions\n\n")
	n := 0
	for _, f := range a.Findings {
		if f.Mode != "single" {
			p("- %s\n", conclusion(f, a.MultiBackend))
			n++
		}
	}
	for _, s := range a.Sweeps {
		p("- %s\n", sweepLine(s))
		n++
	}
	if n == 0 {
		p("- Only single-database runs: nothing to compare.\n")
	}
	var failed, short []string
	for _, f := range a.Findings {
		for _, r := range f.Trials {
			if r.Errors > 0 {
				failed = append(failed, fmt.Sprintf("%s %s trial %d: %d failed requests (%d successful)",
					f.Scenario, f.Label(), r.Trial, r.Errors, r.Ops))
			}
			// Zero is an old row without the column, not a zero-length run.
			if r.DurationS > 0 && r.DurationS < MinDurationS {
				short = append(short, fmt.Sprintf("%s %s trial %d (%.2f s)", f.Scenario, f.Label(), r.Trial, r.DurationS))
			}
		}
	}
	if len(failed) == 0 {
		p("- No request failed in this run.\n")
	} else {
		p("- Runs with failed requests (their throughput counts successful requests only):\n")
		for _, s := range failed {
			p("  - %s\n", s)
		}
	}
	if len(short) > 0 {
		p("- Measured phase under %g s: too short to compare, the numbers are mostly noise (a `--quick` run is a smoke test), so they get no conclusion:\n", float64(MinDurationS))
		for _, s := range short {
			p("  - %s\n", s)
		}
	}
	p("\n")

	if lessons := a.Lessons(); len(lessons) > 0 {
		p("## The seed's lessons\n\n")
		for _, l := range lessons {
			p("- %s %s\n", l.Claim, l.Verdict)
		}
		p("\n")
	}

	if len(a.Sweeps) > 0 {
		p("## Scalability (Universal Scalability Law)\n\n")
		p("X(N) = lambda*N / (1 + sigma*(N-1) + kappa*N*(N-1)), fitted by non-linear least squares to every trial; ")
		p("N* = floor(sqrt((1-sigma)/kappa)), or 1 when sigma >= 1 (more shards then only lower throughput). ")
		p("A fit with R² under %g and residuals over %.0f%% of the mean throughput does not describe its points: ", usl.MinR2, usl.MaxFlatRMSE*100)
		p("it gets no N* and no conclusion (the `usl` command warns in the same words).\n\n")
		p("| Scenario | Shard counts | Points | sigma | kappa | lambda ops/s | N* | R² |\n")
		p("|---|---|---:|---:|---:|---:|---:|---:|\n")
		for _, s := range a.Sweeps {
			counts := make([]string, len(s.Counts))
			for i, c := range s.Counts {
				counts[i] = fmt.Sprint(c)
			}
			if s.Err != nil {
				p("| %s | %s | %d | - | - | - | - | fit needs at least 6 shard counts |\n", s.Scenario, strings.Join(counts, ", "), len(s.Points))
				continue
			}
			nstar := "none"
			if n, ok := s.Model.Peak(); ok {
				nstar = fmt.Sprint(n)
			}
			r2 := fmt.Sprintf("%.3f", s.Model.R2)
			if !s.Model.Meaningful() {
				nstar = "-"
				r2 += " (fit does not describe the points)"
			}
			p("| %s | %s | %d | %.4g | %.4g | %s | %s | %s |\n", s.Scenario, strings.Join(counts, ", "), len(s.Points),
				s.Model.Sigma, s.Model.Kappa, thousands(s.Model.Lambda), nstar, r2)
		}
		p("\n")
	} else {
		p("## Scalability (Universal Scalability Law)\n\n")
		p("No scenario in this run was measured at three or more shard counts; the USL fit needs at least 6 (run `scripts/sweep.sh`).\n\n")
	}

	if len(opt.Charts) > 0 {
		p("## Charts\n\n")
		for _, c := range opt.Charts {
			p("### %s\n\n![%s](%s)\n\n[SVG](%s)\n\n", c.Title, c.Title, c.PNG, c.SVG)
		}
	}
	for _, note := range opt.Notes {
		p("> %s\n\n", note)
	}

	p("## Machine and build\n\n")
	p("| | |\n|---|---|\n")
	first, last := a.Rows[0].Timestamp, a.Rows[0].Timestamp
	for _, r := range a.Rows {
		if r.Timestamp.Before(first) {
			first = r.Timestamp
		}
		if r.Timestamp.After(last) {
			last = r.Timestamp
		}
	}
	p("| Run id | `%s` |\n", runID)
	p("| Date (UTC) | %s to %s |\n", first.UTC().Format("2006-01-02 15:04:05"), last.UTC().Format("2006-01-02 15:04:05"))
	p("| Git commit | %s |\n", distinct(a.Rows, func(r resultscsv.Row) string { return r.GitCommit }))
	p("| CPU | %s |\n", distinct(a.Rows, func(r resultscsv.Row) string {
		if r.CPUModel == "" && r.CPUs == 0 {
			return ""
		}
		return fmt.Sprintf("%s, %d logical CPUs", r.CPUModel, r.CPUs)
	}))
	p("| Go | %s |\n", distinct(a.Rows, func(r resultscsv.Row) string { return r.GoVersion }))
	p("| Backend | %s |\n", distinct(a.Rows, func(r resultscsv.Row) string { return r.Backend }))
	p("| SQLite | %s |\n", distinct(a.Rows, func(r resultscsv.Row) string { return r.SQLiteVer }))
	p("| SQLite synchronous | %s |\n", distinct(a.Rows, func(r resultscsv.Row) string { return r.Sync }))
	p("| Router | %s |\n", distinct(a.Rows, func(r resultscsv.Row) string { return r.Router }))
	writeLoad(p, opt.RunInfo)
	p("\n")

	p("## Parameters\n\n")
	p("| Scenario | Requests per trial | Concurrency | Write ratio | Keys | Distribution | Rate req/s | Measured s | Pool size | Seeds | Trials |\n")
	p("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n")
	var scenarios []string
	for _, f := range a.Findings {
		if !slices.Contains(scenarios, f.Scenario) {
			scenarios = append(scenarios, f.Scenario)
		}
	}
	trialsOf := func(scenario string) int {
		n := 0
		for _, f := range a.Findings {
			if f.Scenario == scenario {
				n = max(n, len(f.Trials))
			}
		}
		return n
	}
	for _, sc := range scenarios {
		var rows []resultscsv.Row
		for _, f := range a.Findings {
			if f.Scenario == sc {
				rows = append(rows, f.Trials...)
			}
		}
		rate := distinct(rows, func(r resultscsv.Row) string {
			if r.Rate == 0 {
				return "closed loop"
			}
			return fmt.Sprintf("%g", r.Rate)
		})
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", sc,
			spread(rows, func(r resultscsv.Row) float64 { return float64(r.Ops) }, thousands),
			distinct(rows, func(r resultscsv.Row) string { return fmt.Sprint(r.Concurrency) }),
			distinct(rows, func(r resultscsv.Row) string { return fmt.Sprintf("%g", r.WriteRatio) }),
			distinct(rows, func(r resultscsv.Row) string { return fmt.Sprint(r.Keys) }),
			distinct(rows, func(r resultscsv.Row) string { return r.Dist }),
			rate,
			spread(rows, func(r resultscsv.Row) float64 { return r.DurationS }, func(x float64) string { return fmt.Sprintf("%.1f", x) }),
			distinct(rows, func(r resultscsv.Row) string { return fmt.Sprint(r.PoolSize) }),
			spread(rows, func(r resultscsv.Row) float64 { return float64(r.Seed) }, func(x float64) string { return fmt.Sprintf("%.0f", x) }),
			trialsOf(sc))
	}
	p("\nRequests per trial: the `ops` column, the successful requests of a trial's measured phase.\n\n")
	commit := distinct(a.Rows, func(r resultscsv.Row) string { return r.GitCommit })
	dirty := ""
	if strings.Contains(commit, "-dirty") {
		dirty = " (it had uncommitted changes, which a checkout does not bring back)"
	}
	rc := buildRerun(a.Rows)
	switch {
	case rc.Verbatim:
		p("To rerun, check out commit %s%s and run the command that produced this run:\n\n", commit, dirty)
	case rc.Exact:
		p("To rerun, check out commit %s%s and run (built from the parameters each row recorded):\n\n", commit, dirty)
	default:
		p("The rows of this run predate the CSV columns that record what a run was asked to do (requested_ops, warmup_s, preload, command, ...), ")
		p("so the command cannot be reconstructed exactly. An **approximate** command, at commit %s%s: ", commit, dirty)
		p("`--ops` is the largest request count a trial recorded, warm-up and preloading are unknown and left out (scripts/scenarios.conf at that commit says which scenarios preload).\n\n")
	}
	p("```sh\n")
	if !rc.Exact {
		p("# approximate: the rows do not record the exact command\n")
	}
	p("%s\n```\n\n", strings.Join(rc.Lines, "\n"))
	for _, n := range rc.Notes {
		p("%s\n\n", n)
	}
	p("Regenerate this report from the repository root with `go run ./cmd/report --csv DIR/%s --out DIR/report.md --run-id %s`, ", opt.CSVName, a.RunID)
	p("DIR being this report's directory.\n")

	if len(a.Others) > 0 {
		p("\n## Other runs in the CSV\n\n")
		for i, o := range a.Others {
			if i == 10 {
				p("- and %d more\n", len(a.Others)-10)
				break
			}
			p("- `%s`: %d rows, last at %s UTC (`go run ./cmd/report --run-id %s`)\n",
				o.RunID, o.Rows, o.Last.UTC().Format("2006-01-02 15:04:05"), o.RunID)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// spread formats a numeric column over rows: the value when all rows agree, else
// "min-max".
func spread(rows []resultscsv.Row, field func(resultscsv.Row) float64, format func(float64) string) string {
	if len(rows) == 0 {
		return "-"
	}
	lo, hi := field(rows[0]), field(rows[0])
	for _, r := range rows[1:] {
		lo, hi = min(lo, field(r)), max(hi, field(r))
	}
	if format(lo) == format(hi) {
		return format(lo)
	}
	return format(lo) + "-" + format(hi)
}

// writeLoad adds the machine's load during the run to the machine table.
func writeLoad(p func(string, ...any), ri *RunInfo) {
	if ri == nil {
		p("| Machine load | not recorded (no %s for this run) |\n", RunInfoName)
		return
	}
	load := func(l []float64) string {
		if len(l) != 3 {
			return "not recorded"
		}
		return fmt.Sprintf("%.2f, %.2f, %.2f", l[0], l[1], l[2])
	}
	p("| Load average at start (1, 5, 15 min) | %s |\n", load(ri.LoadStart))
	p("| Load average at end | %s (counts the lab's own processes) |\n", load(ri.LoadEnd))
	if other, ok := ri.OtherCPUs(); ok {
		share := ""
		if ri.CPUs > 0 {
			share = fmt.Sprintf(", %.0f%% of %d CPUs", 100*other/float64(ri.CPUs), ri.CPUs)
		}
		p("| CPU used by other work during the run | %.2f CPUs on average%s (the machine's busy time from /proc/stat, less the run's own processes) |\n", other, share)
	}
}

// capitalize upper-cases the first letter of s.
func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
