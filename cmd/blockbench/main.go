// Command blockbench benchmarks the autoshard block store: an ingest of files
// of random blocks with one CSV row per batch, and a threshold sweep with
// charts. See "blockbench help" and docs/autoshard.md.
//
//	blockbench --threshold 250000 --target-blocks 3000000 --out ingest.csv
//	blockbench sweep --thresholds never,125k,250k,500k,1M --rounds 3
package main

import (
	"context"
	"os"

	"github.com/shardlab/shardlab/internal/cli"
	"github.com/shardlab/shardlab/internal/cmd/blockbench"
)

func main() {
	cli.Main("blockbench", func(ctx context.Context, args []string) error {
		return blockbench.Run(ctx, args, os.Stdout, os.Stderr)
	}, cli.Code{Err: blockbench.ErrUsage, Exit: 2})
}
