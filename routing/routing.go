// Package routing maps a record key (the lab's user id) to the shard that owns it.
//
// The default strategy is the seed lab's: crc32.ChecksumIEEE(key) % N. It is simple and
// fast, but when N changes almost every key moves to another shard. Jump consistent
// hashing (Lamping and Veach, 2014) is offered beside it: growing from N to N+1 shards
// moves only about 1/(N+1) of the keys, at the price of a few more nanoseconds per key.
//
// The shard a key maps to must never change silently, since that would strand written
// data on a shard nobody asks: golden vectors in the tests pin both strategies.
package routing

import (
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"unsafe"
)

// ErrBadShardCount is returned when a router is asked for fewer than one shard.
var ErrBadShardCount = errors.New("routing: shard count must be at least 1")

// ErrUnknownStrategy is returned by New for a strategy name it does not know.
var ErrUnknownStrategy = errors.New("routing: unknown strategy")

// MaxShards bounds the shard count a router accepts; it keeps a typo such as
// --shards 30000 from opening thousands of databases.
const MaxShards = 4096

// Router answers which shard owns a key. Implementations are safe for concurrent use.
type Router interface {
	// ShardFor returns the index, in [0, Shards()), of the shard that owns key.
	ShardFor(key string) int
	// Shards returns the number of shards the router spreads keys over.
	Shards() int
	// Name returns the strategy name as accepted by New ("crc32" or "jump").
	Name() string
}

// Strategy names accepted by New.
const (
	StrategyCRC32 = "crc32"
	StrategyJump  = "jump"
)

// Strategies returns the names New accepts, default first.
func Strategies() []string { return []string{StrategyCRC32, StrategyJump} }

// New returns the router for the named strategy over n shards.
func New(strategy string, n int) (Router, error) {
	switch strategy {
	case StrategyCRC32:
		return NewCRC32(n)
	case StrategyJump:
		return NewJump(n)
	default:
		return nil, fmt.Errorf("%w %q (want one of %s)", ErrUnknownStrategy, strategy, strings.Join(Strategies(), ", "))
	}
}

func checkShards(n int) error {
	if n < 1 || n > MaxShards {
		return fmt.Errorf("%w and at most %d, got %d", ErrBadShardCount, MaxShards, n)
	}
	return nil
}

// CRC32 is the seed lab's modulo router: crc32.ChecksumIEEE(key) % N.
type CRC32 struct{ n uint32 }

var _ Router = (*CRC32)(nil)

// NewCRC32 returns a modulo-N CRC32 router over n shards.
func NewCRC32(n int) (*CRC32, error) {
	if err := checkShards(n); err != nil {
		return nil, err
	}
	return &CRC32{n: uint32(n)}, nil
}

// ShardFor implements Router.
func (r *CRC32) ShardFor(key string) int {
	// Viewing the string's bytes in place avoids the copy (and allocation) that
	// []byte(key) costs; the checksum only reads them.
	return int(crc32.ChecksumIEEE(unsafe.Slice(unsafe.StringData(key), len(key))) % r.n)
}

// Shards implements Router.
func (r *CRC32) Shards() int { return int(r.n) }

// Name implements Router.
func (r *CRC32) Name() string { return StrategyCRC32 }

// Jump is Lamping and Veach's jump consistent hash over a 64-bit FNV-1a hash of the key.
// FNV-1a is used rather than CRC32 because jump hashing wants 64 well-mixed bits.
type Jump struct{ n int32 }

var _ Router = (*Jump)(nil)

// NewJump returns a jump consistent hash router over n shards.
func NewJump(n int) (*Jump, error) {
	if err := checkShards(n); err != nil {
		return nil, err
	}
	return &Jump{n: int32(n)}, nil
}

// ShardFor implements Router.
func (r *Jump) ShardFor(key string) int {
	return int(JumpHash(fnv1a64(key), r.n))
}

// Shards implements Router.
func (r *Jump) Shards() int { return int(r.n) }

// Name implements Router.
func (r *Jump) Name() string { return StrategyJump }

// JumpHash maps a 64-bit key to a bucket in [0, buckets) so that growing buckets by one
// moves only the keys that land in the new bucket. It follows the published algorithm:
// a linear congruential generator drives a walk of "jumps" forward until it passes buckets.
// buckets must be at least 1.
func JumpHash(key uint64, buckets int32) int32 {
	var b, j int64 = -1, 0
	for j < int64(buckets) {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	return int32(b)
}

// fnv1a64 is the 64-bit FNV-1a hash of s, written out so that routing a key allocates nothing.
func fnv1a64(s string) uint64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= prime64
	}
	return h
}

// CRC32Shard is the crc32 strategy for one key over n shards, without building a Router:
// crc32.ChecksumIEEE(key) % n. n must be at least 1.
func CRC32Shard(key string, n int) int {
	return int(crc32.ChecksumIEEE(unsafe.Slice(unsafe.StringData(key), len(key))) % uint32(n))
}

// JumpShard is the jump strategy for one key over n shards, without building a Router.
// n must be at least 1.
func JumpShard(key string, n int) int { return int(JumpHash(fnv1a64(key), int32(n))) }
