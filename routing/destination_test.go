package routing_test

import (
	"slices"
	"testing"

	"github.com/shardlab/shardlab/routing"
)

func TestNewShardsNormalises(t *testing.T) {
	tests := []struct {
		in   []int
		want routing.Destination
	}{
		{nil, routing.DestinationNone{}},
		{[]int{2}, routing.DestinationShard(2)},
		{[]int{2, 2}, routing.DestinationShard(2)},
		{[]int{3, 1, 3, 0}, routing.DestinationShards{0, 1, 3}},
	}
	for _, tt := range tests {
		got := routing.NewShards(tt.in...)
		if got.String() != tt.want.String() {
			t.Errorf("NewShards(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
	in := []int{3, 1}
	routing.NewShards(in...)
	if !slices.Equal(in, []int{3, 1}) {
		t.Errorf("NewShards modified its argument: %v", in)
	}
}

func TestResolve(t *testing.T) {
	tests := []struct {
		d    routing.Destination
		want []int
	}{
		{routing.DestinationShard(1), []int{1}},
		{routing.DestinationShard(7), nil},
		{routing.DestinationShards{0, 2, 9}, []int{0, 2}},
		{routing.DestinationAll{}, []int{0, 1, 2, 3}},
		{routing.DestinationAny{}, []int{0}},
		{routing.DestinationNone{}, nil},
	}
	for _, tt := range tests {
		if got := routing.Resolve(tt.d, 4); !slices.Equal(got, tt.want) {
			t.Errorf("Resolve(%v, 4) = %v, want %v", tt.d, got, tt.want)
		}
	}
}

func TestUnionAndIntersect(t *testing.T) {
	s := func(i ...int) routing.Destination { return routing.NewShards(i...) }
	tests := []struct {
		a, b             routing.Destination
		union, intersect string
	}{
		{s(1), s(2), "shards [1 2]", "no shard"},
		{s(1), s(1, 2), "shards [1 2]", "shard 1"},
		{s(0, 1), s(2, 3), "all shards", "no shard"},
		{routing.DestinationAll{}, s(3), "all shards", "shard 3"},
		{routing.DestinationNone{}, s(3), "shard 3", "no shard"},
		{routing.DestinationAny{}, s(3), "shard 3", "shard 3"},
	}
	for _, tt := range tests {
		if got := routing.Union(tt.a, tt.b, 4).String(); got != tt.union {
			t.Errorf("Union(%v, %v) = %s, want %s", tt.a, tt.b, got, tt.union)
		}
		if got := routing.Intersect(tt.a, tt.b, 4).String(); got != tt.intersect {
			t.Errorf("Intersect(%v, %v) = %s, want %s", tt.a, tt.b, got, tt.intersect)
		}
	}
}
