package postgres_test

import (
	"errors"
	"testing"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/lab/shardset/postgres"
)

func TestCheckLayout(t *testing.T) {
	ctx := testCtx(t)
	dsns := []string{pgtest.NewDatabase(t, "layout0"), pgtest.NewDatabase(t, "layout1")}
	stores, err := postgres.OpenShards(ctx, dsns, postgres.Options{PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stores {
		t.Cleanup(func() { s.Close() })
	}
	l := shardset.Layout{Backend: "postgres", Shards: 2, Router: "crc32"}
	if err := postgres.CheckLayouts(ctx, stores, l); err != nil {
		t.Fatalf("first CheckLayouts: %v", err)
	}
	if err := postgres.CheckLayouts(ctx, stores, l); err != nil {
		t.Fatalf("same layout again: %v", err)
	}

	// The DSNs in the other order.
	swapped := []*postgres.Store{stores[1], stores[0]}
	err = postgres.CheckLayouts(ctx, swapped, l)
	var se *shardset.ShardError
	if !errors.Is(err, shardset.ErrLayoutMismatch) || !errors.As(err, &se) {
		t.Errorf("swapped DSNs: error = %v, want ErrLayoutMismatch in a ShardError", err)
	}
	// Another shard count or router.
	for _, other := range []shardset.Layout{
		{Backend: "postgres", Shards: 4, Router: "crc32"},
		{Backend: "postgres", Shards: 2, Router: "jump"},
	} {
		if err := stores[0].CheckLayout(ctx, 0, other); !errors.Is(err, shardset.ErrLayoutMismatch) {
			t.Errorf("CheckLayout(%+v) error = %v, want ErrLayoutMismatch", other, err)
		}
	}
}
