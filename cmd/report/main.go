// Command report regenerates a run's report.md and its charts from its results.csv
// (by default those of results/latest). Run `report --help` for the flags.
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	reportcmd "github.com/shardlab/shardlab/internal/cmd/report"
)

func main() {
	cli.Main("report", func(ctx context.Context, args []string) error {
		return reportcmd.Run(ctx, args, os.Stdout, os.Stderr)
	}, cli.Code{Err: reportcmd.ErrUsage, Exit: 2})
}
