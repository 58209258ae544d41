package autoshard_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"

	"github.com/shardlab/shardlab/autoshard"
)

// A store that splits past two rows per shard: the first batch fills level 0 (one
// database, two rows) and spills into level 1 (two databases), which a lookup by hash
// then searches one shard of each level for.
func Example() {
	dir, err := os.MkdirTemp("", "autoshard-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	s, err := autoshard.Open(ctx, dir, autoshard.Options{Threshold: 2, MaxLevel: 3})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	file := sha256.Sum256([]byte("file a"))
	var blocks []autoshard.Block
	for i := range 4 {
		h := sha256.Sum256([]byte(fmt.Sprint("block ", i)))
		blocks = append(blocks, autoshard.Block{Hash: h[:], BlocklistHash: file[:], Idx: i, Offset: int64(i) * 4096, Size: 4096})
	}
	res, err := s.WriteBatch(ctx, "batch-1", blocks)
	if err != nil {
		panic(err)
	}
	fmt.Println("rows inserted:", res.Inserted, "levels written:", res.Levels)
	// The same batch id again writes nothing: a retry after a crash is safe.
	if res, err = s.WriteBatch(ctx, "batch-1", blocks); err != nil {
		panic(err)
	}
	fmt.Println("repeat:", res.Repeat)
	st, err := s.Stats()
	if err != nil {
		panic(err)
	}
	fmt.Println("top level:", st.TopLevel, "rows per level:", st.LevelRows)
	m, err := s.Lookup(ctx, blocks[3].Hash)
	if err != nil {
		panic(err)
	}
	fmt.Printf("block 3: level %d, offset %d\n", m[0].Level, m[0].Offset)
	// Output:
	// rows inserted: 4 levels written: [0 1]
	// repeat: true
	// top level: 1 rows per level: [2 2]
	// block 3: level 1, offset 12288
}
