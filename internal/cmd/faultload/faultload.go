// Package faultload is the faultload command: traffic through the sharding proxy that
// logs every statement (lab/faultload), and the reading of that log against the faults
// scripts/netlab.sh run faults applied. cmd/faultload is a thin wrapper around Run.
package faultload

import (
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/shardlab/shardlab/lab/faultload"
)

// ErrUsage marks a command-line mistake; the command exits with status 2.
var ErrUsage = errors.New("usage")

// ErrFailedCheck is returned by analyze when an acknowledged write is missing or a
// pair is torn (exit status 3).
var ErrFailedCheck = errors.New("an acknowledged write is missing or a transaction is torn")

const usage = `Usage:
  faultload schema
      prints the statements that create the tables the traffic uses
  faultload run [--workers N] [--keys N] [--shard-map FILE] [--pace D] [--pairs]
                [--bound D] [--duration D] --events FILE DSN
      traffic through the proxy at DSN until --duration ends (or SIGINT/SIGTERM):
      each worker on its own connection reads a key of fault_items (1 to --keys),
      then inserts into fault_acks, in turn; with --pairs every other insert is a
      transaction of two keys. Every statement goes to --events as a CSV line: when
      it began and ended, its keys, and its SQLSTATE and error when it failed. A
      statement without an answer within --bound is given up (code "hang") and its
      connection dropped. With --shard-map (id,shard lines), worker w uses the keys
      of shard w mod the shards only, so that a shard that stops answering holds up
      its own workers only.
  faultload analyze --events FILE --windows FILE --shard-map FILE --found FILE
                    [--out FILE]
      reads the log against the faults: --windows has a line kind,shard,begin_us,
      healed_us per fault (shard: its index, as data source ds_<index>); --shard-map
      a line id,shard per key; --found the rows of fault_acks read back (id,worker,
      seq). Writes one CSV row per fault (stdout or --out): the other shards'
      statements before and during it, the faulty shard's, the time to detect and
      to recover, the longest a failing statement took, hangs and the errors seen.
      Then checks that every acknowledged insert was read back and that no pair is
      torn; fails with exit status 3 when one is.

Flags:
`

// Run runs the command with args (without the program name).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("faultload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	workers := fs.Int("workers", 8, "run: connections")
	keys := fs.Int64("keys", 10000, "run: ids of fault_items, 1 to this")
	pace := fs.Duration("pace", 10*time.Millisecond, "run: gap between a worker's statements")
	pairs := fs.Bool("pairs", false, "run: every other insert a transaction of two keys")
	bound := fs.Duration("bound", 60*time.Second, "run: how long a statement may go unanswered before the client gives up (a hang)")
	duration := fs.Duration("duration", time.Minute, "run: length of the traffic")
	seed := fs.Uint64("seed", 1, "run: seed of the keys")
	events := fs.String("events", "", "the event log (run writes it, analyze reads it)")
	windows := fs.String("windows", "", "analyze: the faults applied")
	shardMap := fs.String("shard-map", "", "id,shard lines: run gives each worker one shard's keys; analyze tells the faulty shard's statements from the others'")
	found := fs.String("found", "", "analyze: id,worker,seq lines of fault_acks read back")
	out := fs.String("out", "", "analyze: the results CSV (default stdout)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if len(args) == 0 {
		fs.Usage()
		return fmt.Errorf("%w: give schema, run or analyze", ErrUsage)
	}
	sub := args[0]
	if sub == "-h" || sub == "--help" || sub == "-help" {
		fs.Usage()
		return flag.ErrHelp
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if sub == "schema" {
		if fs.NArg() != 0 {
			return fmt.Errorf("%w: schema takes no arguments", ErrUsage)
		}
		_, err := fmt.Fprintf(stdout, "%s;\n%s;\n", faultload.CreateItems, faultload.CreateAcks)
		return err
	}
	if *events == "" {
		return fmt.Errorf("%w: --events is required", ErrUsage)
	}
	switch sub {
	case "run":
		if fs.NArg() != 1 {
			return fmt.Errorf("%w: run takes the proxy's DSN", ErrUsage)
		}
		if *workers < 1 || *keys < 2 || *bound <= 0 || *duration <= 0 || *pace < 0 {
			return fmt.Errorf("%w: want --workers >= 1, --keys >= 2, and a positive --bound and --duration", ErrUsage)
		}
		var byShard [][]int64
		if *shardMap != "" {
			m, err := readCSV(*shardMap, 2)
			if err != nil {
				return err
			}
			for _, r := range m {
				if r[1] < 0 || r[1] > 1000 {
					return fmt.Errorf("%s: shard %d out of range", *shardMap, r[1])
				}
				for int(r[1]) >= len(byShard) {
					byShard = append(byShard, nil)
				}
				byShard[r[1]] = append(byShard[r[1]], r[0])
			}
		}
		f, err := os.Create(*events)
		if err != nil {
			return err
		}
		defer f.Close()
		log, err := faultload.NewLog(f)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, *duration)
		defer cancel()
		var n, failed int
		var werr error
		err = faultload.Run(ctx, faultload.Traffic{DSN: fs.Arg(0), Workers: *workers, Keys: *keys, ByShard: byShard, Pace: *pace, Pairs: *pairs, Bound: *bound, Seed: *seed},
			func(e faultload.Event) {
				n++
				if !e.OK() {
					failed++
				}
				if werr == nil {
					werr = log.Write(e)
				}
			})
		if err == nil {
			err = werr
		}
		if err == nil {
			err = log.Flush()
		}
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "statements=%d failed=%d\n", n, failed)
		return err
	case "analyze":
		if fs.NArg() != 0 || *windows == "" || *shardMap == "" || *found == "" {
			return fmt.Errorf("%w: analyze takes --events, --windows, --shard-map and --found", ErrUsage)
		}
		return analyze(*events, *windows, *shardMap, *found, *out, stdout)
	}
	return fmt.Errorf("%w: unknown subcommand %q: want schema, run or analyze", ErrUsage, sub)
}

func readCSV(path string, fields int) ([][]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	recs, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out [][]int64
	for i, rec := range recs {
		if len(rec) < fields {
			return nil, fmt.Errorf("%s:%d: want %d fields, got %d", path, i+1, fields, len(rec))
		}
		row := make([]int64, fields)
		for j := range fields {
			v, err := strconv.ParseInt(strings.TrimSpace(rec[len(rec)-fields+j]), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %q is not a number", path, i+1, rec[len(rec)-fields+j])
			}
			row[j] = v
		}
		out = append(out, row)
	}
	return out, nil
}

func analyze(eventsPath, windowsPath, mapPath, foundPath, outPath string, stdout io.Writer) error {
	ef, err := os.Open(eventsPath)
	if err != nil {
		return err
	}
	events, err := faultload.ReadLog(ef)
	ef.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", eventsPath, err)
	}
	// windows: kind,shard,begin_us,healed_us; the kind is text, the rest numbers.
	wf, err := os.Open(windowsPath)
	if err != nil {
		return err
	}
	wrecs, err := csv.NewReader(wf).ReadAll()
	wf.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", windowsPath, err)
	}
	var windows []faultload.Window
	for i, rec := range wrecs {
		if len(rec) != 4 {
			return fmt.Errorf("%s:%d: want kind,shard,begin_us,healed_us", windowsPath, i+1)
		}
		var v [3]int64
		for j := range v {
			if v[j], err = strconv.ParseInt(rec[j+1], 10, 64); err != nil {
				return fmt.Errorf("%s:%d: %q is not a number", windowsPath, i+1, rec[j+1])
			}
		}
		windows = append(windows, faultload.Window{Kind: rec[0], Shard: int(v[0]), Begin: time.UnixMicro(v[1]), Healed: time.UnixMicro(v[2])})
	}
	m, err := readCSV(mapPath, 2)
	if err != nil {
		return err
	}
	shards := make(map[int64]int, len(m))
	for _, r := range m {
		shards[r[0]] = int(r[1])
	}
	missing := 0
	shardOf := func(k int64) int {
		s, ok := shards[k]
		if !ok {
			missing++
			return -1
		}
		return s
	}
	rows, err := readCSV(foundPath, 3)
	if err != nil {
		return err
	}
	found := make(map[faultload.Ack]bool, len(rows))
	for _, r := range rows {
		found[faultload.Ack{ID: r[0], Worker: int(r[1]), Seq: r[2]}] = true
	}
	results := faultload.Analyze(events, windows, shardOf, func(i int) string { return "ds_" + strconv.Itoa(i) })
	if missing > 0 {
		return fmt.Errorf("%s: %d statements' keys have no shard", mapPath, missing)
	}
	w := stdout
	if outPath != "" {
		f, err := os.Create(outPath)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	cw := csv.NewWriter(w)
	ms := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64)
	}
	// never: a time that did not happen (nothing failed, nothing recovered) is empty,
	// not 0.0, which would read as at once.
	never := func(d time.Duration) string {
		if d == 0 {
			return ""
		}
		return ms(d)
	}
	itoa := strconv.Itoa
	cw.Write([]string{"fault", "shard", "duration_s", "others_before_n", "others_before_p50_ms", "others_before_p99_ms",
		"others_n", "others_errors", "others_p50_ms", "others_p99_ms", "faulty_n", "faulty_errors", "faulty_p50_ms",
		"detect_ms", "fail_max_ms", "recover_ms", "after_recovery_n", "after_recovery_errors", "hangs", "errors_naming_shard", "errors"})
	for _, r := range results {
		var errs []string
		for _, e := range r.Errors {
			errs = append(errs, fmt.Sprintf("%dx %s %s", e.N, e.Code, e.Message))
		}
		cw.Write([]string{r.Kind, "ds_" + itoa(r.Shard), strconv.FormatFloat(r.Healed.Sub(r.Begin).Seconds(), 'f', 1, 64),
			itoa(r.Baseline.N), ms(r.Baseline.P50), ms(r.Baseline.P99),
			itoa(r.Others.N), itoa(r.Others.Errors), ms(r.Others.P50), ms(r.Others.P99),
			itoa(r.Faulty.N), itoa(r.Faulty.Errors), ms(r.Faulty.P50),
			never(r.Detect), never(r.FailMax), never(r.Recover), itoa(r.AfterRecovery.N), itoa(r.AfterRecovery.Errors),
			itoa(r.Hangs), itoa(r.Named), strings.Join(errs, " | ")})
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return err
	}
	lost, torn := faultload.Check(events, found)
	acked, _ := faultload.Acknowledged(events)
	fmt.Fprintf(stdout, "acknowledged=%d read_back=%d lost=%d torn_pairs=%d\n", len(acked), len(found), len(lost), len(torn))
	if len(lost) > 0 || len(torn) > 0 {
		return fmt.Errorf("%w: lost %v, torn %v", ErrFailedCheck, first(lost), len(torn))
	}
	return nil
}

func first(a []faultload.Ack) []faultload.Ack { return a[:min(len(a), 5)] }
