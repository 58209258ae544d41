// Command reshard moves a sharded deployment from one layout to another (issue 23).
// Its first command plans the move and changes nothing:
//
//	reshard plan --from CURRENT.toml --to TARGET.toml [--json]
//
// Exit status: 0 the plan can run, 1 it cannot (the reasons are printed) or it could
// not be made, 2 bad usage.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/shardlab/shardlab/reshard"
	"github.com/shardlab/shardlab/rules"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, "reshard:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "reshard:", err)
		os.Exit(1)
	}
}

var (
	errUsage = errors.New("usage")
	// errBlocked: the plan was made and printed, and it cannot run.
	errBlocked = errors.New("the move cannot start (see the plan's problems)")
)

const usage = `Usage: reshard COMMAND [flags]

Moves a sharded deployment (the data sources a rules file names) from one layout to
another: for example from 2 data sources to 4.

Commands:
  plan --from CURRENT.toml --to TARGET.toml [--json]
        measures the move and changes nothing (a dry run): reads every key of every
        sharded table where the current layout keeps it, places it by both layouts,
        and prints per table the rows (and MB) that stay and that move, from where
        to where; the broadcast tables copied to new data sources; the replication
        streams the move needs (one per pair of data sources); and each server's
        wal_level, replication slots, WAL senders and logical replication workers,
        needed against free. Refuses a target that is not a reshard (a table lost or
        of another kind, a key column or type changed, another default data source)
        and a data source that does not answer. Exit 0: the move can start; 1: it
        cannot, and the plan says why; 2: bad usage.

Rules files are TOML (see the rules package, or examples/orders/rules.example.toml).
A data source keeps its name and DSN in both layouts; a new one has a new name.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: reshard plan --from CURRENT.toml --to TARGET.toml (reshard --help)", errUsage)
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	case "plan":
	default:
		return fmt.Errorf("%w: unknown command %q (plan; reshard --help)", errUsage, args[0])
	}
	fs := flag.NewFlagSet("reshard plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	fromPath := fs.String("from", "", "the current layout's rules file (required)")
	toPath := fs.String("to", "", "the target layout's rules file (required)")
	asJSON := fs.Bool("json", false, "print the plan as JSON instead of text")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: plan takes no arguments, got %q", errUsage, fs.Arg(0))
	}
	if *fromPath == "" || *toPath == "" {
		return fmt.Errorf("%w: plan needs --from and --to", errUsage)
	}
	from, err := rules.Load(*fromPath)
	if err != nil {
		return fmt.Errorf("%w: --from: %v", errUsage, err)
	}
	to, err := rules.Load(*toPath)
	if err != nil {
		return fmt.Errorf("%w: --to: %v", errUsage, err)
	}
	p, err := reshard.MakePlan(ctx, from, to, reshard.Options{Progress: stderr})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(p)
	} else {
		err = p.WriteText(stdout)
	}
	if err != nil {
		return err
	}
	if !p.Runnable() {
		return errBlocked
	}
	return nil
}
