package counters

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// bucketPicker chooses the bucket of one increment. release must be called
// once the statement that wrote the bucket has returned.
type bucketPicker interface {
	pick(ctx context.Context) (bucket int, release func(), err error)
}

func noRelease() {}

func newBucketPicker(o Options) bucketPicker {
	switch o.BucketBy {
	case BucketTime:
		return timePicker(o.Buckets)
	case BucketWorker:
		return newWorkerPicker(o.Buckets)
	default:
		return randomPicker(o.Buckets)
	}
}

// randomPicker picks a uniformly random bucket.
type randomPicker int

func (n randomPicker) pick(context.Context) (int, func(), error) {
	return rand.IntN(int(n)), noRelease, nil
}

// timePicker picks the microsecond within the current second, modulo N.
type timePicker int

func (n timePicker) pick(context.Context) (int, func(), error) {
	micros := time.Now().Nanosecond() / 1000
	return micros % int(n), noRelease, nil
}

// workerPicker hands out bucket ids from a pool of free ones, so that no two
// increments in flight at the same time hold the same bucket. The pool is a
// stack (last released, first reused): with W concurrent writers only about W
// buckets stay in use, so the rows they update stay hot in the database's cache
// instead of cycling through all N. An increment that finds the pool empty
// waits for a release (or gives up when its context is cancelled).
type workerPicker struct {
	mu struct {
		sync.Mutex
		free []int
	}
	released chan struct{} // a token per release, to wake one waiter
}

func newWorkerPicker(n int) *workerPicker {
	w := &workerPicker{released: make(chan struct{}, n)}
	w.mu.free = make([]int, n)
	for b := range n {
		w.mu.free[b] = n - 1 - b // bucket 0 on top
	}
	return w
}

func (w *workerPicker) take() (int, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.mu.free) == 0 {
		return 0, false
	}
	b := w.mu.free[len(w.mu.free)-1]
	w.mu.free = w.mu.free[:len(w.mu.free)-1]
	return b, true
}

func (w *workerPicker) give(b int) {
	w.mu.Lock()
	w.mu.free = append(w.mu.free, b)
	w.mu.Unlock()
	select {
	case w.released <- struct{}{}:
	default:
	}
}

func (w *workerPicker) pick(ctx context.Context) (int, func(), error) {
	for {
		if b, ok := w.take(); ok {
			return b, func() { w.give(b) }, nil
		}
		select {
		case <-w.released:
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		}
	}
}
