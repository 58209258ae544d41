// Command counterbench measures the hot-row counter strategies of package
// counters against PostgreSQL or SQLite: throughput and latency of one key
// hammered by many workers, and read latency as the count grows.
//
//	counterbench --duration 10s --trials 3 --out results/counters
//	counterbench --backend sqlite --duration 5s --trials 3
//
// Run counterbench --help for the flags; see docs/counters.md for results.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"shardlab/counters/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := bench.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case errors.Is(err, bench.ErrNotExact):
		fmt.Fprintln(os.Stderr, "counterbench:", err)
		os.Exit(3)
	default:
		fmt.Fprintln(os.Stderr, "counterbench:", err)
		os.Exit(1)
	}
}
