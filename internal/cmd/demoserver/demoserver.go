// Package demoserver is the demo-server command: flag parsing, wiring of the shard set and
// the HTTP server, and graceful shutdown. It lives apart from cmd/demo-server so tests can
// run it in-process.
package demoserver

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/shardlab/shardlab/counters"
	"github.com/shardlab/shardlab/internal/sqlitedb"
	"github.com/shardlab/shardlab/lab/server"
	"github.com/shardlab/shardlab/lab/shards"
	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/lab/shardset/postgres"
	"github.com/shardlab/shardlab/lab/shardset/sqlite"
	"github.com/shardlab/shardlab/routing"
)

// dbPrefixRE is what --db-prefix accepts: a safe start of a PostgreSQL database name.
var dbPrefixRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,39}$`)

// ErrUsage marks a command-line mistake; the command exits with status 2 for it.
var ErrUsage = errors.New("usage")

// config is the parsed command line.
type config struct {
	mode, addr, addrFile, data, router, sync, backend string
	shards, readConns, pool                           int
	dsns                                              []string
	create, reset, lazy                               bool
	groupCommit, oneConn                              bool
	journal, pprofAddr                                string
	dbPrefix                                          string
	counter, bucketBy                                 string
	buckets                                           int
	shutdownTimeout                                   time.Duration
}

// dsnList collects repeated --dsn flags.
type dsnList []string

func (d *dsnList) String() string     { return strings.Join(*d, ",") }
func (d *dsnList) Set(v string) error { *d = append(*d, v); return nil }

const usageHead = `demo-server serves the lab's key-value API over one database (single mode) or
several shards (sharded mode), routing each user_id to its shard.

Usage: demo-server [flags]

Endpoints:
  POST /insert   {"user_id": "...", "data": "..."}  -> {"user_id", "shard", "status"}
  GET  /get?user_id=...                             -> {"user_id", "data", "shard"} or 404
  POST /counter/incr {"key": "...", "by": 1}        -> {"key", "by", "status"}
  GET  /counter?key=...                             -> {"key", "count", "last_seen"} or 404
  GET  /healthz  GET /stats  GET /metrics (Prometheus)

Backends:
  sqlite    one file per shard in --data (the default)
  postgres  one database per shard: --dsn URL once per shard (they may be on different
            hosts), or base --dsn with --create to use databases shardlab_shard_0..N-1:
            one base for all, or one per server (shard i on the (i mod servers)-th)

Flags:
`

func parse(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("demo-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageHead)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.mode, "mode", "single", "single (one database) or sharded")
	fs.IntVar(&c.shards, "shards", 0, "number of shards in sharded mode (default 3); single mode is 1 shard")
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8080", "listen address; port 0 picks a free port")
	fs.StringVar(&c.addrFile, "addr-file", "", "write the address actually bound to this file once listening")
	fs.StringVar(&c.data, "data", "./data", "data directory (one SQLite file per shard)")
	fs.StringVar(&c.router, "router", routing.StrategyCRC32, "routing strategy: "+strings.Join(routing.Strategies(), " or "))
	fs.StringVar(&c.backend, "backend", "sqlite", "storage backend: sqlite or postgres")
	var dsns dsnList
	fs.Var(&dsns, "dsn", "postgres: connection URL of a shard; repeat once per shard, in shard order")
	fs.BoolVar(&c.create, "create", false, "postgres: create databases shardlab_shard_0..N-1 from the base --dsn (shard i on the (i mod count)-th base, when several are given)")
	fs.BoolVar(&c.reset, "reset", false, "postgres with --create: drop and recreate those databases first (DELETES their data)")
	fs.IntVar(&c.pool, "pool", 0, "postgres: connections per shard (default 8)")
	fs.StringVar(&c.dbPrefix, "db-prefix", postgres.DefaultDatabasePrefix, "postgres with --create: shard databases are named <prefix>0..N-1")
	fs.BoolVar(&c.lazy, "lazy", false, "postgres: start even when a shard is down (it answers 503 until it comes back) instead of refusing to start")
	fs.StringVar(&c.counter, "counter", string(counters.StrategyBucket), "hot-row counter strategy: row, append or bucket")
	fs.IntVar(&c.buckets, "buckets", 100, "counter buckets per key (bucket strategy)")
	fs.StringVar(&c.bucketBy, "bucket-by", string(counters.BucketWorker), "how an increment picks its bucket: random, time or worker")
	fs.StringVar(&c.sync, "sync", sqlite.SyncNormal, "SQLite durability: normal (survives a process crash) or full (survives power loss)")
	fs.IntVar(&c.readConns, "read-conns", 0, "read connections per shard (default max(4, GOMAXPROCS))")
	fs.BoolVar(&c.groupCommit, "group-commit", false, "SQLite: commit the writes waiting for a shard together, one transaction (one fsync) for many; each is acknowledged after its commit")
	fs.StringVar(&c.journal, "journal", sqlite.JournalWAL, "SQLite journal: wal, or delete (the rollback journal, where a commit locks readers out: the naive variant)")
	fs.BoolVar(&c.oneConn, "one-conn", false, "SQLite: one connection per shard for reads and writes alike, so every access waits for the one before (the naive variant)")
	fs.StringVar(&c.pprofAddr, "pprof", "", "serve net/http/pprof on this address (e.g. 127.0.0.1:6060), apart from the API")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long in-flight requests may take to finish on SIGINT/SIGTERM")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	}
	c.dsns = dsns
	shardsSet := false
	fs.Visit(func(f *flag.Flag) { shardsSet = shardsSet || f.Name == "shards" })
	if shardsSet && c.shards < 1 {
		return c, fmt.Errorf("%w: --shards must be 1..%d, got %d", ErrUsage, routing.MaxShards, c.shards)
	}
	switch c.mode {
	case "single":
		if c.shards != 0 && c.shards != 1 {
			return c, fmt.Errorf("%w: --mode single is one shard; use --mode sharded --shards %d", ErrUsage, c.shards)
		}
		c.shards = 1
	case "sharded":
		if c.shards == 0 {
			c.shards = 3
		}
		if c.shards < 1 || c.shards > routing.MaxShards {
			return c, fmt.Errorf("%w: --shards must be 1..%d, got %d", ErrUsage, routing.MaxShards, c.shards)
		}
	default:
		return c, fmt.Errorf("%w: --mode must be single or sharded, got %q", ErrUsage, c.mode)
	}
	switch c.backend {
	case "sqlite":
		if c.sync != sqlite.SyncNormal && c.sync != sqlite.SyncFull {
			return c, fmt.Errorf("%w: --sync must be %s or %s, got %q", ErrUsage, sqlite.SyncNormal, sqlite.SyncFull, c.sync)
		}
		if c.journal != sqlite.JournalWAL && c.journal != sqlite.JournalDelete {
			return c, fmt.Errorf("%w: --journal must be %s or %s, got %q", ErrUsage, sqlite.JournalWAL, sqlite.JournalDelete, c.journal)
		}
		if c.oneConn && c.readConns != 0 {
			return c, fmt.Errorf("%w: --one-conn and --read-conns exclude each other", ErrUsage)
		}
		if len(c.dsns) > 0 || c.create || c.reset || c.lazy || c.pool != 0 || c.dbPrefix != postgres.DefaultDatabasePrefix {
			return c, fmt.Errorf("%w: --dsn, --create, --reset, --lazy, --pool and --db-prefix are for --backend postgres", ErrUsage)
		}
		if c.data == "" {
			return c, fmt.Errorf("%w: --data must not be empty", ErrUsage)
		}
	case "postgres":
		switch {
		case c.groupCommit || c.oneConn || c.journal != sqlite.JournalWAL:
			return c, fmt.Errorf("%w: --group-commit, --one-conn and --journal are for --backend sqlite", ErrUsage)
		case len(c.dsns) == 0:
			return c, fmt.Errorf("%w: --backend postgres needs --dsn (once per shard, or once with --create)", ErrUsage)
		case c.create && len(c.dsns) > c.shards:
			return c, fmt.Errorf("%w: --create spreads %d shard(s) over its base --dsn, got %d: more servers than shards", ErrUsage, c.shards, len(c.dsns))
		case !c.create && len(c.dsns) != c.shards:
			return c, fmt.Errorf("%w: %d shard(s) need %d --dsn, got %d (or give one base --dsn with --create)", ErrUsage, c.shards, c.shards, len(c.dsns))
		case c.reset && !c.create:
			return c, fmt.Errorf("%w: --reset only works with --create", ErrUsage)
		case c.reset && c.lazy:
			return c, fmt.Errorf("%w: --reset needs every shard up; it cannot be combined with --lazy", ErrUsage)
		case !dbPrefixRE.MatchString(c.dbPrefix):
			return c, fmt.Errorf("%w: --db-prefix must be lower-case letters, digits and _, starting with a letter (at most 40), got %q", ErrUsage, c.dbPrefix)
		case c.pool < 0 || c.pool > 1000:
			return c, fmt.Errorf("%w: --pool must be 1..1000", ErrUsage)
		}
	default:
		return c, fmt.Errorf("%w: --backend must be sqlite or postgres, got %q", ErrUsage, c.backend)
	}
	if _, err := c.counterOptions(); err != nil {
		return c, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if c.shutdownTimeout <= 0 {
		return c, fmt.Errorf("%w: --shutdown-timeout must be positive", ErrUsage)
	}
	return c, nil
}

// Run runs the demo-server until ctx is cancelled, then shuts down gracefully: it stops
// accepting connections, lets in-flight requests finish (up to --shutdown-timeout) and
// closes the databases. It returns an error wrapping ErrUsage for command-line mistakes,
// flag.ErrHelp for --help, and nil after a clean shutdown.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parse(args, stderr)
	if err != nil {
		return err
	}
	opened, err := openShards(ctx, c, stderr)
	if err != nil {
		return err
	}
	defer opened.Close()
	cfg := server.Config{Mode: c.mode, Backend: c.backend, Set: opened.Set, PoolSize: opened.PoolSize}
	if c.backend == shards.BackendSQLite {
		cfg.Sync = c.sync
		if cfg.SQLiteVersion, err = sqlitedb.Version(ctx); err != nil {
			return err
		}
	}
	if cfg.Counter, err = openCounter(ctx, c, opened); err != nil {
		if !c.lazy {
			return fmt.Errorf("open counter store: %w", err)
		}
		fmt.Fprintf(stderr, "demo-server: warning: counter store unavailable (its shard is down), the counter endpoints answer 503 until a restart: %v\n", err)
		cfg.Counter = unavailableCounter{err: err}
	}
	defer cfg.Counter.Close()
	set := cfg.Set
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.addr, err)
	}
	httpSrv := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
	if c.pprofAddr != "" {
		stopProfiles, err := serveProfiles(c.pprofAddr, stdout)
		if err != nil {
			ln.Close()
			return err
		}
		defer stopProfiles()
	}
	addr := ln.Addr().String()
	if c.addrFile != "" {
		if err := writeFileAtomic(c.addrFile, addr+"\n"); err != nil {
			ln.Close()
			return fmt.Errorf("write --addr-file: %w", err)
		}
	}
	where := "data " + c.data
	if c.backend == "postgres" {
		where = fmt.Sprintf("%d database(s), %d connections each", c.shards, cfg.PoolSize)
	}
	if c.backend == shards.BackendSQLite {
		where += fmt.Sprintf(", sync %s, journal %s", c.sync, c.journal)
		if c.oneConn {
			where += ", one connection per shard"
		}
		if c.groupCommit {
			where += ", group commit"
		}
	}
	fmt.Fprintf(stdout, "demo-server: %s mode, %d shard(s), backend %s, router %s, %s; counters %s\n", c.mode, c.shards, c.backend, c.router, where, c.counter)
	fmt.Fprintf(stdout, "demo-server: listening on http://%s\n", addr)

	serveErr := make(chan error, 1)
	go func() { serveErr <- httpSrv.Serve(ln) }()
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	fmt.Fprintln(stdout, "demo-server: shutting down, draining in-flight requests")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	if err := httpSrv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	<-serveErr // http.ErrServerClosed
	if err := set.Close(); err != nil {
		return fmt.Errorf("close shards: %w", err)
	}
	if commits, writes := opened.CommitStats(); c.groupCommit && commits > 0 {
		fmt.Fprintf(stdout, "demo-server: group commit: %d writes in %d commits, %.1f writes per commit\n", writes, commits, float64(writes)/float64(commits))
	}
	if err := cfg.Counter.Close(); err != nil {
		return fmt.Errorf("close counter store: %w", err)
	}
	fmt.Fprintln(stdout, "demo-server: stopped cleanly")
	return nil
}

func (c config) counterOptions() (counters.Options, error) {
	strategy, err := counters.ParseStrategy(c.counter)
	if err != nil {
		return counters.Options{}, err
	}
	o := counters.Options{Strategy: strategy}
	if strategy == counters.StrategyBucket {
		o.Buckets = c.buckets
		if o.BucketBy, err = counters.ParseBucketBy(c.bucketBy); err != nil {
			return o, err
		}
	}
	return o, o.Validate()
}

// labConfig describes the shard set of the command line.
func (c config) labConfig() shards.Config {
	return shards.Config{
		Backend: c.backend, Shards: c.shards, Router: c.router,
		Dir:    c.data,
		SQLite: sqlite.Options{Sync: c.sync, ReadConns: c.readConns, Journal: c.journal, OneConn: c.oneConn, GroupCommit: c.groupCommit},
		DSNs:   c.dsns, Create: c.create, Reset: c.reset, DatabasePrefix: c.dbPrefix,
		Postgres: postgres.Options{PoolSize: int32(c.pool), Lazy: c.lazy},
	}
}

// openShards opens the shards with shards.Open. It turns option errors into usage errors,
// says on a layout mismatch which flags lead out of it, and warns about shards that are
// down at a --lazy start.
func openShards(ctx context.Context, c config, stderr io.Writer) (*shards.Shards, error) {
	opened, err := shards.Open(ctx, c.labConfig())
	switch {
	case err == nil:
	case errors.Is(err, shards.ErrBadConfig), errors.Is(err, sqlite.ErrBadOptions),
		errors.Is(err, postgres.ErrBadOptions), errors.Is(err, postgres.ErrBadDSN):
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	case errors.Is(err, shardset.ErrLayoutMismatch) && c.create:
		return nil, fmt.Errorf("%w\nthe databases %s* were made for another layout: start with --reset to drop and recreate them (DELETES their data), or choose other databases with --db-prefix",
			err, c.dbPrefix)
	case errors.Is(err, shardset.ErrLayoutMismatch) && c.backend == shards.BackendSQLite:
		return nil, fmt.Errorf("%w\nthe data directory %s holds another layout: give another --data directory to start afresh", err, c.data)
	default:
		return nil, err
	}
	for _, se := range opened.Down {
		fmt.Fprintf(stderr, "demo-server: warning: shard %d is unreachable at start, serving without it until it answers: %v\n", se.Shard, se.Err)
	}
	return opened, nil
}

// openCounter opens the hot-row counter store beside the shards, with their settings:
// counters.db in the data directory (the same --sync) for SQLite, the first shard's
// database (a pool of --pool connections) for PostgreSQL.
func openCounter(ctx context.Context, c config, opened *shards.Shards) (counters.Counter, error) {
	opts, err := c.counterOptions()
	if err != nil {
		return nil, err
	}
	return opened.OpenCounter(ctx, opts)
}

// serveProfiles serves net/http/pprof's handlers on addr, on a listener and mux of their
// own so that the API never exposes them. The returned function stops it.
func serveProfiles(addr string, stdout io.Writer) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on --pprof %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	fmt.Fprintf(stdout, "demo-server: profiles on http://%s/debug/pprof/\n", ln.Addr())
	return func() { srv.Close(); <-done }, nil
}

func writeFileAtomic(path, content string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// unavailableCounter stands in for a counter store that could not be opened at start
// under --lazy: every call fails, so the counter endpoints answer 503.
type unavailableCounter struct{ err error }

func (u unavailableCounter) Incr(context.Context, string, int64) error {
	return fmt.Errorf("counter store unavailable: %w", u.err)
}

func (u unavailableCounter) Get(context.Context, string) (counters.Value, error) {
	return counters.Value{}, fmt.Errorf("counter store unavailable: %w", u.err)
}

func (u unavailableCounter) Close() error { return nil }
