// Command faultload runs traffic through the sharding proxy that logs every statement,
// and reads the log against the faults the network lab applied (scripts/netlab.sh run
// faults). Run `faultload --help` for the details.
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	"github.com/shardlab/shardlab/internal/cmd/faultload"
)

func main() {
	cli.Main("faultload", func(ctx context.Context, args []string) error {
		return faultload.Run(ctx, args, os.Stdout, os.Stderr)
	}, cli.Code{Err: faultload.ErrUsage, Exit: 2}, cli.Code{Err: faultload.ErrFailedCheck, Exit: 3})
}
