// Command usl fits the Universal Scalability Law to a CSV of n,throughput points and
// prints sigma, kappa, lambda, the peak N* and R². Run `usl --help` for the details.
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	"github.com/shardlab/shardlab/usl/uslcli"
)

func main() {
	cli.Main("usl", func(ctx context.Context, args []string) error {
		return uslcli.Run(ctx, args, os.Stdin, os.Stdout, os.Stderr)
	}, cli.Code{Err: uslcli.ErrUsage, Exit: 2})
}
