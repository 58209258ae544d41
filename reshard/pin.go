package reshard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pin pins one table's comparison of one stream to one point of its source's WAL
// while writes go on, as VDiff pins a MySQL table: PostgreSQL's subscriptions cannot
// stop applying at a chosen position, so the source stops writing the table instead,
// for as long as the destination takes to apply what came before.
//
//  1. On a connection of its own, in a transaction, the source's table is locked in
//     SHARE mode: the lock waits for the transactions that wrote it to end (prepared
//     ones included), and holds the next writers back (they wait; readers do not).
//     From then on, every write to the table is committed and none can be.
//  2. A marker is written into the stream (a row of the cutover's marker table, under
//     a key of the pin's own), and the source's comparison connection takes a
//     snapshot: it has every row of the table, as it stands.
//  3. Once the destination has the marker, its subscription has applied every
//     transaction committed before it (it applies them in commit order), so every
//     write to the table: the destination's comparison connection takes a snapshot
//     there too.
//  4. The lock is released and writers go on; the two snapshots stay, and the
//     comparison reads them, both standing at that one point.
//
// Only the destination's apply worker writes the stream's rows there before the
// cutover (Verify pins only while every stream is ready, and a pin checks that its
// subscription still runs), so its snapshot holds them as the source had them.
//
// The destination first catches up without the lock (a marker of its own), so that
// the locked wait covers only what it falls behind meanwhile. The lock's wait is short
// (lockWait) and tried again after a pause, so that a writer that keeps the table (a
// long transaction, a prepared one, VACUUM, or one waiting on a row of another data
// source that a writer queued behind the lock holds) holds the others back only that
// long at a time; the whole pin, lock and catch-up, holds them at most bound, and a
// catch-up that overruns it is not tried again.
type pin struct {
	lock     *pgx.Conn // a second connection to the source, for the lock
	src, dst *pgx.Conn // the comparison's connections: they keep the snapshots
	stream   string    // the stream's name: its subscription's, and its marker's key
	table    string    // the table on the source, quoted
	bound    time.Duration
}

const (
	pinTries = 10
	lockWait = 200 * time.Millisecond
	// catchUpFirst bounds the destination's catch-up before the lock, which holds no
	// writer back.
	catchUpFirst = time.Minute
	// caughtUp is a catch-up short enough to lock after.
	caughtUp = 50 * time.Millisecond
)

// errNotStreaming is a pin's failure that trying again does not mend.
var errNotStreaming = errors.New("the stream's subscription is not enabled (a bounded copy not done, or a cutover under way): verify pinned needs every stream streaming")

// take pins the table: on success src and dst are each in a repeatable-read
// transaction, read only, whose snapshot the caller compares and then commits. It
// returns how long writes to the table waited.
func (p *pin) take(ctx context.Context) (time.Duration, error) {
	var errs []error
	for try := range pinTries {
		waited, err := p.try(ctx)
		if err == nil {
			return waited, nil
		}
		errs = append(errs, err)
		// Nothing is left of the attempt: no snapshot, no lock.
		for _, c := range []*pgx.Conn{p.src, p.dst} {
			if _, rerr := c.Exec(ctx, "ROLLBACK"); rerr != nil {
				return 0, errors.Join(append(errs, rerr)...)
			}
		}
		// Only a lock that did not come is tried again: a destination that did not
		// catch up within the bound, once it had caught up without the lock, would
		// hold the writers that long again.
		var pe *pgconn.PgError
		if ctx.Err() != nil || !errors.As(err, &pe) || pe.Code != "55P03" || try == pinTries-1 {
			break
		}
		// The writers held back go on meanwhile.
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(try+1) * 100 * time.Millisecond):
		}
	}
	return 0, fmt.Errorf("reshard: the comparison could not be pinned (writes to the table are held at most %v each try, the lock's wait at most %v; verify unpinned while the table takes no writes): %w",
		p.bound, min(lockWait, p.bound), errors.Join(errs...))
}

func (p *pin) try(ctx context.Context) (waited time.Duration, err error) {
	var enabled bool
	if err := p.dst.QueryRow(ctx, "SELECT coalesce(bool_and(subenabled), false) FROM pg_subscription WHERE subname = $1 AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())", p.stream).Scan(&enabled); err != nil {
		return 0, err
	}
	if !enabled {
		return 0, fmt.Errorf("%s: %w", p.stream, errNotStreaming)
	}
	// First the destination catches up without the lock, again while that takes
	// long (it applies what came meanwhile), so that the writers wait only for the
	// little it falls behind in the last round.
	deadline := time.Now().Add(catchUpFirst)
	for {
		t := time.Now()
		if err := p.catchUp(ctx, deadline); err != nil {
			return 0, err
		}
		if time.Since(t) < caughtUp {
			break
		}
	}
	began := time.Now()
	tx, err := p.lock.Begin(ctx)
	if err != nil {
		return 0, err
	}
	// The lock lifts in every case: committed on success, rolled back otherwise.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if rerr := tx.Rollback(rctx); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
			err = errors.Join(err, rerr)
		}
	}()
	// The server bounds the lock's wait, so that the connection stays usable.
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", max(min(lockWait, p.bound).Milliseconds(), 1))); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+p.table+" IN SHARE MODE"); err != nil {
		return 0, fmt.Errorf("the writes to %s in flight did not end within %v (%s): %w", p.table, min(lockWait, p.bound), p.holders(ctx), err)
	}
	if err := p.catchUp(ctx, began.Add(p.bound), func() error {
		_, err := p.src.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1")
		return err
	}); err != nil {
		return 0, err
	}
	if _, err := p.dst.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1"); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return time.Since(began), nil
}

// catchUp writes a marker into the stream on the source (then runs each of after
// there) and waits until the destination has it, until deadline.
func (p *pin) catchUp(ctx context.Context, deadline time.Time, after ...func() error) error {
	token := time.Now().UnixNano()
	if _, err := p.src.Exec(ctx, "INSERT INTO "+markerTable+" VALUES ($1, $2) ON CONFLICT (stream) DO UPDATE SET token = excluded.token", p.stream+pinMarker, token); err != nil {
		return err
	}
	for _, fn := range after {
		if err := fn(); err != nil {
			return err
		}
	}
	for {
		var arrived bool
		if err := p.dst.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+markerTable+" WHERE stream = $1 AND token = $2)", p.stream+pinMarker, token).Scan(&arrived); err != nil {
			return err
		}
		if arrived {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the destination had not applied the writes to %s committed before the pin by %s (stream %s)", p.table, deadline.Format("15:04:05.000"), p.stream)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Microsecond):
		}
	}
}

// pinMarker follows a stream's name in its pins' marker rows: the cutover's catch-up
// waits for a token of its own under the stream's name alone.
const pinMarker = "/verify"

// holders names what holds a lock on the table that SHARE waits for, as far as the
// source says (for the error of a lock that timed out).
func (p *pin) holders(ctx context.Context) string {
	rows, err := p.src.Query(ctx, `SELECT coalesce('prepared transaction ' || quote_literal(x.gid), coalesce(a.backend_type, 'backend') || ' ' || l.pid || coalesce(', ' || a.state, ''), l.virtualtransaction) || ' (' || l.mode || ')'
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		LEFT JOIN pg_prepared_xacts x ON l.pid IS NULL AND x.transaction::text = split_part(l.virtualtransaction, '/', 2)
		WHERE l.locktype = 'relation' AND l.relation = $1::regclass AND l.granted
		  AND l.mode IN ('RowExclusiveLock', 'ShareUpdateExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
		ORDER BY x.gid IS NULL, coalesce(a.xact_start, x.prepared) LIMIT 5`, p.table)
	if err != nil {
		return "its holders unknown: " + err.Error()
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "its holders unknown: " + err.Error()
	}
	if len(held) == 0 {
		return "held by no one any more"
	}
	return "held by " + strings.Join(held, "; ")
}
