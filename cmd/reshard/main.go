// Command reshard moves a sharded deployment from one layout to another (issue 23):
//
//	reshard plan|start|status|verify|cancel --from CURRENT.toml --to TARGET.toml
//
// Exit status: 0 done (plan: the move can start), 1 failed (plan: it cannot, and the
// reasons are printed), 2 bad usage. docs/reshard.md says what each step does.
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	"github.com/shardlab/shardlab/internal/cmd/reshard"
)

func main() {
	cli.Main("reshard", func(ctx context.Context, args []string) error {
		return reshard.Main(ctx, args, os.Stdout, os.Stderr)
	}, cli.Code{Err: reshard.ErrUsage, Exit: 2})
}
