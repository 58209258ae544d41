// Package fanout runs a call on many shards at once, bounded, and reports which failed:
// the one fan-out every multi-shard operation of shardlab goes through, whatever a
// shard is to the caller (a SQL connection pool, a key-value backend, a file).
package fanout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/shardlab/shardlab/routing"
)

// DefaultLimit is how many shards Do runs at once unless WithLimit says otherwise: enough
// that one slow shard does not hold up the others, few enough that a set of hundreds of
// shards does not open hundreds of connections at once.
const DefaultLimit = 16

// ErrNoSuchShard is wrapped by Do's error when the destination names a shard outside
// [0, shards): running nothing there would silently lose the call.
var ErrNoSuchShard = errors.New("fanout: no such shard")

// ShardError reports which shard failed. Callers use it to answer "shard 2 is down"
// rather than failing the whole set.
type ShardError struct {
	Shard int   // index of the shard that failed
	Err   error // what the shard's call returned
}

func (e *ShardError) Error() string { return fmt.Sprintf("shard %d: %v", e.Shard, e.Err) }

// Unwrap returns the shard's error.
func (e *ShardError) Unwrap() error { return e.Err }

// Errors is the error Do returns when shards failed: one *ShardError per failed shard,
// in shard order. It unwraps to them, so errors.Is and errors.As look into every shard's
// error; a caller that needs each shard's answer ranges over it after errors.As.
type Errors []*ShardError

// Error lists the shards' errors one per line, as errors.Join does.
func (e Errors) Error() string {
	var b strings.Builder
	for i, se := range e {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(se.Error())
	}
	return b.String()
}

// Unwrap returns the *ShardError values.
func (e Errors) Unwrap() []error {
	out := make([]error, len(e))
	for i, se := range e {
		out[i] = se
	}
	return out
}

// Shard returns the error of shard i, or nil when it did not fail.
func (e Errors) Shard(i int) error {
	for _, se := range e {
		if se.Shard == i {
			return se.Err
		}
	}
	return nil
}

// DoOption tunes one Do call.
type DoOption func(*doConfig)

type doConfig struct {
	limit    int
	failFast bool
}

// WithLimit makes Do run at most n shards at once; n < 1 keeps DefaultLimit.
func WithLimit(n int) DoOption {
	return func(c *doConfig) {
		if n >= 1 {
			c.limit = n
		}
	}
}

// FailFast makes the first failure cancel the context of the shards still running and
// start no further shard: the choice for a scatter-gather read, whose answer is useless
// once one part is missing. Without it every shard runs to the end and reports, which a
// health check wants.
func FailFast() DoOption {
	return func(c *doConfig) { c.failFast = true }
}

// errOtherShardFailed is the cancellation cause FailFast gives the shards still running.
var errOtherShardFailed = errors.New("fanout: another shard failed")

// Do runs fn once for every shard dest names over a set of shards shards (see
// routing.Resolve: DestinationAny is shard 0, DestinationNone runs nothing), at most
// DefaultLimit (or WithLimit) at a time, and waits for all of them. One shard runs on the
// caller's goroutine, so a single-shard call costs no goroutine.
//
// It returns nil when every fn returned nil, and otherwise an Errors value naming each
// failed shard. A destination naming a shard outside [0, shards) runs nothing and fails
// with ErrNoSuchShard.
//
// Cancelling ctx reaches the fns already running through their ctx argument; shards not
// yet started are not started and are reported failed with ctx's error, so every shard
// named either succeeded or appears in the error. Without FailFast one shard's failure
// does not affect the others; with FailFast it cancels them, and the shards that then
// end with that cancellation, or were never started, are left out of the error, which
// holds only the failures that happened on their own.
//
// Do does not know what a shard is: fn reaches whatever handle the caller keeps for
// shard i (a key-value Backend, a SQL connection pool, a file).
func Do(ctx context.Context, dest routing.Destination, shards int, fn func(ctx context.Context, shard int) error, opts ...DoOption) error {
	cfg := doConfig{limit: DefaultLimit}
	for _, o := range opts {
		o(&cfg)
	}
	targets, err := resolve(dest, shards)
	if err != nil {
		return err
	}
	switch len(targets) {
	case 0:
		return nil
	case 1:
		if err := ctx.Err(); err != nil {
			return Errors{{Shard: targets[0], Err: err}}
		}
		if err := fn(ctx, targets[0]); err != nil {
			return Errors{{Shard: targets[0], Err: err}}
		}
		return nil
	}

	runCtx, cancel := ctx, context.CancelCauseFunc(func(error) {})
	if cfg.failFast {
		runCtx, cancel = context.WithCancelCause(ctx)
	}
	defer cancel(nil)

	errs := make([]error, len(targets))
	started := make([]bool, len(targets))
	first := -1 // under FailFast, the target whose failure cancelled the others
	var firstOnce sync.Once
	sem := make(chan struct{}, cfg.limit)
	var wg sync.WaitGroup
launch:
	for i, shard := range targets {
		select {
		case sem <- struct{}{}:
		case <-runCtx.Done():
			break launch
		}
		// A free slot and a cancelled context can be ready together; select picks either.
		if runCtx.Err() != nil {
			<-sem
			break
		}
		started[i] = true
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(runCtx, shard); err != nil {
				errs[i] = err
				if cfg.failFast {
					firstOnce.Do(func() { first = i })
					cancel(errOtherShardFailed)
				}
			}
		})
	}
	wg.Wait()

	collateral := cfg.failFast && errors.Is(context.Cause(runCtx), errOtherShardFailed)
	var out Errors
	for i, shard := range targets {
		err := errs[i]
		switch {
		case !started[i] && collateral:
			continue
		case !started[i]:
			err = ctx.Err()
		case err == nil:
			continue
		case collateral && i != first && ctx.Err() == nil && errors.Is(err, context.Canceled):
			// Ended by the cancellation another shard's failure caused.
			continue
		}
		out = append(out, &ShardError{Shard: shard, Err: err})
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// resolve checks dest against the set's size and returns its shards.
func resolve(dest routing.Destination, shards int) ([]int, error) {
	if dest == nil {
		return nil, fmt.Errorf("%w: nil destination", ErrNoSuchShard)
	}
	if _, none := dest.(routing.DestinationNone); none {
		return nil, nil
	}
	if shards < 1 {
		return nil, fmt.Errorf("%w: %s in a set of %d shards", ErrNoSuchShard, dest, shards)
	}
	var named []int
	switch d := dest.(type) {
	case routing.DestinationShard:
		named = []int{int(d)}
	case routing.DestinationShards:
		// A literal DestinationShards may repeat a shard; running a write twice on it
		// would be wrong, so take each shard once.
		named = slices.Compact(slices.Sorted(slices.Values(d)))
	default:
		return routing.Resolve(dest, shards), nil
	}
	for _, s := range named {
		if s < 0 || s >= shards {
			return nil, fmt.Errorf("%w: %s in a set of %d shards", ErrNoSuchShard, dest, shards)
		}
	}
	return named, nil
}
