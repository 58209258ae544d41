package rundir_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/rundir"
)

func TestNew(t *testing.T) {
	results := t.TempDir()
	runs := filepath.Join(results, "runs")
	now := time.Date(2026, 11, 22, 2, 30, 16, 0, time.FixedZone("CET", 3600))
	want := []string{"counters-20261122T013016Z", "counters-20261122T013016Z-2", "counters-20261122T013016Z-3"}
	for _, name := range want {
		dir, err := rundir.New(runs, "counters-", now)
		if err != nil {
			t.Fatal(err)
		}
		if dir != filepath.Join(runs, name) {
			t.Errorf("dir %s, want %s", dir, filepath.Join(runs, name))
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			t.Errorf("%s: %v", dir, err)
		}
		target, err := os.Readlink(filepath.Join(results, "latest"))
		if err != nil || target != filepath.Join("runs", name) {
			t.Errorf("latest -> %q (%v), want runs/%s", target, err, name)
		}
	}
}

func TestNewLeavesARealLatestAlone(t *testing.T) {
	results := t.TempDir()
	latest := filepath.Join(results, "latest")
	if err := os.Mkdir(latest, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := rundir.New(filepath.Join(results, "runs"), "x-", time.Now()); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(latest); err != nil || !fi.IsDir() {
		t.Errorf("latest: %v, %v; want the directory left as it was", fi, err)
	}
}
