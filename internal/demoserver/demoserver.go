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
	"os"
	"strings"
	"time"

	"shardlab/routing"
	"shardlab/server"
	"shardlab/shardset"
	"shardlab/sqlite"
)

// ErrUsage marks a command-line mistake; the command exits with status 2 for it.
var ErrUsage = errors.New("usage")

// config is the parsed command line.
type config struct {
	mode, addr, addrFile, data, router, sync, backend string
	shards, readConns                                 int
	shutdownTimeout                                   time.Duration
}

const usageHead = `demo-server serves the lab's key-value API over one database (single mode) or
several shards (sharded mode), routing each user_id to its shard.

Usage: demo-server [flags]

Endpoints:
  POST /insert   {"user_id": "...", "data": "..."}  -> {"user_id", "shard", "status"}
  GET  /get?user_id=...                             -> {"user_id", "data", "shard"} or 404
  GET  /healthz  GET /stats  GET /metrics (Prometheus)

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
	fs.StringVar(&c.router, "router", routing.StrategyCRC32, "routing strategy: "+strings.Join(routing.Strategies, " or "))
	fs.StringVar(&c.backend, "backend", "sqlite", "storage backend: sqlite")
	fs.StringVar(&c.sync, "sync", sqlite.SyncNormal, "SQLite durability: normal (survives a process crash) or full (survives power loss)")
	fs.IntVar(&c.readConns, "read-conns", 0, "read connections per shard (default max(4, GOMAXPROCS))")
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
	if c.backend != "sqlite" {
		return c, fmt.Errorf("%w: --backend must be sqlite, got %q", ErrUsage, c.backend)
	}
	if c.data == "" {
		return c, fmt.Errorf("%w: --data must not be empty", ErrUsage)
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
	router, err := routing.New(c.router, c.shards)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	set, err := openSet(ctx, c, router)
	if err != nil {
		return err
	}
	defer set.Close()

	cfg := server.Config{Set: set, Mode: c.mode, Backend: c.backend, Sync: c.sync, PoolSize: c.readConns}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = sqlite.DefaultReadConns()
	}
	if cfg.SQLiteVersion, err = sqlite.Version(ctx); err != nil {
		return fmt.Errorf("read SQLite version: %w", err)
	}
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
	addr := ln.Addr().String()
	if c.addrFile != "" {
		if err := writeFileAtomic(c.addrFile, addr+"\n"); err != nil {
			ln.Close()
			return fmt.Errorf("write --addr-file: %w", err)
		}
	}
	fmt.Fprintf(stdout, "demo-server: %s mode, %d shard(s), backend %s, router %s, data %s\n", c.mode, c.shards, c.backend, c.router, c.data)
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
	fmt.Fprintln(stdout, "demo-server: stopped cleanly")
	return nil
}

func openSet(ctx context.Context, c config, router routing.Router) (*shardset.Set, error) {
	layout := shardset.Layout{Backend: c.backend, Shards: c.shards, Router: c.router}
	if err := shardset.EnsureLayout(c.data, layout); err != nil {
		return nil, err
	}
	stores, err := sqlite.OpenShards(ctx, c.data, c.shards, sqlite.Options{Sync: c.sync, ReadConns: c.readConns})
	if err != nil {
		if errors.Is(err, sqlite.ErrBadOptions) {
			return nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
		return nil, err
	}
	backends := make([]shardset.Backend, len(stores))
	for i, s := range stores {
		backends[i] = s
	}
	return shardset.New(router, backends)
}

func writeFileAtomic(path, content string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
