package counters

import (
	"context"
	"math/rand/v2"
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
// buffered channel holding every free id: taking an id is a receive, giving
// it back a send, and an increment that finds the pool empty waits (or
// gives up when its context is cancelled). The channel is FIFO, so every
// bucket gets used in turn.
type workerPicker struct{ free chan int }

func newWorkerPicker(n int) *workerPicker {
	w := &workerPicker{free: make(chan int, n)}
	for b := range n {
		w.free <- b
	}
	return w
}

func (w *workerPicker) pick(ctx context.Context) (int, func(), error) {
	// Fast path: a free bucket is available without blocking.
	select {
	case b := <-w.free:
		return b, func() { w.free <- b }, nil
	default:
	}
	select {
	case b := <-w.free:
		return b, func() { w.free <- b }, nil
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	}
}
