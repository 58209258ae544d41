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
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardlab/shardlab/lab/netprobe"
)

// ErrUsage marks a command-line mistake; the command exits with status 2.
var ErrUsage = errors.New("usage")

const usage = `Usage:
  netprobe sql [--count N] [--timeout D] DSN
      times N round trips of "SELECT 1" over one connection to DSN and prints
      n=N min_ms=... median_ms=... p99_ms=... max_ms=... mean_ms=... stddev_ms=...
  netprobe read [--query SQL] [--fetch N] [--timeout D] DSN
      runs SQL once over one connection to DSN, reads its answer row by row as it
      arrives (keeping none), and prints
      rows=N bytes=B first_row_ms=... total_ms=...
      --fetch N > 0 fetches it N rows at a time instead, as JDBC's fetch size does
      (in a transaction, Execute with a row limit until the answer ends)
  netprobe latency [--query SQL] [--key-max N] [--count N] [--rate R] [--seed S]
                   [--out FILE] [--timeout D] DSN
      sends SQL over one connection N times at R a second (0: each as soon as the
      last answer is in), $1 drawn from 1 to --key-max when that is set, times each
      from when it was due (a late send counts its wait), and prints
      n=N p50_ms=... p99_ms=... p999_ms=... max_ms=...
      --out writes the samples there, in microseconds, one a line
  netprobe quantiles FILE...
      the same summary of every sample in the files together
  netprobe slowest [--offset D] FILE...
      the model of "slowest of N": each FILE holds one server's samples; prints the
      quantiles of the slowest of one independent draw from each, plus D
      servers=N p50_ms=... p99_ms=... p999_ms=...
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
	fetch := fs.Uint("fetch", 0, "read: rows a part, fetched in parts (0: the whole answer at once)")
	timeout := fs.Duration("timeout", 10*time.Second, "sql, latency: bound on the whole probe (latency: the run's length plus a minute when not given); dial: bound on opening the connection")
	keyMax := fs.Int64("key-max", 0, "latency: $1 is drawn from 1 to this (0: the statement takes no parameter)")
	rate := fs.Float64("rate", 100, "latency: sends a second (0: closed loop)")
	seed := fs.Uint64("seed", 1, "latency: seeds the keys drawn")
	out := fs.String("out", "", "latency: file for the samples (microseconds, one a line)")
	offset := fs.Duration("offset", 0, "slowest: added to every quantile (the cost outside the servers)")
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
	if probe == "quantiles" || probe == "slowest" {
		if fs.NArg() == 0 {
			return fmt.Errorf("%w: %s takes one or more sample files", ErrUsage, probe)
		}
		return summarizeFiles(probe, fs.Args(), *offset, stdout)
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
	case "latency":
		if *count < 1 {
			return fmt.Errorf("%w: --count must be at least 1, got %d", ErrUsage, *count)
		}
		if *rate < 0 || *keyMax < 0 {
			return fmt.Errorf("%w: --rate and --key-max must not be negative", ErrUsage)
		}
		p := netprobe.Paced{Query: *query, KeyMax: *keyMax, N: *count, Seed: *seed}
		if *rate > 0 {
			p.Interval = time.Duration(float64(time.Second) / *rate)
		}
		bound := *timeout
		if !flagSet(fs, "timeout") {
			bound = time.Duration(*count)*p.Interval + time.Minute
		}
		ctx, cancel := context.WithTimeout(ctx, bound)
		defer cancel()
		samples, err := netprobe.Latencies(ctx, target, p)
		if err != nil {
			return err
		}
		if *out != "" {
			if err := writeSamples(*out, samples); err != nil {
				return err
			}
		}
		slices.Sort(samples)
		return printQuantiles(stdout, "n="+strconv.Itoa(len(samples)), samples, 0)
	case "read":
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		if *fetch > math.MaxUint32 {
			return fmt.Errorf("%w: --fetch %d: at most %d", ErrUsage, *fetch, uint32(math.MaxUint32))
		}
		var r netprobe.Read
		var err error
		if *fetch > 0 {
			r, err = netprobe.ReadAnswerInParts(ctx, target, *query, uint32(*fetch))
		} else {
			r, err = netprobe.ReadAnswer(ctx, target, *query)
		}
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
	return fmt.Errorf("%w: unknown probe %q: want sql, latency, quantiles, slowest, read or dial", ErrUsage, probe)
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func writeSamples(path string, samples []time.Duration) error {
	var b []byte
	for _, d := range samples {
		b = strconv.AppendInt(b, d.Microseconds(), 10)
		b = append(b, '\n')
	}
	return os.WriteFile(path, b, 0o644)
}

func readSamples(path string) ([]time.Duration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s []time.Duration
	for i, line := range strings.Fields(string(data)) {
		us, err := strconv.ParseInt(line, 10, 64)
		if err != nil || us < 0 {
			return nil, fmt.Errorf("%s: sample %d: %q is not a count of microseconds", path, i+1, line)
		}
		s = append(s, time.Duration(us)*time.Microsecond)
	}
	if len(s) == 0 {
		return nil, fmt.Errorf("%s: %w", path, netprobe.ErrNoSamples)
	}
	slices.Sort(s)
	return s, nil
}

// quantiles are the ones the tail experiment reports.
var quantiles = []struct {
	name string
	q    float64
}{{"p50_ms", 0.5}, {"p99_ms", 0.99}, {"p999_ms", 0.999}}

func printQuantiles(w io.Writer, head string, sorted []time.Duration, offset time.Duration) error {
	line := head
	for _, q := range quantiles {
		line += " " + q.name + "=" + msText(netprobe.Quantile(sorted, q.q)+offset)
	}
	_, err := fmt.Fprintf(w, "%s max_ms=%s\n", line, msText(sorted[len(sorted)-1]+offset))
	return err
}

func msText(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }

// summarizeFiles answers quantiles (every file's samples pooled) and slowest (the model
// of waiting for one server per file).
func summarizeFiles(probe string, paths []string, offset time.Duration, stdout io.Writer) error {
	sets := make([][]time.Duration, len(paths))
	for i, p := range paths {
		s, err := readSamples(p)
		if err != nil {
			return err
		}
		sets[i] = s
	}
	if probe == "quantiles" {
		all := slices.Concat(sets...)
		slices.Sort(all)
		return printQuantiles(stdout, "n="+strconv.Itoa(len(all)), all, 0)
	}
	line := "servers=" + strconv.Itoa(len(sets))
	for _, q := range quantiles {
		v, err := netprobe.SlowestOf(sets, q.q)
		if err != nil {
			return err
		}
		line += " " + q.name + "=" + msText(v+offset)
	}
	_, err := fmt.Fprintln(stdout, line)
	return err
}
