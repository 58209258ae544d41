package postgres_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/lab/shardset/postgres"
)

// Run with: SHARDLAB_PG_DSN=... go test -run '^$' -bench . ./postgres/
// Each op is one round trip to the server: on loopback the numbers measure PostgreSQL
// and the driver, not the network.

func benchStore(b *testing.B) *postgres.Store {
	s, err := postgres.Open(context.Background(), pgtest.NewDatabase(b, "bench"), postgres.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

func BenchmarkPut(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	data := make([]byte, 256)
	b.Run("serial", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if err := s.Put(ctx, fmt.Sprint("user-", i%10000), data); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := s.Put(ctx, fmt.Sprint("user-", next.Add(1)%10000), data); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func BenchmarkGet(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	const keys = 1000
	for i := range keys {
		if err := s.Put(ctx, fmt.Sprint("user-", i), make([]byte, 256)); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("serial", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if _, err := s.Get(ctx, fmt.Sprint("user-", i%keys)); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.Get(ctx, fmt.Sprint("user-", next.Add(1)%keys)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
