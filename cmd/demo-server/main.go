// Command demo-server serves the lab's key-value API over one SQLite database or several
// shards. Run it with --help for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"shardlab/internal/demoserver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := demoserver.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp):
	case errors.Is(err, demoserver.ErrUsage):
		fmt.Fprintln(os.Stderr, "demo-server:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "demo-server:", err)
		os.Exit(1)
	}
}
