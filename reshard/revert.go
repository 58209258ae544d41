package reshard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/rules"
)

// Between a cutover and its finish, the rows that moved are on their old data sources
// too, where views hide them. A revert makes those the rows in force again, so the
// writes the new layout made since the cutover must reach them: each stream of the
// copy gets a stream back, from the data source the move added to the one it came
// from, publishing the rows the old layout places there (marker table included).
//
// The stream back's publication and slot are made before the cutover's hold. A slot
// made then also decodes the changes the copy goes on applying on the new data source
// until the hold stops it; sent back, they would be duplicates there. So in the hold,
// once the copy stopped and before any write of the new layout, the end of the new
// data source's WAL is marked; the subscriptions on the old data sources, made after
// the hold, start there (their replication origin set to the mark), and the server
// skips every transaction that committed before it. The slots keep every change until
// then. Before the hold, the slots are moved past what the copy applied so far
// (pg_replication_slot_advance), so that the subscriptions decode little that they
// skip; the hold itself moves no slot, which decodes WAL while every client waits.

// reverseTable marks, for each stream back, where its subscription starts: past every
// change the copy applied on its data source (markReverse, or advanceReverse).
const reverseTable = prefix + ".reverse"

// ErrRevert is wrapped when a revert gave up: the new layout serves on, untouched.
var ErrRevert = errors.New("reshard: the revert gave up, and the new layout serves on")

// ErrRevertIncomplete is wrapped when a revert stopped part way (the proxy or the
// command killed during its hold or after it). Running the revert again completes it.
var ErrRevertIncomplete = errors.New("reshard: a revert stopped part way")

// reverseOf returns the stream back of the copy's stream s.
func reverseOf(from, to *rules.Compiled, s stream) stream {
	return stream{from: s.to, to: s.from, name: reverseName(dataSource(to, s.to), dataSource(from, s.from))}
}

// allReverse lists every stream back a move from layout from to layout to may have:
// one for each pair of an old data source and another of the new layout.
func allReverse(from, to *rules.Compiled) []stream {
	var out []stream
	for _, src := range from.DataSources() {
		for _, dst := range to.DataSources() {
			if src.Name != dst.Name {
				out = append(out, reverseOf(from, to, stream{from: src.Name, to: dst.Name}))
			}
		}
	}
	return out
}

// prepareReverse makes, for each of the copy's streams, the publication and the slot
// of its stream back. One left by a cutover that gave up is made again.
func prepareReverse(ctx context.Context, from, to *rules.Compiled, streams []stream, names []string, types [][]rules.KeyType, conns map[string]*pgx.Conn, progress io.Writer) ([]stream, error) {
	var back []stream
	fail := func(err error) ([]stream, error) {
		dropReverse(ctx, from, to, back, progress)
		return nil, err
	}
	carriers := broadcastCarriers(from, to, names, streams)
	for _, b := range from.Rules().Broadcast {
		for _, d := range from.DataSources() {
			if nodeOf(from, b, d.Name) < 0 || nodeOf(to, b, d.Name) >= 0 {
				continue
			}
			if !slices.ContainsFunc(slices.Collect(maps.Keys(carriers)), func(s stream) bool { return s.from == d.Name && slices.Contains(carriers[s], b) }) {
				return fail(fmt.Errorf("reshard: no stream back into %s could carry broadcast table %s, which the new layout does not write there: a revert would find it stale", d.Name, b))
			}
		}
	}
	for _, s := range streams {
		r := reverseOf(from, to, s)
		src := conns[r.from]
		members := []string{markerMember(r.name)}
		tables := backTables(from, to, names, s)
		if len(tables) == 0 {
			continue // a stream of broadcast tables only: the new layout writes them everywhere
		}
		// The broadcast tables of an old data source the new layout does not write
		// them on (a move to new data sources): this stream back carries them whole.
		for _, b := range carriers[s] {
			at := place(to, to.Lookup(b).Nodes[nodeOf(to, b, r.from)])
			if has, _, err := replicaIdentity(ctx, src, at, ""); err != nil {
				return fail(fmt.Errorf("data source %s: %w", r.from, err))
			} else if !has {
				return fail(fmt.Errorf("reshard: broadcast table %s has no replica identity, so that the writes made there after the cutover could not go back to %s, which the new layout does not write it on: give it a primary key, or REPLICA IDENTITY FULL", at, r.to))
			}
			members = append(members, at.qualified())
		}
		for _, name := range tables {
			ni, nj := nodeOf(to, name, r.from), nodeOf(from, name, r.to)
			at := place(to, to.Lookup(name).Nodes[ni])
			key := from.Lookup(name).KeyColumns()[0]
			_, covered, err := replicaIdentity(ctx, src, at, key)
			if err != nil {
				return fail(fmt.Errorf("data source %s: %w", r.from, err))
			}
			if !covered {
				// The move gave the table's source REPLICA IDENTITY FULL (start
				// --replica-identity-full): the same here, restored as there.
				full, err := identityChanged(ctx, conns[s.from], place(from, from.Lookup(name).Nodes[nj]))
				if err != nil {
					return fail(fmt.Errorf("data source %s: %w", s.from, err))
				}
				if full {
					if err := setIdentities(ctx, conns, []Place{at}, &made{}, progress); err != nil {
						return fail(err)
					}
					covered = true
				}
			}
			if !covered {
				return fail(fmt.Errorf("reshard: %s has no replica identity that covers its key %s, so that the writes made there after the cutover could not go back to %s for a revert: give it a primary key with %s, or REPLICA IDENTITY FULL", at, key, r.to, key))
			}
			typ := types[slices.Index(names, name)][0]
			if err := ensureHashHelper(ctx, src, typ); err != nil {
				return fail(fmt.Errorf("data source %s: %w", r.from, err))
			}
			f, err := rowFilter(from, name, typ, nj)
			if err != nil {
				return fail(err)
			}
			members = append(members, at.qualified()+" WHERE ("+f+")")
		}
		if err := dropStream(ctx, src, conns[r.to], r.from, r.to, r.name, io.Discard); err != nil {
			return fail(err)
		}
		back = append(back, r)
		fmt.Fprintf(progress, "reshard: %s -> %s: publication and slot %s, for a revert\n", r.from, r.to, r.name)
		_, err := src.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (slot text PRIMARY KEY, lsn pg_lsn NOT NULL);
			DELETE FROM %[1]s WHERE slot = '%[2]s'`, reverseTable, r.name))
		if err == nil {
			_, err = src.Exec(ctx, "CREATE PUBLICATION "+r.name+" FOR TABLE "+strings.Join(members, ", ")+" WITH (publish = 'insert, update, delete')")
		}
		if err == nil {
			err = createSlot(ctx, src, r.name)
		}
		if err != nil {
			return fail(fmt.Errorf("data source %s: the stream back %s: %w", r.from, r.name, err))
		}
	}
	return back, nil
}

// broadcastCarriers says which stream back carries each broadcast table back to an
// old data source that the new layout does not write it on: the first stream (of
// streams, the copy's) into that data source's stream back whose new data source has
// the table and that carries rows of a sharded table back at all. Exactly one: each
// new data source applies the same changes, and a second stream would apply them again
// out of order with the first.
func broadcastCarriers(from, to *rules.Compiled, names []string, streams []stream) map[stream][]string {
	out := map[stream][]string{}
	for _, b := range from.Rules().Broadcast {
		done := map[string]bool{}
		for _, s := range streams {
			if done[s.from] || nodeOf(from, b, s.from) < 0 || nodeOf(to, b, s.from) >= 0 || nodeOf(to, b, s.to) < 0 || len(backTables(from, to, names, s)) == 0 {
				continue
			}
			done[s.from] = true
			out[s] = append(out[s], b)
		}
	}
	return out
}

// identityChanged reports whether the move gave table at REPLICA IDENTITY FULL.
func identityChanged(ctx context.Context, c *pgx.Conn, at Place) (bool, error) {
	var changed bool
	err := c.QueryRow(ctx, fmt.Sprintf(`SELECT to_regclass('%[1]s.identities') IS NOT NULL
		AND EXISTS (SELECT FROM %[1]s.identities WHERE tbl = (%[2]s) OR tbl = $1)`, prefix, resolvedName), at.qualified()).Scan(&changed)
	return changed, err
}

// backTables lists the sharded tables (of names) whose rows the copy's stream s may
// carry, which its stream back carries back.
func backTables(from, to *rules.Compiled, names []string, s stream) []string {
	var out []string
	for _, name := range names {
		i, j := nodeOf(from, name, s.from), nodeOf(to, name, s.to)
		if i >= 0 && j >= 0 && mayMove(from, to, name, i, j) {
			out = append(out, name)
		}
	}
	return out
}

// slotWait bounds how long making a slot waits for the transactions that hold it back.
var slotWait = 30 * time.Second

// createSlot makes a logical replication slot. PostgreSQL makes it once every
// transaction that was writing anywhere on the server when it began has ended: one
// that stays open holds it back, up to slotWait, and the error names it.
func createSlot(ctx context.Context, c *pgx.Conn, name string) error {
	sctx, cancel := context.WithTimeout(ctx, slotWait)
	defer cancel()
	_, err := c.Exec(sctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", name)
	if err == nil || sctx.Err() == nil || ctx.Err() != nil {
		return err
	}
	// The connection the statement was on is closed: the blockers are read on a new one.
	var who string
	if nc, cerr := pgx.ConnectConfig(ctx, c.Config()); cerr == nil {
		nc.QueryRow(ctx, `SELECT coalesce(string_agg(format('pid %s in database %s, open for %s', pid, datname, date_trunc('second', now() - xact_start)), '; '), 'none left')
			FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()`).Scan(&who)
		nc.Close(context.Background())
	}
	return fmt.Errorf("making slot %s waited %v for transactions that stay open on the server (%s): a slot is made once those writing when it began have ended; end them, or try again: %w",
		name, slotWait, who, err)
}

// advanceWait bounds moving slots back that a crash left unmoved: decoding what was
// written since they were made can take long.
var advanceWait = 10 * time.Minute

// advanceReverse moves the slots of the streams back past every change the copy
// applied, and marks them so. The copy must have stopped, and no write of the new
// layout begun.
func advanceReverse(ctx context.Context, back []stream, conns map[string]*pgx.Conn) error {
	return advance(ctx, back, conns, true)
}

// markReverse marks the end of the WAL of each stream back's data source as where its
// subscription starts: past every change the copy applied there. The copy must have
// stopped (its workers ended, so that every change it applied is in the WAL), and no
// write of the new layout begun. The mark is a commit that waits for the WAL's flush,
// so that it outlives a crash; the slots are not moved (see the top of this file).
func markReverse(ctx context.Context, back []stream, conns map[string]*pgx.Conn) error {
	return eachGroup(ctx, groupBy(back, bySource), func(ctx context.Context, ds string, ss []stream) error {
		err := pgx.BeginFunc(ctx, conns[ds], func(tx pgx.Tx) error {
			// local: the flush here, not a synchronous standby's.
			if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = local"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+reverseTable+" SELECT s, pg_current_wal_insert_lsn() FROM unnest($1::text[]) s ON CONFLICT (slot) DO UPDATE SET lsn = excluded.lsn", streamNames(ss))
			return err
		})
		if err != nil {
			return fmt.Errorf("data source %s: marking where the streams back start: %w", ds, err)
		}
		return nil
	})
}

// advance moves the slots of the streams back to the end of their server's WAL (past
// every change the copy applied so far), and with mark marks them so.
func advance(ctx context.Context, back []stream, conns map[string]*pgx.Conn, mark bool) error {
	return eachGroup(ctx, groupBy(back, bySource), func(ctx context.Context, _ string, ss []stream) error {
		return advanceOn(ctx, ss, conns, mark)
	})
}

// advanceOn is advance for streams back of one data source.
func advanceOn(ctx context.Context, back []stream, conns map[string]*pgx.Conn, mark bool) error {
	ds := back[0].from
	c := conns[ds]
	// The copy's apply worker commits without waiting for the WAL flush, and a slot
	// moves at most to the flushed end: a commit of our own that waits for it
	// (whatever the server's synchronous_commit) flushes past everything written
	// before, the copy's changes included. It must write WAL to wait (a logical
	// message, which the streams' subscribers do not ask for). Once for all the data
	// source's slots.
	var end string
	err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		// local: the flush here, not a synchronous standby's.
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = local"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text FROM (SELECT pg_logical_emit_message(true, 'shardlab_reshard', 'flush')) x").Scan(&end)
	})
	if err != nil {
		return fmt.Errorf("data source %s: %w", ds, err)
	}
	var names, moved []string
	for _, r := range back {
		var short bool
		var at string
		if err := c.QueryRow(ctx, "SELECT end_lsn < $2::pg_lsn, end_lsn::text FROM pg_replication_slot_advance($1, pg_current_wal_flush_lsn())", r.name, end).Scan(&short, &at); err != nil {
			return fmt.Errorf("data source %s: moving slot %s past the copy: %w", ds, r.name, err)
		}
		if short {
			return fmt.Errorf("data source %s: slot %s did not move past %s", ds, r.name, end)
		}
		names, moved = append(names, r.name), append(moved, at)
	}
	if !mark {
		return nil
	}
	// The marks keep where the slots were moved to: PostgreSQL writes a moved slot to
	// disk at its next checkpoint only, and a crash before it would move the slot
	// back; the subscription starts from the mark (subscribeReverse).
	if _, err := c.Exec(ctx, "INSERT INTO "+reverseTable+" SELECT unnest($1::text[]), unnest($2::pg_lsn[]) ON CONFLICT (slot) DO UPDATE SET lsn = excluded.lsn", names, moved); err != nil {
		return fmt.Errorf("data source %s: %w", ds, err)
	}
	return nil
}

// unmarkReverse removes the marks of advanceReverse: a hold that gave up starts the
// copy again, whose changes the slots then take in.
func unmarkReverse(ctx context.Context, back []stream, conns map[string]*pgx.Conn) error {
	for _, r := range back {
		if _, err := conns[r.from].Exec(ctx, "DELETE FROM "+reverseTable+" WHERE slot = $1", r.name); err != nil {
			return fmt.Errorf("data source %s: %w", r.from, err)
		}
	}
	return nil
}

// reverseMade lists the streams back whose slot exists; with advanced, only those the
// cutover marked (where their subscription starts), else only those it did not.
func reverseMade(ctx context.Context, from, to *rules.Compiled, conns map[string]*pgx.Conn, advanced bool) ([]stream, error) {
	var out []stream
	for _, r := range allReverse(from, to) {
		c := conns[r.from]
		var slot, marked bool
		err := c.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1), to_regclass($2) IS NOT NULL",
			r.name, reverseTable).Scan(&slot, &marked)
		if err == nil && slot && marked {
			err = c.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+reverseTable+" WHERE slot = $1)", r.name).Scan(&marked)
		}
		if err != nil {
			return nil, fmt.Errorf("data source %s: %w", r.from, err)
		}
		if slot && marked == advanced {
			out = append(out, r)
		}
	}
	return out, nil
}

// subscribeReverse makes the subscriptions of the streams back that have none, on the
// old data sources: they apply every change their slot kept since the cutover.
func subscribeReverse(ctx context.Context, to *rules.Compiled, back []stream, conns map[string]*pgx.Conn, progress io.Writer) error {
	for _, r := range back {
		var lsn string
		if err := conns[r.from].QueryRow(ctx, "SELECT lsn::text FROM "+reverseTable+" WHERE slot = $1", r.name).Scan(&lsn); err != nil {
			return fmt.Errorf("data source %s: where slot %s was moved to: %w", r.from, r.name, err)
		}
		dst := conns[r.to]
		// One made before, and left disabled short of its origin (a process killed
		// between its steps), gets the origin too; an enabled one streams already.
		var exists, behind bool
		err := dst.QueryRow(ctx, `SELECT true, NOT subenabled AND coalesce(pg_replication_origin_progress('pg_' || oid, false), '0/0') < $2::pg_lsn
			FROM pg_subscription WHERE subname = $1 AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())`, r.name, lsn).Scan(&exists, &behind)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("data source %s: %w", r.to, err)
		}
		if exists && !behind {
			continue
		}
		// Made disabled, its origin set to the mark (the server then
		// starts the stream there, even if a crash moved the slot back), then enabled.
		if !exists {
			var conninfo string
			if conninfo, err = subscriptionConninfo(to, r.from); err == nil {
				_, err = dst.Exec(ctx, fmt.Sprintf("CREATE SUBSCRIPTION %s CONNECTION %s PUBLICATION %s WITH (create_slot = false, slot_name = '%s', copy_data = false, enabled = false)",
					r.name, conninfo, r.name, r.name))
			}
		}
		if err == nil {
			_, err = dst.Exec(ctx, `SELECT pg_replication_origin_advance('pg_' || oid, $2::pg_lsn) FROM pg_subscription
				WHERE subname = $1 AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())`, r.name, lsn)
		}
		if err == nil {
			_, err = dst.Exec(ctx, "ALTER SUBSCRIPTION "+r.name+" ENABLE")
		}
		if err != nil {
			return fmt.Errorf("data source %s: subscribing to %s: %w", r.to, r.name, err)
		}
		fmt.Fprintf(progress, "reshard: %s follows %s (subscription %s), for a revert\n", r.to, r.from, r.name)
	}
	return nil
}

// dropReverse drops the streams back, on connections of its own (the caller's may
// have been closed by a bound): a cutover that gave up leaves none.
func dropReverse(ctx context.Context, from, to *rules.Compiled, back []stream, progress io.Writer) {
	if len(back) == 0 {
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	conns, err := connectAll(uctx, from, to)
	if err != nil {
		fmt.Fprintf(progress, "reshard: the streams back stay (reshard cancel drops them): %v\n", err)
		return
	}
	defer closeAll(conns)
	for _, r := range back {
		if err := dropStream(uctx, conns[r.from], conns[r.to], r.from, r.to, r.name, progress); err != nil {
			fmt.Fprintf(progress, "reshard: the stream back %s stays (reshard cancel drops it): %v\n", r.name, err)
		}
	}
}

// dropAllReverse drops every stream back of the move.
func dropAllReverse(ctx context.Context, from, to *rules.Compiled, conns map[string]*pgx.Conn, progress io.Writer) error {
	for _, r := range allReverse(from, to) {
		if err := dropStream(ctx, conns[r.from], conns[r.to], r.from, r.to, r.name, progress); err != nil {
			return err
		}
	}
	return nil
}

// subscriptionOn reports whether subscription name is enabled on c's database, or its
// worker still runs.
func subscriptionOn(ctx context.Context, c *pgx.Conn, name string) (bool, error) {
	var on bool
	err := c.QueryRow(ctx, `SELECT subenabled OR EXISTS (SELECT FROM pg_stat_subscription st WHERE st.subid = s.oid AND st.pid IS NOT NULL)
		FROM pg_subscription s WHERE subname = $1 AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())`, name).Scan(&on)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return on, err
}

// Revert returns a deployment that a cutover switched from layout from to layout to,
// and that was not finished, to layout from, with every write made since the cutover:
// the streams back (made by the cutover) have carried them to the old data sources,
// where the rows that moved stayed. It is a hold as the cutover's: the proxy px (nil:
// none) holds new transactions, those in flight end (within opts.Drain), the data
// sources record layout from as the one in force at a new version (the fence refuses
// the writes of processes that route by to from then on), the old data sources apply
// every change of the new ones (within opts.CatchUp), the streams back stop, and the
// proxy routes by from; then the held transactions go on. If a step overruns its bound
// or fails, the revert gives up (ErrRevert) and layout to serves on, untouched.
//
// Then it removes what the move made, as Cancel: the streams both ways, the views,
// the tables it created on the data sources it added (their rows are the old data
// sources' now), the helper schemas. A revert that stopped part way is completed by
// running it again.
func Revert(ctx context.Context, from, to *rules.Compiled, px Proxy, opts CutoverOptions) (*CutoverReport, error) {
	opts = opts.withDefaults()
	conns, cur, err := openMove(ctx, from, to)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	switch {
	case cur != nil && cur.Digest == from.Digest() && cur.Phase == phaseReverting:
		return completeRevert(ctx, from, to, cur, conns, opts)
	case cur == nil || cur.Digest == from.Digest():
		return nil, fmt.Errorf("reshard: the move from layout %s to %s was not cut over: there is nothing to revert (cancel ends a move before its cutover)", from.Digest(), to.Digest())
	case cur.Digest != to.Digest():
		return nil, fmt.Errorf("%w: layout version %d (%s) is in force, not the target given (%s)", ErrStaleLayout, cur.Version, cur.Digest, to.Digest())
	case cur.Phase != phaseCutover:
		return nil, fmt.Errorf("reshard: a finish of the move to layout version %d began: the old data sources no longer hold (all) the rows that moved, nor get the writes made since, so it cannot be reverted; run finish to its end (a move back is a new move: reshard start with the two rules files swapped)", cur.Version)
	}
	left, err := cutoverLeft(ctx, from, to, cur, conns)
	if err != nil {
		return nil, err
	}
	if !left.empty() {
		return nil, fmt.Errorf("%w: run reshard cutover again with the same rules files to complete it, then revert", ErrCutoverIncomplete)
	}
	back, err := reverseMade(ctx, from, to, conns, true)
	if err != nil {
		return nil, err
	}
	if err := checkReverse(ctx, from, to, back, conns); err != nil {
		return nil, err
	}
	// Subscribed, and enabled (a hold that gave up, or a revert cut short, may have
	// left one disabled).
	if err := subscribeReverse(ctx, to, back, conns, opts.Progress); err != nil {
		return nil, err
	}
	if err := startStreams(ctx, back, conns); err != nil {
		return nil, err
	}
	// Caught up once before the hold, so that the hold's catch-up waits for little.
	pctx, stop := context.WithTimeout(ctx, max(opts.CatchUp, time.Minute))
	err = catchUp(pctx, back, conns)
	stop()
	if err != nil {
		return nil, fmt.Errorf("%w: the old data sources did not catch up with the new ones: %v", ErrRevert, err)
	}
	sw, discard := func() error { return nil }, func() {}
	if px != nil {
		if sw, discard, err = px.Prepare(ctx, from); err != nil {
			return nil, fmt.Errorf("reshard: readying the proxy for the old layout: %w", err)
		}
	}
	seqs, err := findSequences(ctx, back, conns, opts.Progress)
	if err != nil {
		discard()
		return nil, err
	}
	rep := &CutoverReport{Version: cur.Version + 1}
	next := &Record{Version: cur.Version + 1, Digest: from.Digest(), Phase: phaseReverting, Switched: time.Now().UTC()}
	h := hold{from: from, to: to, px: px, sw: sw, streams: back, prior: cur, next: next, opts: opts, gaveUp: ErrRevert, name: "revert",
		stopped: func(ctx context.Context, conns map[string]*pgx.Conn, step func(string)) error {
			err := syncSequences(ctx, seqs, conns)
			step("sequences")
			return err
		}}
	switched, err := h.run(ctx, conns, rep)
	if !switched {
		discard()
	}
	if err != nil {
		return nil, err
	}
	crashPoint("revert-removing")
	if err := removeReverted(ctx, from, to, next, conns, opts.Progress); err != nil {
		return rep, err
	}
	return rep, nil
}

// checkReverse fails unless every stream of the copy that carried sharded rows has
// its stream back, made and marked past the copy: a revert without one would lose the
// writes made since the cutover on its data source.
func checkReverse(ctx context.Context, from, to *rules.Compiled, back []stream, conns map[string]*pgx.Conn) error {
	names, err := shardedTables(ctx, from, conns)
	if err != nil {
		return err
	}
	for _, src := range from.DataSources() {
		for _, dst := range to.DataSources() {
			if src.Name == dst.Name {
				continue
			}
			s := stream{from: src.Name, to: dst.Name, name: streamName(src, dst)}
			var exists bool
			if err := conns[dst.Name].QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_subscription WHERE subname = $1
				AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database()))`, s.name).Scan(&exists); err != nil {
				return fmt.Errorf("data source %s: %w", dst.Name, err)
			}
			if !exists || len(backTables(from, to, names, s)) == 0 {
				continue
			}
			r := reverseOf(from, to, s)
			if !slices.Contains(back, r) {
				return fmt.Errorf("reshard: the stream back %s from %s to %s is missing, so the writes made on %s since the cutover could not go back: the move cannot be reverted",
					r.name, r.from, r.to, r.from)
			}
		}
	}
	return nil
}

// completeRevert ends a revert that stopped part way: the record on every data source,
// the streams back caught up and stopped, what the move made removed.
func completeRevert(ctx context.Context, from, to *rules.Compiled, cur *Record, conns map[string]*pgx.Conn, opts CutoverOptions) (*CutoverReport, error) {
	fmt.Fprintf(opts.Progress, "reshard: the revert to layout version %d stopped part way: completing it\n", cur.Version)
	// As the hold: every data source switching first, every stream back (enabled again
	// if a hold that gave up stopped it) caught up and stopped, then the record itself.
	final := *cur
	final.Switching = false
	switching := final
	switching.Switching = true
	cctx, stop := context.WithTimeout(ctx, max(opts.CatchUp, time.Minute))
	defer stop()
	all := allDataSources(from, to)
	for _, ds := range all {
		rec, err := readRecord(cctx, conns[ds])
		if err != nil {
			return nil, fmt.Errorf("data source %s: %w", ds, err)
		}
		if rec != nil && rec.Version == cur.Version && rec.Digest == cur.Digest {
			continue
		}
		if err := writeRecord(cctx, conns[ds], &switching); err != nil {
			return nil, fmt.Errorf("data source %s: recording layout version %d: %w", ds, cur.Version, err)
		}
	}
	back, err := reverseMade(cctx, from, to, conns, true)
	if err != nil {
		return nil, err
	}
	if err := subscribeReverse(cctx, to, back, conns, opts.Progress); err != nil {
		return nil, err
	}
	if err := startStreams(cctx, back, conns); err != nil {
		return nil, err
	}
	if err := catchUp(cctx, back, conns); err != nil {
		return nil, err
	}
	if err := stopStreams(cctx, back, conns); err != nil {
		return nil, err
	}
	seqs, err := findSequences(cctx, back, conns, opts.Progress)
	if err == nil {
		err = syncSequences(cctx, seqs, conns)
	}
	if err != nil {
		return nil, err
	}
	for _, ds := range all {
		if err := writeRecord(cctx, conns[ds], &final); err != nil {
			return nil, fmt.Errorf("data source %s: recording layout version %d: %w", ds, cur.Version, err)
		}
	}
	if err := removeReverted(ctx, from, to, &final, conns, opts.Progress); err != nil {
		return nil, err
	}
	return &CutoverReport{Version: cur.Version}, nil
}

// removeReverted removes what a reverted move made, and records the old layout as the
// one that serves alone.
func removeReverted(ctx context.Context, from, to *rules.Compiled, rec *Record, conns map[string]*pgx.Conn, progress io.Writer) error {
	// The old layout serves meanwhile: DDL on its tables (a view dropped, a replica
	// identity restored) waits at most a few seconds for a lock, rather than queue
	// its transactions behind it, or close a cycle of waits across data sources.
	for ds, c := range conns {
		if _, err := c.Exec(ctx, "SET lock_timeout = '5s'"); err != nil {
			return fmt.Errorf("data source %s: %w", ds, err)
		}
	}
	if err := removeMove(ctx, from, to, conns, progress); err != nil {
		return fmt.Errorf("reshard: the layout is reverted, and removing what the move made failed: %w; run reshard revert again", err)
	}
	done := &Record{Version: rec.Version, Digest: rec.Digest, Phase: phaseDone, Switched: rec.Switched}
	for _, ds := range allDataSources(from, to) {
		if err := writeRecord(ctx, conns[ds], done); err != nil {
			return fmt.Errorf("data source %s: recording the revert as finished: %w; run reshard revert again", ds, err)
		}
	}
	fmt.Fprintf(progress, "reshard: reverted to layout version %d; nothing of the move is left\n", rec.Version)
	return nil
}

// checkReverted fails with ErrRevertIncomplete when the revert to record rec (of
// layout l) stopped in its hold: a data source of l without the record, or a stream
// back still running.
func checkReverted(ctx context.Context, l *rules.Compiled, rec *Record) error {
	conns, err := connectAll(ctx, l)
	if err != nil {
		return err
	}
	defer closeAll(conns)
	for _, d := range l.DataSources() {
		r, err := readRecord(ctx, conns[d.Name])
		if err != nil {
			return fmt.Errorf("data source %s: %w", d.Name, err)
		}
		var running bool
		if err := conns[d.Name].QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_subscription s WHERE subname LIKE $1
			AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND (subenabled OR EXISTS (SELECT FROM pg_stat_subscription st WHERE st.subid = s.oid AND st.pid IS NOT NULL)))`,
			strings.ReplaceAll(prefix, "_", `\_`)+`\_r\_%`).Scan(&running); err != nil {
			return fmt.Errorf("data source %s: %w", d.Name, err)
		}
		if r == nil || r.Version != rec.Version || r.Digest != rec.Digest || running {
			return fmt.Errorf("%w: data source %s is not at layout version %d yet, or still applies the changes of the new data sources: run reshard revert again with the same rules files to complete it",
				ErrRevertIncomplete, d.Name, rec.Version)
		}
	}
	return nil
}
