package autoshard_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardlab/shardlab/autoshard"
)

// The crash tests re-execute this test binary as a writer process (selected by
// these environment variables) and SIGKILL it in the middle of a batch.
const (
	envWriterDir  = "AUTOSHARD_CRASH_WRITER_DIR"
	envWriterStop = "AUTOSHARD_CRASH_WRITER_STOP" // "point:n" or "none"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(envFileLimit); spec != "" {
		if err := fileLimitChild(spec); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if dir := os.Getenv(envWriterDir); dir != "" {
		if err := crashWriter(dir, os.Getenv(envWriterStop)); err != nil {
			fmt.Fprintln(os.Stderr, "writer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// crashOptions and the batches are shared by the writer and the checker.
func crashOptions() autoshard.Options {
	return autoshard.Options{Threshold: 200, MaxLevel: 4, Concurrency: 1}
}

// Level capacities are 200, 400, 800, 1600 rows; level 4 is unbounded.
func crashBatches() [][]autoshard.Block {
	return [][]autoshard.Block{
		makeBlocks("crash", 0, 3, 50),   // 150 rows: level 0
		makeBlocks("crash", 3, 50, 50),  // 2500 rows: L0 50, L1 400, L2 800, L3 1250 (15 shard commits)
		makeBlocks("crash", 53, 20, 50), // 1000 rows: L3 350, L4 650
	}
}

// crashWriter writes the crash batches. When the stop point is reached for
// the n-th time it prints KILLME and blocks until it is killed.
func crashWriter(dir, stop string) error {
	opts := crashOptions()
	point, nStr, _ := strings.Cut(stop, ":")
	n, _ := strconv.Atoi(nStr)
	seen := 0
	autoshard.SetHook(&opts, func(p string) {
		if p == point {
			seen++
			if seen == n {
				fmt.Println("KILLME")
				// Sleep rather than block on select{}: the runtime would
				// call a process whose goroutines all block a deadlock.
				time.Sleep(time.Hour)
			}
		}
		if p == "planned" && point == "random" {
			fmt.Println("PLANNED")
		}
	})
	s, err := autoshard.Open(context.Background(), dir, opts)
	if err != nil {
		return err
	}
	defer s.Close()
	for i, b := range crashBatches() {
		if _, err := s.WriteBatch(context.Background(), fmt.Sprintf("batch-%d", i), b); err != nil {
			return err
		}
	}
	fmt.Println("DONE")
	return nil
}

// runWriterUntil starts a writer and kills it with SIGKILL once it prints
// trigger (or, for "PLANNED", after a random short delay). It reports whether
// the writer finished on its own.
func runWriterUntil(t *testing.T, dir, stop, trigger string, delay time.Duration) (finished bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envWriterDir+"="+dir, envWriterStop+"="+stop)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(90*time.Second, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		switch sc.Text() {
		case trigger:
			time.Sleep(delay)
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			return false
		case "DONE":
			if err := cmd.Wait(); err != nil {
				t.Fatalf("writer: %v", err)
			}
			return true
		}
	}
	err = cmd.Wait()
	t.Fatalf("writer stopped without reaching %q: %v", trigger, err)
	return false
}

// retryAndCheck reopens the store as a restarted application would, retries
// every batch, and checks that every block is stored exactly once and the
// level counters match the threshold rule.
func retryAndCheck(t *testing.T, dir string) {
	t.Helper()
	s := openStore(t, dir, crashOptions())
	batches := crashBatches()
	var all []autoshard.Block
	for i, b := range batches {
		mustWrite(t, s, fmt.Sprintf("batch-%d", i), b)
		all = append(all, b...)
	}
	if p, err := s.PendingBatches(context.Background()); err != nil || len(p) != 0 {
		t.Errorf("pending after retry: %v, %v", p, err)
	}
	want := []int64{200, 400, 800, 1600, 650}
	if got := levelRows(t, s); !slices.Equal(got, want) {
		t.Errorf("level rows %v, want %v", got, want)
	}
	for _, b := range all[:300] {
		if m, err := s.Lookup(context.Background(), b.Hash); err != nil || len(m) != 1 {
			t.Fatalf("Lookup(%x) = %d matches, %v; want 1", b.Hash[:4], len(m), err)
		}
	}
	checkExactlyOnce(t, dir, all)
}

func TestCrashMidBatchThenRetry(t *testing.T) {
	// Batch 0 makes one shard commit and batch 1 fifteen (levels 0-3):
	// stop before any of batch 1, after some, after all of them but before
	// the journal says done, and inside batch 2 as it spills into level 4.
	tests := []struct{ stop string }{
		{"planned:2"},          // batch 1 journaled, nothing committed
		{"shard-committed:2"},  // batch 1: level 0 part and one level 1 shard
		{"shard-committed:5"},  // batch 1: into level 2
		{"shard-committed:10"}, // batch 1: into level 3
		{"before-done:2"},      // batch 1: all shards committed, journal pending
		{"shard-committed:20"}, // batch 2, spilling into level 4
	}
	for _, tt := range tests {
		t.Run(strings.ReplaceAll(tt.stop, ":", "="), func(t *testing.T) {
			dir := t.TempDir()
			if runWriterUntil(t, dir, tt.stop, "KILLME", 0) {
				t.Fatal("writer finished, it should have been killed")
			}
			retryAndCheck(t, dir)
		})
	}
}

func TestCrashAtRandomMomentThenRetry(t *testing.T) {
	// Kills that may land inside a shard transaction, not only between
	// commits. Whatever the moment, retrying must give one copy of each block.
	for i := 0; i < 3; i++ {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			dir := t.TempDir()
			delay := time.Duration(rand.IntN(40)) * time.Millisecond
			finished := runWriterUntil(t, dir, "random", "PLANNED", delay)
			t.Logf("killed after %v (writer finished first: %v)", delay, finished)
			retryAndCheck(t, dir)
		})
	}
}
