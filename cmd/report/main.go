// Command report regenerates results/report.md and its charts from results/results.csv.
// Run `report --help` for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"shardlab/report/reportcli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := reportcli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, reportcli.ErrUsage):
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}
