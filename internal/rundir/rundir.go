// Package rundir gives one run of an experiment command (counterbench, blockbench) a
// directory of its own, results/runs/<prefix><UTC time>/, and points results/latest at
// it, as the lab's scripts do (scripts/lib.sh). git ignores both, so a run never changes
// a committed file; scripts/promote.sh publishes a run on purpose.
package rundir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// DefaultRuns is where run directories go, relative to the working directory: the
// repository root when the commands are run as the README shows.
const DefaultRuns = "results/runs"

// LatestName is the symbolic link, beside the runs directory, to the newest run.
const LatestName = "latest"

// ID is the run id of a run started at t: prefix and the UTC time, e.g.
// counters-20261122T023016Z, the form scripts/lib.sh uses.
func ID(prefix string, t time.Time) string {
	return prefix + t.UTC().Format("20060102T150405Z")
}

// New creates the directory runs/ID(prefix, now), or that name with -2, -3 ... appended
// when it is taken (two runs started in the same second), and points LatestName beside
// runs at it. It returns the directory's path. A LatestName that exists and is not a
// symbolic link is left alone.
func New(runs, prefix string, now time.Time) (string, error) {
	if err := os.MkdirAll(runs, 0o755); err != nil {
		return "", fmt.Errorf("run directory: %w", err)
	}
	base := ID(prefix, now)
	name := base
	for n := 2; ; n++ {
		// Mkdir fails on an existing directory: the claim is atomic.
		err := os.Mkdir(filepath.Join(runs, name), 0o755)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("run directory: %w", err)
		}
		name = fmt.Sprintf("%s-%d", base, n)
	}
	dir := filepath.Join(runs, name)
	if err := pointLatest(runs, name); err != nil {
		return dir, err
	}
	return dir, nil
}

// pointLatest makes runs/../latest a relative link to runs/name, replacing an older link
// by renaming a new one over it, so that readers never find it missing.
func pointLatest(runs, name string) error {
	latest := filepath.Join(filepath.Dir(filepath.Clean(runs)), LatestName)
	if fi, err := os.Lstat(latest); err == nil && fi.Mode()&fs.ModeSymlink == 0 {
		return nil
	}
	target := filepath.Join(filepath.Base(filepath.Clean(runs)), name)
	tmp := fmt.Sprintf("%s.%d.tmp", latest, os.Getpid())
	os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("point %s at the run: %w", latest, err)
	}
	if err := os.Rename(tmp, latest); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("point %s at the run: %w", latest, err)
	}
	return nil
}
