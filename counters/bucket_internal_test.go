package counters

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
	// The pool is last-in first-out, so a bucket may go unused when writers rarely
	// overlap; what must hold is that every pick was of a real bucket.
	var total int64
	for b := range buckets {
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

// TestWorkerPickerHandsOutDistinctBucketsThenWaits: N holders get N different buckets,
// the next pick waits until one is released (or its context ends), and the bucket
// released last is handed out first.
func TestWorkerPickerHandsOutDistinctBucketsThenWaits(t *testing.T) {
	const buckets = 5
	p := newWorkerPicker(buckets)
	seen := map[int]bool{}
	releases := make([]func(), 0, buckets)
	for range buckets {
		b, release, err := p.pick(context.Background())
		if err != nil || seen[b] || b < 0 || b >= buckets {
			t.Fatalf("pick = %d, %v (already held: %v)", b, err, seen[b])
		}
		seen[b] = true
		releases = append(releases, release)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, _, err := p.pick(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("pick with every bucket held = %v, want to wait until the context ends", err)
	}
	got := make(chan int)
	go func() {
		b, release, err := p.pick(context.Background())
		if err != nil {
			t.Error(err)
		}
		release()
		got <- b
	}()
	releases[2]()
	second := -1
	if b := <-got; !seen[b] {
		t.Errorf("waiter got bucket %d, not one of the pool", b)
	} else {
		second = b
	}
	b, release, err := p.pick(context.Background())
	if err != nil || b != second {
		t.Errorf("after a release, pick = %d, %v; want the bucket released last (%d)", b, err, second)
	}
	release()
}
