package reshard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
)

// tableCopy is one table of a stream that a bounded copy carries: the rows of at that
// filter keeps ("true": all of them, for a broadcast table).
type tableCopy struct {
	at     Place
	filter string
}

// copyStream makes one stream whose rows the move copies itself, at most limit's rate
// (CopyOptions.CopyRate), instead of the subscription's table synchronization:
//
//  1. the slot, over a replication connection that exports its snapshot: the rows as
//     of the slot's start, and the slot streams every change after it;
//  2. the subscription, disabled and without copy_data, on that slot;
//  3. on the source, a transaction in that snapshot; for each table, COPY of the rows
//     the target places on the destination, through the limiter, into COPY FROM on the
//     destination (as the apply workers write: session_replication_role = replica, so
//     that the table's triggers do not fire);
//  4. the subscription enabled: it streams from the slot's start.
//
// Until step 4 the subscription is disabled, and status says the copy runs. A start
// killed part way leaves the stream disabled with part of its rows: cancel removes it.
func copyStream(ctx context.Context, from *rules.Compiled, st Stream, name string, src, dst *pgx.Conn, copies []tableCopy, limit *rowLimiter, progress io.Writer) error {
	snapshot, release, err := exportSlot(ctx, fromDSN(from, st.From), name)
	if err != nil {
		return fmt.Errorf("data source %s: creating slot %s: %w", st.From, name, err)
	}
	defer release()
	conninfo, err := subscriptionConninfo(from, st.From)
	if err != nil {
		return err
	}
	if _, err := dst.Exec(ctx, fmt.Sprintf("CREATE SUBSCRIPTION %s CONNECTION %s PUBLICATION %s WITH (create_slot = false, slot_name = '%s', copy_data = false, enabled = false)",
		name, conninfo, name, name)); err != nil {
		return fmt.Errorf("data source %s: creating subscription %s: %w", st.To, name, err)
	}
	tx, err := src.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("data source %s: %w", st.From, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+snapshot+"'"); err != nil {
		return fmt.Errorf("data source %s: taking the slot's snapshot: %w", st.From, err)
	}
	release() // the transaction holds the snapshot now
	if _, err := dst.Exec(ctx, "SET session_replication_role = replica"); err != nil {
		return fmt.Errorf("data source %s: %w", st.To, err)
	}
	defer dst.Exec(context.WithoutCancel(ctx), "RESET session_replication_role")
	for _, c := range copies {
		n, err := copyTable(ctx, tx.Conn(), dst, c, limit, progress, st)
		if err != nil {
			return err
		}
		fmt.Fprintf(progress, "reshard: %s -> %s: copied %d rows of %s (%s)\n", st.From, st.To, n, c.at.qualified(), limit)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("data source %s: %w", st.From, err)
	}
	if _, err := dst.Exec(ctx, "ALTER SUBSCRIPTION "+name+" ENABLE"); err != nil {
		return fmt.Errorf("data source %s: enabling subscription %s: %w", st.To, name, err)
	}
	return nil
}

// exportSlot creates logical replication slot name on the data source at dsn over a
// replication connection, exporting the slot's snapshot; the snapshot can be taken
// (SET TRANSACTION SNAPSHOT) until release closes that connection.
func exportSlot(ctx context.Context, dsn, name string) (string, func(), error) {
	// Parsed as pgx does, so that pgx's own settings in the DSN are not sent to the
	// server as run-time parameters.
	pcfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "", nil, err
	}
	cfg := pcfg.Config.Copy()
	cfg.RuntimeParams["replication"] = "database"
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", nil, err
	}
	release := func() { c.Close(context.Background()) }
	res, err := c.Exec(ctx, "CREATE_REPLICATION_SLOT "+name+" LOGICAL pgoutput (SNAPSHOT 'export')").ReadAll()
	if err != nil {
		release()
		return "", nil, err
	}
	// slot_name, consistent_point, snapshot_name, output_plugin
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) < 3 {
		release()
		return "", nil, errors.New("CREATE_REPLICATION_SLOT answered no snapshot")
	}
	return string(res[0].Rows[0][2]), release, nil
}

// copyTable copies the rows of c from the source's transaction to the same table on
// the destination, through the limiter, and returns how many it copied. Text format
// with the source's column names: a destination table made by the user may order its
// columns otherwise.
func copyTable(ctx context.Context, src *pgx.Conn, dst *pgx.Conn, c tableCopy, limit *rowLimiter, progress io.Writer, st Stream) (int64, error) {
	var cols string
	if err := src.QueryRow(ctx, `SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = ''`, c.at.qualified()).Scan(&cols); err != nil {
		return 0, fmt.Errorf("data source %s: the columns of %s: %w", st.From, c.at.qualified(), err)
	}
	pr, pw := io.Pipe()
	w := &limitedWriter{ctx: ctx, w: pw, limit: limit, progress: progress, what: fmt.Sprintf("%s -> %s: %s", st.From, st.To, c.at.qualified()), last: time.Now()}
	done := make(chan error, 1)
	go func() {
		_, err := src.PgConn().CopyTo(ctx, w, fmt.Sprintf("COPY (SELECT %s FROM %s WHERE %s) TO STDOUT", cols, c.at.qualified(), c.filter))
		pw.CloseWithError(err) // nil: the reader sees the end
		done <- err
	}()
	_, err := dst.PgConn().CopyFrom(ctx, pr, fmt.Sprintf("COPY %s (%s) FROM STDIN", c.at.qualified(), cols))
	pr.CloseWithError(errDestinationEnded) // a source still writing stops
	srcErr := <-done
	switch {
	case srcErr != nil && !errors.Is(srcErr, errDestinationEnded):
		// The source failed first (the destination's COPY then failed on it).
		return w.rows, fmt.Errorf("data source %s: copying %s: %w", st.From, c.at.qualified(), srcErr)
	case err != nil:
		return w.rows, fmt.Errorf("data source %s: copying into %s: %w", st.To, c.at.qualified(), err)
	case srcErr != nil:
		return w.rows, fmt.Errorf("data source %s: copying %s: %w", st.From, c.at.qualified(), srcErr)
	}
	return w.rows, nil
}

// errDestinationEnded stops a source's COPY whose destination's COPY ended first.
var errDestinationEnded = errors.New("the destination's COPY ended")

// rowLimiter spaces rows out to at most rate a second (no bound when rate is 0), over
// every table it is used for, and holds them back while its gate (if any) says the
// servers are busy. Time it was not asked for rows (a slot waiting for the
// transactions in flight, the next stream's setup, a hold of the gate) gives at most a
// second's rows of credit, not a burst as long as the wait.
type rowLimiter struct {
	rate  int
	gate  *loadGate
	began time.Time
	rows  int64
}

func newRowLimiter(rate int) *rowLimiter { return &rowLimiter{rate: rate} }

// String says what bounds the rows.
func (l *rowLimiter) String() string {
	what := "no rate bound"
	if l.rate > 0 {
		what = fmt.Sprintf("at most %d rows/s", l.rate)
	}
	if l.gate != nil {
		what += fmt.Sprintf(", held %v in all while other sessions kept more than %d statements running (--max-active)", l.gate.held.Round(time.Millisecond), l.gate.max)
	}
	return what
}

// wait counts n more rows and waits until they are due.
func (l *rowLimiter) wait(ctx context.Context, n int64) error {
	if l.gate != nil {
		if err := l.gate.hold(ctx); err != nil {
			return err
		}
	}
	if l.rate <= 0 {
		l.rows += n
		return nil
	}
	if l.began.IsZero() {
		l.began = time.Now()
	}
	if behind := -time.Until(l.dueAt(l.rows)); behind > time.Second {
		l.began = l.began.Add(behind - time.Second)
	}
	l.rows += n
	if d := time.Until(l.dueAt(l.rows)); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// dueAt is when rows rows are due.
func (l *rowLimiter) dueAt(rows int64) time.Time {
	return l.began.Add(time.Duration(float64(rows) / float64(l.rate) * float64(time.Second)))
}

// limitedWriter passes COPY's text rows (each ends with a newline; one inside a value
// is escaped) to w, waiting on the limiter for each chunk's rows.
type limitedWriter struct {
	ctx      context.Context
	w        io.Writer
	limit    *rowLimiter
	rows     int64
	progress io.Writer
	what     string
	last     time.Time
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	n := int64(bytes.Count(p, []byte{'\n'}))
	if err := w.limit.wait(w.ctx, n); err != nil {
		return 0, err
	}
	w.rows += n
	if time.Since(w.last) > 5*time.Second {
		fmt.Fprintf(w.progress, "reshard: %s: %d rows copied so far\n", w.what, w.rows)
		w.last = time.Now()
	}
	return w.w.Write(p)
}

// loadGate holds a copy (or a verify) back while the servers it reads and writes are busy with other
// work, as Vitess's throttler holds its copy while a MySQL server's running threads
// exceed a bound: every gateEvery at most, it counts on the data sources it watches
// (the source and destination of the stream being copied) the client sessions that run
// a statement (pg_stat_activity's active client backends, server-wide), leaving out
// the move's own; while the count on either is above max, no row goes on. A load that
// saturates the servers runs more statements at once, each for longer: that is when
// the copy waits. Replication workers and WAL senders do not count.
type loadGate struct {
	max      int
	conns    map[string]*pgx.Conn // a connection of the gate's own to each data source
	ours     []int64              // the process IDs of the move's own sessions
	watch    []string             // the data sources of the stream being copied
	what     string               // what waits, for the progress lines
	progress io.Writer
	checked  time.Time
	said     time.Time
	held     time.Duration
}

const gateEvery = 100 * time.Millisecond

// newLoadGate opens the gate's connections to every data source of both layouts; ours
// are the move's other connections, whose sessions do not count.
func newLoadGate(ctx context.Context, max int, from, to *rules.Compiled, progress io.Writer, ours ...map[string]*pgx.Conn) (*loadGate, error) {
	conns, err := connectAll(ctx, from, to)
	if err != nil {
		return nil, err
	}
	if err := canSeeSessions(ctx, conns); err != nil {
		closeAll(conns)
		return nil, err
	}
	g := &loadGate{max: max, conns: conns, what: "the copy", progress: progress}
	for _, m := range append(ours, conns) {
		for _, c := range m {
			g.ours = append(g.ours, int64(c.PgConn().PID()))
		}
	}
	return g, nil
}

// canSeeSessions checks that every connection's role sees other roles' sessions'
// state: pg_stat_activity shows it only to a superuser or a member of
// pg_read_all_stats, and without it a gate would count nothing and never hold.
func canSeeSessions(ctx context.Context, conns map[string]*pgx.Conn) error {
	for _, ds := range slices.Sorted(maps.Keys(conns)) {
		var can bool
		if err := conns[ds].QueryRow(ctx, "SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')").Scan(&can); err != nil {
			return fmt.Errorf("data source %s: %w", ds, err)
		}
		if !can {
			return fmt.Errorf("reshard: --max-active counts other roles' running statements, which data source %s shows only to a superuser or a member of pg_read_all_stats: GRANT pg_read_all_stats TO the role of its DSN", ds)
		}
	}
	return nil
}

func (g *loadGate) close() { closeAll(g.conns) }

// watchOnly makes the gate watch the servers of data sources ds from the next row on.
func (g *loadGate) watchOnly(ds ...string) {
	g.watch = ds
	g.checked = time.Time{}
}

// hold returns once the watched data sources' servers run no more than max statements
// of other sessions.
func (g *loadGate) hold(ctx context.Context) error {
	if time.Since(g.checked) < gateEvery {
		return nil
	}
	var began time.Time // when a check first found a server busy
	defer func() {
		if !began.IsZero() {
			g.held += time.Since(began)
		}
	}()
	for {
		g.checked = time.Now()
		busy, at, who, err := g.busiest(ctx)
		if err != nil {
			return err
		}
		if busy <= g.max {
			return nil
		}
		if began.IsZero() {
			began = g.checked
		}
		if time.Since(g.said) > 5*time.Second {
			fmt.Fprintf(g.progress, "reshard: %s waits: %d other sessions run a statement on the server of %s (--max-active %d): %s\n", g.what, busy, at, g.max, who)
			g.said = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(gateEvery):
		}
	}
}

// busiest returns the greatest count of other sessions' running statements among the
// watched data sources' servers, the data source it was read on, and a few of those
// sessions, for the progress line. A session waiting for a lock does not count: it
// takes no CPU, and it may wait for the copy itself (a client's ALTER TABLE or LOCK
// behind the copy's own lock, and those queued behind that), which a gate counting it
// would hold for ever.
func (g *loadGate) busiest(ctx context.Context) (int, string, string, error) {
	most, at, who := 0, "", ""
	for _, ds := range g.watch {
		var n int
		var some string
		if err := g.conns[ds].QueryRow(ctx, `SELECT count(*), coalesce(string_agg(s, '; ') FILTER (WHERE r <= 3), '') FROM (
				SELECT 'pid ' || pid || coalesce(' (' || usename || '@' || datname || ')', '') || coalesce(', waiting on ' || wait_event_type || ' ' || wait_event, '') || ': ' || left(rtrim(regexp_replace(query, '\s+', ' ', 'g'), '; '), 60) AS s,
					row_number() OVER (ORDER BY query_start) AS r
				FROM pg_stat_activity WHERE state = 'active' AND backend_type = 'client backend' AND wait_event_type IS DISTINCT FROM 'Lock'
				  AND wait_event IS DISTINCT FROM 'ClientRead'
				  AND pid <> pg_backend_pid() AND pid <> ALL ($1::int[])) q`, g.ours).Scan(&n, &some); err != nil {
			return 0, "", "", fmt.Errorf("data source %s: reading its load: %w", ds, err)
		}
		if n > most || at == "" {
			most, at, who = n, ds, some
		}
	}
	return most, at, who, nil
}
