package fanout_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/fanout"
	"github.com/shardlab/shardlab/routing"
)

// visits records which shards fn ran on, safe for concurrent use.
type visits struct {
	mu     sync.Mutex
	shards []int
}

func (v *visits) add(shard int) {
	v.mu.Lock()
	v.shards = append(v.shards, shard)
	v.mu.Unlock()
}

func (v *visits) sorted() []int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Sorted(slices.Values(v.shards))
}

func TestDoRunsTheShardsTheDestinationNames(t *testing.T) {
	tests := []struct {
		dest routing.Destination
		want []int
	}{
		{routing.DestinationNone{}, nil},
		{routing.DestinationAny{}, []int{0}},
		{routing.DestinationShard(2), []int{2}},
		{routing.DestinationShards{1, 3}, []int{1, 3}},
		{routing.DestinationShards{3, 1, 3}, []int{1, 3}}, // a literal with a repeat runs each shard once
		{routing.DestinationAll{}, []int{0, 1, 2, 3, 4}},
	}
	for _, tt := range tests {
		t.Run(tt.dest.String(), func(t *testing.T) {
			var v visits
			err := fanout.Do(context.Background(), tt.dest, 5, func(ctx context.Context, shard int) error {
				v.add(shard)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := v.sorted(); !slices.Equal(got, tt.want) {
				t.Errorf("ran on %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDoRefusesShardsOutsideTheSet(t *testing.T) {
	for _, dest := range []routing.Destination{
		routing.DestinationShard(3), routing.DestinationShard(-1), routing.DestinationShards{0, 7}, nil,
	} {
		ran := false
		err := fanout.Do(context.Background(), dest, 3, func(context.Context, int) error { ran = true; return nil })
		if !errors.Is(err, fanout.ErrNoSuchShard) || ran {
			t.Errorf("Do(%v over 3 shards) = %v, ran %v; want ErrNoSuchShard and nothing run", dest, err, ran)
		}
	}
	if err := fanout.Do(context.Background(), routing.DestinationAll{}, 0, func(context.Context, int) error { return nil }); !errors.Is(err, fanout.ErrNoSuchShard) {
		t.Errorf("Do over an empty set = %v, want ErrNoSuchShard", err)
	}
}

// TestDoRespectsTheLimit: at most the limit of fns run at once, and that many do, so the
// limit is what bounds them and not something else.
func TestDoRespectsTheLimit(t *testing.T) {
	for _, tt := range []struct {
		name  string
		opts  []fanout.DoOption
		limit int
	}{
		{"default", nil, fanout.DefaultLimit},
		{"3", []fanout.DoOption{fanout.WithLimit(3)}, 3},
		{"1", []fanout.DoOption{fanout.WithLimit(1)}, 1},
		{"0 keeps the default", []fanout.DoOption{fanout.WithLimit(0)}, fanout.DefaultLimit},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var running, peak atomic.Int64
			full := make(chan struct{})
			var fullOnce sync.Once
			var v visits
			err := fanout.Do(context.Background(), routing.DestinationAll{}, 40, func(ctx context.Context, shard int) error {
				n := running.Add(1)
				defer running.Add(-1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				if n == int64(tt.limit) {
					fullOnce.Do(func() { close(full) })
				}
				// Hold the slot until the limit was reached once, so the peak shows it.
				select {
				case <-full:
				case <-time.After(5 * time.Second):
				}
				v.add(shard)
				return nil
			}, tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if got := peak.Load(); got != int64(tt.limit) {
				t.Errorf("peak concurrency %d, want %d", got, tt.limit)
			}
			if got := v.sorted(); len(got) != 40 || got[0] != 0 || got[39] != 39 {
				t.Errorf("ran on %v, want every one of 40 shards", got)
			}
		})
	}
}

// TestDoReportsEveryFailedShard: without FailFast each failure comes back as a
// *ShardError naming its shard, and the other shards still ran.
func TestDoReportsEveryFailedShard(t *testing.T) {
	disk := errors.New("disk on fire")
	var v visits
	err := fanout.Do(context.Background(), routing.DestinationAll{}, 5, func(ctx context.Context, shard int) error {
		v.add(shard)
		if shard%2 == 0 {
			return fmt.Errorf("count: %w", disk)
		}
		return nil
	})
	if got := v.sorted(); !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
		t.Errorf("ran on %v, want every shard despite the failures", got)
	}
	var errs fanout.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Do = %v (%T), want fanout.Errors", err, err)
	}
	var failed []int
	for _, se := range errs {
		failed = append(failed, se.Shard)
		if !errors.Is(se, disk) || !strings.Contains(se.Error(), fmt.Sprintf("shard %d: count: disk on fire", se.Shard)) {
			t.Errorf("ShardError %q does not name shard %d and its cause", se, se.Shard)
		}
	}
	if !slices.Equal(failed, []int{0, 2, 4}) {
		t.Errorf("failed shards %v, want [0 2 4] in order", failed)
	}
	if !errors.Is(err, disk) || errs.Shard(2) == nil || errs.Shard(1) != nil {
		t.Errorf("errors.Is through Errors = %v; Shard(2) = %v, Shard(1) = %v", errors.Is(err, disk), errs.Shard(2), errs.Shard(1))
	}
	var se *fanout.ShardError
	if !errors.As(err, &se) || se.Shard != 0 {
		t.Errorf("errors.As(*ShardError) = %v, want the first failed shard", se)
	}
	if lines := strings.Split(err.Error(), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[1], "shard 2: ") {
		t.Errorf("message %q, want one line per failed shard", err)
	}

	// A single shard, which runs on the caller's goroutine, fails the same way.
	err = fanout.Do(context.Background(), routing.DestinationShard(3), 5, func(context.Context, int) error { return disk })
	if !errors.As(err, &se) || se.Shard != 3 || !errors.Is(err, disk) {
		t.Errorf("one shard: %v, want a ShardError for shard 3", err)
	}
}

// TestDoFailFast: the first failure cancels the shards still running and starts no
// more, and only that failure is reported, not the cancellations it caused.
func TestDoFailFast(t *testing.T) {
	broken := errors.New("connection refused")
	var started atomic.Int64
	err := fanout.Do(context.Background(), routing.DestinationAll{}, 20, func(ctx context.Context, shard int) error {
		started.Add(1)
		if shard == 1 {
			return broken
		}
		<-ctx.Done() // the others would run until told to stop
		return fmt.Errorf("query: %w", ctx.Err())
	}, fanout.WithLimit(4), fanout.FailFast())
	var errs fanout.Errors
	if !errors.As(err, &errs) || len(errs) != 1 || errs[0].Shard != 1 || !errors.Is(err, broken) {
		t.Fatalf("Do = %v, want only shard 1's failure", err)
	}
	if n := started.Load(); n > 5 {
		t.Errorf("%d of 20 shards started after the first failed under a limit of 4", n)
	}

	// A failure on its own, not caused by the cancellation, is still reported. Shard 0
	// fails once the others run: a shard that had not started when the first failed
	// would rightly never start.
	other := errors.New("disk full")
	var running sync.WaitGroup
	running.Add(2)
	err = fanout.Do(context.Background(), routing.DestinationAll{}, 3, func(ctx context.Context, shard int) error {
		if shard == 0 {
			running.Wait()
			return broken
		}
		running.Done()
		<-ctx.Done()
		return other
	}, fanout.FailFast())
	if !errors.As(err, &errs) || len(errs) != 3 || !errors.Is(err, other) {
		t.Errorf("Do = %v, want shard 0's failure and both others", err)
	}
}

// TestDoCancelled: cancelling ctx reaches the running fns, starts no more, and every
// shard named appears in the error, so a caller can tell which ones never answered.
func TestDoCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var started atomic.Int64
	go func() {
		for started.Load() < 2 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	begin := time.Now()
	err := fanout.Do(ctx, routing.DestinationAll{}, 6, func(ctx context.Context, shard int) error {
		started.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}, fanout.WithLimit(2))
	if took := time.Since(begin); took > 5*time.Second {
		t.Errorf("Do took %v after its context was cancelled", took)
	}
	if n := started.Load(); n != 2 {
		t.Errorf("%d shards started, want the 2 the limit let in before the cancel", n)
	}
	var errs fanout.Errors
	if !errors.As(err, &errs) || len(errs) != 6 {
		t.Fatalf("Do = %v, want all 6 shards failed", err)
	}
	for i, se := range errs {
		if se.Shard != i || !errors.Is(se, context.Canceled) {
			t.Errorf("entry %d: %v, want shard %d cancelled", i, se, i)
		}
	}

	// Already cancelled: nothing runs, not even a single shard.
	ran := false
	err = fanout.Do(ctx, routing.DestinationShard(0), 1, func(context.Context, int) error { ran = true; return nil })
	if ran || !errors.Is(err, context.Canceled) {
		t.Errorf("Do on a cancelled context: ran %v, %v", ran, err)
	}
}
