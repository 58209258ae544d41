package blockbench

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/shardlab/shardlab/autoshard"
	"github.com/shardlab/shardlab/internal/rundir"
	"github.com/shardlab/shardlab/internal/sqlitedb"
)

// ErrUsage wraps every command-line mistake, including a value out of range
// in an IngestConfig, SweepConfig or the store options, so main can exit
// with 2.
var ErrUsage = errors.New("usage error")

const usageText = `blockbench measures the autoshard block store.

Usage:
  blockbench [ingest] [flags]   one ingest run; one CSV row per batch
  blockbench sweep [flags]      the same ingest for several thresholds, with summary and charts,
                                in a new run directory results/runs/blockbench-<time>/
  blockbench chart --results DIR  redraw the charts of a sweep from its CSVs
  blockbench env                print the Go, CPU and SQLite versions a result depends on

Per-batch CSV columns: time_s,files,blocks,files_per_s,blocks_per_s,shards,level
(files and blocks are totals so far, the rates are those of the batch, shards
counts databases over all levels, level is the top level).

Run "blockbench <command> -h" for the flags of a command.
`

// commonFlags are shared by ingest and sweep.
type commonFlags struct {
	targetBlocks  int64
	maxDuration   time.Duration
	maxLevel      int
	sync          string
	concurrency   int
	filesPerBatch int
	blocksPerFile int
	seed          uint64
	lookups       int
	progress      time.Duration
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.Int64Var(&c.targetBlocks, "target-blocks", DefaultTargetBlocks, "stop once this many blocks are written")
	fs.DurationVar(&c.maxDuration, "max-duration", DefaultMaxDuration, "stop at the first batch boundary after this long")
	fs.IntVar(&c.maxLevel, "max-level", 0, fmt.Sprintf("highest level (2^level shards), 0..%d; 0 = %d, lowered to what the open-file limit fits", autoshard.MaxMaxLevel, autoshard.DefaultMaxLevel))
	fs.StringVar(&c.sync, "sync", "normal", "SQLite synchronous mode: normal, full or off")
	fs.IntVar(&c.concurrency, "concurrency", 0, "concurrent shard commits per batch (0 = number of CPUs)")
	fs.IntVar(&c.filesPerBatch, "files-per-batch", DefaultFilesPerBatch, "files per batch")
	fs.IntVar(&c.blocksPerFile, "blocks-per-file", DefaultBlocksPerFile, "blocks per file")
	fs.Uint64Var(&c.seed, "seed", 1, "random seed for names and hashes")
	fs.IntVar(&c.lookups, "lookups", DefaultLookups, "lookups of written hashes (and as many absent ones) timed at the end")
	fs.DurationVar(&c.progress, "progress", 5*time.Second, "interval of progress lines on stderr (0 = every batch)")
}

func (c *commonFlags) config(stderr io.Writer) (IngestConfig, error) {
	sync, err := autoshard.ParseSyncMode(c.sync)
	if err != nil {
		return IngestConfig{}, fmt.Errorf("%w: --sync: %w", ErrUsage, err)
	}
	cfg := IngestConfig{
		Store: autoshard.Options{
			MaxLevel:    c.maxLevel,
			Sync:        sync,
			Concurrency: c.concurrency,
		},
		TargetBlocks:  c.targetBlocks,
		MaxDuration:   c.maxDuration,
		BlocksPerFile: c.blocksPerFile,
		FilesPerBatch: c.filesPerBatch,
		Seed:          c.seed,
		Lookups:       c.lookups,
		Progress:      stderr,
		ProgressEvery: c.progress,
	}
	return cfg, nil
}

func newFlagSet(name string, stderr io.Writer, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fmt.Fprintf(stderr, "\nFlags of %s:\n", name)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args and turns flag errors into ErrUsage; it reports done
// when -h was asked for.
func parse(fs *flag.FlagSet, args []string) (done bool, err error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return true, nil
		}
		return false, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return false, fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	}
	return false, nil
}

// Run is the blockbench command. args excludes the program name. Cancelling
// ctx stops a running ingest or sweep after its current batch.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "ingest"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "ingest":
		return runIngest(ctx, args, stdout, stderr)
	case "sweep":
		return runSweep(ctx, args, stderr)
	case "chart":
		return runChart(args, stderr)
	case "env":
		return printEnv(ctx, stdout)
	case "help":
		fmt.Fprint(stdout, usageText)
		return nil
	}
	return fmt.Errorf("%w: unknown command %q (want ingest, sweep, chart, env or help)", ErrUsage, cmd)
}

func runIngest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ingest", stderr, usageText)
	var c commonFlags
	c.register(fs)
	threshold := fs.Int64("threshold", 0, "rows per shard database before writes move to the next level; level L holds threshold x 2^L rows (0 = never split)")
	dataDir := fs.String("data", "", "data directory for the store, must be empty (default: a temporary directory, removed afterwards)")
	out := fs.String("out", "", "per-batch CSV file (default: stdout)")
	if done, err := parse(fs, args); done || err != nil {
		return err
	}
	if *threshold < 0 {
		return fmt.Errorf("%w: --threshold %d is negative (0 = never split)", ErrUsage, *threshold)
	}
	cfg, err := c.config(stderr)
	if err != nil {
		return err
	}
	cfg.Store.Threshold = *threshold
	cfg.Dir = *dataDir
	if cfg.Dir == "" {
		tmp, err := os.MkdirTemp("", "blockbench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		cfg.Dir = tmp
	}
	w := stdout
	if *out != "" {
		f, err := createPending(*out)
		if err != nil {
			return err
		}
		defer f.discard()
		w = f
	}
	res, err := Ingest(ctx, cfg, w)
	if err != nil && ctx.Err() != nil {
		// Whatever query the cancellation aborted is not the story.
		fmt.Fprintf(stderr, "interrupted: threshold=%s elapsed_s=%.1f blocks=%d levels=%d shards=%d\n",
			ThresholdLabel(res.Threshold), res.Elapsed.Seconds(), res.Blocks, res.TopLevel+1, res.Shards)
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "done: threshold=%s reached_target=%v time_to_target_s=%.1f elapsed_s=%.1f cpu_s=%.1f blocks=%d levels=%d shards=%d lookup_p50_us=%d lookup_p99_us=%d miss_p50_us=%d miss_p99_us=%d\n",
		ThresholdLabel(res.Threshold), res.ReachedTarget, res.TimeToTarget.Seconds(), res.Elapsed.Seconds(), res.CPU.Seconds(), res.Blocks,
		res.TopLevel+1, res.Shards, res.HitP50, res.HitP99, res.MissP50, res.MissP99)
	if f, ok := w.(*pendingFile); ok {
		return f.commit()
	}
	return nil
}

// ParseThresholds parses a comma-separated list such as "0,250000,1M";
// a k or M suffix multiplies by 1e3 or 1e6, and "never" means 0.
func ParseThresholds(s string) ([]int64, error) {
	var out []int64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		mult := int64(1)
		switch {
		case part == "never":
			part = "0"
		case strings.HasSuffix(part, "k"):
			part, mult = strings.TrimSuffix(part, "k"), 1_000
		case strings.HasSuffix(part, "M"):
			part, mult = strings.TrimSuffix(part, "M"), 1_000_000
		}
		n, err := strconv.ParseInt(part, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: threshold %q is not a non-negative number", ErrUsage, part)
		}
		out = append(out, n*mult)
	}
	return out, nil
}

func runSweep(ctx context.Context, args []string, stderr io.Writer) error {
	fs := newFlagSet("sweep", stderr, usageText)
	var c commonFlags
	c.register(fs)
	thresholds := fs.String("thresholds", "0,250k,500k,1M", "comma-separated thresholds (0 or never = never split; k and M suffixes)")
	rounds := fs.Int("rounds", 1, "repeat the sweep, rotating the order of thresholds each round")
	results := fs.String("results", "", "directory for per-run CSVs, summary.csv and charts (default: a new run directory under "+rundir.DefaultRuns+", which results/latest points at)")
	dataRoot := fs.String("data-root", "", "directory for the per-run stores, each removed after its run (default: a temporary directory)")
	if done, err := parse(fs, args); done || err != nil {
		return err
	}
	ts, err := ParseThresholds(*thresholds)
	if err != nil {
		return err
	}
	if *rounds <= 0 {
		return fmt.Errorf("%w: --rounds %d must be positive", ErrUsage, *rounds)
	}
	base, err := c.config(stderr)
	if err != nil {
		return err
	}
	probe := base
	probe.Dir = "probe"
	if err := probe.validate(); err != nil {
		return err // before a run directory exists for nothing
	}
	if *results == "" {
		// A run of its own: committed results are never overwritten by accident.
		if *results, err = rundir.New(rundir.DefaultRuns, "blockbench-", time.Now()); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "writing to %s\n", *results)
	}
	root := *dataRoot
	if root == "" {
		tmp, err := os.MkdirTemp("", "blockbench-sweep-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		root = tmp
	}
	done, err := Sweep(ctx, SweepConfig{Base: base, Thresholds: ts, Rounds: *rounds, DataRoot: root, ResultsDir: *results}, stderr)
	if err != nil && ctx.Err() != nil {
		if len(done) == 0 {
			fmt.Fprintln(stderr, "interrupted before any run finished")
		} else {
			fmt.Fprintf(stderr, "interrupted after %d finished runs; their rows are in %s/summary.csv\n", len(done), *results)
		}
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
	if err == nil {
		fmt.Fprintf(stderr, "wrote %s/summary.csv and charts\n", *results)
	}
	return err
}

func runChart(args []string, stderr io.Writer) error {
	fs := newFlagSet("chart", stderr, usageText)
	results := fs.String("results", "", "directory of a sweep's CSVs, e.g. results/latest (required)")
	if done, err := parse(fs, args); done || err != nil {
		return err
	}
	if *results == "" {
		return fmt.Errorf("%w: chart needs --results DIR, the directory of a sweep", ErrUsage)
	}
	return RenderCharts(*results)
}

// printEnv prints what a published number depends on.
func printEnv(ctx context.Context, w io.Writer) error {
	db, err := sql.Open(sqlitedb.DriverName, ":memory:")
	if err != nil {
		return err
	}
	defer db.Close()
	var version string
	if err := db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&version); err != nil {
		return err
	}
	fmt.Fprintf(w, "go: %s %s/%s\nnum_cpu: %d\ngomaxprocs: %d\nsqlite: %s (mattn/go-sqlite3, cgo)\n",
		runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), version)
	return nil
}
