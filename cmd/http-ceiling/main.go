// Command http-ceiling serves the demo-server's endpoints with trivial handlers that touch
// no database: the HTTP ceiling that scripts/http_ceiling.sh compares the demo-server with.
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	"github.com/shardlab/shardlab/internal/cmd/httpceiling"
)

func main() {
	cli.Main("http-ceiling", func(ctx context.Context, args []string) error {
		return httpceiling.Run(ctx, args, os.Stdout, os.Stderr)
	}, cli.Code{Err: httpceiling.ErrUsage, Exit: 2})
}
