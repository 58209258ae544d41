// Package reshard is the reshard command: plan, start, status and cancel of a move
// between two layouts, over the toolkit's package of the same name (imported here as
// resharding).
package reshard

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	resharding "github.com/shardlab/shardlab/reshard"
	"github.com/shardlab/shardlab/rules"
)

// ErrUsage is wrapped by every error about the command line (exit status 2).
var ErrUsage = errors.New("usage")

// errBlocked: the plan was made and printed, and it cannot run.
var errBlocked = errors.New("the move cannot start (see the plan's problems)")

const usage = `Usage: reshard COMMAND [flags]

Moves a sharded deployment (the data sources a rules file names) from one layout to
another: for example from 2 data sources to 4.

Commands (each takes --from CURRENT.toml --to TARGET.toml):
  plan [--json]
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
  start [--replica-identity-full] [--copy-rate N] [--max-active N] [--pg-dump PATH]
        begins the move: for each stream a publication on the source (a row filter
        keeps the rows the target places on the destination), a logical replication
        slot, and a subscription on the destination that copies them and keeps them
        current while the current layout goes on serving every read and write. Tables
        a destination lacks are created from the source's definition (pg_dump
        --schema-only). For now: moves into data sources the current layout does not
        use (growing, or 4 to 3 new ones), tables sharded by one column with pghash,
        mod or range and one table per data source; anything else is refused before
        anything is made. With --copy-rate N, start copies the rows itself, at most N
        rows a second for the whole move, from each slot's exported snapshot, and
        enables each subscription once its rows are copied (PostgreSQL's own copy has
        no bound); it then returns when the copy is done. With --max-active N, it
        copies the rows itself too, and holds the copy back while more than N other
        client sessions run a statement on the server of the stream's source or
        destination (pg_stat_activity, every 100ms): the copy takes what room the live
        load leaves, under --copy-rate if given as well.
        A table without a replica identity covering its key (no primary key, as
        pgbench_history) is refused, since PostgreSQL would refuse its UPDATEs and
        DELETEs once published; --replica-identity-full gives it REPLICA IDENTITY
        FULL for the move instead, and cancel restores it.
  status [--watch D]
        where the move stands, from the servers' catalogs: per stream its tables'
        states (copying, synced, ready), the rows on the destination, the slot's lag;
        with --watch, again every D with each stream's copy rate, until every stream
        is ready (or Ctrl-C).
  verify [--chunk-rows N] [--settle D] [--rate N] [--max-active N] [--pin D [--pin-every D]] [--resume]
        compares, per stream, the rows the source has that the target places on the
        destination with the destination's: a count and a checksum per chunk of N
        keys (default 10000), the rows themselves by key where a chunk differs (again
        for D, default 5s, while the destination may not have applied the latest
        writes), and the rows a destination has that the target does not place there.
        Lists missing, extra and different keys; exit 1 if anything differs.
        Unpinned (the default), run it while the moving tables take no writes.
        --pin D pins each table's comparison to one point of its source's WAL while
        the load runs (before the cutover): writes to that table on that source wait
        until the destination has applied those before them and both sides took a
        snapshot (at most D; the destination first catches up without holding them,
        and a lock that waits over 200ms is tried again after a pause), then go on
        while the snapshots are compared, each chunk once (--settle does not apply).
        Reports the longest wait. --pin-every D pins a table again between two chunks
        once its snapshots have been open D, so that a large table's comparison keeps
        them open about D (they hold back VACUUM on both sides), each range of chunks
        at a point of its own, for one more short wait of the writes each time
        (default 0: one pin per table).
        --rate N compares N source rows a second on average (each chunk is read at
        full speed, then verify waits), so that verify does not starve the live load;
        the scans that find the chunks' bounds and the misplaced rows are not bounded
        (default: no bound). --max-active N holds it between chunks as it holds
        start's copy.
        Each chunk compared is recorded on the current layout's first data source: a
        verify cut short (Ctrl-C, a lost server, the command killed) says so, and
        --resume continues it from the chunk after the last one it compared, taking
        what it found before as it was then (pinned as that one was, with the same
        --pin or none). A verify without --resume compares everything again.
  cancel
        ends the move before its cutover and removes what it made: subscriptions,
        slots and publications, the hash helpers, the tables it created on the data
        sources it adds and the rows copied into them. Safe to run again, or after a
        start that was cut short.
  cutover [--proxy-admin DSN] [--catch-up D] [--verify D]
        switches to the target layout once every stream is ready: on the data
        sources that keep rows which move away, a view per sharded table shows only
        the rows that stay; every table the move touches gets the layout fence. With
        --proxy-admin (the proxy's admin database, e.g.
        postgres://127.0.0.1:6432/shardlab_admin), the proxy does the cutover
        (its admin console's RESHARD CUTOVER, given the absolute path of --to, which
        it reads): it holds new transactions on the sharded and broadcast tables
        (those on the default data source's other tables go on), lets those in
        flight end (within its
        --reshard-drain, default 5s), records the new layout on every data source,
        waits until the new data sources applied everything the old ones committed
        (a marker written on each source) and stops the streams (within its
        --reshard-catch-up, default 5s), switches and releases the held transactions
        onto it. If a step overruns, the old layout serves on.
        Without --proxy-admin the data sources switch alone: every process that
        routes by the current rules is then refused its writes (the fence), and is to
        be restarted with the target rules. --verify D compares the destinations with
        the sources in the hold, once nothing writes (verify, pinned), within D,
        counted as pause: a difference gives the cutover up (with --proxy-admin, the
        proxy's RESHARD CUTOVER 'file' VERIFY seconds).
  finish [--proxy-admin DSN] [--delete-rate N]
        ends a move that was cut over: drops the streams, deletes the moved rows from
        the data sources they left (in batches, while the load goes on; at most N
        rows a second on each data source with --delete-rate), switches
        the proxy from the views to the tables, drops the views. Give the proxy that
        serves the deployment; without one, restart proxies after it.
  revert [--proxy-admin DSN] [--catch-up D]
        returns a move that was cut over, and not finished, to the current layout
        (--from), with every write made since: the cutover made a stream back from
        each data source the move added to the one it came from, which keeps the
        rows there current. A hold as the cutover's (the proxy's RESHARD REVERT with
        --proxy-admin): new transactions held, those in flight ended, the old layout
        recorded at a new version, the old data sources caught up, the streams back
        stopped, the proxy switched. Then it removes what the move made, as cancel.
        Safe to run again after one cut short.
  Moves into data sources the current layout uses are not built yet
  (docs/reshard.md).

  timeline --run DIR --accounts N
        reports a run of scripts/reshard_tpcb.sh (the move under pgbench's TPC-B):
        the steps' durations, the copy rate, the longest wait of a client through
        the cutover, p99 latency before, during and around it, failures, the
        reader's counts, the lag, the TPC-B invariant, where the rows ended; writes
        timeline.csv and timeline.svg into DIR. Takes no --from or --to.

Rules files are TOML (see the rules package, or examples/reshard/*.toml).
A data source keeps its name and DSN in both layouts; a new one has a new name.
start records the move on the current layout's data sources: give status, verify and
cancel the same --from and --to files, or they refuse. The command comes first:
reshard plan --from ..., not reshard --from ... plan.
`

// Main runs the command with its arguments (without the program name), writing
// results to stdout and progress to stderr.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: reshard plan|start|status|verify|cancel|cutover|finish|revert --from CURRENT.toml --to TARGET.toml (reshard --help)", ErrUsage)
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	case "timeline":
		fs := flag.NewFlagSet("reshard timeline", flag.ContinueOnError)
		fs.SetOutput(stderr)
		run := fs.String("run", "", "the run directory of scripts/reshard_tpcb.sh (required)")
		accounts := fs.Int64("accounts", 0, "how many accounts the reader must count (pgbench's scale x 100000; required)")
		if err := fs.Parse(args[1:]); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return fmt.Errorf("%w: %v", ErrUsage, err)
		}
		if *run == "" || *accounts <= 0 || fs.NArg() > 0 {
			return fmt.Errorf("%w: reshard timeline --run DIR --accounts N", ErrUsage)
		}
		return timeline(*run, *accounts, stdout)
	case "plan", "start", "status", "verify", "cancel", "cutover", "finish", "revert":
	default:
		return fmt.Errorf("%w: unknown command %q (plan, start, status, verify, cancel, cutover or finish; reshard --help)", ErrUsage, args[0])
	}
	command := args[0]
	fs := flag.NewFlagSet("reshard "+command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	fromPath := fs.String("from", "", "the current layout's rules file (required)")
	toPath := fs.String("to", "", "the target layout's rules file (required)")
	asJSON := fs.Bool("json", false, "plan: print the plan as JSON instead of text")
	watch := fs.Duration("watch", 0, "status: print it again every interval, with each stream's copy rate, until every stream is ready (0: once)")
	chunkRows := fs.Int("chunk-rows", 10000, "verify: source rows per checksum")
	settle := fs.Duration("settle", 5*time.Second, "verify: how long a chunk that differs is compared again")
	verifyRate := fs.Int("rate", 0, "verify: compare this many source rows a second on average, a chunk at a time (0: no bound)")
	pinBound := fs.Duration("pin", 0, "verify: pin each table's comparison to one point of its source's WAL, holding its writes at most this long (0: not pinned)")
	pinEvery := fs.Duration("pin-every", 0, "verify: with --pin, pin a table again between two chunks once its snapshots have been open this long (0: one pin per table)")
	identityFull := fs.Bool("replica-identity-full", false, "start: give published tables without a replica identity covering their key (no primary key) REPLICA IDENTITY FULL while rows move; cancel restores it")
	pgDump := fs.String("pg-dump", "pg_dump", "start: the pg_dump program that copies a table's definition to a destination that lacks it")
	proxyAdmin := fs.String("proxy-admin", "", "cutover, finish, revert: the DSN of the proxy's admin database; the proxy then does the step (RESHARD CUTOVER, FINISH, REVERT)")
	verifyHold := fs.Duration("verify", 0, "cutover: compare the destinations with the sources in the hold, within this bound, counted as pause (0: not)")
	copyRate := fs.Int("copy-rate", 0, "start: copy at most this many rows a second for the whole move, start copying them itself (0: PostgreSQL's table synchronization, no bound)")
	resume := fs.Bool("resume", false, "verify: continue the last verify, cut short, from the chunk after the last one it compared")
	maxActive := fs.Int("max-active", 0, "start, verify: hold the copy (start then copies the rows itself) or the comparison while more than this many other sessions run a statement on its servers (0: no such hold)")
	deleteRate := fs.Int("delete-rate", 0, "finish: delete at most this many moved rows a second on each data source (0: no bound)")
	catchUp := fs.Duration("catch-up", resharding.DefaultCatchUp, "cutover, revert without --proxy-admin: how long the destinations may take to apply the last changes and stop")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: %s takes no arguments, got %q", ErrUsage, command, fs.Arg(0))
	}
	var misplaced error
	fs.Visit(func(f *flag.Flag) {
		if cmds := flagCommands(f.Usage); misplaced == nil && cmds != nil && !slices.Contains(cmds, command) {
			misplaced = fmt.Errorf("%w: --%s is for %s, not %s", ErrUsage, f.Name, strings.Join(cmds, ", "), command)
		}
		if f.Name == "catch-up" && *proxyAdmin != "" && misplaced == nil {
			misplaced = fmt.Errorf("%w: --catch-up is for %s without --proxy-admin: through the proxy, its own --reshard-catch-up bounds the catch-up", ErrUsage, command)
		}
	})
	if misplaced != nil {
		return misplaced
	}
	if *fromPath == "" || *toPath == "" {
		return fmt.Errorf("%w: %s needs --from and --to", ErrUsage, command)
	}
	from, err := rules.Load(*fromPath)
	if err != nil {
		return fmt.Errorf("%w: --from: %v", ErrUsage, err)
	}
	to, err := rules.Load(*toPath)
	if err != nil {
		return fmt.Errorf("%w: --to: %v", ErrUsage, err)
	}
	opts := resharding.Options{Progress: stderr}
	switch command {
	case "start":
		if *copyRate < 0 {
			return fmt.Errorf("%w: --copy-rate takes a number of rows a second, 0 for no bound", ErrUsage)
		}
		if *maxActive < 0 {
			return fmt.Errorf("%w: --max-active takes a number of sessions, 0 for no hold", ErrUsage)
		}
		if _, err := resharding.Start(ctx, from, to, resharding.CopyOptions{Options: opts, PGDump: *pgDump, ReplicaIdentityFull: *identityFull, CopyRate: *copyRate, MaxActive: *maxActive}); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "the move has started: reshard status shows it, reshard cancel ends it")
		return nil
	case "status":
		if *watch < 0 {
			return fmt.Errorf("%w: --watch takes a positive interval, such as 2s", ErrUsage)
		}
		var prev *resharding.Status
		for {
			st, err := resharding.GetStatus(ctx, from, to)
			if err != nil {
				return err
			}
			var b strings.Builder
			if *watch > 0 {
				fmt.Fprintf(&b, "%s\n", st.At.UTC().Format("15:04:05"))
			}
			st.WriteText(&b, prev)
			if _, err := io.WriteString(stdout, b.String()); err != nil {
				return err
			}
			// Watching ends once every stream is ready (or none is under way).
			if *watch == 0 || st.Ready() || len(st.Streams) == 0 {
				return nil
			}
			prev = st
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(*watch):
			}
		}
	case "verify":
		if *chunkRows < 1 || *settle < 0 {
			return fmt.Errorf("%w: --chunk-rows must be positive and --settle 0 or more", ErrUsage)
		}
		if *verifyRate < 0 {
			return fmt.Errorf("%w: --rate takes a number of rows a second, 0 for no bound", ErrUsage)
		}
		if *pinBound < 0 || (*pinBound > 0 && *pinBound < time.Millisecond) {
			return fmt.Errorf("%w: --pin takes a bound from 1ms on the writes' wait (0: not pinned)", ErrUsage)
		}
		if *pinEvery < 0 || (*pinEvery > 0 && *pinBound == 0) {
			return fmt.Errorf("%w: --pin-every takes a duration, and --pin with it", ErrUsage)
		}
		if *maxActive < 0 {
			return fmt.Errorf("%w: --max-active takes a number of sessions, 0 for no hold", ErrUsage)
		}
		d, err := resharding.Verify(ctx, from, to, resharding.VerifyOptions{Options: opts, ChunkRows: *chunkRows, Settle: *settle, Rate: *verifyRate, Pin: *pinBound, PinEvery: *pinEvery, MaxActive: *maxActive, Resume: *resume})
		if err != nil {
			return err
		}
		if err := d.WriteText(stdout); err != nil {
			return err
		}
		if !d.Clean() {
			return errors.New("the destinations differ from the sources")
		}
		return nil
	case "cutover":
		if *verifyHold < 0 || (*proxyAdmin != "" && *verifyHold > time.Hour) || (*verifyHold > 0 && *verifyHold < time.Millisecond) {
			return fmt.Errorf("%w: --verify takes a bound from 1ms (0: no comparison in the hold), at most 1h with --proxy-admin", ErrUsage)
		}
		if *proxyAdmin != "" {
			abs, err := filepath.Abs(*toPath)
			if err != nil {
				return err
			}
			cmd := "RESHARD CUTOVER '" + strings.ReplaceAll(abs, "'", "''") + "'"
			if *verifyHold > 0 {
				cmd += fmt.Sprintf(" VERIFY %g", verifyHold.Seconds())
			}
			return adminCommand(ctx, *proxyAdmin, cmd, stdout)
		}
		rep, err := resharding.Cutover(ctx, from, to, nil, resharding.CutoverOptions{CatchUp: *catchUp, Verify: *verifyHold, Progress: stderr})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "layout version %d is in force on the data sources (catch-up %v): restart every process that routes by the old rules with the new ones; until then their writes are refused\n",
			rep.Version, rep.CatchUp.Round(time.Millisecond))
		return nil
	case "finish":
		if *deleteRate < 0 {
			return fmt.Errorf("%w: --delete-rate takes a number of rows a second, 0 for no bound", ErrUsage)
		}
		if *proxyAdmin != "" {
			cmd := "RESHARD FINISH"
			if *deleteRate > 0 {
				cmd += fmt.Sprintf(" %d", *deleteRate)
			}
			return adminCommand(ctx, *proxyAdmin, cmd, stdout)
		}
		rep, err := resharding.Finish(ctx, from, to, nil, resharding.FinishOptions{Rate: *deleteRate, Progress: stderr})
		if err != nil {
			return err
		}
		for _, k := range slices.Sorted(maps.Keys(rep.Deleted)) {
			fmt.Fprintf(stdout, "%s: %d moved rows deleted\n", k, rep.Deleted[k])
		}
		fmt.Fprintln(stdout, "the move is finished")
		return nil
	case "revert":
		if *proxyAdmin != "" {
			return adminCommand(ctx, *proxyAdmin, "RESHARD REVERT", stdout)
		}
		rep, err := resharding.Revert(ctx, from, to, nil, resharding.CutoverOptions{CatchUp: *catchUp, Progress: stderr})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "layout version %d (the current rules) is in force again, with every write made since the cutover (catch-up %v): restart every process that routes by the target rules with the current ones; until then their writes are refused\n",
			rep.Version, rep.CatchUp.Round(time.Millisecond))
		return nil
	case "cancel":
		if err := resharding.Cancel(ctx, from, to, opts); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "no move is under way between these layouts: everything it made is gone")
		return nil
	}
	p, err := resharding.MakePlan(ctx, from, to, opts)
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

// adminCommand runs one statement on the proxy's admin database and prints its answer.
func adminCommand(ctx context.Context, dsn, sql string, stdout io.Writer) error {
	c, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("--proxy-admin: %w", err)
	}
	defer c.Close(context.Background())
	res, err := c.Exec(ctx, sql).ReadAll()
	if err != nil {
		return fmt.Errorf("the proxy: %w", err)
	}
	for _, r := range res {
		if r.Err != nil {
			return fmt.Errorf("the proxy: %w", r.Err)
		}
		for _, row := range r.Rows {
			var cells []string
			for _, v := range row {
				cells = append(cells, string(v))
			}
			fmt.Fprintln(stdout, strings.Join(cells, "\t"))
		}
	}
	return nil
}

// flagCommands reads the commands a flag is for from the start of its usage, "start,
// verify: ..." (a word after a command's name qualifies it); nil, from a usage without
// that prefix, is every command.
func flagCommands(usage string) []string {
	head, _, ok := strings.Cut(usage, ": ")
	if !ok {
		return nil
	}
	var cmds []string
	for part := range strings.SplitSeq(head, ", ") {
		if f := strings.Fields(part); len(f) > 0 {
			cmds = append(cmds, f[0])
		}
	}
	return cmds
}
