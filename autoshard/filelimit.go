package autoshard

import (
	"fmt"
	"syscall"
)

// File descriptors a store may hold open.
const (
	// filesPerDatabase is the most one shard database (or the manifest)
	// holds open: the writer's connection keeps the database, its WAL and
	// the shared-memory file (3), and each of the two reader connections
	// the database and the WAL (2 each). At rest, with one idle reader,
	// that is 5.
	filesPerDatabase = 7
	// filesReserved is left for the rest of the process: standard streams,
	// the runtime, a listening socket, a CSV being written.
	filesReserved = 64
)

// fileLimitNeeded is the open-file limit a store with this MaxLevel needs in
// the worst case: 2^(maxLevel+1)-1 shard databases plus the manifest.
func fileLimitNeeded(maxLevel int) uint64 {
	databases := uint64(1)<<(maxLevel+1) - 1 + 1
	return databases*filesPerDatabase + filesReserved
}

// ensureFileLimit checks that RLIMIT_NOFILE leaves room for every database
// up to maxLevel. If only the soft limit is too low it raises it to the hard
// limit; if the hard limit is too low too, it refuses with ErrInvalidOptions
// rather than let the store fail with "too many open files" once it has
// grown. A limit it cannot read is not checked.
func ensureFileLimit(maxLevel int) error {
	need := fileLimitNeeded(maxLevel)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur >= need {
		return nil
	}
	if lim.Max >= need {
		raised := lim
		raised.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: max level %d needs up to %d open files (%d databases), but the open-file limit is %d (hard limit %d); lower MaxLevel or raise the limit (ulimit -n %d)",
		ErrInvalidOptions, maxLevel, need, uint64(1)<<(maxLevel+1), lim.Cur, lim.Max, need)
}

// fitFileLimit returns the highest level up to maxLevel whose worst case fits the
// open-file limit, after raising the soft limit to the hard one if that helps. It is
// used for the default MaxLevel, so that a store opened with default options works on
// any machine instead of being refused where the limit is low; an explicit MaxLevel is
// checked by ensureFileLimit instead. A limit it cannot read leaves maxLevel as it is.
func fitFileLimit(maxLevel int) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return maxLevel
	}
	if lim.Cur < fileLimitNeeded(maxLevel) && lim.Max > lim.Cur {
		raised := lim
		raised.Cur = min(lim.Max, fileLimitNeeded(maxLevel))
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			lim = raised
		}
	}
	for maxLevel > 1 && fileLimitNeeded(maxLevel) > lim.Cur {
		maxLevel--
	}
	return maxLevel
}
