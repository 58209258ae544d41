// Command demo-server serves the lab's key-value API over one database or several
// shards. Run it with --help for the flags.
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	"github.com/shardlab/shardlab/internal/cmd/demoserver"
)

func main() {
	cli.Main("demo-server", func(ctx context.Context, args []string) error {
		return demoserver.Run(ctx, args, os.Stdout, os.Stderr)
	}, cli.Code{Err: demoserver.ErrUsage, Exit: 2})
}
