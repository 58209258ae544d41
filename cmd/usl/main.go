// Command usl fits the Universal Scalability Law to a CSV of n,throughput points and
// prints sigma, kappa, lambda, the peak N* and R². Run `usl --help` for the details.
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	uslcmd "github.com/shardlab/shardlab/internal/cmd/usl"
)

func main() {
	cli.Main("usl", func(ctx context.Context, args []string) error {
		return uslcmd.Run(ctx, args, os.Stdin, os.Stdout, os.Stderr)
	}, cli.Code{Err: uslcmd.ErrUsage, Exit: 2})
}
