package autoshard

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
)

// Errors returned by the store. Callers compare with errors.Is.
var (
	// ErrInvalidOptions is wrapped by Open when an option is out of range.
	ErrInvalidOptions = errors.New("autoshard: invalid options")
	// ErrInvalidBlock is wrapped by WriteBatch when a block has an empty
	// hash or a negative index, offset or size.
	ErrInvalidBlock = errors.New("autoshard: invalid block")
	// ErrInvalidBatchID is returned by WriteBatch for an empty batch id.
	ErrInvalidBatchID = errors.New("autoshard: empty batch id")
	// ErrBatchMismatch is returned when a batch id is reused with blocks
	// that differ from the ones first written under that id.
	ErrBatchMismatch = errors.New("autoshard: batch id reused with different blocks")
	// ErrClosed is returned by every call on a closed store.
	ErrClosed = errors.New("autoshard: store is closed")
	// ErrCorruptLayout is wrapped by Open when the data directory has a
	// level with missing shard files below the top level, or a shard file
	// that claims to belong elsewhere.
	ErrCorruptLayout = errors.New("autoshard: corrupt data directory layout")
)

// Limits on Options.MaxLevel. Every shard database of every level stays
// open, and each holds about 5 file descriptors (up to 7 while lookups run
// concurrently): a store up to level L has 2^(L+1)-1 shard databases plus the
// manifest. Open checks the process's open-file limit (RLIMIT_NOFILE) against
// that worst case, raising the soft limit to the hard limit if that is
// enough, and refuses with ErrInvalidOptions otherwise.
const (
	// DefaultMaxLevel is used when Options.MaxLevel is 0: 1024 shards in
	// the top level, 2047 databases in all, about 10,000 open files (up to
	// about 14,400).
	DefaultMaxLevel = 10
	// MaxMaxLevel is the largest accepted Options.MaxLevel: 4096 shards in
	// the top level, 8191 databases in all, about 41,000 open files (up to
	// about 57,000). Beyond it a store runs out of file descriptors long
	// before it runs out of disk.
	MaxMaxLevel = 12
)

// SyncMode is SQLite's synchronous setting for every shard and the manifest.
type SyncMode int

// Sync modes. The zero value is SyncNormal.
const (
	// SyncNormal (PRAGMA synchronous=NORMAL) survives a process crash
	// without loss; an OS crash may lose the last commits (WAL mode).
	SyncNormal SyncMode = iota
	// SyncFull (PRAGMA synchronous=FULL) also survives an OS crash.
	SyncFull
	// SyncOff (PRAGMA synchronous=OFF) is for throwaway benchmarks only.
	SyncOff
)

// String returns the name used by ParseSyncMode.
func (m SyncMode) String() string {
	switch m {
	case SyncNormal:
		return "normal"
	case SyncFull:
		return "full"
	case SyncOff:
		return "off"
	}
	return fmt.Sprintf("SyncMode(%d)", int(m))
}

// ParseSyncMode parses "normal", "full" or "off".
func ParseSyncMode(s string) (SyncMode, error) {
	switch strings.ToLower(s) {
	case "normal":
		return SyncNormal, nil
	case "full":
		return SyncFull, nil
	case "off":
		return SyncOff, nil
	}
	return 0, fmt.Errorf("%w: sync mode %q (want normal, full or off)", ErrInvalidOptions, s)
}

// Options configure a Store. The zero value is valid: never split, SyncNormal,
// one concurrent commit per CPU.
type Options struct {
	// Threshold is the number of rows per shard database after which a
	// level is full (level L holds Threshold x 2^L rows) and writes move to
	// the next level. 0 never splits. The best value depends on the
	// hardware; measure it with cmd/blockbench.
	Threshold int64
	// MaxLevel is the highest level the store creates (2^MaxLevel shards);
	// once there, the top level grows without bound. 0 means
	// DefaultMaxLevel, lowered if the open-file limit cannot fit it. It must be between 0 and MaxMaxLevel, and the
	// open-file limit must allow for 2^(MaxLevel+1) databases of about 5
	// file descriptors each (see MaxMaxLevel).
	MaxLevel int
	// Sync is SQLite's synchronous mode.
	Sync SyncMode
	// Concurrency bounds the shard commits of one batch that run at once.
	// 0 means runtime.NumCPU().
	Concurrency int

	// hook, set only by tests through export_test.go, is called at named
	// points of WriteBatch so a test can kill the process there.
	hook func(point string)
}

func (o Options) withDefaults() (Options, error) {
	if o.Threshold < 0 {
		return o, fmt.Errorf("%w: threshold %d is negative (use 0 to never split)", ErrInvalidOptions, o.Threshold)
	}
	if o.MaxLevel < 0 || o.MaxLevel > MaxMaxLevel {
		return o, fmt.Errorf("%w: max level %d is outside 0..%d", ErrInvalidOptions, o.MaxLevel, MaxMaxLevel)
	}
	if o.MaxLevel == 0 {
		o.MaxLevel = DefaultMaxLevel
	}
	if o.Threshold == 0 {
		o.MaxLevel = 0
	}
	switch o.Sync {
	case SyncNormal, SyncFull, SyncOff:
	default:
		return o, fmt.Errorf("%w: unknown sync mode %d", ErrInvalidOptions, int(o.Sync))
	}
	if o.Concurrency < 0 {
		return o, fmt.Errorf("%w: concurrency %d is negative (use 0 for one per CPU)", ErrInvalidOptions, o.Concurrency)
	}
	if o.Concurrency == 0 {
		o.Concurrency = runtime.NumCPU()
	}
	return o, nil
}
