// Command proxysweep runs seed 001's experiment for shard-proxy (see
// scripts/proxy_sweep.sh, which makes the run directory and records the run) and writes
// its report.
//
//	proxysweep run --out DIR --proxy BIN [flags]
//	proxysweep report --dir DIR --pool-size N --shards N
//	proxysweep relay --listen ADDR --to ADDR [--procs N]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shardlab/shardlab/internal/cmd/proxysweep"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, "proxysweep:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "proxysweep:", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%w: want positive integers separated by commas, got %q", errUsage, s)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: proxysweep run|report|relay [flags]", errUsage)
	}
	switch args[0] {
	case "run":
		fs := flag.NewFlagSet("proxysweep run", flag.ContinueOnError)
		fs.SetOutput(stderr)
		cfg := proxysweep.Config{Progress: stderr}
		var threads, clients, workloads, modes string
		var proxyArgs listFlag
		fs.StringVar(&cfg.Out, "out", "", "run directory (required)")
		fs.StringVar(&cfg.ProxyBin, "proxy", "", "shard-proxy binary (required)")
		fs.StringVar(&cfg.BinDir, "pg-bindir", proxysweep.DefaultBinDir, "PostgreSQL server programs (initdb, pg_ctl)")
		fs.StringVar(&cfg.Server, "server", "", "HOST:PORT of a PostgreSQL server to use (user postgres, trust) instead of starting one: the sweep creates its databases direct and sharded there, refusing if they exist, and drops them at the end")
		fs.StringVar(&cfg.Listen, "listen", "", "HOST:PORT where the proxy, pgbouncer and the relay listen, one at a time (default 127.0.0.1 and a free port)")
		fs.StringVar(&cfg.Reach, "reach", "", "HOST:PORT where the clients reach them (default --listen): a delay line in between, as in scripts/netlab.sh")
		fs.StringVar(&cfg.ClientNetns, "client-netns", "", "run sysbench and pgbench in this network namespace (ip netns exec; needs root)")
		fs.StringVar(&workloads, "workloads", "oltp_point_select,oltp_write_only,oltp_read_write", "sysbench workloads")
		fs.StringVar(&threads, "threads", "8,16,32,64,128,256", "sysbench thread counts")
		fs.IntVar(&cfg.Tables, "tables", 10, "sysbench --tables")
		fs.IntVar(&cfg.TableSize, "table-size", 100000, "sysbench --table-size")
		fs.DurationVar(&cfg.Time, "time", 10*time.Second, "length of each client run")
		fs.DurationVar(&cfg.Warmup, "warmup", 2*time.Second, "sysbench load before the measured time (new server connections, statements prepared), ended by a report checkpoint")
		fs.IntVar(&cfg.Trials, "trials", 3, "interleaved trials")
		fs.IntVar(&cfg.PoolSize, "pool-size", 20, "shard-proxy --pool-size, and pgbouncer's pool in transaction mode")
		fs.IntVar(&cfg.Shards, "shards", 4, "schema shards of the sharded database")
		fs.IntVar(&cfg.ProxyProcs, "proxy-procs", 1, "shard-proxy --procs (GOMAXPROCS; 0: Go's choice, one per CPU); 1 matches pgbouncer's one thread")
		fs.Var(&proxyArgs, "proxy-arg", "one more shard-proxy flag for every proxy target, such as --proxy-arg=--max-transactions=20; repeatable")
		fs.StringVar(&clients, "pgbench-clients", "8,32", "pgbench client counts (passthrough comparison)")
		fs.StringVar(&modes, "pgbench-modes", "extended,simple", "pgbench -M modes")
		fs.IntVar(&cfg.PgbenchScale, "pgbench-scale", 10, "pgbench -i -s")
		if err := fs.Parse(args[1:]); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		var err error
		if cfg.Threads, err = ints(threads); err != nil {
			return err
		}
		if cfg.PgbenchClients, err = ints(clients); err != nil {
			return err
		}
		cfg.ProxyArgs = proxyArgs
		cfg.Workloads = strings.Split(workloads, ",")
		cfg.PgbenchModes = strings.Split(modes, ",")
		if modes == "" {
			cfg.PgbenchModes = nil
		}
		if cfg.Out == "" || cfg.ProxyBin == "" {
			return fmt.Errorf("%w: --out and --proxy are required", errUsage)
		}
		for _, f := range []struct{ name, v string }{{"--server", cfg.Server}, {"--listen", cfg.Listen}, {"--reach", cfg.Reach}} {
			if f.v == "" {
				continue
			}
			if err := proxysweep.CheckAddr(f.v); err != nil {
				return fmt.Errorf("%w: %s: %v", errUsage, f.name, err)
			}
		}
		if cfg.Reach != "" && cfg.Listen == "" {
			return fmt.Errorf("%w: --reach needs --listen (the port the delay line forwards to)", errUsage)
		}
		if cfg.Tables < 1 || cfg.TableSize < 1 || cfg.Trials < 1 || cfg.PoolSize < 1 || cfg.Shards < 2 || cfg.Time < time.Second || cfg.ProxyProcs < 0 {
			return fmt.Errorf("%w: --tables, --table-size, --trials, --pool-size must be positive, --shards at least 2, --time at least 1s, --proxy-procs 0 or more", errUsage)
		}
		cfg.Work, err = os.MkdirTemp("", "shardlab-proxysweep-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(cfg.Work)
		if err := os.Chmod(cfg.Work, 0o755); err != nil {
			return err
		}
		if err := proxysweep.Run(ctx, cfg); err != nil {
			return err
		}
		return nil
	case "report":
		fs := flag.NewFlagSet("proxysweep report", flag.ContinueOnError)
		fs.SetOutput(stderr)
		var cfg proxysweep.ReportConfig
		fs.StringVar(&cfg.Dir, "dir", "", "run directory (required)")
		fs.IntVar(&cfg.PoolSize, "pool-size", 20, "the run's --pool-size")
		fs.IntVar(&cfg.Shards, "shards", 4, "the run's --shards")
		fs.IntVar(&cfg.ProxyProcs, "proxy-procs", 1, "the run's --proxy-procs")
		fs.StringVar(&cfg.Where, "where", "", "where the run's server and services were, for the report (default: the sweep's own cluster on this host)")
		if err := fs.Parse(args[1:]); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		if cfg.Dir == "" {
			return fmt.Errorf("%w: --dir is required", errUsage)
		}
		return proxysweep.WriteReport(cfg)
	case "relay":
		fs := flag.NewFlagSet("proxysweep relay", flag.ContinueOnError)
		fs.SetOutput(stderr)
		fs.Usage = func() {
			fmt.Fprintln(stderr, "proxysweep relay: a byte relay, each client with a server connection of its own (the sweep's go-relay target,")
			fmt.Fprintln(stderr, "the least a Go middleware costs per transaction). Flags:")
			fs.PrintDefaults()
		}
		listen := fs.String("listen", "127.0.0.1:6439", "address to listen on")
		to := fs.String("to", "127.0.0.1:5432", "server to relay to")
		procs := fs.Int("procs", 1, "OS threads running Go code at once (GOMAXPROCS), as shard-proxy --procs; 0: Go's choice")
		if err := fs.Parse(args[1:]); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		if fs.NArg() > 0 || *procs < 0 {
			return fmt.Errorf("%w: proxysweep relay takes --listen, --to and --procs (0 or more)", errUsage)
		}
		if *procs > 0 {
			runtime.GOMAXPROCS(*procs)
		}
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return err
		}
		return proxysweep.Relay(ctx, ln, *to)
	}
	return fmt.Errorf("%w: unknown subcommand %q (run, report or relay)", errUsage, args[0])
}

// listFlag collects a repeatable flag's values.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }
