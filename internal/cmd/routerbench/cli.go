package routerbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/shardlab/shardlab/internal/rundir"
)

// ErrUsage is wrapped by errors about the command line (exit status 2).
var ErrUsage = errors.New("usage")

type dsnFlags []string

func (d *dsnFlags) String() string     { return strings.Join(*d, ",") }
func (d *dsnFlags) Set(v string) error { *d = append(*d, v); return nil }

// Main is the routerbench command: it parses args, runs the experiment into a run
// directory and says where the results are.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("routerbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg Config
	var dsns dsnFlags
	var seed int64
	fs.StringVar(&cfg.Experiment, "experiment", ExperimentOverhead, "overhead (driver vs plain database/sql on one table) or limit (1db x 2t, 2db x 1t, 2db x 2t vs one table)")
	fs.StringVar(&cfg.Backend, "backend", BackendPostgres, "postgres or sqlite")
	fs.Var(&dsns, "dsn", "a PostgreSQL server to create the benchmark's databases on (repeat for a second server; default $SHARDLAB_PG_DSN)")
	fs.IntVar(&cfg.Concurrency, "concurrency", 16, "workers per measurement")
	fs.DurationVar(&cfg.Duration, "duration", 4*time.Second, "length of each measurement (a Go duration)")
	fs.DurationVar(&cfg.Warmup, "warmup", time.Second, "unmeasured load before each measurement")
	fs.IntVar(&cfg.Trials, "trials", 6, "interleaved trials (6 or more give confidence intervals)")
	fs.Float64Var(&cfg.Rate, "rate", 0, "open loop: requests per second in each measurement, timed from when each should start (0: closed loop, at saturation)")
	fs.StringVar(&cfg.Arrival, "arrival", "constant", "open loop: constant or poisson gaps between requests")
	fs.IntVar(&cfg.Orders, "orders", 20000, "orders loaded before measuring")
	fs.Int64Var(&seed, "seed", 4, "seed of the order ids and request sequences")
	fs.StringVar(&cfg.Out, "out", "", "the run directory (default: a new results/runs/routerbench-<time>/)")
	fs.BoolVar(&cfg.KeepDatabases, "keep-databases", false, "leave the benchmark's PostgreSQL databases (routerbench_*) on their servers after the run; by default they are dropped")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: routerbench [flags]\n\nReproduces seed 004 (Sharding-JDBC's performance report) with shardlab's database/sql driver.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", ErrUsage, fs.Args())
	}
	cfg.DSNs = dsns
	if len(cfg.DSNs) == 0 && cfg.Backend != BackendSQLite {
		if d := os.Getenv("SHARDLAB_PG_DSN"); d != "" {
			cfg.DSNs = []string{d}
		}
	}
	cfg.Seed = uint64(seed)
	cfg.Command = strings.Join(append([]string{"go run ./cmd/routerbench"}, quoteArgs(args)...), " ")
	out := cfg.Out
	cfg.Out = "-" // validated below with the real directory
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	cfg.Out, cfg.DataDir = out, ""
	if cfg.Out == "" {
		dir, err := rundir.New(rundir.DefaultRuns, "routerbench-", time.Now())
		if err != nil {
			return err
		}
		cfg.Out = dir
	}
	fmt.Fprintf(stdout, "routerbench: writing into %s\n", cfg.Out)
	cfg.Progress = stdout
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if _, err := Run(ctx, cfg); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "routerbench: done; the report is %s/report.md\n", cfg.Out)
	return nil
}

// quoteArgs quotes the arguments that a shell would split or expand, so that the
// recorded command line runs as it ran.
func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$&;|<>*?()[]{}\\`!#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return out
}
