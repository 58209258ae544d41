package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/lab/shardset/postgres"
	"github.com/shardlab/shardlab/routing"
)

// A server with one DSN per shard (the shards may live on different hosts).
func ExampleOpenShards() {
	ctx := context.Background()
	dsns := []string{
		"postgres://lab@db1.example:5432/shard0",
		"postgres://lab@db2.example:5432/shard1",
	}
	stores, err := postgres.OpenShards(ctx, dsns, postgres.Options{PoolSize: 16})
	if err != nil {
		log.Fatal(err) // "open shard 1: postgres: postgres://lab@db2.example:5432/shard1: failed to connect ..."
	}
	layout := shardset.Layout{Backend: "postgres", Shards: len(stores), Router: routing.StrategyCRC32}
	if err := postgres.CheckLayouts(ctx, stores, layout); err != nil {
		log.Fatal(err) // the DSNs were given in another order, or for another shard count
	}
	router, _ := routing.New(routing.StrategyCRC32, len(stores))
	backends := make([]shardset.Backend, len(stores))
	for i, s := range stores {
		backends[i] = s
	}
	set, err := shardset.New(router, backends)
	if err != nil {
		log.Fatal(err)
	}
	defer set.Close()

	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, _, err = set.Get(ctx, "user-42")
	var shardErr *shardset.ShardError
	switch {
	case errors.Is(err, shardset.ErrNotFound):
		fmt.Println("404")
	case errors.As(err, &shardErr):
		fmt.Printf("503: shard %d is unavailable\n", shardErr.Shard)
	}
}

// One base DSN from which shardlab makes databases shardlab_shard_0..N-1 (--create).
func ExampleCreateShardDatabases() {
	ctx := context.Background()
	dsns, err := postgres.CreateShardDatabases(ctx, "postgres://postgres@127.0.0.1:5432/postgres", 4)
	if err != nil {
		log.Fatal(err)
	}
	stores, err := postgres.OpenShards(ctx, dsns, postgres.Options{})
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range stores {
		fmt.Println(s.DSN(), s.Options().PoolSize)
		s.Close()
	}
}
