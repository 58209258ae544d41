// Package report turns a run's results CSV into its report.md: a findings table with
// the median of repeated trials and its confidence interval, verdicts from benchstat's
// statistics (a Mann-Whitney U test against the single baseline, stated with its
// p-value, and no verdict where the trials are too few or too short to support one),
// short conclusions computed from the numbers, a Universal Scalability Law fit for
// shard sweeps, charts, the machine and its load, and the parameters needed to rerun.
// Nothing in the report is typed by hand and, for a given CSV (and sample files), its
// text is always the same.
package report

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/shardlab/shardlab/lab/resultscsv"
	"github.com/shardlab/shardlab/lab/usl"
)

// ErrNoRows is returned when the CSV holds no measured rows.
var ErrNoRows = errors.New("the results CSV has no rows")

// ErrRunNotFound is returned when the requested run id is not in the CSV.
var ErrRunNotFound = errors.New("no rows with that run id")

// Stat summarises one figure over repeated trials.
type Stat struct {
	Median, Min, Max float64
	N                int // number of trials
}

// newStat summarises xs (which it sorts).
func newStat(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{}
	}
	slices.Sort(xs)
	n := len(xs)
	med := xs[n/2]
	if n%2 == 0 {
		med = (xs[n/2-1] + xs[n/2]) / 2
	}
	return Stat{Median: med, Min: xs[0], Max: xs[n-1], N: n}
}

// Key identifies one configuration of a run.
type Key struct {
	Scenario string
	Backend  string
	Mode     string // single or sharded
	Shards   int
}

// Label is the configuration's short name: "single" or "sharded x3".
func (k Key) Label() string {
	if k.Mode == "single" {
		return "single"
	}
	return fmt.Sprintf("%s x%d", k.Mode, k.Shards)
}

// Verdict texts. Faster and slower verdicts are "1.17x faster" and "1.15x slower".
const (
	VerdictBaseline     = "baseline"
	VerdictNoBaseline   = "no single baseline in this run"
	VerdictNoPairs      = "no trial number in common with single"
	VerdictNoThroughput = "no throughput to compare"
	VerdictTooShort     = "measured phase under 1 s: no conclusion"
	VerdictTooFew       = "too few trials to tell"
	VerdictNoDifference = "no significant difference"
)

// Kind classifies a Finding's verdict, for code that needs more than its text.
type Kind int

// The kinds of verdict, one per Verdict text (Faster and Slower carry the ratio).
const (
	KindBaseline Kind = iota
	KindNoBaseline
	KindNoPairs
	KindNoThroughput
	KindTooShort     // a trial's measured phase was under MinDurationS
	KindTooFew       // the sample sizes cannot give p <= Alpha
	KindNoDifference // the test ran and p > Alpha
	KindFaster
	KindSlower
)

// Finding is one row of the findings table: a configuration's trials summarised, and
// compared with the single baseline of the same scenario and backend.
type Finding struct {
	Key
	Trials     []resultscsv.Row // in trial order
	Throughput Stat             // ops/s
	// ThroughputCI is the confidence interval of the median throughput (not OK under 6
	// trials).
	ThroughputCI Interval
	AvgMs        Stat
	P99Ms        Stat
	Errors       int64 // failed requests over all trials
	Ops          int64 // successful requests over all trials

	// Ratio is throughput over the single baseline's, per trial (trial k of this
	// configuration against single's trial k, matched by trial number); zero N when
	// there is no baseline.
	Ratio Stat
	// RatioCI is a bootstrap confidence interval of Ratio's median over the pairs (not
	// OK under MinBootstrapPairs pairs).
	RatioCI Interval
	// Test compares the throughputs with the baseline's; zero without a baseline.
	Test Test
	// Short is set when a trial of this configuration or of its baseline measured for
	// less than MinDurationS.
	Short bool
	// Unpaired lists the trial numbers, of this configuration or of its baseline, that
	// have no partner with the same number on the other side and so are left out of
	// Ratio; increasing, nil when every trial is paired.
	Unpaired []int
	Verdict  string // one of the Verdict constants, or "1.92x faster" / "1.15x slower"
	Kind     Kind   // the verdict's kind
	// Baseline is the single configuration compared against, nil for none.
	Baseline *Finding
}

// Sweep is the USL analysis of one scenario over shard counts.
type Sweep struct {
	Scenario, Backend string
	Points            []usl.Point // one per trial; single rows count as N=1
	Counts            []int       // distinct shard counts, increasing
	Model             usl.Model
	Err               error // why there is no model (too few shard counts)
	// Short is set when a trial measured for less than MinDurationS: the sweep then gets
	// no conclusion.
	Short bool
}

// Analysis is everything the report says about one run.
type Analysis struct {
	RunID    string
	Rows     []resultscsv.Row // the run's rows, in file order
	Findings []*Finding       // scenario order of first appearance, then single, then by shards
	Sweeps   []*Sweep         // scenarios measured at more than two shard counts
	Others   []RunSummary     // other runs in the CSV, newest first

	// MultiBackend is set when the run measured more than one backend, so that texts
	// name the backend.
	MultiBackend bool
}

// RunSummary names another run in the CSV, so the reader can ask for it.
type RunSummary struct {
	RunID string
	Last  time.Time
	Rows  int
}

// newestRun returns the run id of the newest row (the later one in the file on a tie).
func newestRun(rows []resultscsv.Row) string {
	best := 0
	for i, r := range rows {
		if !r.Timestamp.Before(rows[best].Timestamp) {
			best = i
		}
	}
	return rows[best].RunID
}

// Analyze computes the report's numbers for the run runID of rows, or for the run of the
// newest row when runID is empty.
func Analyze(rows []resultscsv.Row, runID string) (*Analysis, error) {
	if len(rows) == 0 {
		return nil, ErrNoRows
	}
	if runID == "" {
		runID = newestRun(rows)
	}
	a := &Analysis{RunID: runID}
	others := map[string]*RunSummary{}
	for _, r := range rows {
		if r.RunID == runID {
			a.Rows = append(a.Rows, r)
			continue
		}
		o := others[r.RunID]
		if o == nil {
			o = &RunSummary{RunID: r.RunID}
			others[r.RunID] = o
		}
		o.Rows++
		if r.Timestamp.After(o.Last) {
			o.Last = r.Timestamp
		}
	}
	if len(a.Rows) == 0 {
		return nil, fmt.Errorf("%w: %q", ErrRunNotFound, runID)
	}
	for _, o := range others {
		a.Others = append(a.Others, *o)
	}
	slices.SortFunc(a.Others, func(x, y RunSummary) int {
		return cmp.Or(y.Last.Compare(x.Last), cmp.Compare(x.RunID, y.RunID))
	})

	// Group by configuration, keeping scenarios and backends in order of appearance.
	order := map[string]int{}
	groups := map[Key]*Finding{}
	for _, r := range a.Rows {
		if _, ok := order[r.Scenario]; !ok {
			order[r.Scenario] = len(order)
		}
		if _, ok := order["\x00"+r.Backend]; !ok {
			order["\x00"+r.Backend] = len(order)
		}
		k := Key{Scenario: r.Scenario, Backend: r.Backend, Mode: r.Mode, Shards: r.Shards}
		f := groups[k]
		if f == nil {
			f = &Finding{Key: k}
			groups[k] = f
			a.Findings = append(a.Findings, f)
		}
		f.Trials = append(f.Trials, r)
	}
	modeRank := func(m string) int {
		if m == "single" {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(a.Findings, func(x, y *Finding) int {
		return cmp.Or(
			cmp.Compare(order[x.Scenario], order[y.Scenario]),
			cmp.Compare(order["\x00"+x.Backend], order["\x00"+y.Backend]),
			cmp.Compare(modeRank(x.Mode), modeRank(y.Mode)),
			strings.Compare(x.Mode, y.Mode),
			cmp.Compare(x.Shards, y.Shards),
		)
	})

	for _, f := range a.Findings {
		slices.SortStableFunc(f.Trials, func(x, y resultscsv.Row) int {
			return cmp.Or(cmp.Compare(x.Trial, y.Trial), x.Timestamp.Compare(y.Timestamp))
		})
		var tput, avg, p99 []float64
		for _, r := range f.Trials {
			tput = append(tput, r.ThroughputOpsS)
			avg = append(avg, r.AvgMs)
			p99 = append(p99, r.P99Ms)
			f.Errors += r.Errors
			f.Ops += r.Ops
		}
		f.ThroughputCI = medianCI(tput)
		f.Throughput, f.AvgMs, f.P99Ms = newStat(tput), newStat(avg), newStat(p99)
	}
	for _, f := range a.Findings {
		if f.Mode == "single" {
			f.Verdict, f.Kind = VerdictBaseline, KindBaseline
			continue
		}
		base := groups[Key{Scenario: f.Scenario, Backend: f.Backend, Mode: "single", Shards: 1}]
		if base == nil {
			// A single run recorded with another shard count still is the baseline.
			for _, g := range a.Findings {
				if g.Scenario == f.Scenario && g.Backend == f.Backend && g.Mode == "single" {
					base = g
					break
				}
			}
		}
		if base == nil {
			f.Verdict, f.Kind = VerdictNoBaseline, KindNoBaseline
			continue
		}
		f.Baseline = base
		var ratios []float64
		ratios, f.Unpaired = pairRatios(f.Trials, base.Trials)
		f.Ratio = newStat(slices.Clone(ratios))
		f.RatioCI = bootstrapMedianCI(ratios)
		f.Test = uTest(throughputs(base.Trials), throughputs(f.Trials))
		f.Short = hasShortTrial(f.Trials) || hasShortTrial(base.Trials)
		f.Kind = verdictKind(f)
		switch f.Kind {
		case KindNoPairs:
			f.Verdict = VerdictNoPairs
		case KindNoThroughput:
			f.Verdict = VerdictNoThroughput
		case KindTooShort:
			f.Verdict = VerdictTooShort
		case KindTooFew:
			f.Verdict = VerdictTooFew
		case KindNoDifference:
			f.Verdict = VerdictNoDifference
		case KindFaster:
			f.Verdict = fmt.Sprintf("%.2fx faster", f.Ratio.Median)
		case KindSlower:
			f.Verdict = fmt.Sprintf("%.2fx slower", 1/f.Ratio.Median)
		}
	}
	a.Sweeps = sweeps(a.Findings)
	a.MultiBackend = strings.Contains(distinct(a.Rows, func(r resultscsv.Row) string { return r.Backend }), ",")
	return a, nil
}

// verdictKind decides what may be said of f against its baseline. The order matters:
// trials too short to measure anything get no conclusion whatever the test says, and
// sample sizes that cannot reach significance are said to be too few rather than "no
// difference", which would read as a finding.
func verdictKind(f *Finding) Kind {
	switch {
	case f.Ratio.N == 0 && len(f.Unpaired) > 0:
		return KindNoPairs
	case f.Ratio.N == 0 || f.Ratio.Median == 0:
		return KindNoThroughput
	case f.Short:
		return KindTooShort
	case !f.Test.Possible():
		return KindTooFew
	case !f.Test.Significant():
		return KindNoDifference
	case f.Throughput.Median >= f.Baseline.Throughput.Median:
		return KindFaster
	}
	return KindSlower
}

// throughputs returns the throughput of each trial.
func throughputs(trials []resultscsv.Row) []float64 {
	out := make([]float64, len(trials))
	for i, r := range trials {
		out[i] = r.ThroughputOpsS
	}
	return out
}

// hasShortTrial reports whether a trial measured for less than MinDurationS. A zero
// duration is an old row without the column, not a zero-length run.
func hasShortTrial(trials []resultscsv.Row) bool {
	return slices.ContainsFunc(trials, func(r resultscsv.Row) bool { return r.DurationS > 0 && r.DurationS < MinDurationS })
}

// pairRatios divides the throughput of each trial by that of the baseline trial with the
// same trial number, so that a missing trial on either side drops that one pair instead
// of shifting every later one. A trial whose number has no partner (or appears again on
// its side) is returned in unpaired; a baseline of zero throughput gives no ratio.
func pairRatios(trials, base []resultscsv.Row) (ratios []float64, unpaired []int) {
	baseByTrial := map[int]resultscsv.Row{}
	used := map[int]bool{}
	for _, b := range base {
		if _, dup := baseByTrial[b.Trial]; dup {
			unpaired = append(unpaired, b.Trial)
			continue
		}
		baseByTrial[b.Trial] = b
	}
	for _, r := range trials {
		b, ok := baseByTrial[r.Trial]
		if !ok || used[r.Trial] {
			unpaired = append(unpaired, r.Trial)
			continue
		}
		used[r.Trial] = true
		if b.ThroughputOpsS > 0 {
			ratios = append(ratios, r.ThroughputOpsS/b.ThroughputOpsS)
		}
	}
	for t := range baseByTrial {
		if !used[t] {
			unpaired = append(unpaired, t)
		}
	}
	slices.Sort(unpaired)
	return ratios, slices.Compact(unpaired)
}

// sweeps collects, per scenario and backend, the throughput of every trial against its
// shard count, and fits the USL where there are enough shard counts. Sharded rows are the
// points; the single baseline counts as N=1 unless a sharded N=1 was measured. Scenarios
// at one or two shard counts are left out: there is no curve to speak of.
func sweeps(findings []*Finding) []*Sweep {
	var out []*Sweep
	index := map[[2]string]*Sweep{}
	for _, f := range findings {
		k := [2]string{f.Scenario, f.Backend}
		s := index[k]
		if s == nil {
			s = &Sweep{Scenario: f.Scenario, Backend: f.Backend}
			index[k] = s
			out = append(out, s)
		}
	}
	for _, s := range out {
		hasSharded1 := false
		for _, f := range findings {
			if f.Scenario == s.Scenario && f.Backend == s.Backend && f.Mode != "single" && f.Shards == 1 {
				hasSharded1 = true
			}
		}
		for _, f := range findings {
			if f.Scenario != s.Scenario || f.Backend != s.Backend {
				continue
			}
			n := f.Shards
			if f.Mode == "single" {
				if hasSharded1 {
					continue
				}
				n = 1
			}
			if !slices.Contains(s.Counts, n) {
				s.Counts = append(s.Counts, n)
			}
			for _, r := range f.Trials {
				s.Points = append(s.Points, usl.Point{N: float64(n), X: r.ThroughputOpsS})
			}
			s.Short = s.Short || hasShortTrial(f.Trials)
		}
		slices.Sort(s.Counts)
		s.Model, s.Err = usl.Fit(s.Points)
	}
	return slices.DeleteFunc(out, func(s *Sweep) bool { return len(s.Counts) < 3 })
}

// distinct returns the distinct non-empty values of field over rows, in order of
// appearance, joined with ", ".
func distinct(rows []resultscsv.Row, field func(resultscsv.Row) string) string {
	var vals []string
	for _, r := range rows {
		if v := field(r); v != "" && !slices.Contains(vals, v) {
			vals = append(vals, v)
		}
	}
	if len(vals) == 0 {
		return "unknown"
	}
	return strings.Join(vals, ", ")
}

// thousands formats x rounded to an integer with comma separators.
func thousands(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return fmt.Sprint(x)
	}
	s := fmt.Sprintf("%.0f", math.Abs(x))
	var b strings.Builder
	if x < 0 && s != "0" {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
