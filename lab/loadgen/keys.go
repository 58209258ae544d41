package loadgen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
)

// Key distributions accepted by NewKeyChooser.
const (
	DistUniform = "uniform" // every key equally likely
	DistZipfian = "zipfian" // YCSB's zipfian with constant 0.99: a few keys take most requests
	DistHotspot = "hotspot" // YCSB's hotspot: 80% of requests go to 20% of the keys
)

// Dists returns the distribution names, default first.
func Dists() []string { return []string{DistUniform, DistZipfian, DistHotspot} }

// ZipfianConstant is YCSB's default skew. Go's rand.Zipf needs s > 1, so it cannot
// produce this distribution; the generator below follows Gray et al., "Quickly generating
// billion-record synthetic databases" (SIGMOD 1994), as YCSB does.
const ZipfianConstant = 0.99

// KeyChooser picks key indexes in [0, n). Implementations are safe for concurrent use as
// long as each goroutine passes its own *rand.Rand.
type KeyChooser interface {
	Next(rng *rand.Rand) int
}

// NewKeyChooser returns the chooser for the named distribution over n keys.
func NewKeyChooser(dist string, n int) (KeyChooser, error) {
	if n < 1 {
		return nil, fmt.Errorf("key space must hold at least 1 key, got %d", n)
	}
	switch dist {
	case DistUniform:
		return uniform{n: n}, nil
	case DistZipfian:
		return newZipfian(n, ZipfianConstant), nil
	case DistHotspot:
		return newHotspot(n, 0.2, 0.8), nil
	}
	return nil, fmt.Errorf("unknown distribution %q (want %s)", dist, strings.Join(Dists(), ", "))
}

type uniform struct{ n int }

func (u uniform) Next(rng *rand.Rand) int { return rng.IntN(u.n) }

// zipfian draws rank i (0 = most popular) with probability proportional to 1/(i+1)^theta.
type zipfian struct {
	n                        int
	theta, alpha, zetan, eta float64
	halfPowTheta             float64
}

func newZipfian(n int, theta float64) *zipfian {
	zeta := func(n int) float64 {
		sum := 0.0
		for i := 1; i <= n; i++ {
			sum += 1 / math.Pow(float64(i), theta)
		}
		return sum
	}
	z := &zipfian{n: n, theta: theta, alpha: 1 / (1 - theta), zetan: zeta(n)}
	zeta2 := zeta(2)
	z.eta = (1 - math.Pow(2/float64(n), 1-theta)) / (1 - zeta2/z.zetan)
	z.halfPowTheta = 1 + math.Pow(0.5, theta)
	return z
}

func (z *zipfian) Next(rng *rand.Rand) int {
	u := rng.Float64()
	uz := u * z.zetan
	if uz < 1 {
		return 0
	}
	if uz < z.halfPowTheta {
		return min(1, z.n-1)
	}
	return min(int(float64(z.n)*math.Pow(z.eta*u-z.eta+1, z.alpha)), z.n-1)
}

// hotspot sends hotOps of the requests to the first hotFraction of the keys.
type hotspot struct {
	n, hot int
	hotOps float64
}

func newHotspot(n int, hotFraction, hotOps float64) hotspot {
	hot := max(1, int(float64(n)*hotFraction))
	return hotspot{n: n, hot: min(hot, n), hotOps: hotOps}
}

func (h hotspot) Next(rng *rand.Rand) int {
	if h.hot == h.n || rng.Float64() < h.hotOps {
		return rng.IntN(h.hot)
	}
	return h.hot + rng.IntN(h.n-h.hot)
}

// KeyName is the user id loadgen uses for key index i.
func KeyName(i int) string { return fmt.Sprintf("user%d", i) }
