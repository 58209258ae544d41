// Command counterbench measures the hot-row counter strategies of package
// counters against PostgreSQL or SQLite: throughput and latency of one key
// hammered by many workers, and read latency as the count grows.
//
//	counterbench --duration 10s --trials 3          # into results/runs/counters-<time>/
//	counterbench --backend sqlite --duration 5s --trials 3
//
// Run counterbench --help for the flags; see docs/counters.md for results.
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	"github.com/shardlab/shardlab/internal/cmd/counterbench"
)

func main() {
	cli.Main("counterbench", func(ctx context.Context, args []string) error {
		return counterbench.Run(ctx, args, os.Stdout, os.Stderr)
	}, cli.Code{Err: counterbench.ErrUsage, Exit: 2}, cli.Code{Err: counterbench.ErrNotExact, Exit: 3})
}
