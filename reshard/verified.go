package reshard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/rules"
)

// A verify records what it compared, chunk by chunk, in the move's own schema on the
// current layout's first data source, so that a verify cut short (Ctrl-C, a server
// restarted, a lost connection, the command killed) can be resumed from the chunk
// after the last one compared instead of from its first table, as VDiff resumes from
// the last key it compared. A run's record is replaced by the next verify that is not
// a resume, and dropped with the rest of the move's schema by cancel and finish.
const (
	verifyRunTable = prefix + ".verify_run"
	verifiedTable  = prefix + ".verified"
	// verifyLock is the advisory lock a verify holds on its record's data source
	// while it runs: one verify of a move at a time, and status tells a verify
	// running from one cut short.
	verifyLock = fenceLock + 1
)

// verifyRun is the record of one verify. A nil *verifyRun records nothing (the
// comparison in a cutover's hold, which is never resumed).
type verifyRun struct {
	c       *pgx.Conn // to the current layout's first data source, for the record only
	ds      string
	started time.Time
	pinned  bool
	layout  string                            // the layout record in force when it started
	tables  map[[3]string]verifiedTableRecord // by source, destination and table

	stopAfter, chunks int  // a test's cut (VerifyOptions.stopAfterChunks), and the chunks recorded
	noted             bool // something was recorded that a resume takes
}

// verifiedTableRecord is how far a verify got through one table of one stream.
type verifiedTableRecord struct {
	Diff RowDiff
	// Next is the key the next chunk starts at, once a chunk was compared
	// (Diff.Chunks > 0) and until the last (Done).
	Next string
	Done bool
	// Misplaced reports that this stream's comparison counted the destination's rows
	// that the target places elsewhere (once per destination and table).
	Misplaced bool
}

// layoutText names the layout record in force, for a verify's record: a verify is
// resumed only under the layout record it started under.
func layoutText(rec *Record) string {
	if rec == nil {
		return "none"
	}
	return fmt.Sprintf("version %d (phase %s, switching %t)", rec.Version, rec.Phase, rec.Switching)
}

// openVerifyRun opens the record of a verify: a new one, replacing what an earlier
// verify recorded, or with resume the one a verify cut short left, which must have
// been pinned as this one is and started under the same layout record.
func openVerifyRun(ctx context.Context, from *rules.Compiled, layout *Record, pinned, resume bool) (*verifyRun, error) {
	d := from.DataSources()[0]
	c, err := connectOne(ctx, d)
	if err != nil {
		return nil, err
	}
	r := &verifyRun{c: c, ds: d.Name, pinned: pinned, layout: layoutText(layout), tables: map[[3]string]verifiedTableRecord{}}
	if err := r.lock(ctx); err != nil {
		c.Close(context.Background())
		return nil, fmt.Errorf("data source %s: %w", d.Name, err)
	}
	if err := r.open(ctx, resume); err != nil {
		r.close()
		return nil, fmt.Errorf("data source %s: verify's record: %w", d.Name, err)
	}
	return r, nil
}

// lock takes the verify's advisory lock, held until the verify ends or its session
// does (its process killed), or says which verify holds it. A session that ends as
// the lock is tried (a verify interrupted a moment before) is given a second.
func (r *verifyRun) lock(ctx context.Context) error {
	for deadline := time.Now().Add(time.Second); ; {
		var ok bool
		if err := r.c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", int64(verifyLock)).Scan(&ok); err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	var pid int
	err := r.c.QueryRow(ctx, verifyHolder, int64(verifyLock)).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return errors.New("a verify of this move was running, and ended just now: run verify again")
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("a verify of this move is running (server process %d): one verify at a time; wait for it, or stop it (Ctrl-C, or pg_terminate_backend(%d)), then verify --resume goes on from its last chunk",
		pid, pid)
}

// verifyHolder finds the session that holds the verify's lock in this database.
const verifyHolder = `SELECT l.pid FROM pg_locks l
	WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND l.classid = ($1::bigint >> 32)::oid AND l.objid = ($1::bigint & 4294967295)::oid AND l.objsubid = 1`

// VerifyRecord is what the record of a move's last verify says (Status.Verify).
type VerifyRecord struct {
	Started  time.Time
	Finished time.Time // zero: not finished, running or cut short
	Running  bool      // a verify holds the record's lock now
	Pinned   bool
	// Layout is the layout record in force when it started, and Stale reports that
	// another is in force now (a resume is refused).
	Layout string
	Stale  bool
	// Tables compared, all or in part, Done of them whole, and their chunks and
	// differences so far.
	Tables, Done, Chunks      int
	Missing, Extra, Different int64
}

// readVerifyRecord reads the record of a move's last verify from the current
// layout's first data source; nil when there is none. layout is the layout record in
// force now.
func readVerifyRecord(ctx context.Context, c *pgx.Conn, layout *Record) (*VerifyRecord, error) {
	var exists bool
	if err := c.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL", verifyRunTable, verifiedTable).Scan(&exists); err != nil || !exists {
		return nil, err
	}
	v := &VerifyRecord{}
	var finished *time.Time
	err := c.QueryRow(ctx, "SELECT started, pinned, layout, finished FROM "+verifyRunTable).Scan(&v.Started, &v.Pinned, &v.Layout, &finished)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if finished != nil {
		v.Finished = *finished
	}
	v.Stale = v.Layout != layoutText(layout)
	var pid int
	switch err := c.QueryRow(ctx, verifyHolder, int64(verifyLock)).Scan(&pid); {
	case err == nil:
		v.Running = true
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, err
	}
	err = c.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE done), coalesce(sum((diff->>'Chunks')::int), 0),
		coalesce(sum((diff->>'MissingN')::bigint), 0), coalesce(sum((diff->>'ExtraN')::bigint), 0), coalesce(sum((diff->>'DifferentN')::bigint), 0)
		FROM `+verifiedTable).Scan(&v.Tables, &v.Done, &v.Chunks, &v.Missing, &v.Extra, &v.Different)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// writeText writes the record's line of status.
func (v *VerifyRecord) writeText(b *strings.Builder) {
	fmt.Fprintf(b, "verify: started %s", v.Started.UTC().Format(time.DateTime+" UTC"))
	if v.Pinned {
		b.WriteString(", pinned")
	}
	fmt.Fprintf(b, ", %d chunks of %d tables compared (%d whole): %d missing, %d extra, %d different", v.Chunks, v.Tables, v.Done, v.Missing, v.Extra, v.Different)
	switch {
	case v.Running:
		b.WriteString("; running\n")
	case v.Finished.IsZero() && v.Tables == 0:
		b.WriteString("; stopped before its first chunk (nothing to resume)\n")
	case !v.Finished.IsZero():
		fmt.Fprintf(b, "; finished %s\n", v.Finished.UTC().Format(time.DateTime+" UTC"))
	case v.Stale:
		fmt.Fprintf(b, "; cut short under layout record %s, another in force now: not resumable (run reshard verify again)\n", v.Layout)
	default:
		b.WriteString("; cut short (reshard verify --resume goes on from its last chunk)\n")
	}
}

func (r *verifyRun) open(ctx context.Context, resume bool) error {
	if !resume {
		// A new record replaces the last, its tables made again (whatever columns an
		// earlier version of them had).
		return pgx.BeginFunc(ctx, r.c, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %[1]s;
				DROP TABLE IF EXISTS %[2]s, %[3]s;
				CREATE TABLE %[2]s (one int PRIMARY KEY DEFAULT 1 CHECK (one = 1), started timestamptz NOT NULL,
					pinned bool NOT NULL, layout text NOT NULL, finished timestamptz);
				CREATE TABLE %[3]s (src text, dst text, tbl text, next text NOT NULL, done bool NOT NULL,
					misplaced bool NOT NULL, diff jsonb NOT NULL, PRIMARY KEY (src, dst, tbl))`, prefix, verifyRunTable, verifiedTable))
			if err != nil {
				return err
			}
			return tx.QueryRow(ctx, "INSERT INTO "+verifyRunTable+" (started, pinned, layout) VALUES (now(), $1, $2) RETURNING started",
				r.pinned, r.layout).Scan(&r.started)
		})
	}
	var exists bool
	if err := r.c.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", verifyRunTable).Scan(&exists); err != nil {
		return err
	}
	var wasPinned bool
	var layout string
	var finished *time.Time
	err := pgx.ErrNoRows
	if exists {
		err = r.c.QueryRow(ctx, "SELECT started, pinned, layout, finished FROM "+verifyRunTable).Scan(&r.started, &wasPinned, &layout, &finished)
	}
	started := r.started.UTC().Format(time.DateTime + " UTC")
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return errors.New("no verify of this move was recorded: nothing to resume (run verify without --resume)")
	case err != nil:
		return err
	case finished != nil:
		return fmt.Errorf("the last verify, started %s, finished at %s: nothing to resume (run verify without --resume to compare again)",
			started, finished.UTC().Format(time.DateTime+" UTC"))
	case layout != r.layout:
		return fmt.Errorf("the verify started %s compared under layout record %s, and %s is in force now: what it compared may have changed since (run verify without --resume)",
			started, layout, r.layout)
	case wasPinned != r.pinned:
		return fmt.Errorf("the verify started %s was %s: resume it %s", started,
			map[bool]string{true: "pinned", false: "not pinned"}[wasPinned], map[bool]string{true: "with --pin", false: "without --pin"}[wasPinned])
	}
	rows, err := r.c.Query(ctx, "SELECT src, dst, tbl, next, done, misplaced, diff FROM "+verifiedTable)
	if err != nil {
		return err
	}
	var k [3]string
	var rec verifiedTableRecord
	var raw []byte
	_, err = pgx.ForEachRow(rows, []any{&k[0], &k[1], &k[2], &rec.Next, &rec.Done, &rec.Misplaced, &raw}, func() error {
		rec.Diff = RowDiff{}
		if err := json.Unmarshal(raw, &rec.Diff); err != nil {
			return err
		}
		r.tables[k] = rec
		return nil
	})
	if err != nil {
		return err
	}
	if len(r.tables) == 0 {
		return fmt.Errorf("the verify started %s stopped before it recorded anything: nothing to resume (run verify without --resume)", started)
	}
	r.noted = true // what it takes from the record is resumable again
	return nil
}

// table returns what the resumed verify recorded of one table of one stream.
func (r *verifyRun) table(from, to, table string) (verifiedTableRecord, bool) {
	if r == nil {
		return verifiedTableRecord{}, false
	}
	rec, ok := r.tables[[3]string{from, to, table}]
	return rec, ok
}

// misplacedCounted reports whether the resumed verify counted a destination's rows
// of a table that the target places elsewhere, over one of the streams this verify
// compares (current; a stream gone since is not reported, nor is what it counted).
func (r *verifyRun) misplacedCounted(to, table string, current map[[3]string]bool) bool {
	if r == nil {
		return false
	}
	for k, rec := range r.tables {
		if k[1] == to && k[2] == table && rec.Misplaced && current[k] {
			return true
		}
	}
	return false
}

// note records how far the comparison of one table of one stream got.
func (r *verifyRun) note(ctx context.Context, rd *RowDiff, rec verifiedTableRecord) error {
	if r == nil {
		return nil
	}
	raw, err := json.Marshal(rd)
	if err == nil {
		_, err = r.c.Exec(ctx, "INSERT INTO "+verifiedTable+` (src, dst, tbl, next, done, misplaced, diff) VALUES ($1, $2, $3, $4, $5, $6, $7)
			ON CONFLICT (src, dst, tbl) DO UPDATE SET next = excluded.next, done = excluded.done, misplaced = excluded.misplaced, diff = excluded.diff`,
			rd.From, rd.To, rd.Table, rec.Next, rec.Done, rec.Misplaced, raw)
	}
	if err != nil {
		return fmt.Errorf("data source %s: recording what verify compared: %w", r.ds, err)
	}
	r.noted = true
	return nil
}

// chunkDone counts a chunk recorded, and cuts the verify short where a test asks.
func (r *verifyRun) chunkDone() error {
	if r == nil {
		return nil
	}
	if r.chunks++; r.stopAfter > 0 && r.chunks >= r.stopAfter {
		return errCrashed
	}
	return nil
}

// resumable reports whether a verify that stops now leaves a record to resume.
func (r *verifyRun) resumable() bool { return r != nil && r.noted }

// finish records that the verify compared everything.
func (r *verifyRun) finish(ctx context.Context) error {
	if r == nil {
		return nil
	}
	if _, err := r.c.Exec(ctx, "UPDATE "+verifyRunTable+" SET finished = now()"); err != nil {
		return fmt.Errorf("data source %s: recording what verify compared: %w", r.ds, err)
	}
	return nil
}

// close releases the verify's lock, before its session ends, and closes the record's
// connection.
func (r *verifyRun) close() {
	if r == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.c.Exec(ctx, "SELECT pg_advisory_unlock($1)", int64(verifyLock))
	r.c.Close(ctx)
	// A query cancelled closes the connection in the background: its session, and
	// the lock with it, ends once that is done.
	select {
	case <-r.c.PgConn().CleanupDone():
	case <-ctx.Done():
	}
}
