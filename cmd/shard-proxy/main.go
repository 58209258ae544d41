// Command shard-proxy is shardlab's PostgreSQL wire-protocol sharding proxy. Run it
// with --help for the flags.
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	"github.com/shardlab/shardlab/internal/proxycli"
)

func main() {
	cli.Main("shard-proxy", func(ctx context.Context, args []string) error {
		return proxycli.Run(ctx, args, os.Stdout, os.Stderr)
	}, cli.Code{Err: proxycli.ErrUsage, Exit: 2})
}
