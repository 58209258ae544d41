// Command delayline is the network lab's delay line: a Toxiproxy server with a
// microsecond delay toxic (lab/delayline). scripts/netlab.sh runs one on each server
// host. Run `delayline --help` for the details.
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	"github.com/shardlab/shardlab/internal/cmd/delayline"
)

func main() {
	cli.Main("delayline", func(ctx context.Context, args []string) error {
		return delayline.Run(ctx, args, os.Stderr)
	}, cli.Code{Err: delayline.ErrUsage, Exit: 2})
}
