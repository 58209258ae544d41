// Package blockbench is the ingest benchmark for the autoshard block store:
// it writes files of random blocks in batches, records the write rate after
// every batch, measures lookup latency at the end, and sweeps thresholds to
// help a user pick theirs. cmd/blockbench is its command-line front end.
package blockbench

import (
	"context"
	"encoding/binary"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/shardlab/shardlab/autoshard"
)

// Defaults sized for a 2-core machine.
const (
	DefaultBlocksPerFile = 1234
	DefaultFilesPerBatch = 250
	DefaultTargetBlocks  = 5_000_000
	DefaultMaxDuration   = 10 * time.Minute
	DefaultLookups       = 5000
)

// ErrDataDirNotEmpty is returned when the ingest would start on an existing
// store: the rates would not be comparable with a fresh run.
var ErrDataDirNotEmpty = errors.New("data directory is not empty")

// IngestConfig describes one ingest run.
type IngestConfig struct {
	// Dir is the store's data directory; it must be empty or missing.
	Dir string
	// Store holds the store options (threshold, max level, sync, concurrency).
	Store autoshard.Options
	// TargetBlocks stops the run once this many blocks are written.
	TargetBlocks int64
	// MaxDuration stops the run at the first batch boundary after it.
	MaxDuration time.Duration
	// BlocksPerFile and FilesPerBatch shape the batches (1234 and 250).
	BlocksPerFile, FilesPerBatch int
	// Seed makes the random hashes reproducible.
	Seed uint64
	// Lookups is the number of lookups of written hashes (and as many of
	// absent ones) timed after the ingest.
	Lookups int
	// Progress, if not nil, gets a status line every ProgressEvery.
	Progress      io.Writer
	ProgressEvery time.Duration
}

// validate reports a value out of range as ErrUsage: for the command these
// are flag values.
func (c *IngestConfig) validate() error {
	switch {
	case c.Dir == "":
		return fmt.Errorf("%w: no data directory", ErrUsage)
	case c.TargetBlocks <= 0:
		return fmt.Errorf("%w: target blocks %d must be positive", ErrUsage, c.TargetBlocks)
	case c.MaxDuration <= 0:
		return fmt.Errorf("%w: max duration %v must be positive", ErrUsage, c.MaxDuration)
	case c.BlocksPerFile <= 0 || c.FilesPerBatch <= 0:
		return fmt.Errorf("%w: blocks per file (%d) and files per batch (%d) must be positive", ErrUsage, c.BlocksPerFile, c.FilesPerBatch)
	case c.Lookups < 0:
		return fmt.Errorf("%w: lookups %d is negative", ErrUsage, c.Lookups)
	}
	return nil
}

// BatchRow is one CSV row: the state after one batch.
type BatchRow struct {
	TimeS      float64 // seconds since the start, at the end of the batch
	Files      int64   // files written so far
	Blocks     int64   // blocks written so far
	FilesPerS  float64 // rate of this batch
	BlocksPerS float64 // rate of this batch
	Shards     int     // shard databases over all levels
	Level      int     // the top level after the batch
}

// CSVHeader is the header of the per-batch CSV.
var CSVHeader = []string{"time_s", "files", "blocks", "files_per_s", "blocks_per_s", "shards", "level"}

func (r BatchRow) record() []string {
	return []string{
		strconv.FormatFloat(r.TimeS, 'f', 3, 64),
		strconv.FormatInt(r.Files, 10),
		strconv.FormatInt(r.Blocks, 10),
		strconv.FormatFloat(r.FilesPerS, 'f', 1, 64),
		strconv.FormatFloat(r.BlocksPerS, 'f', 0, 64),
		strconv.Itoa(r.Shards),
		strconv.Itoa(r.Level),
	}
}

// IngestResult sums up one run.
type IngestResult struct {
	Threshold     int64
	Rows          []BatchRow
	Blocks        int64
	Elapsed       time.Duration
	ReachedTarget bool
	// TimeToTarget is the elapsed time at the batch that reached the
	// target; zero if it was not reached.
	TimeToTarget time.Duration
	TopLevel     int
	Shards       int
	// CPU is the CPU time (user + system) the process used during the
	// ingest. On a machine shared with other jobs it is steadier than
	// wall time, which also counts the time spent waiting for a core.
	CPU time.Duration
	// Lookup latency of hashes that exist (Hit) and that do not (Miss), in
	// microseconds.
	HitP50, HitP99, MissP50, MissP99 int64
}

// batchMaker fills reusable block slices with random hashes.
type batchMaker struct {
	rng    *rand.ChaCha8
	blocks []autoshard.Block
	buf    []byte
}

func newBatchMaker(seed uint64, files, perFile int) *batchMaker {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:8], seed)
	n := files * perFile
	m := &batchMaker{rng: rand.NewChaCha8(key), blocks: make([]autoshard.Block, n), buf: make([]byte, 32*(n+files))}
	bl := m.buf[32*n:]
	for f := 0; f < files; f++ {
		for i := 0; i < perFile; i++ {
			j := f*perFile + i
			m.blocks[j] = autoshard.Block{
				Hash:          m.buf[32*j : 32*j+32],
				BlocklistHash: bl[32*f : 32*f+32],
				Idx:           i,
				Offset:        int64(i) * 128 << 10,
				Size:          128 << 10,
			}
		}
	}
	return m
}

// next refills every hash; the slices returned are valid until the next call.
func (m *batchMaker) next() []autoshard.Block {
	_, _ = m.rng.Read(m.buf)
	return m.blocks
}

// Ingest runs one ingest into a fresh store and writes one CSV row per batch
// to csvOut (if not nil). Cancelling ctx stops the run after the current
// batch's shard commits are aborted; the result so far is returned with the
// context's error.
func Ingest(ctx context.Context, cfg IngestConfig, csvOut io.Writer) (res IngestResult, err error) {
	res.Threshold = cfg.Store.Threshold
	if err := cfg.validate(); err != nil {
		return res, err
	}
	if entries, err := os.ReadDir(cfg.Dir); err == nil && len(entries) > 0 {
		return res, fmt.Errorf("%w: %s", ErrDataDirNotEmpty, cfg.Dir)
	}
	store, err := autoshard.Open(ctx, cfg.Dir, cfg.Store)
	if errors.Is(err, autoshard.ErrInvalidOptions) {
		return res, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, store.Close()) }()

	var cw *csv.Writer
	if csvOut != nil {
		cw = csv.NewWriter(csvOut)
		if err := cw.Write(CSVHeader); err != nil {
			return res, err
		}
	}
	maker := newBatchMaker(cfg.Seed, cfg.FilesPerBatch, cfg.BlocksPerFile)
	sampler := newSampler(cfg.Lookups, cfg.Seed)
	start := time.Now()
	cpuStart := processCPU()
	lastProgress := start
	var files int64
	for batch := 0; ; batch++ {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		blocks := maker.next()
		sampler.offer(blocks)
		t0 := time.Now()
		br, err := store.WriteBatch(ctx, fmt.Sprintf("batch-%06d", batch), blocks)
		if err != nil {
			return res, err
		}
		took := time.Since(t0).Seconds()
		files += int64(cfg.FilesPerBatch)
		res.Blocks += br.Inserted
		st, err := store.Stats()
		if err != nil {
			return res, err
		}
		row := BatchRow{
			TimeS:      time.Since(start).Seconds(),
			Files:      files,
			Blocks:     res.Blocks,
			FilesPerS:  float64(cfg.FilesPerBatch) / took,
			BlocksPerS: float64(br.Inserted) / took,
			Shards:     st.Shards,
			Level:      st.TopLevel,
		}
		res.Rows = append(res.Rows, row)
		if cw != nil {
			if err := cw.Write(row.record()); err != nil {
				return res, err
			}
			cw.Flush()
			if err := cw.Error(); err != nil {
				return res, err
			}
		}
		res.Elapsed = time.Since(start)
		res.TopLevel, res.Shards = st.TopLevel, st.Shards
		if cfg.Progress != nil && (time.Since(lastProgress) >= cfg.ProgressEvery || res.Blocks >= cfg.TargetBlocks) {
			lastProgress = time.Now()
			fmt.Fprintf(cfg.Progress, "threshold=%s t=%.1fs blocks=%d (%.0f%% of target) batch_rate=%.0f blocks/s level=%d shards=%d\n",
				ThresholdLabel(cfg.Store.Threshold), row.TimeS, res.Blocks, 100*float64(res.Blocks)/float64(cfg.TargetBlocks), row.BlocksPerS, st.TopLevel, st.Shards)
		}
		if res.Blocks >= cfg.TargetBlocks {
			res.ReachedTarget, res.TimeToTarget = true, res.Elapsed
			break
		}
		if res.Elapsed >= cfg.MaxDuration {
			break
		}
	}
	res.CPU = processCPU() - cpuStart
	return res, measureLookups(ctx, store, sampler, &res)
}

// sampler keeps a uniform sample of written hashes (reservoir sampling).
type sampler struct {
	size   int
	seen   int64
	hashes [][]byte
	rng    *rand.Rand
}

func newSampler(size int, seed uint64) *sampler {
	return &sampler{size: size, rng: rand.New(rand.NewPCG(seed, 0x5eed))}
}

func (s *sampler) offer(blocks []autoshard.Block) {
	for i := range blocks {
		s.seen++
		if len(s.hashes) < s.size {
			s.hashes = append(s.hashes, append([]byte(nil), blocks[i].Hash...))
		} else if j := s.rng.Int64N(s.seen); j < int64(s.size) {
			copy(s.hashes[j], blocks[i].Hash)
		}
	}
}

// measureLookups times a lookup of every sampled hash and of as many random
// absent hashes, each into an HDR histogram in microseconds.
func measureLookups(ctx context.Context, store *autoshard.Store, s *sampler, res *IngestResult) error {
	if len(s.hashes) == 0 {
		return nil
	}
	hit := hdrhistogram.New(1, 60_000_000, 3)
	miss := hdrhistogram.New(1, 60_000_000, 3)
	absent := make([]byte, 32)
	for _, h := range s.hashes {
		for _, probe := range []struct {
			hash []byte
			into *hdrhistogram.Histogram
			want bool
		}{{h, hit, true}, {absent, miss, false}} {
			if !probe.want {
				for i := range absent {
					absent[i] = byte(s.rng.Uint32())
				}
			}
			t0 := time.Now()
			m, err := store.Lookup(ctx, probe.hash)
			us := time.Since(t0).Microseconds()
			if err != nil {
				return err
			}
			if probe.want && len(m) == 0 {
				return fmt.Errorf("written hash %x not found", probe.hash)
			}
			_ = probe.into.RecordValue(max(us, 1))
		}
	}
	res.HitP50, res.HitP99 = hit.ValueAtQuantile(50), hit.ValueAtQuantile(99)
	res.MissP50, res.MissP99 = miss.ValueAtQuantile(50), miss.ValueAtQuantile(99)
	return nil
}

// ThresholdLabel names a threshold for files and charts: "never" for 0.
func ThresholdLabel(t int64) string {
	if t == 0 {
		return "never"
	}
	return strconv.FormatInt(t, 10)
}

// processCPU returns the user plus system CPU time of this process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
