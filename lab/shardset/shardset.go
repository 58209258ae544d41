// Package shardset spreads records over a fixed set of shards: a router names the shard
// that owns a key, and every read and write for that key goes to that shard's backend.
// Single mode is simply a set of one shard, so the baseline runs the very same code.
//
// Backends are adapters over a real database: package sqlite (one file per shard) and
// package postgres (one database per shard, possibly on different hosts). A Backend is
// one kind of shard handle; multi-shard calls go through package fanout.
package shardset

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/shardlab/shardlab/internal/fanout"
	"github.com/shardlab/shardlab/routing"
)

// ErrNotFound is returned when a key has no record.
var ErrNotFound = errors.New("shardset: record not found")

// ErrClosed is returned by calls on a closed Set (wrapped in a *ShardError by Put and Get).
// A call that races with Close may instead see the backend's own error.
var ErrClosed = errors.New("shardset: closed")

// Backend stores the records of one shard. Implementations are safe for concurrent use.
type Backend interface {
	// Put stores data under key, replacing any earlier value. When it returns nil the
	// write is committed with the backend's configured durability.
	Put(ctx context.Context, key string, data []byte) error
	// Get returns the data stored under key, or an error wrapping ErrNotFound.
	Get(ctx context.Context, key string) ([]byte, error)
	// Count returns the number of records in the shard.
	Count(ctx context.Context) (int64, error)
	// Ping checks that the shard answers.
	Ping(ctx context.Context) error
	// Close releases the backend; calling it again returns nil.
	Close() error
}

// ShardError reports which shard failed (see fanout.ShardError).
type ShardError = fanout.ShardError

// Errors is the error of a call that failed on several shards (see fanout.Errors).
type Errors = fanout.Errors

// Set routes keys to backends. It is safe for concurrent use.
type Set struct {
	router   routing.Router
	backends []Backend
	closed   atomic.Bool
}

// New returns a Set over backends, one per shard of router, in shard order.
// The Set takes ownership of the backends: Close closes them.
func New(router routing.Router, backends []Backend) (*Set, error) {
	if router == nil {
		return nil, errors.New("shardset: nil router")
	}
	if len(backends) != router.Shards() {
		return nil, fmt.Errorf("shardset: router spreads keys over %d shards but %d backends were given", router.Shards(), len(backends))
	}
	return &Set{router: router, backends: backends}, nil
}

// Router returns the set's router.
func (s *Set) Router() routing.Router { return s.router }

// Shards returns the number of shards.
func (s *Set) Shards() int { return len(s.backends) }

// ShardFor returns the shard that owns key.
func (s *Set) ShardFor(key string) int { return s.router.ShardFor(key) }

// Put stores data under key on the shard that owns it and returns that shard's index.
// A backend failure is returned as a *ShardError.
func (s *Set) Put(ctx context.Context, key string, data []byte) (int, error) {
	shard := s.router.ShardFor(key)
	if s.closed.Load() {
		return shard, &ShardError{Shard: shard, Err: ErrClosed}
	}
	if err := s.backends[shard].Put(ctx, key, data); err != nil {
		return shard, &ShardError{Shard: shard, Err: err}
	}
	return shard, nil
}

// Get returns the data stored under key and the shard it was read from. A missing key
// gives an error wrapping ErrNotFound; a backend failure a *ShardError.
func (s *Set) Get(ctx context.Context, key string) ([]byte, int, error) {
	shard := s.router.ShardFor(key)
	if s.closed.Load() {
		return nil, shard, &ShardError{Shard: shard, Err: ErrClosed}
	}
	data, err := s.backends[shard].Get(ctx, key)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, shard, err
		}
		return nil, shard, &ShardError{Shard: shard, Err: err}
	}
	return data, shard, nil
}

// Counts returns the number of records in each shard, asking the shards concurrently
// (see Do). A shard that fails gives -1 and its error is in the returned Errors; the
// other counts are still filled in. Cancelling ctx fails the shards that have not
// answered.
func (s *Set) Counts(ctx context.Context) ([]int64, error) {
	counts := make([]int64, len(s.backends))
	for i := range counts {
		counts[i] = -1
	}
	err := fanout.Do(ctx, routing.DestinationAll{}, len(s.backends), func(ctx context.Context, i int) error {
		if s.closed.Load() {
			return ErrClosed
		}
		n, err := s.backends[i].Count(ctx)
		if err != nil {
			return err
		}
		counts[i] = n
		return nil
	})
	return counts, err
}

// Health pings every shard concurrently (see Do) and returns one entry per shard: nil
// when it answered, else what its backend said. A shard that hangs is reported when ctx
// ends, without delaying the others.
func (s *Set) Health(ctx context.Context) []error {
	out := make([]error, len(s.backends))
	err := fanout.Do(ctx, routing.DestinationAll{}, len(s.backends), func(ctx context.Context, i int) error {
		if s.closed.Load() {
			return ErrClosed
		}
		return s.backends[i].Ping(ctx)
	})
	var errs Errors
	if errors.As(err, &errs) {
		for _, se := range errs {
			out[se.Shard] = se.Err
		}
	}
	return out
}

// Close closes every backend, concurrently (see Do), and returns the first error in
// shard order. Calling it again returns nil.
func (s *Set) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	// Closing a pool waits for its connections in use; one slow shard need not hold up
	// the others.
	err := fanout.Do(context.Background(), routing.DestinationAll{}, len(s.backends), func(_ context.Context, i int) error {
		return s.backends[i].Close()
	})
	var errs Errors
	if errors.As(err, &errs) {
		return fmt.Errorf("close shard %d: %w", errs[0].Shard, errs[0].Err)
	}
	return err
}
