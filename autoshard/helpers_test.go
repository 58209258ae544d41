package autoshard_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/shardlab/shardlab/autoshard"
	"github.com/shardlab/shardlab/internal/sqlitedb"
)

// makeBlocks returns deterministic blocks for files [first, first+files),
// perFile blocks each, with uniformly spread hashes.
func makeBlocks(seed string, first, files, perFile int) []autoshard.Block {
	var out []autoshard.Block
	for f := first; f < first+files; f++ {
		bl := sha256.Sum256([]byte(fmt.Sprintf("%s/file/%d", seed, f)))
		for i := 0; i < perFile; i++ {
			h := sha256.Sum256(binary.BigEndian.AppendUint64(bl[:], uint64(i)))
			out = append(out, autoshard.Block{
				Hash: h[:], BlocklistHash: bl[:], Idx: i,
				Offset: int64(i) * 128 << 10, Size: 128 << 10,
			})
		}
	}
	return out
}

func openStore(t *testing.T, dir string, opts autoshard.Options) *autoshard.Store {
	t.Helper()
	s, err := autoshard.Open(context.Background(), dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func mustWrite(t *testing.T, s *autoshard.Store, id string, blocks []autoshard.Block) autoshard.BatchResult {
	t.Helper()
	res, err := s.WriteBatch(context.Background(), id, blocks)
	if err != nil {
		t.Fatalf("WriteBatch(%s): %v", id, err)
	}
	return res
}

type key struct {
	hash, blocklist string
	idx             int
}

// copiesOnDisk opens every shard file under dir directly (not through the
// store) and counts how often each key is stored. It also checks that every
// row sits in the shard that ShardFor names and that the shard's persisted
// row counter equals its real row count.
func copiesOnDisk(t *testing.T, dir string) map[key]int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "level-*", "shard-*.db"))
	if err != nil {
		t.Fatal(err)
	}
	copies := make(map[key]int)
	for _, f := range files {
		var level, shard int
		if _, err := fmt.Sscanf(filepath.Base(filepath.Dir(f))+"/"+filepath.Base(f), "level-%d/shard-%d.db", &level, &shard); err != nil {
			t.Fatalf("parse %s: %v", f, err)
		}
		db, err := sql.Open(sqlitedb.DriverName, "file:"+f+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		rows, err := db.Query(`SELECT hash, blocklist_hash, idx FROM blocks`)
		if err != nil {
			t.Fatalf("query %s: %v", f, err)
		}
		var n int64
		for rows.Next() {
			var k key
			var h, bl []byte
			if err := rows.Scan(&h, &bl, &k.idx); err != nil {
				t.Fatal(err)
			}
			if got := autoshard.ShardFor(h, level); got != shard {
				t.Errorf("%s holds a block of shard %d", f, got)
			}
			k.hash, k.blocklist = string(h), string(bl)
			copies[k]++
			n++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		var counter int64
		if err := db.QueryRow(`SELECT rows FROM shard_meta`).Scan(&counter); err != nil {
			t.Fatalf("read counter of %s: %v", f, err)
		}
		if counter != n {
			t.Errorf("%s: row counter %d, real rows %d", f, counter, n)
		}
		db.Close()
	}
	return copies
}

// checkExactlyOnce fails unless every block of want is stored exactly once
// on disk and nothing else is stored.
func checkExactlyOnce(t *testing.T, dir string, want []autoshard.Block) {
	t.Helper()
	copies := copiesOnDisk(t, dir)
	if len(copies) != len(want) {
		t.Errorf("disk holds %d distinct keys, want %d", len(copies), len(want))
	}
	bad := 0
	for _, b := range want {
		k := key{string(b.Hash), string(b.BlocklistHash), b.Idx}
		if n := copies[k]; n != 1 && bad < 5 {
			t.Errorf("block %x/%d stored %d times, want 1", b.Hash[:4], b.Idx, n)
			bad++
		}
	}
}

func levelRows(t *testing.T, s *autoshard.Store) []int64 {
	t.Helper()
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st.LevelRows
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
