package routing_test

import (
	"fmt"

	"github.com/shardlab/shardlab/routing"
)

// A router names the shard of a key: CRC32 of the key modulo the shard count, the
// lab's default. The same key always lands on the same shard.
func ExampleNew() {
	r, err := routing.New(routing.StrategyCRC32, 3)
	if err != nil {
		panic(err)
	}
	for _, key := range []string{"alice", "dave", "erin", "frank"} {
		fmt.Printf("%s -> shard %d\n", key, r.ShardFor(key))
	}
	// Output:
	// alice -> shard 2
	// dave -> shard 2
	// erin -> shard 0
	// frank -> shard 2
}

// PostgreSQL's own hash partitioning: the partition PGPartition names for a bigint is
// the one `PARTITION BY HASH` with `FOR VALUES WITH (MODULUS 4, REMAINDER r)` holds it
// in, so shards made this way are interchangeable with native hash partitions.
func ExamplePGPartition() {
	for _, id := range []int64{1, 2, 3, 42} {
		fmt.Printf("order %d -> partition %d of 4\n", id, routing.PGPartition(routing.PGHashInt8(id), 4))
	}
	// Output:
	// order 1 -> partition 0 of 4
	// order 2 -> partition 2 of 4
	// order 3 -> partition 1 of 4
	// order 42 -> partition 2 of 4
}

// A routing answer is a value: one shard, some, all, any, or none. Resolve lists the
// shards it names.
func ExampleUnion() {
	d := routing.Union(routing.DestinationShard(1), routing.NewShards(3, 0), 4)
	fmt.Println(routing.Resolve(d, 4))
	fmt.Println(routing.Resolve(routing.DestinationAll{}, 4))
	// Output:
	// [0 1 3]
	// [0 1 2 3]
}
