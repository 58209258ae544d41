// Command loadgen simulates concurrent users against a demo-server and measures
// throughput and latency. Run it with --help for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"shardlab/internal/loadgencli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := loadgencli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp):
	case errors.Is(err, loadgencli.ErrUsage):
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}
