package reshard

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/rules"
)

// FinishOptions tune Finish.
type FinishOptions struct {
	// Batch is how many moved rows one statement deletes from an old data source (0:
	// DefaultFinishBatch): each batch is a transaction of its own, so that the delete
	// holds no lock for long and the live load goes on beside it.
	Batch int
	// Drain bounds the proxy's pause for its switch to the plain layout (0:
	// DefaultDrain).
	Drain time.Duration
	// Rate bounds the delete, in rows a second on each data source (0: no bound):
	// after each batch it waits as long as the bound asks.
	Rate int
	// Progress receives a line per step, and one per table deleted from.
	Progress io.Writer
}

// DefaultFinishBatch is the usual FinishOptions.Batch.
const DefaultFinishBatch = 10000

// FinishReport says what Finish did.
type FinishReport struct {
	Deleted map[string]int64 // moved rows deleted from their old data sources, by "data source.table"
	Pause   time.Duration    // the proxy's pause for its switch to the plain layout
}

// Finish ends a move that was cut over: it drops the streams (subscriptions, slots,
// publications), deletes the moved rows from the data sources they left (in batches,
// while the load goes on: the views hide them meanwhile), switches the proxy px (nil:
// none) from the views to the tables themselves, drops the views, and records the
// move as done. It can be run again after a failure or a crash, and picks up where it
// stopped. The fence stays: a process that still routes by the old rules stays
// refused.
//
// Without px, a proxy that still reads through the views would fail once they are
// dropped: give the proxy that serves the deployment, or restart it with the new
// rules after the finish.
func Finish(ctx context.Context, from, to *rules.Compiled, px Proxy, opts FinishOptions) (*FinishReport, error) {
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if opts.Batch <= 0 {
		opts.Batch = DefaultFinishBatch
	}
	if opts.Drain <= 0 {
		opts.Drain = DefaultDrain
	}
	conns, err := connectAll(ctx, from, to)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	cur, err := currentRecord(ctx, from, to, conns)
	if err != nil {
		return nil, err
	}
	switch {
	case cur != nil && cur.Digest == from.Digest() && cur.Phase != phaseDone:
		return nil, fmt.Errorf("reshard: the move was reverted to layout version %d: run reshard revert again to complete it", cur.Version)
	case cur == nil || (cur.Digest == from.Digest()):
		return nil, fmt.Errorf("reshard: the move from layout %s to %s was not cut over: cut it over first (or cancel it)", from.Digest(), to.Digest())
	case cur.Digest != to.Digest():
		return nil, fmt.Errorf("%w: layout version %d (%s) is in force, not the target given (%s)", ErrStaleLayout, cur.Version, cur.Digest, to.Digest())
	}
	rep := &FinishReport{Deleted: map[string]int64{}}
	if cur.Phase == phaseCutover || cur.Phase == phaseFinishing {
		if err := finishMoved(ctx, from, to, cur, conns, px, opts, rep); err != nil {
			return rep, err
		}
	}
	// What is left is dropped last, and again by a finish run after one that stopped
	// part way: the views (no layout in force reads through them any more) and the
	// move's own schema (its record, the hash helpers, the marker, the marks of what it
	// fed and of the replica identities it changed).
	for _, v := range cur.Views {
		vq := Place{Schema: v.Schema, Table: v.Name}.qualified()
		if _, err := conns[v.DataSource].Exec(ctx, "DROP VIEW IF EXISTS "+vq); err != nil {
			return rep, fmt.Errorf("data source %s: dropping view %s: %w", v.DataSource, vq, err)
		}
	}
	for _, ds := range allDataSources(from, to) {
		if _, err := conns[ds].Exec(ctx, "DROP SCHEMA IF EXISTS "+prefix+" CASCADE"); err != nil {
			return rep, fmt.Errorf("data source %s: %w", ds, err)
		}
	}
	fmt.Fprintf(opts.Progress, "reshard: the move to layout version %d is finished\n", cur.Version)
	return rep, nil
}

// finishMoved carries out the steps of a finish that need the move cut over and not
// finished: the streams dropped, the moved rows deleted, the proxy switched to the
// tables, the replica identities restored, and the move recorded as done (the views
// kept in the record, so that a finish run again drops them).
func finishMoved(ctx context.Context, from, to *rules.Compiled, cur *Record, conns map[string]*pgx.Conn, px Proxy, opts FinishOptions, rep *FinishReport) error {
	if err := checkMove(ctx, from, to, conns); err != nil {
		return err
	}
	// A cutover that stopped part way is completed first (its streams may still run,
	// its sequences are not set): the cutover run again does it.
	left, err := cutoverLeft(ctx, from, to, cur, conns)
	if err != nil {
		return err
	}
	if !left.empty() {
		return fmt.Errorf("%w: run reshard cutover again with the same rules files to complete it, then finish", ErrCutoverIncomplete)
	}
	// Recorded before anything is dropped: from here a revert is refused (the streams
	// back go first, and the rows that moved away go after).
	finishing := *cur
	finishing.Phase = phaseFinishing
	finishing.Switching = false
	for _, ds := range allDataSources(from, to) {
		if err := writeRecord(ctx, conns[ds], &finishing); err != nil {
			return fmt.Errorf("data source %s: recording the finish: %w; run finish again", ds, err)
		}
	}
	crashPoint("finish-finishing")
	// The streams first: the streams back, which would carry the new layout's writes
	// back to the rows deleted below; then the copy's, stopped at the cutover, whose
	// slots would hold the WAL of the deletes.
	if err := dropAllReverse(ctx, from, to, conns, opts.Progress); err != nil {
		return err
	}
	for _, src := range from.DataSources() {
		for _, dst := range to.DataSources() {
			if src.Name == dst.Name {
				continue
			}
			if err := dropStream(ctx, conns[src.Name], conns[dst.Name], src.Name, dst.Name, streamName(src, dst), opts.Progress); err != nil {
				return err
			}
		}
	}
	names, err := shardedTables(ctx, from, conns)
	if err != nil {
		return err
	}
	types, err := checkKeyTypes(ctx, from, to, names, conns)
	if err != nil {
		return err
	}
	typeOf := map[string]rules.KeyType{}
	for i, n := range names {
		typeOf[n] = types[i][0]
	}
	for _, v := range cur.Views {
		n, err := deleteMoved(ctx, conns[v.DataSource], to, v, typeOf[v.Table], opts, opts.Progress)
		rep.Deleted[v.DataSource+"."+v.Table] = n
		if err != nil {
			return err
		}
	}
	// The places the target leaves: every row there moved. All of a data source's at
	// once, so that a foreign key between two of them does not stop the TRUNCATE.
	leaving := map[string][]Place{}
	leftNames := map[Place]string{}
	for _, name := range names {
		for _, n := range from.Lookup(name).Nodes {
			if at := place(from, n); nodeOf(to, name, at.DataSource) < 0 {
				leaving[at.DataSource] = append(leaving[at.DataSource], at)
				leftNames[at] = name
			}
		}
	}
	for _, ds := range slices.Sorted(maps.Keys(leaving)) {
		counts, err := emptyLeft(ctx, conns[ds], to, leaving[ds], opts.Progress)
		if err != nil {
			return err
		}
		for i, at := range leaving[ds] {
			rep.Deleted[ds+"."+leftNames[at]] = counts[i]
		}
	}
	crashPoint("finish-deleted")
	if px != nil {
		sw, discard, err := px.Prepare(ctx, to)
		if err != nil {
			return fmt.Errorf("reshard: readying the proxy to read the tables themselves: %w; run finish again", err)
		}
		held := time.Now()
		dctx, stop := context.WithTimeout(ctx, opts.Drain)
		resume, err := px.Pause(dctx)
		stop()
		if err != nil {
			discard()
			return fmt.Errorf("reshard: pausing the proxy to switch it from the views to the tables: %w; run finish again", err)
		}
		if err = sw(); err != nil {
			discard()
		}
		if rerr := resume(); err == nil {
			err = rerr
		}
		rep.Pause = time.Since(held)
		if err != nil {
			return fmt.Errorf("reshard: switching the proxy from the views to the tables: %w; run finish again", err)
		}
		fmt.Fprintf(opts.Progress, "reshard: the proxy reads the tables themselves (paused %v)\n", rep.Pause.Round(time.Microsecond))
	}
	for _, ds := range allDataSources(from, to) {
		if err := restoreIdentities(ctx, conns[ds], ds, opts.Progress); err != nil {
			return err
		}
	}
	done := *cur
	done.Switching = false
	done.Phase = phaseDone // From and Views kept: a finish run again drops what is left
	for _, ds := range allDataSources(from, to) {
		if err := writeRecord(ctx, conns[ds], &done); err != nil {
			return fmt.Errorf("data source %s: recording the move as finished: %w; run finish again", ds, err)
		}
	}
	return nil
}

// deleteMoved deletes from a table on an old data source the rows that layout to
// places elsewhere (those view v hides), batch rows per transaction, in key order: each
// batch starts at the last key the one before deleted (at it, not after it: a key need
// not be unique, as pgbench_history's aid), so that the table is read about once in
// all.
func deleteMoved(ctx context.Context, c *pgx.Conn, to *rules.Compiled, v View, typ rules.KeyType, opts FinishOptions, progress io.Writer) (int64, error) {
	batch := opts.Batch
	if opts.Rate > 0 {
		batch = min(batch, opts.Rate) // no batch above the bound
	}
	at := Place{DataSource: v.DataSource, Schema: v.Schema, Table: unqualifiedView(v)}
	node := nodeOf(to, v.Table, v.DataSource)
	filter, err := rowFilter(to, v.Table, typ, node)
	if err != nil {
		return 0, err
	}
	key := pgx.Identifier{to.Lookup(v.Table).KeyColumns()[0]}.Sanitize()
	// The move's own writes pass the fence as the layout in force.
	if _, err := c.Exec(ctx, "SELECT set_config($1, $2, false)", LayoutSetting, to.Digest()); err != nil {
		return 0, fmt.Errorf("data source %s: %w", v.DataSource, err)
	}
	// $1 is the last key deleted, as text (NULL: from the first).
	sql := fmt.Sprintf(`WITH d AS (DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(SELECT ctid FROM %[1]s
			WHERE ($1::text IS NULL OR %[2]s >= $1::text::%[4]s) AND NOT (%[3]s) ORDER BY %[2]s LIMIT %[5]d)) RETURNING %[2]s)
		SELECT count(*), ((array_agg(%[2]s ORDER BY %[2]s DESC))[1])::text FROM d`, at.qualified(), key, filter, typ, batch)
	var total int64
	var after *string
	began, last := time.Now(), time.Now()
	for {
		var n int64
		if err := c.QueryRow(ctx, sql, after).Scan(&n, &after); err != nil {
			return total, fmt.Errorf("data source %s: deleting the rows of %s that moved: %w", v.DataSource, at.qualified(), err)
		}
		total += n
		if n == 0 {
			break
		}
		if opts.Rate > 0 {
			// Ahead of the bound: wait until the rows deleted so far are due.
			due := began.Add(time.Duration(float64(total) / float64(opts.Rate) * float64(time.Second)))
			select {
			case <-ctx.Done():
				return total, ctx.Err()
			case <-time.After(time.Until(due)):
			}
		}
		if time.Since(last) > 5*time.Second {
			fmt.Fprintf(progress, "reshard: %s: %d moved rows of %s deleted so far\n", v.DataSource, total, at.qualified())
			last = time.Now()
		}
	}
	fmt.Fprintf(progress, "reshard: %s: deleted the %d rows of %s that moved away\n", v.DataSource, total, at.qualified())
	return total, nil
}

// emptyLeft empties tables of one data source that layout to no longer places there
// (a move to new data sources): every row in them moved. It counts their rows (one
// read of each), then TRUNCATEs them in one statement, not a bounded delete: that
// writes next to no WAL and leaves no dead rows, and nothing of the layout in force
// reads them. It waits at most 10 s for a reader of the old layout to let go of them.
// A table of another kind whose foreign key references one of them stops it (never
// CASCADE: that would empty the user's table too).
func emptyLeft(ctx context.Context, c *pgx.Conn, to *rules.Compiled, places []Place, progress io.Writer) ([]int64, error) {
	counts := make([]int64, len(places))
	var names []string
	for _, at := range places {
		names = append(names, at.qualified())
	}
	err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		// The move's own writes pass the fence as the layout in force.
		if _, err := tx.Exec(ctx, "SELECT set_config($1, $2, true), set_config('lock_timeout', '10s', true)", LayoutSetting, to.Digest()); err != nil {
			return err
		}
		for i, name := range names {
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+name).Scan(&counts[i]); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, "TRUNCATE "+strings.Join(names, ", "))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("data source %s: emptying %s, which the new layout does not use there: %w; run finish again", places[0].DataSource, strings.Join(names, ", "), err)
	}
	for i, name := range names {
		fmt.Fprintf(progress, "reshard: %s: emptied %s (%d rows), which the new layout does not use there\n", places[0].DataSource, name, counts[i])
	}
	return counts, nil
}

// unqualifiedView is the name of the table view v stands for.
func unqualifiedView(v View) string {
	return v.Name[:len(v.Name)-len(viewSuffix)]
}
