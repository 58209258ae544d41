package report

import (
	"math"
	"math/rand/v2"
	"slices"

	"golang.org/x/perf/benchmath"
)

// The statistics of the verdicts are benchstat's (golang.org/x/perf/benchmath): no
// assumption about the distribution of the trials, the Mann-Whitney U test to compare
// two configurations and order statistics for the confidence interval of a median.
const (
	// Alpha is the significance level: a difference is called only when the test's p is
	// at most Alpha, as benchstat does.
	Alpha = 0.05
	// Confidence is the level of every confidence interval in the report.
	Confidence = 0.95
	// BootstrapResamples is the number of resamples of the paired trials behind the
	// confidence interval of the ratio.
	BootstrapResamples = 10000
	// MinBootstrapPairs is the number of trial pairs under which the report gives the
	// ratio no bootstrap interval. A percentile bootstrap of a median from a handful of
	// values is far too narrow (3 pairs often give an interval of width zero); from 6
	// on, where the median's own order-statistic interval exists, it is usable.
	MinBootstrapPairs = 6
)

// thresholds are benchmath's, at Alpha.
var thresholds = &benchmath.Thresholds{CompareAlpha: Alpha}

// Interval is a confidence interval at level Confidence; OK is false when the data
// cannot give one (too few trials).
type Interval struct {
	Lo, Hi float64
	OK     bool
}

// medianCI is the confidence interval of the median of xs at level Confidence, from
// order statistics: it needs 6 or more values at 95%.
func medianCI(xs []float64) Interval {
	if len(xs) == 0 {
		return Interval{}
	}
	s := benchmath.AssumeNothing.Summary(benchmath.NewSample(slices.Clone(xs), thresholds), Confidence)
	if math.IsInf(s.Lo, 0) || math.IsInf(s.Hi, 0) || math.IsNaN(s.Lo) || math.IsNaN(s.Hi) {
		return Interval{}
	}
	return Interval{Lo: s.Lo, Hi: s.Hi, OK: true}
}

// Test is the outcome of a Mann-Whitney U test of one configuration's throughputs
// against its baseline's.
type Test struct {
	P      float64 // two-sided p-value
	N1, N2 int     // trials of the baseline and of the configuration
	// MinP is the smallest p the test can give for these sample sizes, reached when the
	// two samples do not interleave at all: 2/C(N1+N2, N1). Above Alpha, no outcome of
	// the trials could be called a difference.
	MinP float64
}

// Possible reports whether the sample sizes allow a p at most Alpha.
func (t Test) Possible() bool { return t.MinP <= Alpha }

// Significant reports whether the test finds a difference at level Alpha.
func (t Test) Significant() bool { return t.Possible() && t.P <= Alpha }

// uTest compares the throughputs of base and other.
func uTest(base, other []float64) Test {
	c := benchmath.AssumeNothing.Compare(
		benchmath.NewSample(slices.Clone(base), thresholds), benchmath.NewSample(slices.Clone(other), thresholds))
	return Test{P: c.P, N1: len(base), N2: len(other), MinP: minUTestP(len(base), len(other))}
}

// minUTestP is the smallest two-sided p-value of the exact Mann-Whitney U test for
// samples of n1 and n2 values: only the two most extreme arrangements of the
// C(n1+n2, n1) equally likely ones reach it. 3 against 3 gives 2/20 = 0.1.
func minUTestP(n1, n2 int) float64 {
	if n1 == 0 || n2 == 0 {
		return 1
	}
	// C(n1+n2, n1) as a float: exact enough for any trial count a lab runs.
	c := 1.0
	for i := 1; i <= n1; i++ {
		c = c * float64(n2+i) / float64(i)
	}
	return min(1, 2/c)
}

// bootstrapMedianCI is a percentile bootstrap confidence interval, at level
// Confidence, of the median of xs (here the per-trial ratios against the baseline):
// BootstrapResamples resamples with replacement. The generator has a fixed seed, so a
// given CSV always gives the same report.
func bootstrapMedianCI(xs []float64) Interval {
	n := len(xs)
	if n < MinBootstrapPairs {
		return Interval{}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	meds := make([]float64, BootstrapResamples)
	buf := make([]float64, n)
	for i := range meds {
		for j := range buf {
			buf[j] = xs[rng.IntN(n)]
		}
		meds[i] = median(buf)
	}
	slices.Sort(meds)
	tail := (1 - Confidence) / 2
	lo := meds[int(math.Floor(tail*float64(len(meds))))]
	hi := meds[min(len(meds)-1, int(math.Ceil((1-tail)*float64(len(meds))))-1)]
	return Interval{Lo: lo, Hi: hi, OK: true}
}

// median sorts xs and returns its median.
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// minTrialsForCI is the smallest number of trials whose median has a confidence
// interval at level Confidence: 6 at 95%.
func minTrialsForCI() int {
	for n := 2; ; n++ {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = float64(i)
		}
		if medianCI(xs).OK {
			return n
		}
	}
}

// Median returns the median of xs (xs is not modified).
func Median(xs []float64) float64 { return median(slices.Clone(xs)) }

// MedianCI is the confidence interval, at level Confidence, of the median of xs: from
// order statistics, so it needs 6 or more values at 95% (OK false otherwise).
func MedianCI(xs []float64) Interval { return medianCI(xs) }

// UTest compares two samples with the Mann-Whitney U test, as the report's verdicts do.
func UTest(base, other []float64) Test { return uTest(base, other) }

// RatioCI is a bootstrap confidence interval of the median of per-pair ratios, as the
// report gives for paired trials (MinBootstrapPairs or more).
func RatioCI(ratios []float64) Interval { return bootstrapMedianCI(ratios) }
