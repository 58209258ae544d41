// Command blockbench benchmarks the autoshard block store: an ingest of files
// of random blocks with one CSV row per batch, and a threshold sweep with
// charts. See "blockbench help" and docs/autoshard.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"shardlab/autoshard/blockbench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := blockbench.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "blockbench:", err)
		if errors.Is(err, blockbench.ErrUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}
