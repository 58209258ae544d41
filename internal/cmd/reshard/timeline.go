package reshard

import (
	"bufio"
	"cmp"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/shardlab/shardlab/lab/charts"
)

// The timeline command reads a run directory of scripts/reshard_tpcb.sh and reports
// the move under load: its steps' durations, the copy rate, the replication lag, the
// longest wait of a client, latency and throughput around the cutover, failures, the
// reader's counts, the TPC-B invariant, where the rows ended, and a timeline chart.

// txn is one pgbench transaction: when it ended (unix µs), its latency (from its
// scheduled start under -R, so the schedule lag included) and its schedule lag (µs).
type txn struct {
	end, latency, lag int64
	failed            bool
}

// readTransactions reads pgbench's per-transaction log ("client_id transaction_no
// time script_no time_epoch time_us [schedule_lag]"), plain or gzipped.
func readTransactions(path string) ([]txn, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return nil, err
		}
		defer gz.Close()
		r = gz
	}
	var out []txn
	// Each client's last transaction is left out: the line of the one a thread
	// logged last may be cut short when pgbench was stopped, and a cut lag still
	// parses (a lag of 781 for 78103462 made a 78 s transaction of one on schedule).
	// That line is some client's last.
	last := map[string]int{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 7 {
			// Under -R every line has seven fields; a thread's last line cut short
			// when pgbench was stopped may run into the next file's first.
			continue
		}
		sec, err1 := strconv.ParseInt(fs[4], 10, 64)
		us, err2 := strconv.ParseInt(fs[5], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		t := txn{end: sec*1_000_000 + us}
		if fs[2] == "failed" {
			t.failed = true
		} else if fs[2] == "skipped" {
			continue
		} else if t.latency, err = strconv.ParseInt(fs[2], 10, 64); err != nil {
			continue
		}
		if len(fs) >= 7 {
			t.lag, _ = strconv.ParseInt(fs[6], 10, 64)
		}
		last[fs[0]] = len(out)
		out = append(out, t)
	}
	drop := map[int]bool{}
	for _, i := range last {
		drop[i] = true
	}
	kept := out[:0]
	for i, t := range out {
		if !drop[i] {
			kept = append(kept, t)
		}
	}
	out = kept
	slices.SortFunc(out, func(a, b txn) int { return int(a.end - b.end) })
	return out, sc.Err()
}

// readEvents reads "unix_ms name" lines.
func readEvents(path string) (map[string]int64, []string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	at := map[string]int64{}
	var order []string
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		ms, name, ok := strings.Cut(line, " ")
		v, err := strconv.ParseInt(ms, 10, 64)
		if !ok || err != nil {
			continue
		}
		at[name] = v
		order = append(order, name)
	}
	return at, order, nil
}

func percentile(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// window returns the latencies (µs) of the transactions that ended in [from, to) ms.
func window(ts []txn, from, to int64) []int64 {
	var out []int64
	for _, t := range ts {
		if !t.failed && t.end >= from*1000 && t.end < to*1000 {
			out = append(out, t.latency)
		}
	}
	slices.Sort(out)
	return out
}

// longestThrough returns the greatest latency among the transactions that ran through
// a hold from hs to he (unix ms; transactions that ended after hs and started before
// 1 s after he), counted from their scheduled start and from their actual start.
func longestThrough(ts []txn, hs, he int64) (longest, longestRun int64) {
	for _, t := range ts {
		start := t.end - t.latency
		if !t.failed && t.end >= hs*1000 && start <= he*1000+1_000_000 {
			longest = max(longest, t.latency)
			longestRun = max(longestRun, t.latency-t.lag)
		}
	}
	return longest, longestRun
}

func readFile(dir, name string) string {
	b, _ := os.ReadFile(filepath.Join(dir, name))
	return strings.TrimSpace(string(b))
}

// copyHeld says, from start's progress, how long a copy with --max-active was held
// ("" for a copy without the hold).
func copyHeld(progress string) string {
	held := ""
	for line := range strings.SplitSeq(progress, "\n") {
		if _, rest, ok := strings.Cut(line, ", held "); ok {
			held = strings.TrimSuffix(rest, ")")
		}
	}
	return held
}

// verifiedHow says how verify compared, from its report: pinned, with the longest
// wait of a table's writes, or not.
func verifiedHow(report string) string {
	for line := range strings.SplitSeq(report, "\n") {
		if wait, ok := strings.CutPrefix(line, "pinned: each table compared at one point of its source; "); ok {
			return "under load, each table pinned to one point of its source's WAL: " + wait
		}
		if rest, ok := strings.CutPrefix(line, "pinned: each range of chunks compared at one point of its source "); ok {
			return "under load, each range of chunks pinned to one point of its source's WAL " + rest
		}
	}
	return "under load; it is not pinned to one WAL position"
}

// oldestOpen reads the samples of the oldest open transaction (lines "<ms> <seconds>"):
// the greatest, and how many samples there are.
func oldestOpen(samples string) (oldest float64, n int) {
	for line := range strings.SplitSeq(samples, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		s, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		oldest, n = max(oldest, s), n+1
	}
	return oldest, n
}

// verifyHeld says, from verify's report, how long a verify with --max-active was held
// in all; "" without the hold.
func verifyHeld(report string) string {
	for line := range strings.SplitSeq(report, "\n") {
		if held, ok := strings.CutPrefix(line, "held "); ok {
			return held
		}
	}
	return ""
}

// timeline reports run directory dir (accounts: how many the reader must count).
func timeline(dir string, accounts int64, stdout io.Writer) error {
	ts, err := readTransactions(filepath.Join(dir, "transactions.log.gz"))
	if errors.Is(err, os.ErrNotExist) {
		ts, err = readTransactions(filepath.Join(dir, "transactions.log"))
	}
	if err != nil {
		return fmt.Errorf("pgbench's transaction log: %w", err)
	}
	ev, order, err := readEvents(filepath.Join(dir, "events.txt"))
	if err != nil {
		return err
	}
	// Only transactions that ended while the load ran (a damaged line may parse into
	// another time).
	ts = slices.DeleteFunc(ts, func(t txn) bool { return t.end < ev["load"]*1000 || t.end > (ev["stop"]+5000)*1000 })
	if len(ts) == 0 {
		return errors.New("pgbench's transaction log has no transaction during the load")
	}
	// The move ends with a finish, or with a revert back to the old layout.
	end := "finish"
	if _, ok := ev["revert_start"]; ok {
		end = "revert"
	}
	for _, need := range []string{"load", "copy_start", "copy_ready", "cutover_start", "cutover_end", end + "_start", end + "_end", "stop"} {
		if _, ok := ev[need]; !ok {
			return fmt.Errorf("events.txt has no %s: the run did not finish", need)
		}
	}
	secs := func(a, b string) float64 { return float64(ev[b]-ev[a]) / 1000 }
	var b strings.Builder
	rate := strings.Fields(readFile(dir, "rate.txt"))
	fmt.Fprintf(&b, "command: %s\n", readFile(dir, "command.txt"))
	if len(rate) == 2 {
		fmt.Fprintf(&b, "load: pgbench TPC-B -M extended through shard-proxy at %s tps (pgbench -R), %s measured just before\n", rate[1], rate[0])
	}

	// The steps.
	var copied int64
	for line := range strings.SplitSeq(readFile(dir, "copied-accounts.txt"), "\n") {
		n, _ := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
		copied += n
	}
	copySecs := secs("copy_start", "copy_ready")
	fmt.Fprintf(&b, "copy: %.1f s (status polled every 2 s), %d accounts to the new data sources (%.0f rows/s, pgbench_history and the broadcast tables besides)\n",
		copySecs, copied, float64(copied)/copySecs)
	if held := copyHeld(readFile(dir, "start.txt")); held != "" {
		fmt.Fprintf(&b, "  the copy was held %s\n", held)
	}
	if _, ok := ev["verify_end"]; ok {
		verdict := "clean"
		switch {
		case readFile(dir, "verify-rc.txt") == "0":
		case !strings.Contains(readFile(dir, "verify.txt"), "\ncompared in "):
			verdict = "FAILED (verify.stderr)" // no report: it did not compare
		default:
			verdict = "DIFFERENCES (verify.txt)"
		}
		if strings.HasPrefix(verdict, "FAILED") {
			fmt.Fprintf(&b, "verify: %.1f s, %s\n", secs("verify_start", "verify_end"), verdict)
		} else {
			fmt.Fprintf(&b, "verify: %.1f s, %s (%s)\n", secs("verify_start", "verify_end"), verdict, verifiedHow(readFile(dir, "verify.txt")))
		}
		if held := verifyHeld(readFile(dir, "verify.txt")); held != "" {
			fmt.Fprintf(&b, "  verify was held %s\n", held)
		}
		if oldest, n := oldestOpen(readFile(dir, "snapshots.txt")); n > 0 {
			fmt.Fprintf(&b, "  the oldest transaction open on the servers during verify: %.1f s (snapshots.txt, %d samples a second apart)\n", oldest, n)
		}
	}
	holds := []string{"cutover"}
	if end == "revert" {
		holds = append(holds, "revert")
	}
	for _, h := range holds {
		steps := map[string]string{}
		for line := range strings.SplitSeq(readFile(dir, h+".txt"), "\n") {
			if k, v, ok := strings.Cut(line, "\t"); ok {
				steps[k] = v
			}
		}
		fmt.Fprintf(&b, "%s: the proxy paused %s ms (drain %s, catch-up %s, switch %s); the command took %.2f s\n",
			h, steps["pause"], steps["drain"], steps["catch_up"], steps["switch"], secs(h+"_start", h+"_end"))
	}
	if end == "finish" {
		fmt.Fprintf(&b, "finish: %.1f s\n", secs("finish_start", "finish_end"))
	}

	// Clients.
	var failed int
	for _, t := range ts {
		if t.failed {
			failed++
		}
	}
	aborted := strings.Count(readFile(dir, "pgbench.stderr"), "aborted")
	fmt.Fprintf(&b, "transactions: %d logged, %d failed, %d client aborts (pgbench.stderr)\n", len(ts), failed, aborted)
	// The longest wait: among the transactions that ran through the cutover, the
	// greatest latency. Under pgbench -R a transaction's latency runs from the moment
	// it was scheduled, so a transaction the hold delayed counts the delay, and so do
	// the client's next ones, scheduled meanwhile (no coordinated omission).
	// The hold's own share is the time from a transaction's actual start (its
	// schedule lag after the scheduled one) to its end: a backlog that a saturated
	// load built up before does not count there.
	for _, h := range holds {
		longest, longestRun := longestThrough(ts, ev[h+"_start"], ev[h+"_end"])
		fmt.Fprintf(&b, "the longest wait of a client through the %s: %.1f ms from a transaction's scheduled start (schedule lag included), %.1f ms from its actual start\n",
			h, float64(longest)/1000, float64(longestRun)/1000)
	}
	cs, ce := ev["cutover_start"], ev["cutover_end"]
	var before []int64
	for _, t := range ts {
		if !t.failed && t.end >= (ev["load"]+2000)*1000 && t.end < ev["copy_start"]*1000 {
			before = append(before, t.latency-t.lag)
		}
	}
	slices.Sort(before)
	fmt.Fprintf(&b, "  (from the actual start, before the move: p99 %.2f ms, max %.2f ms)\n", float64(percentile(before, 0.99))/1000, float64(percentile(before, 1))/1000)
	// The bystander load: a table of the default data source, which the hold does
	// not pause.
	bs, err := readTransactions(filepath.Join(dir, "bystander.log.gz"))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("the bystander load's transaction log: %w", err)
	default:
		var bfailed int
		for _, t := range bs {
			if t.failed {
				bfailed++
			}
		}
		fmt.Fprintf(&b, "bystander load (a table of the default data source, which the move leaves where it is): %d transactions logged, %d failed\n", len(bs), bfailed)
		var bbefore []int64
		for _, t := range bs {
			if !t.failed && t.end >= (ev["load"]+2000)*1000 && t.end < ev["copy_start"]*1000 {
				bbefore = append(bbefore, t.latency-t.lag)
			}
		}
		slices.Sort(bbefore)
		for _, h := range holds {
			longest, longestRun := longestThrough(bs, ev[h+"_start"], ev[h+"_end"])
			fmt.Fprintf(&b, "  its longest wait through the %s: %.1f ms from the scheduled start, %.1f ms from the actual start (before the move: p99 %.2f ms, max %.2f ms)\n",
				h, float64(longest)/1000, float64(longestRun)/1000, float64(percentile(bbefore, 0.99))/1000, float64(percentile(bbefore, 1))/1000)
		}
	}
	pre := window(ts, ev["load"]+2000, ev["copy_start"])
	during := window(ts, ev["copy_start"], ev["copy_ready"])
	around := window(ts, cs-1000, ce+1000)
	after := window(ts, ev[end+"_end"], ev["stop"])
	ms := func(us int64) float64 { return float64(us) / 1000 }
	fmt.Fprintf(&b, "p99 latency: before the move %.2f ms, during the copy %.2f ms, from 1 s before to 1 s after the cutover %.2f ms, after the %s %.2f ms\n",
		ms(percentile(pre, 0.99)), ms(percentile(during, 0.99)), ms(percentile(around, 0.99)), end, ms(percentile(after, 0.99)))
	if end == "revert" {
		fmt.Fprintf(&b, "p99 latency from 1 s before to 1 s after the revert: %.2f ms\n", ms(percentile(window(ts, ev["revert_start"]-1000, ev["revert_end"]+1000), 0.99)))
	}
	// What the copy and verify cost the load: the throughput against the rate asked,
	// and the latencies (a pinned verify holds each table's writes a moment).
	for _, step := range []struct{ name, start, end string }{{"the copy", "copy_start", "copy_ready"}, {"verify", "verify_start", "verify_end"}} {
		if _, ok := ev[step.end]; !ok {
			continue
		}
		var run []int64
		for _, t := range ts {
			if !t.failed && t.end >= ev[step.start]*1000 && t.end < ev[step.end]*1000 {
				run = append(run, t.latency-t.lag)
			}
		}
		slices.Sort(run)
		fmt.Fprintf(&b, "during %s: %.0f tps; p99 latency %.2f ms; from the actual start, p99 %.2f ms, max %.2f ms\n", step.name,
			float64(len(run))/(float64(ev[step.end]-ev[step.start])/1000),
			ms(percentile(window(ts, ev[step.start], ev[step.end]), 0.99)), ms(percentile(run, 0.99)), ms(percentile(run, 1)))
	}
	fmt.Fprintf(&b, "p50 latency: before %.2f ms, around the cutover %.2f ms\n", ms(percentile(pre, 0.5)), ms(percentile(around, 0.5)))

	// The reader.
	var reads, wrong int
	var badSample string
	for line := range strings.SplitSeq(readFile(dir, "reader.txt"), "\n") {
		fs := strings.Fields(line)
		if len(fs) < 2 {
			continue
		}
		reads++
		if n, err := strconv.ParseInt(fs[1], 10, 64); err != nil || n != accounts {
			wrong++
			if badSample == "" {
				badSample = line
			}
		}
	}
	fmt.Fprintf(&b, "reader: %d counts of pgbench_accounts through the proxy, %d not %d", reads, wrong, accounts)
	if badSample != "" {
		fmt.Fprintf(&b, " (first: %q)", badSample)
	}
	b.WriteString("\n")

	// Lag.
	var maxLag int64
	lagAt := map[int64]int64{} // second -> the greatest lag of any slot then
	for line := range strings.SplitSeq(readFile(dir, "lag.txt"), "\n") {
		fs := strings.Fields(line)
		if len(fs) != 3 {
			continue
		}
		at, _ := strconv.ParseInt(fs[0], 10, 64)
		v, _ := strconv.ParseInt(fs[2], 10, 64)
		if at >= ev["copy_start"] && at < ev["cutover_start"] {
			// After the cutover the stopped streams' slots hold WAL until finish
			// drops them: that is not lag.
			maxLag = max(maxLag, v)
		}
		lagAt[at/1000] = max(lagAt[at/1000], v)
	}
	fmt.Fprintf(&b, "replication lag from the copy's start to the cutover: at most %.1f MB of WAL behind (lag.txt; per second in timeline.csv, empty where no sample)\n", float64(maxLag)/1e6)

	// The invariant and the placement.
	inv := strings.Fields(readFile(dir, "invariant.txt"))
	if len(inv) == 5 {
		ok := inv[0] == inv[1] && inv[1] == inv[2] && inv[2] == inv[3]
		fmt.Fprintf(&b, "TPC-B invariant: sum(abalance) %s, sum(bbalance) %s, sum(tbalance) %s, sum(delta) %s: %s; %s accounts\n",
			inv[0], inv[1], inv[2], inv[3], map[bool]string{true: "equal", false: "NOT EQUAL"}[ok], inv[4])
	}
	var misplaced, total, leftovers int64
	bsums := map[string]bool{}
	for line := range strings.SplitSeq(readFile(dir, "placement.txt"), "\n") {
		fs := strings.Fields(line)
		if len(fs) != 5 {
			continue
		}
		n, _ := strconv.ParseInt(fs[1], 10, 64)
		m, _ := strconv.ParseInt(fs[2], 10, 64)
		l, _ := strconv.ParseInt(fs[4], 10, 64)
		total, misplaced, leftovers = total+n, misplaced+m, leftovers+l
		if fs[3] != "-" { // a data source the layout in force does not name
			bsums[fs[3]] = true
		}
	}
	// placement-of.txt says which data sources the placement was checked against
	// (runs before it was written checked the four of a growth, or the two a revert
	// returned to).
	of := readFile(dir, "placement-of.txt")
	switch {
	case of != "":
	case end == "revert":
		of = "the two data sources of the old layout"
	default:
		of = "the four data sources"
	}
	fmt.Fprintf(&b, "placement: %d accounts, %d of them not where the layout in force places them, checked on %s; the branches' balances agree on every data source: %v; %d slots, subscriptions or publications left\n",
		total, misplaced, of, len(bsums) == 1, leftovers)
	if end == "revert" {
		fmt.Fprintf(&b, "the data sources the move added: %s\n", cmp.Or(readFile(dir, "added.txt"), "(added.txt is missing)"))
	}

	// The timeline.
	t0 := ev["load"] / 1000
	last := ts[len(ts)-1].end / 1_000_000
	var samples []charts.Sample
	var csv strings.Builder
	csv.WriteString("second,tps,p50_ms,p99_ms,max_ms,failed,lag_bytes\n")
	i := 0
	for s := t0; s <= last; s++ {
		var lat []int64
		var fails int
		for ; i < len(ts) && ts[i].end < (s+1)*1_000_000; i++ {
			if ts[i].end < s*1_000_000 {
				continue
			}
			if ts[i].failed {
				fails++
				continue
			}
			lat = append(lat, ts[i].latency)
		}
		slices.Sort(lat)
		p99 := ms(percentile(lat, 0.99))
		lag := ""
		if v, ok := lagAt[s]; ok {
			lag = strconv.FormatInt(v, 10)
		}
		fmt.Fprintf(&csv, "%d,%d,%.3f,%.3f,%.3f,%d,%s\n", s-t0, len(lat), ms(percentile(lat, 0.5)), p99, ms(percentile(lat, 1)), fails, lag)
		samples = append(samples, charts.Sample{T: float64(s - t0), Throughput: float64(len(lat)), P99: p99})
	}
	if err := os.WriteFile(filepath.Join(dir, "timeline.csv"), []byte(csv.String()), 0o644); err != nil {
		return err
	}
	var marks []charts.Mark
	for _, name := range order {
		if name == "load" || name == "stop" {
			continue
		}
		// On the bins' clock: second s holds the transactions that ended in it.
		marks = append(marks, charts.Mark{T: float64(ev[name]-t0*1000) / 1000, Label: strings.ReplaceAll(name, "_", " ")})
	}
	title := "pgbench TPC-B through shard-proxy while it reshards from 2 to 4 data sources"
	if end == "revert" {
		title = "TPC-B through shard-proxy: 2 to 4 data sources, then a revert"
	}
	chart := charts.TimelineChart{Title: title,
		Series: []charts.Timeline{{Label: "per second", Trials: [][]charts.Sample{samples}}}, Marks: marks}
	if err := charts.Save(chart, filepath.Join(dir, "timeline.svg"), filepath.Join(dir, "timeline.png")); err != nil {
		return err
	}
	b.WriteString("timeline: timeline.csv, timeline.svg, timeline.png\n")
	_, err = io.WriteString(stdout, b.String())
	return err
}
