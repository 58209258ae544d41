package counters

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
)

// TestWorkerPickerNeverSharesABucket is the guarantee of BucketWorker: no
// bucket is ever held by two increments at once, even with more writers than
// buckets. It lives inside the package because the guarantee is about an
// unexported piece that the public API cannot observe.
func TestWorkerPickerNeverSharesABucket(t *testing.T) {
	const buckets, writers, rounds = 4, 16, 500
	p := newWorkerPicker(buckets)
	var held [buckets]atomic.Int32
	var used [buckets]atomic.Int64
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range rounds {
				b, release, err := p.pick(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				if n := held[b].Add(1); n != 1 {
					t.Errorf("bucket %d held by %d writers at once", b, n)
				}
				used[b].Add(1)
				held[b].Add(-1)
				release()
			}
		})
	}
	wg.Wait()
	var total int64
	for b := range buckets {
		if used[b].Load() == 0 {
			t.Errorf("bucket %d never used", b)
		}
		total += used[b].Load()
	}
	if total != writers*rounds {
		t.Errorf("%d picks, want %d", total, writers*rounds)
	}
	if len(p.mu.free) != buckets {
		t.Errorf("%d buckets free after the run, want %d", len(p.mu.free), buckets)
	}
}

func TestPickersStayInRange(t *testing.T) {
	for _, by := range BucketChoosers() {
		p := newBucketPicker(Options{Strategy: StrategyBucket, Buckets: 5, BucketBy: by})
		for range 1000 {
			b, release, err := p.pick(context.Background())
			if err != nil || b < 0 || b >= 5 {
				t.Fatalf("%s: pick = %d, %v", by, b, err)
			}
			release()
		}
	}
}
