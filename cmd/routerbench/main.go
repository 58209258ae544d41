// Command routerbench reproduces seed 004, Sharding-JDBC's performance report, with
// shardlab's database/sql driver, on PostgreSQL or SQLite:
//
//	routerbench --experiment overhead --duration 4s --trials 6
//	routerbench --experiment limit --dsn postgres://db1/... --dsn postgres://db2/...
//	routerbench --backend sqlite --experiment limit
//
// Results go into a new run directory under results/runs/ (or --out). Run
// routerbench --help for the flags; docs/shardsql.md has the results.
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	"github.com/shardlab/shardlab/internal/cmd/routerbench"
)

func main() {
	cli.Main("routerbench", func(ctx context.Context, args []string) error {
		return routerbench.Main(ctx, args, os.Stdout, os.Stderr)
	}, cli.Code{Err: routerbench.ErrUsage, Exit: 2})
}
