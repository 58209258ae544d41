// Package usl is the `usl` command: fit the Universal Scalability Law to a CSV of
// (n, throughput) points from anywhere, print the coefficients and optionally draw the
// chart. cmd/usl is a thin wrapper around Run.
package usl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/shardlab/shardlab/lab/charts"
	"github.com/shardlab/shardlab/lab/usl"
)

// ErrUsage is returned for bad command-line arguments; the command exits with status 2.
var ErrUsage = errors.New("usage error")

const usage = `usage: usl [--chart OUT.png[,OUT.svg]] [--title TEXT] FILE|-

Fits the Universal Scalability Law
    X(N) = lambda*N / (1 + sigma*(N-1) + kappa*N*(N-1))
to the points of FILE (or standard input for -), a CSV with the header
"n,throughput" and one point per line; several lines may share an n (one per
trial). At least %d distinct values of n are needed.

It prints one line:
    sigma=... kappa=... lambda=... nstar=N|none r2=...
sigma is contention, kappa coherency cost, lambda the throughput at n=1 without
either, nstar = floor(sqrt((1-sigma)/kappa)) the n of peak throughput (1 when
sigma >= 1: more load only lowers throughput; "none" when kappa < %g, i.e. no
peak), r2 the goodness of fit. When r2 is below %g and the points scatter by more
than %.0f%% of their mean around the curve, the curve does not describe them: the
line is still printed, with a warning on standard error (the same words as the lab's
report), and the chart marks no peak. A low r2 with points within %.0f%% of the curve
is a flat curve, which a note on standard error says.

Flags:
`

// Run runs the command with args (without the program name), reading "-" from stdin.
// It returns flag.ErrHelp after printing help for -h/--help, an error wrapping ErrUsage
// for bad arguments, and other errors for unreadable input or a failed fit. ctx is
// unused: the work takes milliseconds.
func Run(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("usl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	chart := fs.String("chart", "", "also draw the points and fitted curve to these comma-separated `files` (.png, .svg)")
	title := fs.String("title", "", "chart title (default: the input file name)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), usage, usl.MinDistinctN, usl.KappaZero, usl.MinR2, usl.MaxFlatRMSE*100, usl.MaxFlatRMSE*100)
		fs.PrintDefaults()
	}
	// Accept flags before and after the file name.
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return fmt.Errorf("%w: %v", ErrUsage, err)
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(positional) != 1 {
		fs.Usage()
		return fmt.Errorf("%w: want exactly one input file (or -), got %d", ErrUsage, len(positional))
	}
	var chartPaths []string
	if *chart != "" {
		for _, p := range strings.Split(*chart, ",") {
			if _, err := charts.FormatOf(p); err != nil {
				return fmt.Errorf("%w: --chart %s: want a .png or .svg file name", ErrUsage, p)
			}
			chartPaths = append(chartPaths, p)
		}
	}

	name := positional[0]
	in := stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	points, err := usl.ReadCSV(in)
	if err != nil {
		return fmt.Errorf("%s: %w", displayName(name), err)
	}
	m, err := usl.Fit(points)
	if err != nil {
		return fmt.Errorf("%s: %w", displayName(name), err)
	}
	fmt.Fprintln(stdout, m)
	if w := m.PoorFit(); w != "" {
		fmt.Fprintf(stderr, "usl: warning: %s: %s\n", displayName(name), w)
	}
	if n := m.FlatNote(); n != "" {
		fmt.Fprintf(stderr, "usl: note: %s: %s\n", displayName(name), n)
	}

	if len(chartPaths) > 0 {
		t := *title
		if t == "" {
			t = fmt.Sprintf("%s: USL fit, sigma=%.4g kappa=%.4g", name, m.Sigma, m.Kappa)
		}
		c := usl.ScalingChart(t, points, m)
		c.XLabel, c.YLabel = "n", "throughput"
		if err := charts.Save(c, chartPaths...); err != nil {
			return err
		}
	}
	return nil
}

// displayName names the input in messages.
func displayName(name string) string {
	if name == "-" {
		return "standard input"
	}
	return name
}
