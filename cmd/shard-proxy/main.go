// Command shard-proxy is shardlab's PostgreSQL wire-protocol sharding proxy. Run it
// with --help for the flags.
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	"github.com/shardlab/shardlab/internal/cmd/shardproxy"
)

func main() {
	cli.Main("shard-proxy", func(ctx context.Context, args []string) error {
		return shardproxy.Run(ctx, args, os.Stdout, os.Stderr)
	}, cli.Code{Err: shardproxy.ErrUsage, Exit: 2})
}
