// Package delayline is the delayline command: a Toxiproxy server with the lab's
// microsecond delay toxic (lab/delayline), for scripts/netlab.sh. cmd/delayline is a thin
// wrapper around Run.
package delayline

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"

	"github.com/shardlab/shardlab/lab/delayline"
)

// ErrUsage marks a command-line mistake; the command exits with status 2.
var ErrUsage = errors.New("usage")

const usage = `Usage: delayline [--api HOST:PORT] [--proxies FILE] [--procs N] [--log-level LEVEL]

Serves Toxiproxy's HTTP API (https://github.com/Shopify/toxiproxy#http-api) with
the proxies of FILE, a JSON list of {"name", "listen", "upstream"} objects, and
one toxic besides Toxiproxy's own: "delay", attributes delay_us and jitter_us,
which holds every chunk of data for delay_us ± jitter_us microseconds. Runs until
SIGINT or SIGTERM.

  curl -X POST http://127.0.0.1:8474/proxies/pg/toxics \
    -d '{"name":"d_up","type":"delay","stream":"upstream","attributes":{"delay_us":250,"jitter_us":50}}'

Flags:
`

// Run serves until ctx is cancelled, logging to logw. It returns flag.ErrHelp for --help
// and an error wrapping ErrUsage for a bad command line.
func Run(ctx context.Context, args []string, logw io.Writer) error {
	fs := flag.NewFlagSet("delayline", flag.ContinueOnError)
	fs.SetOutput(logw)
	api := fs.String("api", "127.0.0.1:8474", "address of the HTTP API")
	proxies := fs.String("proxies", "", "JSON `file` of the proxies to create at start")
	level := fs.String("log-level", "warn", "debug, info, warn or error")
	procs := fs.Int("procs", 0, "OS threads that run Go code at once (GOMAXPROCS); 0 keeps Go's choice, one per CPU. "+
		"The lab runs it with 1: a delay line waits more than it works, and with one thread a chunk passes from goroutine to goroutine without waking another")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	}
	if *procs < 0 {
		return fmt.Errorf("%w: --procs must be 0 or more, got %d", ErrUsage, *procs)
	}
	if *procs > 0 {
		runtime.GOMAXPROCS(*procs)
	}
	return delayline.Serve(ctx, delayline.Config{API: *api, ProxiesFile: *proxies, Log: logw, LogLevel: *level})
}
