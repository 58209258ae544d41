// Package netprobe is the netprobe command: the network lab's probes (lab/netprobe) for
// scripts/netlab.sh, which runs it inside its hosts. cmd/netprobe is a thin wrapper
// around Run.
package netprobe

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/shardlab/shardlab/lab/netprobe"
)

// ErrUsage marks a command-line mistake; the command exits with status 2.
var ErrUsage = errors.New("usage")

const usage = `Usage:
  netprobe sql [--count N] [--timeout D] DSN
      times N round trips of "SELECT 1" over one connection to DSN and prints
      n=N min_ms=... median_ms=... p99_ms=... max_ms=... mean_ms=... stddev_ms=...
  netprobe read [--query SQL] [--timeout D] DSN
      runs SQL once over one connection to DSN, reads its answer row by row as it
      arrives (keeping none), and prints
      rows=N bytes=B first_row_ms=... total_ms=...
  netprobe dial [--timeout D] HOST:PORT
      tries to open a TCP connection and prints what became of it: answered,
      refused, timeout (nothing came back within D, as across a partition) or
      unreachable (no route, or a local firewall rule)

Flags:
`

// Run runs the command with args (without the program name). It returns flag.ErrHelp
// for --help, an error wrapping ErrUsage for a bad command line, and other errors when a
// probe fails. Cancelling ctx ends the probe under way.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("netprobe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	count := fs.Int("count", 200, "sql: timed round trips")
	query := fs.String("query", "SELECT 1", "read: the statement whose answer is read")
	timeout := fs.Duration("timeout", 10*time.Second, "sql: bound on the whole probe; dial: bound on opening the connection")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if len(args) == 0 {
		fs.Usage()
		return fmt.Errorf("%w: give a probe, sql, read or dial", ErrUsage)
	}
	probe := args[0]
	if probe == "-h" || probe == "--help" || probe == "-help" {
		fs.Usage()
		return flag.ErrHelp
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: %s takes exactly one target, got %d", ErrUsage, probe, fs.NArg())
	}
	if *timeout <= 0 {
		return fmt.Errorf("%w: --timeout must be positive, got %v", ErrUsage, *timeout)
	}
	target := fs.Arg(0)
	switch probe {
	case "sql":
		if *count < 1 {
			return fmt.Errorf("%w: --count must be at least 1, got %d", ErrUsage, *count)
		}
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		samples, err := netprobe.SQLRoundTrips(ctx, target, *count)
		if err != nil {
			return err
		}
		s, err := netprobe.Summarize(samples)
		if err != nil {
			return err
		}
		ms := func(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }
		_, err = fmt.Fprintf(stdout, "n=%d min_ms=%s median_ms=%s p99_ms=%s max_ms=%s mean_ms=%s stddev_ms=%s\n",
			s.N, ms(s.Min), ms(s.Median), ms(s.P99), ms(s.Max), ms(s.Mean), ms(s.Stddev))
		return err
	case "read":
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		r, err := netprobe.ReadAnswer(ctx, target, *query)
		if err != nil {
			return err
		}
		ms := func(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }
		_, err = fmt.Fprintf(stdout, "rows=%d bytes=%d first_row_ms=%s total_ms=%s\n", r.Rows, r.Bytes, ms(r.FirstRow), ms(r.Total))
		return err
	case "dial":
		outcome, err := netprobe.Dial(ctx, target, *timeout)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, outcome)
		return err
	}
	return fmt.Errorf("%w: unknown probe %q: want sql, read or dial", ErrUsage, probe)
}
