package autoshard

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/shardlab/shardlab/internal/fanout"
	"github.com/shardlab/shardlab/internal/sqlitedb"
	"github.com/shardlab/shardlab/routing"
)

// Block is one row of the block table: the block with hash Hash is block Idx
// of the file whose block list hashes to BlocklistHash, at Offset with Size
// bytes. (Hash, BlocklistHash, Idx) is the primary key.
type Block struct {
	Hash          []byte
	BlocklistHash []byte
	Idx           int
	Offset        int64
	Size          int
}

// Match is a block found by Lookup, with the level and shard that hold it.
type Match struct {
	Block
	Level int
	Shard int
}

// BatchResult says what one WriteBatch call did.
type BatchResult struct {
	// Blocks is the number of distinct keys in the batch.
	Blocks int
	// Inserted is the number of rows the batch added; keys that were
	// already stored in their target shard add nothing.
	Inserted int64
	// Levels lists the levels the batch wrote to, in order.
	Levels []int
	// Repeat is true when the batch id had already completed, so the call
	// wrote nothing.
	Repeat bool
}

// Stats is a snapshot of the store's shape.
type Stats struct {
	// TopLevel is the level that takes new writes.
	TopLevel int
	// Shards is the number of shard databases over all levels.
	Shards int
	// Rows is the number of stored rows over all levels.
	Rows int64
	// LevelRows[l] is the number of rows stored in level l.
	LevelRows []int64
}

// Store is an auto-splitting block store. Lookup and Stats may run
// concurrently with each other and with WriteBatch; WriteBatch calls are
// serialised.
type Store struct {
	dir  string
	opts Options

	manifest             *sqlitedb.DB
	manifestW, manifestR *sql.DB // manifest's writer and read pool

	// writeMu serialises WriteBatch and Close; shard row counters change
	// only under it.
	writeMu sync.Mutex

	mu struct {
		sync.RWMutex
		levels   [][]*shard // levels[l] has 2^l shards
		closed   bool
		closeErr error
	}
}

var (
	levelDirRe  = regexp.MustCompile(`^level-(\d{2})$`)
	shardFileRe = regexp.MustCompile(`^shard-(\d{4,})\.db$`)
)

func levelDir(dir string, level int) string {
	return filepath.Join(dir, fmt.Sprintf("level-%02d", level))
}

func shardPath(dir string, level, index int) string {
	return filepath.Join(levelDir(dir, level), fmt.Sprintf("shard-%04d.db", index))
}

// Open opens or creates the store in dir. It validates opts, checks that the
// open-file limit fits opts.MaxLevel (see MaxMaxLevel; a default MaxLevel is
// lowered to what the limit fits, an explicit one is refused), then discovers
// the levels from the level-LL folders in dir, so that a reopened store keeps
// writing to the level where it stopped. Shard files missing from the top
// level (a crash while the level was being created) are created; missing
// files below the top level are ErrCorruptLayout. Cancelling ctx stops Open
// while it opens databases.
func Open(ctx context.Context, dir string, opts Options) (*Store, error) {
	defaultLevel := opts.MaxLevel == 0
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if defaultLevel && opts.MaxLevel > 0 {
		opts.MaxLevel = fitFileLimit(opts.MaxLevel)
	}
	if err := ensureFileLimit(opts.MaxLevel); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	s := &Store{dir: dir, opts: opts}
	s.manifest, err = openSQLite(ctx, filepath.Join(dir, "manifest.db"), opts.Sync, manifestSchema)
	if err != nil {
		return nil, fmt.Errorf("open manifest: %w", err)
	}
	s.manifestW, s.manifestR = s.manifest.Writer(), s.manifest.Reader()
	top, err := discoverTopLevel(dir)
	if err != nil {
		return nil, errors.Join(err, s.Close())
	}
	for l := 0; l <= top; l++ {
		if err := s.openLevel(ctx, l, l == top); err != nil {
			return nil, errors.Join(err, s.Close())
		}
	}
	return s, nil
}

// discoverTopLevel returns the highest level folder in dir (0 for a new
// store) and checks that the levels below it have all their shard files.
func discoverTopLevel(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("read data dir: %w", err)
	}
	var levels []int
	for _, e := range entries {
		m := levelDirRe.FindStringSubmatch(e.Name())
		if m == nil || !e.IsDir() {
			continue
		}
		l, _ := strconv.Atoi(m[1])
		levels = append(levels, l)
	}
	slices.Sort(levels)
	for i, l := range levels {
		if l != i {
			return 0, fmt.Errorf("%w: level %d is missing", ErrCorruptLayout, i)
		}
		if l > MaxMaxLevel {
			return 0, fmt.Errorf("%w: level %d is above %d", ErrCorruptLayout, l, MaxMaxLevel)
		}
	}
	top := 0
	if len(levels) > 0 {
		top = levels[len(levels)-1]
	}
	for l := 0; l < top; l++ {
		entries, err := os.ReadDir(levelDir(dir, l))
		if err != nil {
			return 0, fmt.Errorf("read level %d: %w", l, err)
		}
		seen := make(map[int]bool)
		for _, e := range entries {
			m := shardFileRe.FindStringSubmatch(e.Name())
			if m == nil {
				continue
			}
			i, _ := strconv.Atoi(m[1])
			if i >= 1<<l {
				return 0, fmt.Errorf("%w: level %d has shard %d, want fewer than %d", ErrCorruptLayout, l, i, 1<<l)
			}
			seen[i] = true
		}
		if len(seen) != 1<<l {
			return 0, fmt.Errorf("%w: level %d has %d of its %d shard files", ErrCorruptLayout, l, len(seen), 1<<l)
		}
	}
	return top, nil
}

// openLevel opens (and, if create, creates) the 2^level shards of a level,
// Concurrency at a time, and appends them to s.mu.levels. Callers open levels
// in order.
func (s *Store) openLevel(ctx context.Context, level int, create bool) error {
	if err := os.MkdirAll(levelDir(s.dir, level), 0o755); err != nil {
		return fmt.Errorf("create level %d: %w", level, err)
	}
	shards := make([]*shard, 1<<level)
	err := fanout.Do(ctx, routing.DestinationAll{}, len(shards), func(ctx context.Context, i int) error {
		p := shardPath(s.dir, level, i)
		if !create {
			if _, err := os.Stat(p); err != nil {
				return fmt.Errorf("%w: %w", ErrCorruptLayout, err)
			}
		}
		sh, err := openShard(ctx, p, level, i, s.opts.Sync)
		if err != nil {
			return err
		}
		shards[i] = sh
		return nil
	}, fanout.WithLimit(s.opts.Concurrency), fanout.FailFast())
	if err != nil {
		var opened []*shard
		for _, sh := range shards {
			if sh != nil {
				opened = append(opened, sh)
			}
		}
		return errors.Join(fmt.Errorf("open level %d: %w", level, err), closeShards(opened))
	}
	s.mu.Lock()
	s.mu.levels = append(s.mu.levels, shards)
	s.mu.Unlock()
	return nil
}

func closeShards(shards []*shard) error {
	var errs []error
	for _, sh := range shards {
		errs = append(errs, sh.close())
	}
	return errors.Join(errs...)
}

func (s *Store) levels() ([][]*shard, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.closed {
		return nil, ErrClosed
	}
	return s.mu.levels, nil
}

func levelRows(shards []*shard) int64 {
	var n int64
	for _, sh := range shards {
		n += atomic.LoadInt64(&sh.rows)
	}
	return n
}

// Dir returns the data directory.
func (s *Store) Dir() string { return s.dir }

// Options returns the options in force, with defaults filled in.
func (s *Store) Options() Options {
	o := s.opts
	o.hook = nil
	return o
}

// Stats returns the current shape of the store. It does no I/O.
func (s *Store) Stats() (Stats, error) {
	levels, err := s.levels()
	if err != nil {
		return Stats{}, err
	}
	st := Stats{TopLevel: len(levels) - 1, LevelRows: make([]int64, len(levels))}
	for l, shards := range levels {
		st.Shards += len(shards)
		st.LevelRows[l] = levelRows(shards)
		st.Rows += st.LevelRows[l]
	}
	return st, nil
}

// dedupKey identifies a block's primary key unambiguously.
func dedupKey(b *Block) string {
	buf := make([]byte, 0, binary.MaxVarintLen64+len(b.Hash)+len(b.BlocklistHash)+8)
	buf = binary.AppendUvarint(buf, uint64(len(b.Hash)))
	buf = append(buf, b.Hash...)
	buf = append(buf, b.BlocklistHash...)
	buf = binary.BigEndian.AppendUint64(buf, uint64(b.Idx))
	return string(buf)
}

func validateBatch(id string, blocks []Block) error {
	if id == "" {
		return ErrInvalidBatchID
	}
	for i := range blocks {
		b := &blocks[i]
		switch {
		case len(b.Hash) == 0:
			return fmt.Errorf("%w: block %d has an empty hash", ErrInvalidBlock, i)
		case b.Idx < 0 || b.Offset < 0 || b.Size < 0:
			return fmt.Errorf("%w: block %d has a negative index, offset or size", ErrInvalidBlock, i)
		}
	}
	return nil
}

// levelCapacity is the number of rows that fill a level: Threshold rows per
// shard database, 2^level databases.
func levelCapacity(threshold int64, level int) int64 {
	if threshold > math.MaxInt64>>level {
		return math.MaxInt64
	}
	return threshold << level
}

// plan splits n new rows over the levels starting at the top one: the top
// level takes what fits below its capacity, each following level takes up to
// its capacity, and a level at MaxLevel takes the rest.
func (s *Store) plan(levels [][]*shard, n int) []segment {
	level := len(levels) - 1
	count := levelRows(levels[level])
	var segs []segment
	start := 0
	for start < n {
		take := n - start
		if s.opts.Threshold > 0 && level < s.opts.MaxLevel {
			room := max(levelCapacity(s.opts.Threshold, level)-count, 0)
			take = int(min(room, int64(take)))
		}
		if take > 0 {
			segs = append(segs, segment{Level: level, Start: start, End: start + take})
			start += take
		}
		level++
		count = 0
	}
	return segs
}

func (s *Store) fire(point string) {
	if s.opts.hook != nil {
		s.opts.hook(point)
	}
}

// WriteBatch stores blocks as the batch named id. Duplicate keys inside the
// batch are written once (the first wins). The batch goes to the top level;
// if it would take the level past its capacity (Threshold x 2^level rows) it
// is split, in the order given, so that the level ends exactly full and the
// rest goes to new levels.
//
// A batch that failed or whose process died part way must be retried with
// the same id and the same blocks: the retry follows the plan journaled by
// the first attempt, so it leaves exactly one copy of every block. Retrying a
// completed batch is a no-op with Repeat set; reusing an id for different
// blocks is ErrBatchMismatch.
//
// Cancelling ctx aborts the shard transactions that have not committed yet;
// the batch then stays pending until it is retried.
func (s *Store) WriteBatch(ctx context.Context, id string, blocks []Block) (BatchResult, error) {
	if err := validateBatch(id, blocks); err != nil {
		return BatchResult{}, err
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	levels, err := s.levels()
	if err != nil {
		return BatchResult{}, err
	}

	uniq := make([]Block, 0, len(blocks))
	seen := make(map[string]struct{}, len(blocks))
	for i := range blocks {
		k := dedupKey(&blocks[i])
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		uniq = append(uniq, blocks[i])
	}
	res := BatchResult{Blocks: len(uniq)}

	digest := batchDigest(blocks)
	entry, err := readJournal(ctx, s.manifestR, id)
	if err != nil {
		return res, err
	}
	switch {
	case entry == nil:
		entry = &journalEntry{digest: digest, plan: s.plan(levels, len(uniq))}
		if err := writeJournal(ctx, s.manifestW, id, entry, len(uniq)); err != nil {
			return res, err
		}
	case string(entry.digest) != string(digest):
		return res, fmt.Errorf("%w: batch %q", ErrBatchMismatch, id)
	case entry.done:
		res.Repeat = true
		res.Inserted = entry.inserted
		for _, seg := range entry.plan {
			res.Levels = append(res.Levels, seg.Level)
		}
		return res, nil
	}
	s.fire("planned")

	// Create the levels the plan needs, then route every block to its shard.
	type levelTask struct {
		level   int
		buckets [][]Block // buckets[i] goes to shard i of the level
		shards  []int     // the shards with a non-empty bucket
	}
	var tasks []levelTask
	for _, seg := range entry.plan {
		for len(levels) <= seg.Level {
			if err := s.openLevel(ctx, len(levels), true); err != nil {
				return res, err
			}
			if levels, err = s.levels(); err != nil {
				return res, err
			}
		}
		res.Levels = append(res.Levels, seg.Level)
		lt := levelTask{level: seg.Level, buckets: make([][]Block, len(levels[seg.Level]))}
		for _, b := range uniq[seg.Start:seg.End] {
			i := ShardFor(b.Hash, seg.Level)
			lt.buckets[i] = append(lt.buckets[i], b)
		}
		for i, bs := range lt.buckets {
			if len(bs) > 0 {
				lt.shards = append(lt.shards, i)
			}
		}
		tasks = append(tasks, lt)
	}

	// One level after the other, each level's shards concurrently (fanout.Do); the
	// first failure cancels the shard transactions not yet committed.
	var inserted atomic.Int64
	for _, lt := range tasks {
		shards := levels[lt.level]
		err := fanout.Do(ctx, routing.NewShards(lt.shards...), len(shards), func(ctx context.Context, i int) error {
			sh := shards[i]
			n, repeat, err := sh.apply(ctx, id, lt.buckets[i])
			if err != nil {
				return err
			}
			if !repeat {
				atomic.AddInt64(&sh.rows, n)
			}
			inserted.Add(n)
			s.fire("shard-committed")
			return nil
		}, fanout.WithLimit(s.opts.Concurrency), fanout.FailFast())
		if err != nil {
			return res, fmt.Errorf("batch %q: level %d: %w", id, lt.level, err)
		}
	}
	s.fire("before-done")
	res.Inserted = inserted.Load()
	if err := markDone(ctx, s.manifestW, id, res.Inserted); err != nil {
		return res, err
	}
	return res, nil
}

// Lookup returns every stored block with this hash, from every level, in
// level order. It asks one shard per level (see ShardFor). Cancelling ctx
// aborts the query in progress.
func (s *Store) Lookup(ctx context.Context, hash []byte) ([]Match, error) {
	// Hold the read lock throughout: Close takes the write lock, so it
	// cannot close a shard under a running query.
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.closed {
		return nil, ErrClosed
	}
	var out []Match
	for l, shards := range s.mu.levels {
		m, err := shards[ShardFor(hash, l)].lookup(ctx, hash)
		if err != nil {
			return nil, fmt.Errorf("lookup in level %d: %w", l, err)
		}
		out = append(out, m...)
	}
	return out, nil
}

// PendingBatches returns the ids of batches that were started but not
// completed, oldest id first; each should be retried with its blocks.
func (s *Store) PendingBatches(ctx context.Context) ([]string, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.closed {
		return nil, ErrClosed
	}
	rows, err := s.manifestR.QueryContext(ctx, `SELECT id FROM batches WHERE state = 'pending' ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// Close waits for a running WriteBatch, then closes every database. It is
// idempotent and returns the first close's result on every call.
func (s *Store) Close() error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return s.mu.closeErr
	}
	s.mu.closed = true
	var errs []error
	for _, shards := range s.mu.levels {
		errs = append(errs, closeShards(shards))
	}
	if s.manifest != nil {
		errs = append(errs, s.manifest.Close())
	}
	s.mu.closeErr = errors.Join(errs...)
	return s.mu.closeErr
}
