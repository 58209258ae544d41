package autoshard_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/shardlab/shardlab/autoshard"
)

// BenchmarkWriteBatch writes batches of 25 files x 1234 blocks into a store
// that splits every 100k rows per database; cmd/blockbench is the full-size
// experiment.
func BenchmarkWriteBatch(b *testing.B) {
	s, err := autoshard.Open(context.Background(), b.TempDir(), autoshard.Options{Threshold: 100_000})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	i := 0
	var blocks int64
	for b.Loop() {
		batch := makeBlocks(fmt.Sprint("bench", i), 0, 25, 1234)
		res, err := s.WriteBatch(context.Background(), fmt.Sprint("b", i), batch)
		if err != nil {
			b.Fatal(err)
		}
		blocks += res.Inserted
		i++
	}
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkLookup looks up written hashes in a store of four levels.
func BenchmarkLookup(b *testing.B) {
	s, err := autoshard.Open(context.Background(), b.TempDir(), autoshard.Options{Threshold: 2000})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	all := makeBlocks("lookup", 0, 30, 1000) // levels 0..3
	if _, err := s.WriteBatch(context.Background(), "all", all); err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		if _, err := s.Lookup(context.Background(), all[i%len(all)].Hash); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
