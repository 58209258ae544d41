// Command netprobe measures a network path for the network lab (scripts/netlab.sh):
// SQL round trips over one connection, or whether a TCP connection opens at all. Run
// `netprobe --help` for the details.
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	"github.com/shardlab/shardlab/internal/cmd/netprobe"
)

func main() {
	cli.Main("netprobe", func(ctx context.Context, args []string) error {
		return netprobe.Run(ctx, args, os.Stdout, os.Stderr)
	}, cli.Code{Err: netprobe.ErrUsage, Exit: 2})
}
