package routing

import (
	"fmt"
	"slices"
)

// Destination is a routing answer: which shards a key, a statement or a batch goes to.
// It is one of DestinationShard, DestinationShards, DestinationAll, DestinationAny or
// DestinationNone, and executors switch on the concrete type:
//
//	switch d := dest.(type) {
//	case routing.DestinationShard:   // exactly one shard
//	case routing.DestinationShards:  // these shards
//	case routing.DestinationAll:     // every shard
//	case routing.DestinationAny:     // any one shard will do (a read of a copied table)
//	case routing.DestinationNone:    // no shard can hold a match
//	}
//
// Resolve turns any of them into the list of shard indexes.
type Destination interface {
	// String describes the destination for plans and errors, e.g. "shard 2", "shards [0 3]".
	String() string
	isDestination()
}

// DestinationShard is one shard, by index.
type DestinationShard int

// DestinationShards is a set of shards, ascending and without repeats (see NewShards).
type DestinationShards []int

// DestinationAll is every shard of the set.
type DestinationAll struct{}

// DestinationAny is any single shard: each holds the same data, so the executor picks one.
type DestinationAny struct{}

// DestinationNone is no shard at all: the condition cannot match anywhere (for example
// `key IN ()` after every value was ruled out). Executors answer with an empty result.
type DestinationNone struct{}

func (DestinationShard) isDestination()  {}
func (DestinationShards) isDestination() {}
func (DestinationAll) isDestination()    {}
func (DestinationAny) isDestination()    {}
func (DestinationNone) isDestination()   {}

func (d DestinationShard) String() string  { return fmt.Sprintf("shard %d", int(d)) }
func (d DestinationShards) String() string { return fmt.Sprintf("shards %v", []int(d)) }
func (DestinationAll) String() string      { return "all shards" }
func (DestinationAny) String() string      { return "any shard" }
func (DestinationNone) String() string     { return "no shard" }

// NewShards returns the destination for a set of shard indexes, which may be unsorted
// and repeat: none gives DestinationNone, one index a DestinationShard, more a sorted
// DestinationShards without repeats. The caller's slice is not modified.
func NewShards(shards ...int) Destination {
	switch len(shards) {
	case 0:
		return DestinationNone{}
	case 1:
		return DestinationShard(shards[0])
	}
	s := slices.Clone(shards)
	slices.Sort(s)
	s = slices.Compact(s)
	if len(s) == 1 {
		return DestinationShard(s[0])
	}
	return DestinationShards(s)
}

// Union returns the destination covering both a and b over a set of n shards.
func Union(a, b Destination, n int) Destination {
	switch {
	case isNone(a):
		return b
	case isNone(b):
		return a
	}
	_, aAll := a.(DestinationAll)
	_, bAll := b.(DestinationAll)
	if aAll || bAll {
		return DestinationAll{}
	}
	// DestinationAny united with a concrete set is satisfied by that set.
	if _, ok := a.(DestinationAny); ok {
		return b
	}
	if _, ok := b.(DestinationAny); ok {
		return a
	}
	u := NewShards(append(Resolve(a, n), Resolve(b, n)...)...)
	if s, ok := u.(DestinationShards); ok && len(s) == n {
		return DestinationAll{}
	}
	return u
}

// Intersect returns the shards both a and b name over a set of n shards. It is how two
// conditions joined by AND narrow a statement: `k = 1 AND k IN (1, 2)` goes where both go.
func Intersect(a, b Destination, n int) Destination {
	if _, ok := a.(DestinationAll); ok {
		return b
	}
	if _, ok := b.(DestinationAll); ok {
		return a
	}
	if _, ok := a.(DestinationAny); ok {
		return b
	}
	if _, ok := b.(DestinationAny); ok {
		return a
	}
	bs := Resolve(b, n)
	var out []int
	for _, s := range Resolve(a, n) {
		if slices.Contains(bs, s) {
			out = append(out, s)
		}
	}
	return NewShards(out...)
}

func isNone(d Destination) bool {
	_, ok := d.(DestinationNone)
	return ok
}

// Resolve returns the shard indexes d names over a set of n shards, ascending.
// DestinationAny resolves to shard 0, so that copies are read from one fixed place
// unless the executor has a better choice. Indexes outside [0, n) are dropped.
func Resolve(d Destination, n int) []int {
	switch d := d.(type) {
	case DestinationShard:
		if int(d) >= 0 && int(d) < n {
			return []int{int(d)}
		}
		return nil
	case DestinationShards:
		out := make([]int, 0, len(d))
		for _, s := range d {
			if s >= 0 && s < n {
				out = append(out, s)
			}
		}
		return out
	case DestinationAll:
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	case DestinationAny:
		if n > 0 {
			return []int{0}
		}
		return nil
	default:
		return nil
	}
}
