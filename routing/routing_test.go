package routing_test

import (
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"testing"

	"github.com/shardlab/shardlab/routing"
)

// goldenVectors pins the shard of known keys. A failure here means data written by an
// earlier build would now be looked for on the wrong shard: never "fix" it by editing
// the table without a migration plan. The values were computed independently of this
// package (Python's zlib.crc32 and a transcription of the jump hash paper).
var goldenVectors = []struct {
	strategy string
	shards   int
	key      string
	want     int
}{
	{"crc32", 3, "user1", 1},
	{"crc32", 3, "user2", 2},
	{"crc32", 3, "alice", 2},
	{"crc32", 3, "", 0},
	{"crc32", 4, "user1", 1},
	{"crc32", 5, "user42", 3},
	{"crc32", 5, "bob", 4},
	{"crc32", 1, "anything", 0},
	{"jump", 3, "user1", 0},
	{"jump", 3, "user2", 2},
	{"jump", 3, "alice", 0},
	{"jump", 4, "user1", 3},
	{"jump", 5, "user42", 4},
	{"jump", 5, "bob", 2},
	{"jump", 1, "anything", 0},
}

func TestGoldenVectors(t *testing.T) {
	for _, v := range goldenVectors {
		r, err := routing.New(v.strategy, v.shards)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.ShardFor(v.key); got != v.want {
			t.Errorf("%s/%d ShardFor(%q) = %d, want %d", v.strategy, v.shards, v.key, got, v.want)
		}
	}
}

// TestCRC32MatchesSeed checks the default router is exactly the seed lab's formula.
func TestCRC32MatchesSeed(t *testing.T) {
	for n := 1; n <= 8; n++ {
		r, err := routing.NewCRC32(n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 1000 {
			key := fmt.Sprintf("user%d", i)
			if got, want := r.ShardFor(key), int(crc32.ChecksumIEEE([]byte(key))%uint32(n)); got != want {
				t.Fatalf("n=%d key %q: got %d want %d", n, key, got, want)
			}
		}
	}
}

// TestJumpMatchesReference compares JumpHash with a direct transcription of the published
// pseudo-code, driven by the standard library's FNV-1a.
func TestJumpMatchesReference(t *testing.T) {
	reference := func(key uint64, n int) int {
		b, j := int64(-1), int64(0)
		for j < int64(n) {
			b = j
			key = key*2862933555777941757 + 1
			j = int64(float64(b+1) * (float64(1<<31) / float64((key>>33)+1)))
		}
		return int(b)
	}
	for n := 1; n <= 16; n++ {
		r, err := routing.NewJump(n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 500 {
			key := fmt.Sprintf("k-%d", i)
			h := fnv.New64a()
			h.Write([]byte(key))
			if got, want := r.ShardFor(key), reference(h.Sum64(), n); got != want {
				t.Fatalf("n=%d key %q: got %d want %d", n, key, got, want)
			}
		}
	}
}

func TestShardsInRangeAndBalanced(t *testing.T) {
	const keys = 60000
	for _, strategy := range routing.Strategies() {
		for _, n := range []int{1, 2, 3, 5, 8} {
			r, err := routing.New(strategy, n)
			if err != nil {
				t.Fatal(err)
			}
			counts := make([]int, n)
			for i := range keys {
				s := r.ShardFor(fmt.Sprintf("user%d", i))
				if s < 0 || s >= n {
					t.Fatalf("%s/%d: shard %d out of range", strategy, n, s)
				}
				counts[s]++
			}
			want := keys / n
			for s, c := range counts {
				if c < want*9/10 || c > want*11/10 {
					t.Errorf("%s/%d: shard %d has %d keys, want %d +-10%%", strategy, n, s, c, want)
				}
			}
		}
	}
}

// movedFraction returns the share of keys whose shard differs between from and to shards.
func movedFraction(t *testing.T, strategy string, from, to, keys int) float64 {
	t.Helper()
	a, err := routing.New(strategy, from)
	if err != nil {
		t.Fatal(err)
	}
	b, err := routing.New(strategy, to)
	if err != nil {
		t.Fatal(err)
	}
	moved := 0
	for i := range keys {
		key := fmt.Sprintf("user%d", i)
		if a.ShardFor(key) != b.ShardFor(key) {
			moved++
		}
	}
	return float64(moved) / float64(keys)
}

// TestKeysMovedWhenGrowing shows the cost of resharding from 3 to 4 shards: modulo
// hashing moves about 3/4 of the keys, jump hashing about 1/4 (only those the new shard takes).
func TestKeysMovedWhenGrowing(t *testing.T) {
	const keys = 100000
	crc := movedFraction(t, routing.StrategyCRC32, 3, 4, keys)
	jump := movedFraction(t, routing.StrategyJump, 3, 4, keys)
	t.Logf("keys moved 3->4 shards: crc32 %.1f%%, jump %.1f%%", crc*100, jump*100)
	if crc < 0.70 || crc > 0.80 {
		t.Errorf("crc32 moved %.3f of keys, want about 0.75", crc)
	}
	if jump < 0.23 || jump > 0.27 {
		t.Errorf("jump moved %.3f of keys, want about 0.25", jump)
	}
	// Jump hashing only ever moves keys onto the new shard.
	a, _ := routing.NewJump(3)
	b, _ := routing.NewJump(4)
	for i := range keys {
		key := fmt.Sprintf("user%d", i)
		if from, to := a.ShardFor(key), b.ShardFor(key); from != to && to != 3 {
			t.Fatalf("jump moved %q from %d to %d, not to the new shard", key, from, to)
		}
	}
}

func TestBadInput(t *testing.T) {
	for _, n := range []int{0, -1, routing.MaxShards + 1} {
		if _, err := routing.New("crc32", n); !errors.Is(err, routing.ErrBadShardCount) {
			t.Errorf("New(crc32, %d) error = %v, want ErrBadShardCount", n, err)
		}
		if _, err := routing.New("jump", n); !errors.Is(err, routing.ErrBadShardCount) {
			t.Errorf("New(jump, %d) error = %v, want ErrBadShardCount", n, err)
		}
	}
	if _, err := routing.New("md5", 3); !errors.Is(err, routing.ErrUnknownStrategy) {
		t.Errorf("New(md5) error = %v, want ErrUnknownStrategy", err)
	}
}

func BenchmarkShardFor(b *testing.B) {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("user%d", i)
	}
	for _, strategy := range routing.Strategies() {
		r, err := routing.New(strategy, 5)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(strategy, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				_ = r.ShardFor(keys[i&1023])
				i++
			}
		})
	}
}
