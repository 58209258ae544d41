// Package usl fits Neil Gunther's Universal Scalability Law to measured throughput:
//
//	X(N) = lambda*N / (1 + sigma*(N-1) + kappa*N*(N-1))
//
// where N is the concurrency or, in this lab, the shard count; sigma is the contention
// (serialised share of the work), kappa the coherency cost (pairwise cross-talk) and
// lambda the throughput of one unit without either. The fit is a non-linear least-squares
// fit of throughput (not of a linearised transform), started from the quadratic
// regression of N/X on N, with sigma and kappa kept non-negative (values under 1e-12 are
// reported as exactly 0).
package usl

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize"
)

// MinDistinctN is the number of distinct N values Fit needs. The model has three
// parameters, and telling contention from coherency apart needs the curve's shape, so
// with fewer distinct loads the fit would follow the noise.
const MinDistinctN = 6

// KappaZero is the coherency coefficient below which Peak reports no peak: with kappa
// under 1e-6 the peak would lie beyond N = 1000, far outside any measured range, so it
// is a statement about rounding rather than about the system.
const KappaZero = 1e-6

// MinR2 is the coefficient of determination below which a fit is not used for
// conclusions: under 0.5 the curve explains less than half of the spread of the measured
// throughput around its mean, so trial-to-trial noise (or a shape the law does not have)
// dominates and sigma, kappa and N* would describe that noise, not the system.
const MinR2 = 0.5

// MaxFlatRMSE is the residual, as a share of the mean throughput, under which a fit is
// used even with a low R². When throughput hardly changes with N there is almost no
// spread for the curve to explain, so R² is near 0 by construction even for a curve that
// passes within a few percent of every point: such a flat curve is a finding (sigma near
// 1: more units add nothing), not noise.
const MaxFlatRMSE = 0.05

// ErrTooFewPoints is returned by Fit when the points span fewer than MinDistinctN
// distinct values of N.
var ErrTooFewPoints = errors.New("too few points")

// ErrInvalidPoint is returned by Fit for a point whose N is below 1 or whose throughput
// is negative, NaN or infinite.
var ErrInvalidPoint = errors.New("invalid point")

// ErrNoConvergence is returned by Fit when the optimiser finds no finite solution.
var ErrNoConvergence = errors.New("the fit did not converge")

// Point is one measurement: throughput X at load (or shard count) N. Several points may
// share an N, for example one per repeated trial.
type Point struct {
	N float64 // load or shard count, >= 1
	X float64 // throughput at N
}

// Model is a fitted Universal Scalability Law curve and its goodness of fit.
type Model struct {
	Sigma  float64 // contention coefficient, >= 0
	Kappa  float64 // coherency coefficient, >= 0
	Lambda float64 // throughput of a single unit (X(1) of the curve)

	R2        float64 // coefficient of determination of the throughput fit, 1 is perfect
	RMSE      float64 // root mean square residual, in throughput units
	MeanX     float64 // mean measured throughput of the points
	Points    int     // number of points fitted
	DistinctN int     // number of distinct N among them
}

// Throughput is the model's throughput at n.
func (m Model) Throughput(n float64) float64 {
	return m.Lambda * n / (1 + m.Sigma*(n-1) + m.Kappa*n*(n-1))
}

// Peak returns N*, the load of peak throughput, and ok=false when there is no peak.
//
// With sigma >= 1 the peak is N* = 1 whatever kappa: X(N) = lambda*N/(1+sigma*(N-1)+...)
// then never rises above X(1), and falls from N = 1 on when sigma > 1, so more units
// only lower throughput. Otherwise N* = floor(sqrt((1-sigma)/kappa)), at least 1, and
// ok=false when kappa is below KappaZero (the curve only flattens towards lambda/sigma).
// Peak says nothing about whether the fit describes the data; see Meaningful.
func (m Model) Peak() (nstar int, ok bool) {
	// Sigma first: a zero kappa would otherwise read as "rises for ever".
	if m.Sigma >= 1 {
		return 1, true
	}
	if m.Kappa < KappaZero {
		return 0, false
	}
	return max(1, int(math.Floor(math.Sqrt((1-m.Sigma)/m.Kappa)))), true
}

// Meaningful reports whether the fit describes its points well enough for sigma, kappa
// and N* to be read as findings about the system: R² >= MinR2, or a residual within
// MaxFlatRMSE of the mean throughput (a flat curve, where R² says nothing).
func (m Model) Meaningful() bool {
	return m.R2 >= MinR2 || (m.MeanX > 0 && m.RMSE <= MaxFlatRMSE*m.MeanX)
}

// PoorFit is the warning for a fit that is not Meaningful, in the words both the usl
// command and the lab's report use; it is empty for a fit that describes its points.
func (m Model) PoorFit() string {
	if m.Meaningful() {
		return ""
	}
	return fmt.Sprintf("the USL fit does not describe these points (R² = %.3f, below %g, and residuals over %.0f%% of the mean): "+
		"draw no conclusion from sigma, kappa or N*", m.R2, MinR2, MaxFlatRMSE*100)
}

// FlatNote explains a Meaningful fit whose R² is under MinR2: the throughput hardly
// changes, so there is nothing for R² to measure. It is empty otherwise.
func (m Model) FlatNote() string {
	if m.R2 >= MinR2 || !m.Meaningful() {
		return ""
	}
	return fmt.Sprintf("R² = %.3f is below %g only because the throughput hardly changes (residuals within %.0f%% of the mean): "+
		"the flat curve is the finding", m.R2, MinR2, MaxFlatRMSE*100)
}

// String renders the model as the command-line tool prints it.
func (m Model) String() string {
	nstar := "none"
	if n, ok := m.Peak(); ok {
		nstar = fmt.Sprint(n)
	}
	return fmt.Sprintf("sigma=%.6g kappa=%.6g lambda=%.6g nstar=%s r2=%.4f",
		m.Sigma, m.Kappa, m.Lambda, nstar, m.R2)
}

// distinctN counts the distinct N values among points.
func distinctN(points []Point) int {
	ns := make([]float64, len(points))
	for i, p := range points {
		ns[i] = p.N
	}
	slices.Sort(ns)
	return len(slices.Compact(ns))
}

// Fit fits the model to points by non-linear least squares on throughput. It needs
// points at MinDistinctN or more distinct values of N (several points per N are
// allowed and weigh equally) and returns ErrTooFewPoints otherwise.
func Fit(points []Point) (Model, error) {
	for i, p := range points {
		if !(p.N >= 1) || math.IsInf(p.N, 0) || !(p.X >= 0) || math.IsInf(p.X, 0) {
			return Model{}, fmt.Errorf("%w: point %d (n=%g, throughput=%g): n must be >= 1 and throughput >= 0",
				ErrInvalidPoint, i+1, p.N, p.X)
		}
	}
	d := distinctN(points)
	if d < MinDistinctN {
		return Model{}, fmt.Errorf("%w: the fit needs at least %d distinct values of n, got %d (%d points)",
			ErrTooFewPoints, MinDistinctN, d, len(points))
	}

	// Work in throughput scaled to a maximum of 1 so the objective is of order one
	// whatever the unit.
	scale := 0.0
	for _, p := range points {
		scale = max(scale, p.X)
	}
	if scale == 0 {
		return Model{}, fmt.Errorf("%w: all throughputs are zero", ErrInvalidPoint)
	}
	ns := make([]float64, len(points))
	ys := make([]float64, len(points))
	for i, p := range points {
		ns[i], ys[i] = p.N, p.X/scale
	}

	guess := linearGuess(ns, ys)
	starts := [][3]float64{
		{guess.Sigma, guess.Kappa, guess.Lambda},
		{0.05, 0.001, guess.Lambda},
		{0.3, 0.05, guess.Lambda},
	}
	best := [3]float64{}
	bestF := math.Inf(1)
	for _, s := range starts {
		x, f, err := minimise(ns, ys, s)
		if err == nil && f < bestF {
			best, bestF = x, f
		}
	}
	if math.IsInf(bestF, 1) || math.IsNaN(bestF) {
		return Model{}, ErrNoConvergence
	}
	// The optimiser approaches the sigma, kappa >= 0 boundary without reaching it; call
	// what is left there zero rather than print 1e-28.
	for i := range 2 {
		if best[i] < 1e-12 {
			best[i] = 0
		}
	}
	m := Model{Sigma: best[0], Kappa: best[1], Lambda: best[2] * scale, Points: len(points), DistinctN: d}
	m.R2, m.RMSE, m.MeanX = goodness(m, points)
	return m, nil
}

// goodness computes R², the RMSE of m on points and their mean throughput.
func goodness(m Model, points []Point) (r2, rmse, mean float64) {
	for _, p := range points {
		mean += p.X
	}
	mean /= float64(len(points))
	var sse, sst float64
	for _, p := range points {
		r := p.X - m.Throughput(p.N)
		sse += r * r
		sst += (p.X - mean) * (p.X - mean)
	}
	rmse = math.Sqrt(sse / float64(len(points)))
	if sst == 0 {
		if sse == 0 {
			return 1, rmse, mean
		}
		return 0, rmse, mean
	}
	return 1 - sse/sst, rmse, mean
}

// linearGuess estimates the parameters from the quadratic regression
// N/X = c0 + c1*N + c2*N², which is the model rearranged:
// c0 = (1-sigma)/lambda, c1 = (sigma-kappa)/lambda, c2 = kappa/lambda.
// It returns a rough, always usable starting point.
func linearGuess(ns, ys []float64) Model {
	fallback := Model{Sigma: 0.1, Kappa: 0.01, Lambda: 1}
	var xs, ts []float64
	for i := range ns {
		if ys[i] > 0 {
			n := ns[i]
			xs = append(xs, 1, n, n*n)
			ts = append(ts, n/ys[i])
		}
	}
	if len(ts) < 3 {
		return fallback
	}
	a := mat.NewDense(len(ts), 3, xs)
	b := mat.NewVecDense(len(ts), ts)
	var c mat.VecDense
	if err := c.SolveVec(a, b); err != nil {
		return fallback
	}
	c0, c1, c2 := c.AtVec(0), c.AtVec(1), c.AtVec(2)
	inv := c0 + c1 + c2
	if !(inv > 0) {
		return fallback
	}
	lambda := 1 / inv
	m := Model{Sigma: lambda * (c1 + c2), Kappa: lambda * c2, Lambda: lambda}
	// The optimiser works on square roots, where zero is a stationary point; start
	// slightly inside the feasible region instead.
	m.Sigma = min(max(m.Sigma, 1e-4), 10)
	m.Kappa = min(max(m.Kappa, 1e-6), 10)
	return m
}

// minimise runs BFGS from start (sigma, kappa, lambda) on the sum of squared residuals,
// with sigma = a², kappa = b² so that both stay non-negative. It returns the parameters
// and the objective value.
func minimise(ns, ys []float64, start [3]float64) ([3]float64, float64, error) {
	model := func(x []float64, n float64) (v, d float64) {
		s, k := x[0]*x[0], x[1]*x[1]
		d = 1 + s*(n-1) + k*n*(n-1)
		return x[2] * n / d, d
	}
	p := optimize.Problem{
		Func: func(x []float64) float64 {
			sse := 0.0
			for i, n := range ns {
				v, d := model(x, n)
				if d <= 0 {
					return math.Inf(1)
				}
				r := v - ys[i]
				sse += r * r
			}
			return sse
		},
		Grad: func(grad, x []float64) {
			grad[0], grad[1], grad[2] = 0, 0, 0
			for i, n := range ns {
				v, d := model(x, n)
				r := 2 * (v - ys[i])
				// dX/dsigma = -X*(n-1)/D, dX/dkappa = -X*n*(n-1)/D, dX/dlambda = n/D.
				grad[0] += r * (-v * (n - 1) / d) * 2 * x[0]
				grad[1] += r * (-v * n * (n - 1) / d) * 2 * x[1]
				grad[2] += r * n / d
			}
		},
	}
	init := []float64{math.Sqrt(start[0]), math.Sqrt(start[1]), start[2]}
	settings := &optimize.Settings{
		GradientThreshold: 1e-13,
		Converger:         &optimize.FunctionConverge{Absolute: 1e-16, Relative: 1e-12, Iterations: 200},
		MajorIterations:   5000,
	}
	res, err := optimize.Minimize(p, init, settings, &optimize.BFGS{})
	if res == nil {
		return [3]float64{}, math.Inf(1), err
	}
	x := res.X
	if math.IsNaN(res.F) || math.IsInf(res.F, 0) {
		return [3]float64{}, math.Inf(1), ErrNoConvergence
	}
	return [3]float64{x[0] * x[0], x[1] * x[1], x[2]}, res.F, nil
}
