package autoshard_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/shardlab/shardlab/autoshard"
)

// envFileLimit selects fileLimitChild in TestMain: "soft:hard:maxLevel:fill".
const envFileLimit = "AUTOSHARD_FILELIMIT_CHILD"

// fileLimitChild runs under a lowered RLIMIT_NOFILE: it opens a store and,
// if asked, fills every level up to MaxLevel and looks blocks up from
// several goroutines. It prints REFUSED with Open's error, or OK with the
// soft limit it ended with.
func fileLimitChild(spec string) error {
	var lim syscall.Rlimit
	var maxLevel int
	var fill bool
	if _, err := fmt.Sscanf(spec, "%d:%d:%d:%t", &lim.Cur, &lim.Max, &maxLevel, &fill); err != nil {
		return err
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "autoshard-filelimit-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	const threshold = 10
	s, err := autoshard.Open(ctx, dir, autoshard.Options{Threshold: threshold, MaxLevel: maxLevel, Concurrency: 8})
	if err != nil {
		fmt.Println("REFUSED:", err)
		return nil
	}
	defer s.Close()
	if fill {
		// Levels 0..maxLevel hold threshold x (2^(maxLevel+1)-1) rows.
		blocks := makeBlocks("filelimit", 0, 2<<maxLevel, threshold)
		if _, err := s.WriteBatch(ctx, "fill", blocks); err != nil {
			return err
		}
		if st, err := s.Stats(); err != nil || st.TopLevel != maxLevel {
			return fmt.Errorf("stats %+v, %v; want top level %d", st, err, maxLevel)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for w := range 16 {
			wg.Go(func() {
				for i := w; i < len(blocks); i += 16 {
					if _, err := s.Lookup(ctx, blocks[i].Hash); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
	}
	if err := s.Close(); err != nil {
		return err
	}
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	fmt.Printf("OK soft=%d\n", lim.Cur)
	return nil
}

func TestOpenChecksFileLimit(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skip(err)
	}
	need10 := autoshard.FileLimitNeeded(10)
	if lim.Max < need10 {
		t.Skipf("hard open-file limit %d is below %d", lim.Max, need10)
	}
	need3 := autoshard.FileLimitNeeded(3)
	tests := []struct {
		name       string
		soft, hard uint64
		maxLevel   int
		fill       bool
		want       string
	}{
		{"hard limit too low", 256, 256, 10, false, fmt.Sprintf("REFUSED: autoshard: invalid options: max level 10 needs up to %d open files", need10)},
		// The estimate is enough for a full store under concurrent lookups.
		{"exactly enough", need3, need3, 3, true, fmt.Sprintf("OK soft=%d", need3)},
		{"soft limit raised", 256, need10, 10, false, fmt.Sprintf("OK soft=%d", need10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%d:%d:%t", envFileLimit, tt.soft, tt.hard, tt.maxLevel, tt.fill))
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.HasPrefix(string(out), tt.want) {
				t.Errorf("child: %v; output %q, want it to start with %q", err, out, tt.want)
			}
		})
	}
}

// TestDefaultMaxLevelFitsALowLimit: with default options a store must open under a low
// open-file limit, its top level lowered to what fits, instead of being refused.
func TestDefaultMaxLevelFitsALowLimit(t *testing.T) {
	if os.Getenv("AUTOSHARD_FIT_CHILD") == "1" {
		lim := syscall.Rlimit{Cur: 1024, Max: 1024}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Skipf("cannot lower the open-file limit: %v", err)
		}
		s, err := autoshard.Open(context.Background(), t.TempDir(), autoshard.Options{Threshold: 10})
		if err != nil {
			t.Fatalf("default options refused under a 1024-file limit: %v", err)
		}
		s.Close()
		if _, err := autoshard.Open(context.Background(), t.TempDir(), autoshard.Options{Threshold: 10, MaxLevel: 10}); !errors.Is(err, autoshard.ErrInvalidOptions) {
			t.Fatalf("explicit MaxLevel 10 under a 1024-file limit: %v, want ErrInvalidOptions", err)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDefaultMaxLevelFitsALowLimit$", "-test.count=1")
	cmd.Env = append(os.Environ(), "AUTOSHARD_FIT_CHILD=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
