// Package counterbench is the hot-row contention benchmark behind cmd/counterbench.
//
// It reproduces the table of the seed article ("Manual Record Sharding for
// High-Performance Updates in Postgres"): N workers over a pool of
// connections increment one single key as fast as they can, once per
// strategy of package counters, and the throughput of each strategy is
// compared with the insert-only (append) strategy measured in the same
// trial. Trials are repeated and the order of the strategies rotates from
// one trial to the next, so that every ratio comes from side-by-side runs.
// After every run the count is read back and compared with the number of
// acknowledged increments.
//
// A second experiment measures the latency of reading a counter as its
// number of increments grows: append's count(*) against bucket's sum().
package counterbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/shardlab/shardlab/counters"
	"github.com/shardlab/shardlab/internal/postgresdb"
)

// ErrNotExact is returned by [Run] when, after some run, the count read back
// differed from the number of acknowledged increments.
var ErrNotExact = errors.New("counterbench: count differs from acknowledged increments")

// EnvDSN names the environment variable holding the default PostgreSQL server.
const EnvDSN = "SHARDLAB_PG_DSN"

// DefaultDSN is the server used when EnvDSN is unset.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// ErrUsage is wrapped by Run's errors about the command line.
var ErrUsage = errors.New("usage")

// Config is a parsed command line.
type Config struct {
	// Backend is "postgres" or "sqlite".
	Backend string
	// DSN is the PostgreSQL server; the benchmark creates its own database
	// there and drops it at the end.
	DSN string
	// SQLiteDir holds the SQLite files; empty means a new temporary
	// directory, removed at the end.
	SQLiteDir string
	// Workers is the number of goroutines incrementing concurrently.
	Workers int
	// Pool is the number of database connections (PostgreSQL) or read
	// connections (SQLite, whose writes go through one connection).
	Pool int
	// Ops, if positive, ends a run after that many increments.
	Ops int64
	// Duration, if positive, ends a run after that long.
	Duration time.Duration
	// Warmup is run, unmeasured, before each measured run.
	Warmup time.Duration
	// Trials is how many times every case runs.
	Trials int
	// Cases are the strategies of the contention table.
	Cases []counters.Options
	// Experiments are "contention" and/or "read".
	Experiments []string
	// ReadCases are the strategies of the read experiment.
	ReadCases []counters.Options
	// ReadSizes are the numbers of increments at which reads are measured.
	ReadSizes []int64
	// ReadSamples is the number of reads measured at each size.
	ReadSamples int
	// Out is the directory the CSV files and charts are written to; empty means a
	// new run directory under results/runs (see resolveOut).
	Out string
}

// DefaultCases is the seed's table plus the worker strategy.
const DefaultCases = "row,append,bucket:100:random,bucket:100:time,bucket:1000:random,bucket:1000:time,bucket:100:worker"

// ParseCase parses "row", "append" or "bucket:<N>:<random|time|worker>".
func ParseCase(s string) (counters.Options, error) {
	parts := strings.Split(strings.TrimSpace(s), ":")
	st, err := counters.ParseStrategy(parts[0])
	if err != nil {
		return counters.Options{}, err
	}
	o := counters.Options{Strategy: st}
	switch {
	case st == counters.StrategyBucket && len(parts) == 3:
		n, err := strconv.Atoi(parts[1])
		if err != nil {
			return o, fmt.Errorf("case %q: bucket count: %w", s, err)
		}
		o.Buckets = n
		if o.BucketBy, err = counters.ParseBucketBy(parts[2]); err != nil {
			return o, fmt.Errorf("case %q: %w", s, err)
		}
	case st == counters.StrategyBucket:
		return o, fmt.Errorf("case %q: want bucket:<N>:<random|time|worker>", s)
	case len(parts) != 1:
		return o, fmt.Errorf("case %q: only bucket takes :<N>:<chooser>", s)
	}
	if err := o.Validate(); err != nil {
		return o, fmt.Errorf("case %q: %w", s, err)
	}
	return o, nil
}

func parseCases(s string) ([]counters.Options, error) {
	var out []counters.Options
	for f := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		o, err := ParseCase(f)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	if len(out) == 0 {
		return nil, errors.New("no cases")
	}
	return out, nil
}

// ParseArgs parses the command line (without the program name). It returns
// flag.ErrHelp after printing the usage for -h/--help.
func ParseArgs(args []string, stderr io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("counterbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	defDSN := os.Getenv(EnvDSN)
	if defDSN == "" {
		defDSN = DefaultDSN
	}
	fs.StringVar(&c.Backend, "backend", "postgres", "database: postgres or sqlite")
	fs.StringVar(&c.DSN, "dsn", defDSN, "PostgreSQL server (default from $"+EnvDSN+"); a database is created on it and dropped at the end")
	fs.StringVar(&c.SQLiteDir, "sqlite-dir", "", "directory for the SQLite files (default: a temporary directory, removed at the end)")
	fs.IntVar(&c.Workers, "workers", 20, "concurrent writers hammering the one key")
	fs.IntVar(&c.Pool, "pool", 20, "database connections (SQLite: read connections; writes use one)")
	fs.Int64Var(&c.Ops, "ops", 0, "increments per run (0: use --duration only)")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "length of a run (ignored if --ops is set and --duration is not)")
	fs.DurationVar(&c.Warmup, "warmup", time.Second, "unmeasured warm-up before each run")
	fs.IntVar(&c.Trials, "trials", 1, "trials; every case runs once per trial, in an order rotated each trial")
	cases := fs.String("cases", DefaultCases, "contention cases: row, append, bucket:<N>:<random|time|worker>, comma-separated")
	exps := fs.String("experiment", "contention,read", "experiments to run: contention, read, or both")
	readCases := fs.String("read-cases", "append,bucket:100:random,bucket:1000:random", "cases of the read-latency experiment")
	readSizes := fs.String("read-sizes", "10000,100000,1000000", "increments at which read latency is measured, ascending")
	fs.IntVar(&c.ReadSamples, "read-samples", 200, "reads measured at each size")
	fs.StringVar(&c.Out, "out", "", "output directory for CSV files and charts (default: a new run directory results/runs/counters-<time>, which results/latest points at)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: counterbench [flags]\n\nHammers one hot key with every counter strategy and reports ops/s, latency\nand the ratio to insert-only (append), plus read latency as counts grow.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	durationSet := false
	fs.Visit(func(f *flag.Flag) { durationSet = durationSet || f.Name == "duration" })
	if c.Ops > 0 && !durationSet {
		c.Duration = 0
	}
	var err error
	if c.Cases, err = parseCases(*cases); err != nil {
		return c, fmt.Errorf("--cases: %w", err)
	}
	if c.ReadCases, err = parseCases(*readCases); err != nil {
		return c, fmt.Errorf("--read-cases: %w", err)
	}
	for f := range strings.SplitSeq(*readSizes, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || n < 1 {
			return c, fmt.Errorf("--read-sizes: bad size %q", f)
		}
		if len(c.ReadSizes) > 0 && n <= c.ReadSizes[len(c.ReadSizes)-1] {
			return c, fmt.Errorf("--read-sizes: %d is not larger than the size before it", n)
		}
		c.ReadSizes = append(c.ReadSizes, n)
	}
	for f := range strings.SplitSeq(*exps, ",") {
		switch f = strings.TrimSpace(f); f {
		case "contention", "read":
			c.Experiments = append(c.Experiments, f)
		default:
			return c, fmt.Errorf("--experiment: unknown experiment %q (want contention, read)", f)
		}
	}
	switch {
	case c.Backend != "postgres" && c.Backend != "sqlite":
		return c, fmt.Errorf("--backend: %q is neither postgres nor sqlite", c.Backend)
	case c.Workers < 1:
		return c, fmt.Errorf("--workers: %d, want at least 1", c.Workers)
	case c.Pool < 1 || c.Pool > postgresdb.MaxPoolSize:
		return c, fmt.Errorf("--pool: %d, want 1..%d", c.Pool, postgresdb.MaxPoolSize)
	case c.Trials < 1:
		return c, fmt.Errorf("--trials: %d, want at least 1", c.Trials)
	case c.Ops < 0 || c.Duration < 0 || c.Warmup < 0:
		return c, errors.New("--ops, --duration and --warmup must not be negative")
	case c.Ops == 0 && c.Duration == 0:
		return c, errors.New("set --ops or --duration")
	case c.ReadSamples < 1:
		return c, fmt.Errorf("--read-samples: %d, want at least 1", c.ReadSamples)
	}
	return c, nil
}

// Run parses args and runs the experiments, writing a summary table to
// stdout, progress to stderr and CSV files and charts to --out. Cancelling
// ctx stops the runs; the database the benchmark created is dropped anyway.
// It returns flag.ErrHelp for --help, an error wrapping [ErrUsage] for a bad
// command line and an error wrapping [ErrNotExact] if
// any run lost or doubled an increment.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := ParseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if err := resolveOut(&cfg, stderr); err != nil {
		return err
	}
	tg, err := openTarget(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := tg.close(context.WithoutCancel(ctx)); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if err := writeMeta(ctx, cfg, tg, args); err != nil {
		return err
	}
	var inexact error
	for _, e := range cfg.Experiments {
		switch e {
		case "contention":
			err = runContention(ctx, cfg, tg, stdout, stderr)
		case "read":
			err = runRead(ctx, cfg, tg, stdout, stderr)
		}
		if errors.Is(err, ErrNotExact) {
			inexact = err
			continue
		}
		if err != nil {
			return err
		}
	}
	return inexact
}
