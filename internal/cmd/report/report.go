// Package report is the `report` command: regenerate a run's report.md and its charts
// from the results CSV. cmd/report is a thin wrapper around Run.
package report

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/shardlab/shardlab/lab/report"
)

// ErrUsage is returned for bad command-line arguments; the command exits with status 2.
var ErrUsage = errors.New("usage error")

const usage = `usage: report [flags]

Writes a markdown report of one run of the results CSV (by default the run of the
newest row, in the newest run directory): the findings table (median of the trials
with its 95% confidence interval, ratio against single with a bootstrap interval, and
a verdict from a Mann-Whitney U test at alpha 0.05, as benchstat's, with its p-value;
no verdict when the trials are too few or too short), computed conclusions, the USL
fit of shard sweeps, charts (PNG and SVG), the machine description and its load during
the run (from run.txt).

With --netlab, it writes the report of network lab runs instead (scripts/netlab.sh run
tail and run pgbench, at one or more presets): their tables, the tail against shard
count beside the slowest-of-N model, and latency and throughput against the round
trip. --out is then required.

Flags:
`

// Run runs the command with args (without the program name). It returns flag.ErrHelp
// after printing help, an error wrapping ErrUsage for bad arguments, and the report's
// errors otherwise. Cancelling ctx stops it before the report is written.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg report.Config
	fs.StringVar(&cfg.CSVPath, "csv", "results/latest/results.csv", "results CSV to read (results/latest is the newest run's directory)")
	fs.StringVar(&cfg.OutPath, "out", "", "markdown report to write (default: report.md beside --csv)")
	fs.StringVar(&cfg.RunID, "run-id", "", "run to report (default: the run of the newest row)")
	fs.StringVar(&cfg.ChartsDir, "charts-dir", "", "directory for the charts (default: charts/ next to --out)")
	fs.StringVar(&cfg.TimeseriesDir, "timeseries-dir", "", "directory of loadgen's per-second samples, one subdirectory per run (default: timeseries/ next to --csv)")
	fs.StringVar(&cfg.RunInfoPath, "run-info", "", "the run's run.txt, for the machine's load (default: run.txt beside --csv)")
	fs.BoolVar(&cfg.NoCharts, "no-charts", false, "write the markdown only")
	var netlab []string
	fs.Func("netlab", "a network lab run's results.csv (repeat for several runs)", func(v string) error {
		netlab = append(netlab, v)
		return nil
	})
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	}
	if len(netlab) > 0 {
		if cfg.OutPath == "" {
			return fmt.Errorf("%w: --netlab needs --out", ErrUsage)
		}
		files, err := report.Netlab(report.NetlabConfig{CSVPaths: netlab, OutPath: cfg.OutPath, ChartsDir: cfg.ChartsDir})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s (%d runs, %d files)\n", cfg.OutPath, len(netlab), len(files))
		return nil
	}
	res, err := report.Generate(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s (run %s, %d rows, %d chart files)\n",
		res.Report, res.Analysis.RunID, len(res.Analysis.Rows), len(res.Charts))
	return nil
}
