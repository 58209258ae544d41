package autoshard_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/autoshard"
)

func TestOpenRefusesBadOptions(t *testing.T) {
	tests := []struct {
		name string
		opts autoshard.Options
		want string
	}{
		{"negative threshold", autoshard.Options{Threshold: -1}, "threshold -1 is negative"},
		{"negative max level", autoshard.Options{Threshold: 10, MaxLevel: -1}, "max level -1 is outside"},
		{"max level too high", autoshard.Options{Threshold: 10, MaxLevel: autoshard.MaxMaxLevel + 1}, fmt.Sprintf("max level %d is outside", autoshard.MaxMaxLevel+1)},
		{"negative concurrency", autoshard.Options{Concurrency: -2}, "concurrency -2 is negative"},
		{"unknown sync mode", autoshard.Options{Sync: autoshard.SyncMode(42)}, "unknown sync mode 42"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			s, err := autoshard.Open(context.Background(), dir, tt.opts)
			if err == nil {
				s.Close()
				t.Fatal("Open accepted bad options")
			}
			if !errors.Is(err, autoshard.ErrInvalidOptions) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want ErrInvalidOptions mentioning %q", err, tt.want)
			}
			if fileExists(dir) {
				t.Error("Open created the data dir despite bad options")
			}
		})
	}
	if _, err := autoshard.ParseSyncMode("sometimes"); !errors.Is(err, autoshard.ErrInvalidOptions) {
		t.Errorf("ParseSyncMode(sometimes) = %v, want ErrInvalidOptions", err)
	}
	for _, m := range []autoshard.SyncMode{autoshard.SyncNormal, autoshard.SyncFull, autoshard.SyncOff} {
		if got, err := autoshard.ParseSyncMode(m.String()); err != nil || got != m {
			t.Errorf("ParseSyncMode(%q) = %v, %v", m.String(), got, err)
		}
	}
}

func TestWriteBatchRefusesBadInput(t *testing.T) {
	s := openStore(t, t.TempDir(), autoshard.Options{Threshold: 10})
	ctx := context.Background()
	good := makeBlocks("bad", 0, 1, 3)
	if _, err := s.WriteBatch(ctx, "", good); !errors.Is(err, autoshard.ErrInvalidBatchID) {
		t.Errorf("empty id: %v", err)
	}
	noHash := slices.Clone(good)
	noHash[1].Hash = nil
	if _, err := s.WriteBatch(ctx, "x", noHash); !errors.Is(err, autoshard.ErrInvalidBlock) {
		t.Errorf("empty hash: %v", err)
	}
	negative := slices.Clone(good)
	negative[2].Offset = -1
	if _, err := s.WriteBatch(ctx, "x", negative); !errors.Is(err, autoshard.ErrInvalidBlock) {
		t.Errorf("negative offset: %v", err)
	}
	mustWrite(t, s, "x", good)
	if _, err := s.WriteBatch(ctx, "x", makeBlocks("other", 0, 1, 3)); !errors.Is(err, autoshard.ErrBatchMismatch) {
		t.Errorf("reused id: %v", err)
	}
}

func TestLevelsAppearExactlyAtThreshold(t *testing.T) {
	const T = 1000
	dir := t.TempDir()
	s := openStore(t, dir, autoshard.Options{Threshold: T, MaxLevel: 3})
	all := makeBlocks("levels", 0, 100, 100) // 10000 blocks
	// Level L is full at T x 2^L rows: 1000, 2000, 4000.
	steps := []struct {
		n          int
		wantRows   []int64
		wantLevels []int
	}{
		{700, []int64{700}, []int{0}},
		{300, []int64{1000}, []int{0}}, // exactly full: no new level yet
		{1, []int64{1000, 1}, []int{1}},
		{1999, []int64{1000, 2000}, []int{1}}, // exactly full again
		{1, []int64{1000, 2000, 1}, []int{2}},
		{4999, []int64{1000, 2000, 4000, 1000}, []int{2, 3}},
		// MaxLevel 3: the top level takes everything past it.
		{2000, []int64{1000, 2000, 4000, 3000}, []int{3}},
	}
	next := 0
	for i, st := range steps {
		res := mustWrite(t, s, "b"+string(rune('a'+i)), all[next:next+st.n])
		next += st.n
		if got := levelRows(t, s); !slices.Equal(got, st.wantRows) {
			t.Fatalf("step %d: level rows %v, want %v", i, got, st.wantRows)
		}
		if !slices.Equal(res.Levels, st.wantLevels) || res.Inserted != int64(st.n) {
			t.Fatalf("step %d: result %+v, want levels %v and %d inserted", i, res, st.wantLevels, st.n)
		}
		if !fileExists(filepath.Join(dir, "level-0"+string(rune('0'+len(st.wantRows)-1)), "shard-0000.db")) {
			t.Fatalf("step %d: top level folder missing", i)
		}
	}
	stats, _ := s.Stats()
	if stats.Shards != 1+2+4+8 || stats.TopLevel != 3 || stats.Rows != 10000 {
		t.Errorf("stats %+v", stats)
	}
	checkExactlyOnce(t, dir, all)
}

func TestLargeBatchSpansSeveralLevels(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, autoshard.Options{Threshold: 100})
	all := makeBlocks("span", 0, 10, 100)
	res := mustWrite(t, s, "one", all)
	if want := []int64{100, 200, 400, 300}; !slices.Equal(levelRows(t, s), want) {
		t.Fatalf("level rows %v, want %v", levelRows(t, s), want)
	}
	if !slices.Equal(res.Levels, []int{0, 1, 2, 3}) {
		t.Errorf("levels %v", res.Levels)
	}
	checkExactlyOnce(t, dir, all)
}

func TestThresholdZeroNeverSplits(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, autoshard.Options{})
	all := makeBlocks("zero", 0, 10, 300)
	for i := 0; i < 10; i++ {
		mustWrite(t, s, "b"+string(rune('0'+i)), all[i*300:(i+1)*300])
	}
	if got := levelRows(t, s); !slices.Equal(got, []int64{3000}) {
		t.Fatalf("level rows %v, want [3000]", got)
	}
}

func TestDuplicatesInsideBatchAreStoredOnce(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, autoshard.Options{Threshold: 5})
	blocks := makeBlocks("dup", 0, 1, 6)
	withDups := append(slices.Clone(blocks), blocks[0], blocks[3])
	res := mustWrite(t, s, "d", withDups)
	if res.Blocks != 6 || res.Inserted != 6 {
		t.Errorf("result %+v, want 6 blocks inserted", res)
	}
	if got := levelRows(t, s); !slices.Equal(got, []int64{5, 1}) {
		t.Errorf("level rows %v, want [5 1]", got)
	}
	checkExactlyOnce(t, dir, blocks)
}

func TestReopenContinuesAndFindsEveryBlock(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := autoshard.Options{Threshold: 400, MaxLevel: 5}
	all := makeBlocks("reopen", 0, 30, 100)
	s, err := autoshard.Open(ctx, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 15; i++ {
		mustWrite(t, s, "r"+string(rune('a'+i)), all[i*100:(i+1)*100])
	}
	before := levelRows(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Lookup(ctx, all[0].Hash); !errors.Is(err, autoshard.ErrClosed) {
		t.Errorf("Lookup after Close: %v", err)
	}
	if _, err := s.WriteBatch(ctx, "late", all[:1]); !errors.Is(err, autoshard.ErrClosed) {
		t.Errorf("WriteBatch after Close: %v", err)
	}

	s = openStore(t, dir, opts)
	if got := levelRows(t, s); !slices.Equal(got, before) {
		t.Fatalf("after reopen level rows %v, want %v", got, before)
	}
	for _, b := range all[:1500] {
		m, err := s.Lookup(ctx, b.Hash)
		if err != nil {
			t.Fatal(err)
		}
		if len(m) != 1 || m[0].Idx != b.Idx || m[0].Offset != b.Offset || m[0].Size != b.Size {
			t.Fatalf("Lookup(%x) = %+v", b.Hash[:4], m)
		}
	}
	// Writing continues in the level where the first process stopped.
	for i := 15; i < 30; i++ {
		mustWrite(t, s, "r"+string(rune('a'+i)), all[i*100:(i+1)*100])
	}
	want := []int64{400, 800, 1600, 200}
	if got := levelRows(t, s); !slices.Equal(got, want) {
		t.Fatalf("level rows %v, want %v", got, want)
	}
	checkExactlyOnce(t, dir, all)
}

func TestLookupSeesAllLevels(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir(), autoshard.Options{Threshold: 10})
	// The same data block appears in three files written at three levels.
	shared := makeBlocks("shared", 0, 1, 1)[0]
	// Level capacities are 10, 20, 40 rows.
	for i, seed := range []string{"f0", "f1", "f2"} {
		n := []int{9, 19, 9}[i]
		filler := makeBlocks(seed, 0, 1, n)
		b := shared
		b.BlocklistHash = filler[0].BlocklistHash
		b.Idx = n
		mustWrite(t, s, seed, append(filler, b))
		if got := len(levelRows(t, s)); got != i+1 {
			t.Fatalf("after %s: %d levels, want %d", seed, got, i+1)
		}
	}
	m, err := s.Lookup(ctx, shared.Hash)
	if err != nil {
		t.Fatal(err)
	}
	var levels []int
	for _, x := range m {
		levels = append(levels, x.Level)
		if x.Shard != autoshard.ShardFor(shared.Hash, x.Level) {
			t.Errorf("match in shard %d of level %d", x.Shard, x.Level)
		}
	}
	if !slices.Equal(levels, []int{0, 1, 2}) {
		t.Fatalf("matches in levels %v, want [0 1 2]", levels)
	}
	if m, err := s.Lookup(ctx, []byte("missing")); err != nil || len(m) != 0 {
		t.Errorf("Lookup(missing) = %v, %v", m, err)
	}
}

func TestRetryOfCompletedBatchIsNoop(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, autoshard.Options{Threshold: 50})
	all := makeBlocks("again", 0, 1, 120)
	first := mustWrite(t, s, "a", all)
	again := mustWrite(t, s, "a", all)
	if !again.Repeat || again.Inserted != first.Inserted || !slices.Equal(again.Levels, first.Levels) {
		t.Errorf("retry result %+v, first %+v", again, first)
	}
	if got := levelRows(t, s); !slices.Equal(got, []int64{50, 70}) {
		t.Errorf("level rows %v", got)
	}
	checkExactlyOnce(t, dir, all)
}

// A batch that is interrupted after it spilled into new levels must, when
// retried, go to the same shards as the first attempt, even though the store
// now has more levels than it had when the batch was planned.
func TestRetryAfterPartialSpillAcrossLevels(t *testing.T) {
	for _, stopAfter := range []int{0, 1, 2, 4, 6, 10} {
		t.Run("commits="+strconv.Itoa(stopAfter), func(t *testing.T) {
			dir := t.TempDir()
			opts := autoshard.Options{Threshold: 300, Concurrency: 1}
			// Level capacities are 300, 600, 1200, 2400 rows.
			first := makeBlocks("spill", 0, 5, 100)   // 500 rows: L0 300, L1 200
			second := makeBlocks("spill", 5, 20, 100) // 2000 rows: L1 400, L2 1200, L3 400
			ctx, cancel := context.WithCancel(context.Background())
			commits := 0
			armed := false
			autoshard.SetHook(&opts, func(point string) {
				if armed && (point == "planned" && stopAfter == 0 || point == "shard-committed") {
					if point == "shard-committed" {
						commits++
					}
					if commits == stopAfter {
						cancel()
					}
				}
			})
			s := openStore(t, dir, opts)
			mustWrite(t, s, "first", first)
			armed = true
			if _, err := s.WriteBatch(ctx, "second", second); !errors.Is(err, context.Canceled) {
				t.Fatalf("interrupted batch: err %v, want context.Canceled", err)
			}
			armed = false
			pending, err := s.PendingBatches(context.Background())
			if err != nil || !slices.Equal(pending, []string{"second"}) {
				t.Fatalf("pending %v, %v", pending, err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, dir, opts)
			res := mustWrite(t, s, "second", second)
			if res.Repeat || res.Inserted != 2000 {
				t.Errorf("retry result %+v, want 2000 inserted", res)
			}
			if got := levelRows(t, s); !slices.Equal(got, []int64{300, 600, 1200, 400}) {
				t.Errorf("level rows %v, want [300 600 1200 400]", got)
			}
			checkExactlyOnce(t, dir, append(first, second...))
			if pending, _ := s.PendingBatches(context.Background()); len(pending) != 0 {
				t.Errorf("still pending: %v", pending)
			}
		})
	}
}

func TestOpenChecksLayout(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := autoshard.Options{Threshold: 10}
	s, err := autoshard.Open(ctx, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, "a", makeBlocks("layout", 0, 1, 35)) // levels 0..2: 10, 20, 5
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A missing file in the top level (crash while creating it) is recreated.
	if err := os.Remove(filepath.Join(dir, "level-02", "shard-0003.db")); err != nil {
		t.Fatal(err)
	}
	s, err = autoshard.Open(ctx, dir, opts)
	if err != nil {
		t.Fatalf("reopen with a partial top level: %v", err)
	}
	s.Close()
	// A missing file below the top level is data loss and refused.
	for _, suffix := range []string{"", "-wal", "-shm"} {
		os.Remove(filepath.Join(dir, "level-01", "shard-0001.db"+suffix))
	}
	if _, err := autoshard.Open(ctx, dir, opts); !errors.Is(err, autoshard.ErrCorruptLayout) {
		t.Fatalf("reopen with a missing shard below the top: %v, want ErrCorruptLayout", err)
	}
}

// The shard a hash maps to is part of the on-disk format.
func TestShardForGolden(t *testing.T) {
	tests := []struct {
		hash  []byte
		level int
		want  int
	}{
		{[]byte{0xff, 0xff}, 0, 0},
		{[]byte{0x80}, 1, 1},
		{[]byte{0x7f, 0xff}, 1, 0},
		{[]byte{0xc0}, 2, 3},
		{[]byte{0x12, 0x34, 0x56}, 8, 0x12},
		{[]byte{0x12, 0x34, 0x56}, 12, 0x123},
		{[]byte{0xab, 0xcd, 0xef, 0x01}, 16, 0xabcd},
		{[]byte{}, 5, 0},
		{[]byte{0xff}, 10, 0x3fc},
	}
	for _, tt := range tests {
		if got := autoshard.ShardFor(tt.hash, tt.level); got != tt.want {
			t.Errorf("ShardFor(%x, %d) = %d, want %d", tt.hash, tt.level, got, tt.want)
		}
	}
}
