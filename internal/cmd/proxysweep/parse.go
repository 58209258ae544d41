// Package proxysweep is seed 001's experiment for the wire proxy: sysbench through the
// proxy at a range of thread counts, with and without pool aggregation, beside direct
// PostgreSQL and pgbouncer, on a throwaway PostgreSQL cluster of its own; and pgbench
// through a passthrough proxy beside pgbouncer in transaction mode. It runs the
// clients, samples the server's backend connections, parses the clients' output, and
// writes a CSV, charts and a report. scripts/proxy_sweep.sh is its front end.
package proxysweep

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Measure is what one client run measured.
type Measure struct {
	TPS, QPS   float64 // transactions and queries per second
	P95, P99   float64 // latency percentiles, milliseconds
	Errors     float64 // sysbench's ignored errors (deadlock retries), pgbench's failed transactions
	Latencies  int     // how many latencies the percentiles come from
	DurationS  float64
	ClientExit int
	// Transactions is how many transactions sysbench counted in its last report (the
	// measured part; its DurationS also covers the warm-up); 0 when not reported.
	Transactions float64
}

// ErrNoResult is returned for client output that holds no result.
var ErrNoResult = errors.New("proxysweep: no result in the client's output")

var (
	sbTransactions = regexp.MustCompile(`^\s*transactions:\s+(\d+)\s+\(([0-9.]+) per sec\.\)`)
	sbQueries      = regexp.MustCompile(`^\s*queries:\s+\d+\s+\(([0-9.]+) per sec\.\)`)
	sbIgnored      = regexp.MustCompile(`^\s*ignored errors:\s+(\d+)`)
	sbTime         = regexp.MustCompile(`^\s*total time:\s+([0-9.]+)s`)
	sbHistogram    = regexp.MustCompile(`^\s*([0-9.]+)\s+\|\**\s+(\d+)\s*$`)
)

// ParseSysbench reads sysbench's report, run with --histogram=on: throughput, ignored
// errors, and the 95th and 99th percentiles from the latency histogram. When the output
// holds several reports (--report-checkpoints ends a warm-up with one), the last counts.
func ParseSysbench(r io.Reader) (Measure, error) {
	var m Measure
	var hist []bucket
	found := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "Latency histogram") {
			// A report checkpoint (the end of the warm-up) printed one before: the
			// last report counts.
			hist = hist[:0]
		}
		if g := sbTransactions.FindStringSubmatch(line); g != nil {
			m.Transactions, _ = strconv.ParseFloat(g[1], 64)
			m.TPS, _ = strconv.ParseFloat(g[2], 64)
			found = true
		} else if g := sbQueries.FindStringSubmatch(line); g != nil {
			m.QPS, _ = strconv.ParseFloat(g[1], 64)
		} else if g := sbIgnored.FindStringSubmatch(line); g != nil {
			m.Errors, _ = strconv.ParseFloat(g[1], 64)
		} else if g := sbTime.FindStringSubmatch(line); g != nil {
			m.DurationS, _ = strconv.ParseFloat(g[1], 64)
		} else if g := sbHistogram.FindStringSubmatch(line); g != nil {
			v, err1 := strconv.ParseFloat(g[1], 64)
			n, err2 := strconv.ParseInt(g[2], 10, 64)
			if err1 == nil && err2 == nil {
				hist = append(hist, bucket{v, n})
			}
		}
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if !found {
		return m, ErrNoResult
	}
	m.P95, m.P99, m.Latencies = percentiles(hist)
	return m, nil
}

type bucket struct {
	value float64
	count int64
}

// percentiles returns the 95th and 99th percentiles of a histogram (bucket values in
// ascending order or not) and its count.
func percentiles(h []bucket) (p95, p99 float64, n int) {
	slices.SortFunc(h, func(a, b bucket) int { return compare(a.value, b.value) })
	var total int64
	for _, b := range h {
		total += b.count
	}
	if total == 0 {
		return math.NaN(), math.NaN(), 0
	}
	at := func(q float64) float64 {
		rank := int64(math.Ceil(q * float64(total)))
		var seen int64
		for _, b := range h {
			seen += b.count
			if seen >= rank {
				return b.value
			}
		}
		return h[len(h)-1].value
	}
	return at(0.95), at(0.99), int(total)
}

func compare(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

var (
	pgbTPS    = regexp.MustCompile(`^tps = ([0-9.]+) \(without initial connection time\)`)
	pgbFailed = regexp.MustCompile(`^number of failed transactions: (\d+)`)
)

// ParsePgbench reads pgbench's report and, from the per-transaction logs (pgbench -l),
// the latency percentiles; logs is the logs' content, one reader per file.
func ParsePgbench(report io.Reader, logs ...io.Reader) (Measure, error) {
	var m Measure
	found := false
	sc := bufio.NewScanner(report)
	for sc.Scan() {
		line := sc.Text()
		if g := pgbTPS.FindStringSubmatch(line); g != nil {
			m.TPS, _ = strconv.ParseFloat(g[1], 64)
			m.QPS = m.TPS
			found = true
		} else if g := pgbFailed.FindStringSubmatch(line); g != nil {
			m.Errors, _ = strconv.ParseFloat(g[1], 64)
		}
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if !found {
		return m, ErrNoResult
	}
	// A log line: client_id transaction_no time script_no time_epoch time_us, time in
	// microseconds.
	var lat []float64
	for _, l := range logs {
		sc := bufio.NewScanner(l)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 3 {
				continue
			}
			us, err := strconv.ParseFloat(f[2], 64)
			if err != nil {
				return m, fmt.Errorf("proxysweep: pgbench log line %q: %w", sc.Text(), err)
			}
			lat = append(lat, us/1000)
		}
		if err := sc.Err(); err != nil {
			return m, err
		}
	}
	m.Latencies = len(lat)
	m.P95, m.P99 = math.NaN(), math.NaN()
	if len(lat) > 0 {
		slices.Sort(lat)
		pick := func(q float64) float64 { return lat[max(int(math.Ceil(q*float64(len(lat))))-1, 0)] }
		m.P95, m.P99 = pick(0.95), pick(0.99)
	}
	return m, nil
}
