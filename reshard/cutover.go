package reshard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/rules"
)

// Proxy is a running proxy that a cutover switches from one layout to another
// (package proxy's Server). Without one, a cutover switches the data sources alone:
// every process that routes by the old rules is then fenced off, and is to be
// restarted with the new ones.
type Proxy interface {
	// Pause holds new transactions that touch the tables a move changes (the sharded
	// and broadcast ones; the proxy's others go on) and waits, within ctx, until those
	// in flight end (as the admin console's PAUSE). resume lifts that pause, after a
	// Switch too.
	Pause(ctx context.Context) (resume func() error, err error)
	// Prepare readies the proxy to route by rules l while it serves on (a router, its
	// pools warmed): sw switches to it once the proxy is paused, discard drops it.
	Prepare(ctx context.Context, l *rules.Compiled) (sw func() error, discard func(), err error)
}

// CutoverOptions bound a cutover's steps.
type CutoverOptions struct {
	// Drain bounds the wait for the transactions in flight to end once new ones are
	// held (0: DefaultDrain).
	Drain time.Duration
	// CatchUp bounds the rest of the hold once the transactions in flight ended: no
	// prepared transaction left on the sources, the new layout recorded, every
	// destination applying its source's changes up to a marker written then, and the
	// streams stopped (0: DefaultCatchUp); with Verify, CatchUp + Verify.
	CatchUp time.Duration
	// Verify, when positive, compares the destinations with their sources in the
	// hold, once the streams stopped (Verify, pinned: nothing writes then), within
	// this bound, counted as pause: a difference, or the bound overrun, gives the
	// cutover up. It reads every moving row, so it suits small moves.
	Verify time.Duration
	// Progress receives a line per step.
	Progress io.Writer
	// crashAfterRecord stops the cutover once the new layout is recorded, as a crash
	// would (tests).
	crashAfterRecord bool
}

// errCrashed ends a cutover or a verify that a test crashed.
var errCrashed = errors.New("reshard: crashed (a test)")

// Defaults of CutoverOptions.
const (
	DefaultDrain   = 5 * time.Second
	DefaultCatchUp = 5 * time.Second
)

// ErrCutover is wrapped when a cutover gave up: the old layout serves on, untouched.
var ErrCutover = errors.New("reshard: the cutover gave up, and the old layout serves on")

// CutoverReport says how a cutover went.
type CutoverReport struct {
	Version int64 // the layout version now in force
	// Pause is how long new transactions were held: from the start of the pause to
	// its end; Drain, CatchUp and Switch are its steps.
	Pause, Drain, CatchUp, Switch time.Duration
	// Steps are CatchUp's own steps, in order, with their durations.
	Steps []Step
	Views []View
}

// Step is one step of a hold and how long it took.
type Step struct {
	Name string
	Took time.Duration
}

// viewComment marks the views a move makes, so that no other is replaced or dropped.
const viewComment = "made by shardlab reshard cutover; dropped by reshard finish and cancel"

// viewSuffix ends the name of the view that stands for a table between cutover and
// finish.
const viewSuffix = "__shardlab_owned"

// Cutover switches a deployment from layout from to layout to, once the copy of
// Start is streaming: the proxy px (nil: none) holds new transactions, those in flight
// finish (within Drain), the data sources record layout to as the one in force (the
// fence refuses the writes of processes that route by from from then on), the
// destinations apply every change the sources committed before (within CatchUp), the
// streams stop, and the proxy routes by to from then on; then the held transactions
// go on. If a step overruns its bound or fails, the cutover undoes what
// it did and the old layout serves on (ErrCutover).
//
// Until Finish, the rows that moved are on their old data sources too: there, each
// sharded table is read and written through a view that shows only the rows layout to
// places there, so that no read sees a moved row twice. Before the hold, the cutover
// makes those views and puts the fence on every table the move touches.
func Cutover(ctx context.Context, from, to *rules.Compiled, px Proxy, opts CutoverOptions) (*CutoverReport, error) {
	opts = opts.withDefaults()
	conns, cur, err := openMove(ctx, from, to)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	if cur != nil && cur.Phase == phaseReverting {
		return nil, fmt.Errorf("%w: run reshard revert again with the same rules files to complete it", ErrRevertIncomplete)
	}
	if cur != nil && cur.Digest == to.Digest() {
		return complete(ctx, from, to, cur, conns, opts)
	}
	if cur != nil && cur.Digest != from.Digest() {
		return nil, fmt.Errorf("%w: layout version %d (%s) is in force, not the current rules given (%s)", ErrStaleLayout, cur.Version, cur.Digest, from.Digest())
	}
	st, err := statusOn(ctx, from, to, conns)
	if err != nil {
		return nil, err
	}
	if !st.Ready() {
		var b strings.Builder
		st.WriteText(&b)
		return nil, fmt.Errorf("reshard: the copy is not streaming every table yet, so the move cannot cut over:\n%s", b.String())
	}
	streams := streamsOf(from, to, st)
	for _, s := range streams {
		var ok bool
		if err := conns[s.from].QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication_tables WHERE pubname = $1
			AND schemaname = $2 AND tablename = 'marker')`, s.name, prefix).Scan(&ok); err != nil {
			return nil, fmt.Errorf("data source %s: %w", s.from, err)
		}
		if !ok {
			return nil, fmt.Errorf("reshard: publication %s on %s has no marker table (a move started by an older reshard): cancel the move and start it again", s.name, s.from)
		}
	}

	// Before the hold: the views and the fence. Neither changes what the old layout
	// reads or writes.
	names, err := shardedTables(ctx, from, conns)
	if err != nil {
		return nil, err
	}
	types, err := checkKeyTypes(ctx, from, to, names, conns)
	if err != nil {
		return nil, err
	}
	views, err := makeViews(ctx, from, to, names, types, conns, opts.Progress)
	if err != nil {
		return nil, err
	}
	version := int64(1)
	if cur != nil {
		version = cur.Version
	}
	before := &Record{Version: version, Digest: from.Digest(), Phase: phaseDone, Switched: time.Now().UTC()}
	if err := fenceAll(ctx, from, to, names, conns, cur == nil, before); err != nil {
		return nil, err
	}

	rep := &CutoverReport{Version: version + 1, Views: views}
	after := &Record{Version: version + 1, Digest: to.Digest(), Phase: phaseCutover, Views: views, Switched: time.Now().UTC()}
	// The old rules, for a finish from the proxy's console; without DSNs, which may
	// hold passwords (a data source's name says which it is).
	fromRules := from.Rules()
	fromRules.DataSources = slices.Clone(fromRules.DataSources)
	for i := range fromRules.DataSources {
		fromRules.DataSources[i].DSN = ""
	}
	after.From = &fromRules

	// The streams back, from the new data sources to the old, for a revert: their
	// publications and slots made now, where their subscriptions start marked in the
	// hold (past every change the copy applied), their subscriptions made after it.
	back, err := prepareReverse(ctx, from, to, streams, names, types, conns, opts.Progress)
	if err != nil {
		return nil, err
	}
	// The proxy's router for the new layout, made and warmed before the hold.
	sw, discard := func() error { return nil }, func() {}
	if px != nil {
		if sw, discard, err = px.Prepare(ctx, withViews(to, views)); err != nil {
			dropReverse(ctx, from, to, back, opts.Progress)
			return nil, fmt.Errorf("reshard: readying the proxy for the new layout: %w", err)
		}
	}
	prior := before
	if cur != nil {
		prior = cur
	}
	// The slots back moved past what the copy applied so far, so that the streams back
	// decode little that they skip (the hold only marks where they start).
	actx, astop := context.WithTimeout(ctx, advanceWait)
	err = advance(actx, back, conns, false)
	astop()
	if err != nil {
		discard()
		dropReverse(ctx, from, to, back, opts.Progress)
		return nil, err
	}
	outer := ctx
	seqs, err := findSequences(ctx, streams, conns, opts.Progress)
	if err != nil {
		discard()
		dropReverse(ctx, from, to, back, opts.Progress)
		return nil, err
	}
	h := hold{from: from, to: to, px: px, sw: sw, streams: streams, prior: prior, next: after, opts: opts, gaveUp: ErrCutover, name: "cutover",
		stopped: func(ctx context.Context, conns map[string]*pgx.Conn, step func(string)) error {
			if err := syncSequences(ctx, seqs, conns); err != nil {
				return err
			}
			step("sequences")
			if opts.Verify > 0 {
				if err := verifyInHold(outer, from, to, opts); err != nil {
					return err
				}
				step("verify")
			}
			err := markReverse(ctx, back, conns)
			step("slots_back_marked")
			return err
		},
		undoStopped: func(ctx context.Context, conns map[string]*pgx.Conn) error { return unmarkReverse(ctx, back, conns) }}
	switched, err := h.run(ctx, conns, rep)
	if !switched {
		discard()
		// A hold that gave up cleanly leaves the old layout as it was: the streams back
		// go. One that could not put things back keeps them, for the cutover that
		// completes it.
		if !errors.Is(err, errCrashed) && !h.undoFailed {
			dropReverse(ctx, from, to, back, opts.Progress)
		}
	}
	if err != nil {
		return nil, err
	}
	crashPoint("cutover-done")
	// The old data sources follow the new ones from now on, until finish or revert; a
	// subscription that cannot be made now is made by revert.
	if err := subscribeReverse(ctx, to, back, conns, opts.Progress); err != nil {
		fmt.Fprintf(opts.Progress, "reshard: the streams back to the old data sources are not subscribed yet (a revert subscribes them): %v\n", err)
	}
	return rep, nil
}

// ErrCutoverIncomplete is wrapped when a cutover stopped part way (the proxy or the
// command killed during its hold): the new layout is recorded on some data sources, or
// the streams still run. Running the cutover again completes it.
var ErrCutoverIncomplete = errors.New("reshard: a cutover stopped part way")

// complete ends a cutover that stopped part way: the new layout recorded on every data
// source, the destinations caught up with their sources, the streams stopped. Once it
// is complete, it refuses to run again.
func complete(ctx context.Context, from, to *rules.Compiled, cur *Record, conns map[string]*pgx.Conn, opts CutoverOptions) (*CutoverReport, error) {
	switch cur.Phase {
	case phaseCutover:
	case phaseFinishing:
		return nil, fmt.Errorf("reshard: a finish of the move to layout version %d (%s) began: run finish again", cur.Version, cur.Digest)
	default:
		return nil, fmt.Errorf("reshard: the move to layout version %d (%s) is finished already", cur.Version, cur.Digest)
	}
	left, err := cutoverLeft(ctx, from, to, cur, conns)
	if err != nil {
		return nil, err
	}
	if left.empty() {
		// A cutover killed after its hold may not have subscribed the streams back:
		// their slots would keep the new layout's WAL until a revert or a finish.
		back, err := reverseMade(ctx, from, to, conns, true)
		if err == nil {
			err = subscribeReverse(ctx, to, back, conns, opts.Progress)
		}
		if err != nil {
			fmt.Fprintf(opts.Progress, "reshard: the streams back to the old data sources are not subscribed yet (a revert subscribes them): %v\n", err)
		}
		return nil, fmt.Errorf("reshard: the move was cut over already (layout version %d); finish it, or revert it", cur.Version)
	}
	fmt.Fprintf(opts.Progress, "reshard: the cutover to layout version %d stopped part way: completing it\n", cur.Version)
	// As the hold: every data source switching first (no process writes, of either
	// layout), the streams caught up and stopped, the streams back marked past the copy
	// (their slots moved there too), then the record itself.
	final := *cur
	final.Switching = false
	switching := final
	switching.Switching = true
	cctx, stop := context.WithTimeout(ctx, opts.CatchUp)
	defer stop()
	for _, ds := range left.records {
		if err := writeRecord(cctx, conns[ds], &switching); err != nil {
			return nil, fmt.Errorf("data source %s: recording layout version %d: %w", ds, cur.Version, err)
		}
	}
	if err := catchUp(cctx, left.streams, conns); err != nil {
		return nil, err
	}
	if err := stopStreams(cctx, left.streams, conns); err != nil {
		return nil, err
	}
	// The sequences of every stream's tables (those stopped before the crash too).
	made, err := madeStreams(cctx, from, to, conns)
	var seqs []seqSync
	if err == nil {
		seqs, err = findSequences(cctx, made, conns, opts.Progress)
	}
	if err == nil {
		err = syncSequences(cctx, seqs, conns)
	}
	if err != nil {
		return nil, err
	}
	// Moving a slot decodes every change since it was made, which a crash long ago
	// makes many: a bound of its own.
	actx, astop := context.WithTimeout(ctx, advanceWait)
	defer astop()
	if err := advanceReverse(actx, left.reverse, conns); err != nil {
		return nil, err
	}
	// On a bound of its own: the advance may have taken long.
	wctx, wstop := context.WithTimeout(ctx, opts.CatchUp)
	defer wstop()
	for _, ds := range allDataSources(from, to) {
		if err := writeRecord(wctx, conns[ds], &final); err != nil {
			return nil, fmt.Errorf("data source %s: recording layout version %d: %w", ds, cur.Version, err)
		}
	}
	fmt.Fprintf(opts.Progress, "reshard: layout version %d in force on every data source; the streams stopped\n", cur.Version)
	back, err := reverseMade(ctx, from, to, conns, true)
	if err == nil {
		err = subscribeReverse(ctx, to, back, conns, opts.Progress)
	}
	if err != nil {
		fmt.Fprintf(opts.Progress, "reshard: the streams back to the old data sources are not subscribed yet (a revert subscribes them): %v\n", err)
	}
	return &CutoverReport{Version: cur.Version, Views: cur.Views}, nil
}

// unfinished is what a cutover that stopped part way left to do.
type unfinished struct {
	records []string // data sources without the new record
	streams []stream // streams still enabled
	reverse []stream // streams back not marked past the copy
}

func (u unfinished) empty() bool {
	return len(u.records) == 0 && len(u.streams) == 0 && len(u.reverse) == 0
}

// cutoverLeft finds what a cutover to record cur has left to do.
func cutoverLeft(ctx context.Context, from, to *rules.Compiled, cur *Record, conns map[string]*pgx.Conn) (unfinished, error) {
	var u unfinished
	for _, ds := range allDataSources(from, to) {
		rec, err := readRecord(ctx, conns[ds])
		if err != nil {
			return u, fmt.Errorf("data source %s: %w", ds, err)
		}
		if rec == nil || rec.Version != cur.Version || rec.Digest != cur.Digest || rec.Switching {
			u.records = append(u.records, ds)
		}
	}
	for _, src := range from.DataSources() {
		for _, dst := range to.DataSources() {
			if src.Name == dst.Name {
				continue
			}
			name := streamName(src, dst)
			enabled, err := subscriptionOn(ctx, conns[dst.Name], name)
			if err != nil {
				return u, fmt.Errorf("data source %s: %w", dst.Name, err)
			}
			if enabled {
				u.streams = append(u.streams, stream{from: src.Name, to: dst.Name, name: name})
			}
		}
	}
	var err error
	u.reverse, err = reverseMade(ctx, from, to, conns, false)
	return u, err
}

// currentRecord reads the layout record of the data sources of both layouts: the one
// with the highest version (nil: none).
func currentRecord(ctx context.Context, from, to *rules.Compiled, conns map[string]*pgx.Conn) (*Record, error) {
	var cur *Record
	for _, ds := range allDataSources(from, to) {
		rec, err := readRecord(ctx, conns[ds])
		if err != nil {
			return nil, fmt.Errorf("data source %s: reading the layout record: %w", ds, err)
		}
		if newer(rec, cur) {
			cur = rec
		}
	}
	return cur, nil
}

// allDataSources names the data sources of both layouts once, the current layout's
// first.
func allDataSources(from, to *rules.Compiled) []string {
	var out []string
	for _, l := range []*rules.Compiled{from, to} {
		for _, d := range l.DataSources() {
			if !slices.Contains(out, d.Name) {
				out = append(out, d.Name)
			}
		}
	}
	return out
}

// makeViews makes, on each data source both layouts share, for each sharded table, the
// view that shows the rows layout to places there.
func makeViews(ctx context.Context, from, to *rules.Compiled, names []string, types [][]rules.KeyType, conns map[string]*pgx.Conn, progress io.Writer) ([]View, error) {
	var views []View
	for i, name := range names {
		for _, n := range from.Lookup(name).Nodes {
			at := place(from, n)
			node := nodeOf(to, name, at.DataSource)
			if node < 0 {
				continue
			}
			filter, err := rowFilter(to, name, types[i][0], node)
			if err != nil {
				return nil, err
			}
			v := View{Table: name, DataSource: at.DataSource, Schema: at.Schema, Name: at.Table + viewSuffix}
			vq := Place{Schema: at.Schema, Table: v.Name}.qualified()
			c := conns[at.DataSource]
			// A relation of that name that the move did not make is not replaced.
			var comment *string
			var exists bool
			if err := c.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL, obj_description(to_regclass($1), 'pg_class')", vq).Scan(&exists, &comment); err != nil {
				return nil, fmt.Errorf("data source %s: %w", at.DataSource, err)
			}
			if exists && (comment == nil || *comment != viewComment) {
				return nil, fmt.Errorf("data source %s: %s exists and is not the move's view: rename it", at.DataSource, vq)
			}
			if _, err := c.Exec(ctx, fmt.Sprintf("CREATE OR REPLACE VIEW %s AS SELECT * FROM %s WHERE %s; COMMENT ON VIEW %s IS '%s'",
				vq, at.qualified(), filter, vq, viewComment)); err != nil {
				return nil, fmt.Errorf("data source %s: creating view %s: %w", at.DataSource, vq, err)
			}
			fmt.Fprintf(progress, "reshard: %s: view %s shows the rows of %s that stay\n", at.DataSource, vq, at.qualified())
			views = append(views, v)
		}
	}
	return views, nil
}

// fenceAll puts the layout record's table and the fence on every data source of both
// layouts, on each of the sharded tables names and the broadcast tables there; with
// first (no record yet), it records layout before, the current one.
func fenceAll(ctx context.Context, from, to *rules.Compiled, names []string, conns map[string]*pgx.Conn, first bool, before *Record) error {
	for _, ds := range allDataSources(from, to) {
		c := conns[ds]
		if err := createLayoutTable(ctx, c); err != nil {
			return fmt.Errorf("data source %s: %w", ds, err)
		}
		if first {
			if err := writeRecord(ctx, c, before); err != nil {
				return fmt.Errorf("data source %s: recording the layout: %w", ds, err)
			}
		}
	}
	tables := append(slices.Clone(names), from.Rules().Broadcast...)
	done := map[Place]bool{}
	for _, l := range []*rules.Compiled{from, to} {
		for _, name := range tables {
			for _, n := range l.Lookup(name).Nodes {
				at := place(l, n)
				if done[at] {
					continue
				}
				done[at] = true
				if err := installFence(ctx, conns[at.DataSource], at); err != nil {
					return fmt.Errorf("data source %s: the fence on %s: %w", at.DataSource, at.qualified(), err)
				}
			}
		}
	}
	return nil
}

// stream is one replication stream of a move, by its data sources' names.
type stream struct {
	from, to, name string
}

// streamsOf lists the move's streams that st found.
func streamsOf(from, to *rules.Compiled, st *Status) []stream {
	var out []stream
	for _, s := range st.Streams {
		out = append(out, stream{from: s.From, to: s.To, name: streamName(dataSource(from, s.From), dataSource(to, s.To))})
	}
	return out
}

// catchUp waits until every stream's destination has applied every change its
// source committed so far: it writes a new token in the marker table on each source,
// for each of its streams, and waits until each destination has its stream's token.
// A subscription applies its source's transactions in commit order, so the token
// arrives after all that came before it. (The slot's confirmed position would tell
// too, but a subscriber reports it only every second or so.)
func catchUp(ctx context.Context, streams []stream, conns map[string]*pgx.Conn) error {
	token := time.Now().UnixNano()
	err := eachGroup(ctx, groupBy(streams, bySource), func(ctx context.Context, ds string, ss []stream) error {
		names := streamNames(ss)
		if _, err := conns[ds].Exec(ctx, "INSERT INTO "+markerTable+" SELECT unnest($1::text[]), $2 ON CONFLICT (stream) DO UPDATE SET token = excluded.token", names, token); err != nil {
			return fmt.Errorf("data source %s: marking streams %v: %w", ds, names, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return eachGroup(ctx, groupBy(streams, byDestination), func(ctx context.Context, ds string, ss []stream) error {
		names := streamNames(ss)
		for {
			var behind []string
			rows, err := conns[ds].Query(ctx, "SELECT s FROM unnest($1::text[]) s WHERE NOT EXISTS (SELECT FROM "+markerTable+" m WHERE m.stream = s AND m.token = $2) ORDER BY s", names, token)
			if err == nil {
				behind, err = pgx.CollectRows(rows, pgx.RowTo[string])
			}
			if err != nil {
				return fmt.Errorf("data source %s: %w", ds, err)
			}
			if len(behind) == 0 {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("streams %v into %s had not applied their sources' last changes: %w", behind, ds, ctx.Err())
			case <-time.After(500 * time.Microsecond):
			}
		}
	})
}

func streamNames(ss []stream) []string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = s.name
	}
	return names
}

// stopStreams disables every stream's subscription and waits until its apply worker
// has stopped: from then on the new layout writes the destinations itself.
func stopStreams(ctx context.Context, streams []stream, conns map[string]*pgx.Conn) error {
	return eachGroup(ctx, groupBy(streams, byDestination), func(ctx context.Context, ds string, ss []stream) error {
		c := conns[ds]
		// One transaction disables them all (one commit). A disabled subscription's
		// worker notices only when it next wakes (up to a second): it is ended at once
		// instead, once the commit says not to start it again.
		var disable strings.Builder
		for _, s := range ss {
			disable.WriteString("ALTER SUBSCRIPTION " + s.name + " DISABLE;")
		}
		if _, err := c.Exec(ctx, disable.String()); err != nil {
			return fmt.Errorf("data source %s: %w", ds, err)
		}
		names := streamNames(ss)
		if _, err := c.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_subscription WHERE subname = ANY($1) AND pid IS NOT NULL", names); err != nil {
			return fmt.Errorf("data source %s: %w", ds, err)
		}
		for {
			var running []string
			rows, err := c.Query(ctx, "SELECT DISTINCT subname::text FROM pg_stat_subscription WHERE subname = ANY($1) AND pid IS NOT NULL ORDER BY 1", names)
			if err == nil {
				running, err = pgx.CollectRows(rows, pgx.RowTo[string])
			}
			if err != nil {
				return fmt.Errorf("data source %s: %w", ds, err)
			}
			if len(running) == 0 {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("the subscriptions %v on %s did not stop: %w", running, ds, ctx.Err())
			case <-time.After(time.Millisecond):
			}
		}
	})
}

// noPrepared waits until no source of a stream holds a prepared transaction.
func noPrepared(ctx context.Context, streams []stream, conns map[string]*pgx.Conn) error {
	return eachGroup(ctx, groupBy(streams, bySource), func(ctx context.Context, ds string, _ []stream) error {
		for {
			var n int
			if err := conns[ds].QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()").Scan(&n); err != nil {
				return fmt.Errorf("data source %s: %w", ds, err)
			}
			if n == 0 {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("data source %s holds %d prepared transactions (pg_prepared_xacts): %w", ds, n, ctx.Err())
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
}

// startStreams enables the streams again (a cutover that gives up).
func startStreams(ctx context.Context, streams []stream, conns map[string]*pgx.Conn) error {
	var errs []error
	for _, s := range streams {
		if _, err := conns[s.to].Exec(ctx, "ALTER SUBSCRIPTION "+s.name+" ENABLE"); err != nil {
			errs = append(errs, fmt.Errorf("data source %s: %w", s.to, err))
		}
	}
	return errors.Join(errs...)
}

// verifyInHold runs Verify in a cutover's hold, when opts.Verify asks (see
// CutoverOptions.Verify): an error when a row differs or the bound is overrun.
func verifyInHold(ctx context.Context, from, to *rules.Compiled, opts CutoverOptions) error {
	if opts.Verify <= 0 {
		return nil
	}
	t := time.Now()
	vctx, cancel := context.WithTimeout(ctx, opts.Verify)
	defer cancel()
	// Nothing writes in the hold: a chunk that differs is not compared again.
	d, err := Verify(vctx, from, to, VerifyOptions{Options: Options{Progress: opts.Progress}, noRecord: true})
	if err != nil {
		return fmt.Errorf("verifying in the hold: %w", err)
	}
	if !d.Clean() {
		var b strings.Builder
		d.WriteText(&b)
		return fmt.Errorf("the destinations differ from the sources:\n%s", b.String())
	}
	fmt.Fprintf(opts.Progress, "reshard: verified in the hold in %v: the destinations hold every row\n", time.Since(t).Round(time.Millisecond))
	return nil
}
