package reshard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// pin pins one table's comparison of one stream to one point of its source's WAL
// while writes go on, as VDiff pins a MySQL table: PostgreSQL's subscriptions cannot
// stop applying at a chosen position, so the source stops writing the table instead,
// for as long as the destination takes to apply what came before.
//
//  1. On a connection of its own, in a transaction, the source's table is locked in
//     SHARE mode: the lock waits for the transactions that wrote it to end, and holds
//     the next writers back (they wait; readers do not). From then on, every write to
//     the table is committed and none can be.
//  2. A marker is written into the stream (the cutover's catch-up marker), and the
//     source's comparison connection takes a snapshot: it has every row of the table,
//     as it stands.
//  3. Once the destination has the marker, its subscription has applied every
//     transaction committed before it, so every write to the table: the destination's
//     comparison connection takes a snapshot there too.
//  4. The lock is released and writers go on; the two snapshots stay, and the
//     comparison reads them, both standing at that one point.
//
// Only the destination's apply worker writes the stream's rows there before the
// cutover (Verify refuses to pin after it), so its snapshot holds them as the source
// had them. A pin that does not succeed within bound (the lock's wait, or the
// destination's catch-up) is released and tried again, up to three times; the writes
// never fail, they wait at most bound each time.
type pin struct {
	lock     *pgx.Conn // a second connection to the source, for the lock
	src, dst *pgx.Conn // the comparison's connections: they keep the snapshots
	stream   string    // the stream's name, which its marker row has
	table    string    // the table on the source, quoted
	bound    time.Duration
}

const pinTries = 3

// take pins the table: on success src and dst are each in a repeatable-read
// transaction, read only, whose snapshot the caller compares and then commits. It
// returns how long writes to the table waited.
func (p *pin) take(ctx context.Context) (time.Duration, error) {
	var errs []error
	for range pinTries {
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
		if ctx.Err() != nil {
			break
		}
	}
	return 0, fmt.Errorf("reshard: the comparison could not be pinned (writes to the table are held at most %v each try; raise the bound, or verify unpinned while the table takes no writes): %w", p.bound, errors.Join(errs...))
}

func (p *pin) try(ctx context.Context) (waited time.Duration, err error) {
	began := time.Now()
	tx, err := p.lock.Begin(ctx)
	if err != nil {
		return 0, err
	}
	// The lock lifts in every case: committed on success, rolled back otherwise.
	defer func() {
		if rerr := tx.Rollback(context.WithoutCancel(ctx)); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
			err = errors.Join(err, rerr)
		}
	}()
	// The server bounds the lock's wait, so that the connection stays usable.
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", max(p.bound.Milliseconds(), 1))); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+p.table+" IN SHARE MODE"); err != nil {
		return 0, fmt.Errorf("the writes to %s in flight did not end within %v: %w", p.table, p.bound, err)
	}
	token := time.Now().UnixNano()
	if _, err := p.src.Exec(ctx, "INSERT INTO "+markerTable+" VALUES ($1, $2) ON CONFLICT (stream) DO UPDATE SET token = excluded.token", p.stream, token); err != nil {
		return 0, err
	}
	if _, err := p.src.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1"); err != nil {
		return 0, err
	}
	for {
		var arrived bool
		if err := p.dst.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+markerTable+" WHERE stream = $1 AND token = $2)", p.stream, token).Scan(&arrived); err != nil {
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
