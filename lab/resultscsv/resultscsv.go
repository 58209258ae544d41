// Package resultscsv reads and writes the lab's results CSV: one row per measured run of
// loadgen, appended by the scenario scripts to the results.csv of their run directory
// (results/runs/<run-id>/). Every row carries what is needed to rerun it (parameters,
// build and machine), so a report can be regenerated from the file alone. The columns are
// documented in docs/results-csv.md.
package resultscsv

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrHeaderMismatch is returned by Append when the file already holds a header other than
// Columns: appending would mix two layouts in one file, so the caller must move it aside.
var ErrHeaderMismatch = errors.New("resultscsv: existing CSV header differs from this version's columns")

// ErrMissingColumn is returned by Read when the file lacks a column every row needs.
var ErrMissingColumn = errors.New("resultscsv: CSV lacks a required column")

// Row is one measured run.
type Row struct {
	Timestamp      time.Time // when the measured phase ended (UTC)
	Scenario       string    // scenario label, e.g. read_heavy_cachelike
	Mode           string    // single or sharded
	Shards         int       // shard count (1 in single mode)
	Ops            int64     // requests completed in the measured phase
	Concurrency    int       // concurrent workers (simulated users)
	WriteRatio     float64   // share of requests that are writes, 0..1
	ThroughputOpsS float64   // completed requests per second of the measured phase
	AvgMs          float64   // mean response time
	P50Ms          float64   // response-time percentiles
	P95Ms          float64
	P99Ms          float64
	MaxMs          float64
	Errors         int64 // failed requests (any kind)

	P999Ms      float64 // 99.9th percentile response time
	RunID       string  // groups rows of one script invocation (comparisons are made within a run)
	Trial       int     // 1-based trial number within the run
	Backend     string  // sqlite or postgres
	Router      string  // crc32 or jump
	Sync        string  // SQLite synchronous setting (normal or full), empty for other backends
	PoolSize    int     // connections per shard (reads), as configured on the server
	Keys        int     // key-space size
	Dist        string  // key distribution: uniform, zipfian or hotspot
	Rate        float64 // open-loop target rate in requests/s, 0 for closed loop
	Late        int64   // open loop: requests that started more than 1 ms after their intended time
	SvcP50Ms    float64 // service time (from actual send) percentiles; equal to response time in closed loop
	SvcP99Ms    float64
	ReadHitRate float64 // share of reads that found their key
	DurationS   float64 // length of the measured phase in seconds
	Seed        int64   // random seed of the workload
	GitCommit   string  // commit of the lab that ran
	GoVersion   string  // Go toolchain that built it
	CPUs        int     // logical CPUs of the machine
	CPUModel    string  // CPU model name
	SQLiteVer   string  // SQLite library version (sqlite backend)

	// What the run was asked to do, beyond the columns above, so it can be rerun exactly.
	RequestedOps       int64   // --ops asked for (0 when the run was timed)
	RequestedDurationS float64 // --duration asked for, seconds (0 when counted in ops)
	WarmupS            float64 // unmeasured warm-up, seconds
	Preload            bool    // every key written once before measuring
	Arrival            string  // open-loop spacing: constant or poisson (empty in closed loop)
	DataSize           int     // bytes of data per write
	Command            string  // the script command line that produced the row, when a script ran it
}

// Columns returns the CSV header, in order. The first fourteen are the seed lab's columns.
func Columns() []string { return slices.Clone(columns) }

var columns = []string{
	"timestamp", "scenario", "mode", "shards", "ops", "concurrency", "write_ratio",
	"throughput_ops_s", "avg_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms", "errors",
	"p999_ms", "run_id", "trial", "backend", "router", "sync", "pool_size", "keys", "dist",
	"rate", "late", "svc_p50_ms", "svc_p99_ms", "read_hit_rate", "duration_s", "seed",
	"git_commit", "go_version", "cpus", "cpu_model", "sqlite_version",
	"requested_ops", "requested_duration_s", "warmup_s", "preload", "arrival", "data_size", "command",
}

func ftoa(f float64, prec int) string { return strconv.FormatFloat(f, 'f', prec, 64) }

// record renders r in the order of Columns.
func (r Row) record() []string {
	return []string{
		r.Timestamp.UTC().Format(time.RFC3339), r.Scenario, r.Mode, strconv.Itoa(r.Shards),
		strconv.FormatInt(r.Ops, 10), strconv.Itoa(r.Concurrency), ftoa(r.WriteRatio, 3),
		ftoa(r.ThroughputOpsS, 1), ftoa(r.AvgMs, 3), ftoa(r.P50Ms, 3), ftoa(r.P95Ms, 3),
		ftoa(r.P99Ms, 3), ftoa(r.MaxMs, 3), strconv.FormatInt(r.Errors, 10),
		ftoa(r.P999Ms, 3), r.RunID, strconv.Itoa(r.Trial), r.Backend, r.Router, r.Sync,
		strconv.Itoa(r.PoolSize), strconv.Itoa(r.Keys), r.Dist, ftoa(r.Rate, 1),
		strconv.FormatInt(r.Late, 10), ftoa(r.SvcP50Ms, 3), ftoa(r.SvcP99Ms, 3),
		ftoa(r.ReadHitRate, 4), ftoa(r.DurationS, 3), strconv.FormatInt(r.Seed, 10),
		r.GitCommit, r.GoVersion, strconv.Itoa(r.CPUs), r.CPUModel, r.SQLiteVer,
		strconv.FormatInt(r.RequestedOps, 10), ftoa(r.RequestedDurationS, 3), ftoa(r.WarmupS, 3),
		strconv.FormatBool(r.Preload), r.Arrival, strconv.Itoa(r.DataSize), r.Command,
	}
}

// Append adds rows to the CSV file at path, writing the header first when the file is
// new or empty. The file is locked (flock) while the header is checked and the rows are
// appended with one write in O_APPEND mode, then synced: several loadgens appending to
// one file do not overwrite each other, and a crash leaves whole rows or none.
func Append(path string, rows ...Row) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("results CSV: %w", err) // err names the file
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", path, err)
	}
	// Closing the file releases the lock.
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("results CSV: %w", err)
	}
	var b strings.Builder
	w := csv.NewWriter(&b)
	if st.Size() == 0 {
		w.Write(columns)
	} else {
		header, err := csv.NewReader(f).Read()
		if err != nil {
			return fmt.Errorf("read header of %s: %w", path, err)
		}
		if !slices.Equal(header, columns) {
			return fmt.Errorf("%w: %s (move it aside to start a new file)", ErrHeaderMismatch, path)
		}
	}
	for _, r := range rows {
		w.Write(r.record())
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return fmt.Errorf("encode a row: %w", err)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		return fmt.Errorf("results CSV: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("results CSV: %w", err)
	}
	return f.Close()
}

// ReadFile reads every row of the CSV file at path.
func ReadFile(path string) ([]Row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read results CSV: %w", err)
	}
	defer f.Close()
	rows, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rows, nil
}

// Read parses a results CSV. Columns are matched by header name, so files written by an
// older version with fewer columns still read; absent columns are left zero.
func Read(r io.Reader) ([]Row, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("read header: %w", err)
	}
	idx := make(map[string]int, len(header))
	for i, h := range header {
		idx[strings.TrimSpace(h)] = i
	}
	for _, c := range []string{"scenario", "mode", "shards", "throughput_ops_s"} {
		if _, ok := idx[c]; !ok {
			return nil, fmt.Errorf("%w %q", ErrMissingColumn, c)
		}
	}
	var rows []Row
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			return rows, nil
		}
		if err != nil {
			return nil, err
		}
		p := parser{rec: rec, idx: idx}
		row := Row{
			Timestamp: p.time("timestamp"), Scenario: p.str("scenario"), Mode: p.str("mode"),
			Shards: int(p.int("shards")), Ops: p.int("ops"), Concurrency: int(p.int("concurrency")),
			WriteRatio: p.float("write_ratio"), ThroughputOpsS: p.float("throughput_ops_s"),
			AvgMs: p.float("avg_ms"), P50Ms: p.float("p50_ms"), P95Ms: p.float("p95_ms"),
			P99Ms: p.float("p99_ms"), MaxMs: p.float("max_ms"), Errors: p.int("errors"),
			P999Ms: p.float("p999_ms"), RunID: p.str("run_id"), Trial: int(p.int("trial")),
			Backend: p.str("backend"), Router: p.str("router"), Sync: p.str("sync"),
			PoolSize: int(p.int("pool_size")), Keys: int(p.int("keys")), Dist: p.str("dist"),
			Rate: p.float("rate"), Late: p.int("late"), SvcP50Ms: p.float("svc_p50_ms"),
			SvcP99Ms: p.float("svc_p99_ms"), ReadHitRate: p.float("read_hit_rate"),
			DurationS: p.float("duration_s"), Seed: p.int("seed"), GitCommit: p.str("git_commit"),
			GoVersion: p.str("go_version"), CPUs: int(p.int("cpus")), CPUModel: p.str("cpu_model"),
			SQLiteVer: p.str("sqlite_version"), RequestedOps: p.int("requested_ops"),
			RequestedDurationS: p.float("requested_duration_s"), WarmupS: p.float("warmup_s"),
			Preload: p.bool("preload"), Arrival: p.str("arrival"), DataSize: int(p.int("data_size")),
			Command: p.str("command"),
		}
		if p.err != nil {
			return nil, fmt.Errorf("line %d: %w", line, p.err)
		}
		rows = append(rows, row)
	}
}

// parser pulls typed fields out of one record, keeping the first error.
type parser struct {
	rec []string
	idx map[string]int
	err error
}

func (p *parser) str(col string) string {
	i, ok := p.idx[col]
	if !ok || i >= len(p.rec) {
		return ""
	}
	return strings.TrimSpace(p.rec[i])
}

func (p *parser) int(col string) int64 {
	s := p.str(col)
	if s == "" {
		return 0
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil && p.err == nil {
		p.err = fmt.Errorf("column %s: %w", col, err)
	}
	return v
}

func (p *parser) float(col string) float64 {
	s := strings.ReplaceAll(p.str(col), ",", "")
	if s == "" {
		return 0
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil && p.err == nil {
		p.err = fmt.Errorf("column %s: %w", col, err)
	}
	return v
}

func (p *parser) bool(col string) bool {
	s := p.str(col)
	if s == "" {
		return false
	}
	v, err := strconv.ParseBool(s)
	if err != nil && p.err == nil {
		p.err = fmt.Errorf("column %s: %w", col, err)
	}
	return v
}

func (p *parser) time(col string) time.Time {
	s := p.str(col)
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil && p.err == nil {
		p.err = fmt.Errorf("column %s: %w", col, err)
	}
	return t
}
