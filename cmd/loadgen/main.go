// Command loadgen simulates concurrent users against a demo-server and measures
// throughput and latency. Run it with --help for the flags.
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	loadgencmd "github.com/shardlab/shardlab/internal/cmd/loadgen"
)

func main() {
	cli.Main("loadgen", func(ctx context.Context, args []string) error {
		return loadgencmd.Run(ctx, args, os.Stdout, os.Stderr)
	}, cli.Code{Err: loadgencmd.ErrUsage, Exit: 2})
}
