package reshard

import (
	"context"
	"testing"
	"time"
)

// TestRowLimiterCreditIsBounded: rows asked for after a long idle time pass at once for
// at most a second's worth; beyond that they wait for their time. A limiter that kept
// its start would let the 5 seconds idle carry 500 rows at once.
func TestRowLimiterCreditIsBounded(t *testing.T) {
	ctx := context.Background()
	l := newRowLimiter(100)
	l.began = time.Now().Add(-5 * time.Second) // started, then idle for 5 s
	began := time.Now()
	if err := l.wait(ctx, 100); err != nil { // a second's credit: no wait
		t.Fatal(err)
	}
	if d := time.Since(began); d > 500*time.Millisecond {
		t.Errorf("the first second's rows waited %v", d)
	}
	if err := l.wait(ctx, 50); err != nil { // half a second more
		t.Fatal(err)
	}
	if d := time.Since(began); d < 400*time.Millisecond {
		t.Errorf("150 rows at 100 a second after a long idle time passed in %v, want about 500 ms", d)
	}
}

// TestRowLimiterRate: rows counted in pieces pass at the rate.
func TestRowLimiterRate(t *testing.T) {
	ctx := context.Background()
	l := newRowLimiter(1000)
	began := time.Now()
	for range 60 {
		if err := l.wait(ctx, 5); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(began); d < 290*time.Millisecond {
		t.Errorf("300 rows at 1000 a second passed in %v", d)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := l.wait(cctx, 10000); err == nil {
		t.Error("a wait with its context cancelled did not fail")
	}
}
