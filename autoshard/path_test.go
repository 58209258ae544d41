package autoshard_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shardlab/shardlab/autoshard"
)

// A data directory whose name holds URI metacharacters must still get its
// files inside it: the path goes into a SQLite file: URI.
func TestOpenEscapesDataDirInURI(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "a?b#c%41 d")
	s := openStore(t, dir, autoshard.Options{Threshold: 10, MaxLevel: 1})
	mustWrite(t, s, "b1", makeBlocks("esc", 0, 1, 30))
	for _, p := range []string{"manifest.db", "level-00/shard-0000.db", "level-01/shard-0001.db"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	entries, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != filepath.Base(dir) {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("files next to the data directory: %q", names)
	}
}

// Lookups racing with Close must either succeed or report ErrClosed, never a
// database/sql error about a closed database.
func TestLookupRacingCloseReportsErrClosed(t *testing.T) {
	for range 20 {
		s, err := autoshard.Open(context.Background(), t.TempDir(), autoshard.Options{Threshold: 10, MaxLevel: 2})
		if err != nil {
			t.Fatal(err)
		}
		blocks := makeBlocks("race", 0, 2, 30)
		mustWrite(t, s, "b1", blocks)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for w := range 8 {
			wg.Go(func() {
				for i := 0; ; i++ {
					if _, err := s.Lookup(context.Background(), blocks[(w+i)%len(blocks)].Hash); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		time.Sleep(2 * time.Millisecond)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if !errors.Is(err, autoshard.ErrClosed) {
				t.Fatalf("Lookup during Close: %v, want ErrClosed", err)
			}
		}
	}
}

// The sync mode of Options reaches every database the store opens, read back
// from the connections that commit.
func TestSyncModeReachesEveryDatabase(t *testing.T) {
	for _, mode := range []autoshard.SyncMode{autoshard.SyncNormal, autoshard.SyncFull, autoshard.SyncOff} {
		t.Run(mode.String(), func(t *testing.T) {
			s := openStore(t, t.TempDir(), autoshard.Options{Threshold: 10, MaxLevel: 1, Sync: mode})
			mustWrite(t, s, "b1", makeBlocks("sync", 0, 1, 30)) // spills into level 1
			got, err := autoshard.Synchronous(context.Background(), s)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 4 { // the manifest, level 0's shard and level 1's two
				t.Fatalf("%d databases: %v", len(got), got)
			}
			for i, v := range got {
				if v != mode.String() {
					t.Errorf("database %d: synchronous %s, want %s", i, v, mode)
				}
			}
		})
	}
}
