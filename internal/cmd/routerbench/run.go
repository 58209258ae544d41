package routerbench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // plain database/sql on PostgreSQL, the baseline

	"github.com/shardlab/shardlab/internal/postgresdb"
	"github.com/shardlab/shardlab/internal/sqlitedb"
	"github.com/shardlab/shardlab/lab/loadgen"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/shardsql"
)

// Experiments.
const (
	ExperimentOverhead = "overhead"
	ExperimentLimit    = "limit"
)

// Backends.
const (
	BackendPostgres = "postgres"
	BackendSQLite   = "sqlite"
)

// Config describes one run of the benchmark.
type Config struct {
	Experiment  string        // ExperimentOverhead or ExperimentLimit
	Backend     string        // BackendPostgres or BackendSQLite
	DSNs        []string      // PostgreSQL servers: one, or two (the limit experiment's second database goes to the second)
	Concurrency int           // workers per measurement
	Duration    time.Duration // length of each measurement
	Warmup      time.Duration // unmeasured load before each measurement
	Trials      int           // interleaved trials
	Orders      int           // orders loaded before measuring
	Seed        uint64        // order ids and request sequences
	Out         string        // the run directory
	DataDir     string        // SQLite files (default Out/data)
	Progress    io.Writer     // one line per measurement; nil for none
	Command     string        // recorded in run.txt and the report (default: routerbench and its arguments)
	Rate        float64       // open loop: requests per second per measurement (0: closed loop, at saturation)
	Arrival     string        // open loop: loadgen.ArrivalConstant (default) or loadgen.ArrivalPoisson
	// KeepDatabases leaves the PostgreSQL databases on their servers after the run, for
	// inspection; by default they are dropped (each run makes them afresh).
	KeepDatabases bool
}

// Validate checks c and fills defaults.
func (c *Config) Validate() error {
	switch c.Experiment {
	case ExperimentOverhead, ExperimentLimit:
	default:
		return fmt.Errorf("experiment must be %s or %s, got %q", ExperimentOverhead, ExperimentLimit, c.Experiment)
	}
	switch c.Backend {
	case "":
		c.Backend = BackendPostgres
	case BackendPostgres, BackendSQLite:
	default:
		return fmt.Errorf("backend must be %s or %s, got %q", BackendPostgres, BackendSQLite, c.Backend)
	}
	if c.Backend == BackendPostgres && (len(c.DSNs) < 1 || len(c.DSNs) > 2) {
		return fmt.Errorf("give one or two PostgreSQL servers (--dsn, or $SHARDLAB_PG_DSN), got %d", len(c.DSNs))
	}
	if c.Concurrency < 1 || c.Concurrency > 1000 {
		return fmt.Errorf("concurrency must be 1..1000, got %d", c.Concurrency)
	}
	if c.Duration < 100*time.Millisecond {
		return fmt.Errorf("duration must be at least 100ms, got %v", c.Duration)
	}
	if c.Warmup < 0 {
		return fmt.Errorf("warm-up must not be negative")
	}
	if c.Trials < 1 || c.Trials > 100 {
		return fmt.Errorf("trials must be 1..100, got %d", c.Trials)
	}
	if c.Rate < 0 {
		return fmt.Errorf("rate must not be negative, got %v", c.Rate)
	}
	switch c.Arrival {
	case "":
		c.Arrival = loadgen.ArrivalConstant
	case loadgen.ArrivalConstant, loadgen.ArrivalPoisson:
	default:
		return fmt.Errorf("arrival must be %s or %s, got %q", loadgen.ArrivalConstant, loadgen.ArrivalPoisson, c.Arrival)
	}
	if c.Orders < 1 {
		return fmt.Errorf("orders must be at least 1, got %d", c.Orders)
	}
	if c.Out == "" {
		return errors.New("an output directory is needed")
	}
	if c.DataDir == "" {
		c.DataDir = filepath.Join(c.Out, "data")
	}
	return nil
}

// Measurement is one timed run of one operation on one configuration.
type Measurement struct {
	Config        string
	Operation     string
	Trial         int
	OpsPerSec     float64
	P50, P95, P99 float64 // milliseconds
	Errors        int64
}

// layout is a configuration to measure: a handle over databases set up for it.
type layout struct {
	name      string
	router    bool
	databases int // 1 or 2
	tables    int // per database
}

func layouts(experiment string) []layout {
	if experiment == ExperimentOverhead {
		return []layout{{"direct-1db-1t", false, 1, 1}, {"router-1db-1t", true, 1, 1}}
	}
	return []layout{
		{"direct-1db-1t", false, 1, 1}, {"direct-1db-2t", false, 1, 2},
		{"router-1db-2t", true, 1, 2}, {"router-2db-1t", true, 2, 1}, {"router-2db-2t", true, 2, 2},
	}
}

// Run runs the experiment and writes its raw measurements, summary CSV, charts and
// report into cfg.Out. Cancelling ctx stops it between measurements.
func Run(ctx context.Context, cfg Config) ([]Measurement, error) {
	scratch := cfg.DataDir == "" // the SQLite files go under Out, and away at the end
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if scratch && cfg.Backend == BackendSQLite {
		// Runs after the handles close (deferred below): the run directory keeps the
		// measurements, not hundreds of megabytes of benchmark data.
		defer os.RemoveAll(cfg.DataDir)
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, err
	}
	started, err := startRunInfo(cfg)
	if err != nil {
		return nil, err
	}
	progress := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, format+"\n", args...)
		}
	}
	made := map[string][]string{} // databases by shape: layouts of one shape share them
	if cfg.Backend != BackendSQLite && !cfg.KeepDatabases {
		// Runs after the handles close (deferred below): no database is left on the
		// servers.
		defer func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			for shape, dsns := range made {
				for i := range dsns {
					if err := postgresdb.DropDatabase(ctx, cfg.DSNs[min(i, len(cfg.DSNs)-1)], databaseName(shape, i)); err != nil {
						progress("could not drop %s: %v", databaseName(shape, i), err)
					}
				}
			}
		}()
	}
	var handles []*handle
	defer func() {
		for _, h := range handles {
			h.close()
		}
	}()
	for _, l := range layouts(cfg.Experiment) {
		progress("setting up %s: %d orders", l.name, cfg.Orders)
		h, err := setup(ctx, cfg, l, made)
		if err != nil {
			return nil, fmt.Errorf("set up %s: %w", l.name, err)
		}
		handles = append(handles, h)
	}
	var nextID atomic.Uint64
	nextID.Store(uint64(cfg.Orders) + 1<<32)
	var out []Measurement
	for trial := range cfg.Trials {
		order := slices.Clone(handles)
		if trial%2 == 1 {
			slices.Reverse(order) // alternate, so that no configuration always goes first
		}
		for _, op := range Operations() {
			for _, h := range order {
				if err := ctx.Err(); err != nil {
					return out, err
				}
				m, err := measure(ctx, cfg, h, op, trial, &nextID)
				if h.idle != nil {
					// Only the configuration being measured holds server connections: five
					// configurations at full concurrency would not fit in PostgreSQL's
					// default max_connections of 100.
					h.idle()
				}
				if err != nil {
					return out, fmt.Errorf("%s %s trial %d: %w", h.name, op, trial+1, err)
				}
				progress("trial %d/%d  %-14s %-7s %9.0f ops/s  p99 %.2f ms  errors %d",
					trial+1, cfg.Trials, h.name, op, m.OpsPerSec, m.P99, m.Errors)
				out = append(out, m)
			}
		}
	}
	if err := writeOutputs(cfg, out); err != nil {
		return out, err
	}
	return out, finishRunInfo(cfg, started)
}

func measure(ctx context.Context, cfg Config, h *handle, op string, trial int, nextID *atomic.Uint64) (Measurement, error) {
	t, err := newTarget(ctx, h, op, cfg.Seed, nextID)
	if err != nil {
		return Measurement{}, err
	}
	defer t.st.close()
	write := 1.0
	if op == OpSelect {
		write = 0
	}
	res, err := loadgen.RunTarget(ctx, t, loadgen.Config{
		Duration: cfg.Duration, Warmup: cfg.Warmup, Concurrency: cfg.Concurrency, WriteRatio: write,
		Keys: cfg.Orders, Dist: loadgen.DistUniform, Seed: int64(cfg.Seed) + int64(trial), DataSize: 24,
		Timeout: 30 * time.Second, Rate: cfg.Rate, Arrival: cfg.Arrival,
	})
	if err != nil {
		return Measurement{}, err
	}
	m := Measurement{Config: h.name, Operation: op, Trial: trial + 1, OpsPerSec: res.Throughput(), Errors: res.Errors}
	if res.Response.TotalCount() > 0 {
		m.P50 = loadgen.Ms(res.Response.ValueAtQuantile(50))
		m.P95 = loadgen.Ms(res.Response.ValueAtQuantile(95))
		m.P99 = loadgen.Ms(res.Response.ValueAtQuantile(99))
	}
	if res.Errors > 0 && res.Ops == 0 {
		return m, fmt.Errorf("every request failed: %v", res.ErrorsByKind)
	}
	return m, nil
}

// databaseName names database i of a layout shape (databases x tables).
func databaseName(shape string, i int) string { return fmt.Sprintf("routerbench_%s_%d", shape, i) }

// setup creates a layout's databases (dropping any left by an earlier run), its tables,
// and the preloaded orders, and returns the handle that measures it. Layouts of one
// shape (databases x tables) share their databases, as seed 004 compares JDBC and
// Sharding-JDBC on the same database: the application's physical tables and the
// driver's are the same tables, placed by the same hash.
func setup(ctx context.Context, cfg Config, l layout, made map[string][]string) (*handle, error) {
	shape := fmt.Sprintf("%ddb_%dt", l.databases, l.tables)
	dsns, shared := made[shape]
	for i := range l.databases {
		if shared {
			break
		}
		name := databaseName(shape, i)
		switch cfg.Backend {
		case BackendSQLite:
			if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
				return nil, err
			}
			path := filepath.Join(cfg.DataDir, name+".db")
			for _, suffix := range []string{"", "-wal", "-shm"} {
				os.Remove(path + suffix)
			}
			dsns = append(dsns, path)
		default:
			server := cfg.DSNs[min(i, len(cfg.DSNs)-1)]
			if err := postgresdb.DropDatabase(ctx, server, name); err != nil {
				return nil, err
			}
			dsn, err := postgresdb.CreateDatabase(ctx, server, name)
			if err != nil {
				return nil, err
			}
			dsns = append(dsns, dsn)
		}
	}
	made[shape] = dsns
	h := &handle{name: l.name, tables: l.tables, router: l.router}
	if l.router {
		sources := dsns
		if cfg.Backend == BackendSQLite {
			sources = nil
			for _, p := range dsns {
				sources = append(sources, "sqlite:"+p)
			}
		}
		c, err := rules.Parse([]byte(rulesTOML(sources, l.tables)))
		if err != nil {
			return nil, err
		}
		conn, err := shardsql.NewConnector(ctx, shardsql.Config{Rules: c, MaxConns: cfg.Concurrency})
		if err != nil {
			return nil, err
		}
		db := shardsql.OpenDB(conn)
		h.read, h.write, h.close, h.idle = db, db, db.Close, conn.CloseIdle
		for _, ddl := range []string{createOrder("t_order"), createItem("t_order_item")} {
			if shared {
				break
			}
			if _, err := db.ExecContext(ctx, ddl); err != nil {
				h.close()
				return nil, err
			}
		}
	} else {
		switch cfg.Backend {
		case BackendSQLite:
			sdb, err := sqlitedb.OpenDB(ctx, dsns[0], sqlitedb.Options{})
			if err != nil {
				return nil, err
			}
			h.read, h.write, h.close = sdb.Reader(), sdb.Writer(), sdb.Close
		default:
			db, err := sql.Open("pgx", dsns[0])
			if err != nil {
				return nil, err
			}
			db.SetMaxOpenConns(cfg.Concurrency)
			db.SetMaxIdleConns(cfg.Concurrency)
			h.read, h.write, h.close = db, db, db.Close
			h.idle = func() {
				db.SetMaxIdleConns(0) // closes the idle connections
				db.SetMaxIdleConns(cfg.Concurrency)
			}
		}
		for i := range max(l.tables, 1) {
			if shared {
				break
			}
			o, it := "t_order", "t_order_item"
			if l.tables > 1 {
				o, it = fmt.Sprintf("t_order_%d", i), fmt.Sprintf("t_order_item_%d", i)
			}
			for _, ddl := range []string{createOrder(o), createItem(it)} {
				if _, err := h.write.ExecContext(ctx, ddl); err != nil {
					h.close()
					return nil, err
				}
			}
		}
	}
	if !shared {
		if err := preload(ctx, h, cfg.Seed, cfg.Orders); err != nil {
			h.close()
			return nil, err
		}
	}
	return h, nil
}
