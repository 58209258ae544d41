package reshard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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
// The lock's wait is short (lockWait) and tried again after a pause, so that a writer
// that keeps the table (a long transaction, a prepared one, VACUUM, or one waiting on
// a row of another data source that a writer queued behind the lock holds) holds the
// others back only that long at a time; the whole pin, lock and catch-up, holds them at
// most bound.
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
		if ctx.Err() != nil || errors.Is(err, errNotStreaming) {
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
	token := time.Now().UnixNano()
	if _, err := p.src.Exec(ctx, "INSERT INTO "+markerTable+" VALUES ($1, $2) ON CONFLICT (stream) DO UPDATE SET token = excluded.token", p.stream+pinMarker, token); err != nil {
		return 0, err
	}
	if _, err := p.src.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1"); err != nil {
		return 0, err
	}
	for {
		var arrived bool
		if err := p.dst.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+markerTable+" WHERE stream = $1 AND token = $2)", p.stream+pinMarker, token).Scan(&arrived); err != nil {
			return 0, err
		}
		if arrived {
			break
		}
		if time.Since(began) > p.bound {
			return 0, fmt.Errorf("the destination had not applied the writes to %s committed before the pin within %v (stream %s)", p.table, p.bound, p.stream)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(500 * time.Microsecond):
		}
	}
	if _, err := p.dst.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1"); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return time.Since(began), nil
}

// pinMarker follows a stream's name in its pins' marker rows: the cutover's catch-up
// waits for a token of its own under the stream's name alone.
const pinMarker = "/verify"

// holders names what holds a lock on the table that SHARE waits for, as far as the
// source says (for the error of a lock that timed out).
func (p *pin) holders(ctx context.Context) string {
	rows, err := p.src.Query(ctx, `SELECT coalesce('prepared transaction ' || quote_literal(x.gid), a.backend_type || ' ' || l.pid || coalesce(', ' || a.state, ''), l.virtualtransaction) || ' (' || l.mode || ')'
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		LEFT JOIN pg_prepared_xacts x ON l.pid IS NULL AND x.transaction::text = split_part(l.virtualtransaction, '/', 2)
		WHERE l.locktype = 'relation' AND l.relation = $1::regclass AND l.granted
		  AND l.mode IN ('RowExclusiveLock', 'ShareUpdateExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
		ORDER BY 1 LIMIT 5`, p.table)
	if err != nil {
		return "its holders unknown: " + err.Error()
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(held) == 0 {
		return "held by no one any more"
	}
	return "held by " + strings.Join(held, "; ")
}
