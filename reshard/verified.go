package reshard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
)

// verifyRun is the record of one verify.
type verifyRun struct {
	c       *pgx.Conn // to the current layout's first data source, for the record only
	ds      string
	started time.Time
	pinned  bool
	tables  map[[3]string]verifiedTableRecord // by source, destination and table

	stopAfter, chunks int // a test's cut (VerifyOptions.stopAfterChunks), and the chunks recorded
}

// verifiedTableRecord is how far a verify got through one table of one stream.
type verifiedTableRecord struct {
	Diff RowDiff
	// Next is the key the next chunk starts at; "" with Done false: no chunk compared
	// yet (the destination's misplaced rows may be counted already).
	Next string
	Done bool
}

// openVerifyRun opens the record of a verify: a new one, replacing what an earlier
// verify recorded, or with resume the one a verify cut short left, which must have
// been pinned as this one is.
func openVerifyRun(ctx context.Context, from *rules.Compiled, pinned, resume bool) (*verifyRun, error) {
	d := from.DataSources()[0]
	c, err := connectOne(ctx, d)
	if err != nil {
		return nil, err
	}
	r := &verifyRun{c: c, ds: d.Name, pinned: pinned, tables: map[[3]string]verifiedTableRecord{}}
	if err := r.open(ctx, resume); err != nil {
		c.Close(context.Background())
		return nil, fmt.Errorf("data source %s: verify's record: %w", d.Name, err)
	}
	return r, nil
}

func (r *verifyRun) open(ctx context.Context, resume bool) error {
	if !resume {
		_, err := r.c.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %[1]s;
			CREATE TABLE IF NOT EXISTS %[2]s (one int PRIMARY KEY DEFAULT 1 CHECK (one = 1), started timestamptz NOT NULL,
				pinned bool NOT NULL, finished timestamptz);
			CREATE TABLE IF NOT EXISTS %[3]s (src text, dst text, tbl text, next text NOT NULL, done bool NOT NULL, diff jsonb NOT NULL,
				PRIMARY KEY (src, dst, tbl));
			BEGIN;
			DELETE FROM %[3]s;
			INSERT INTO %[2]s (started, pinned) VALUES (now(), %[4]t)
				ON CONFLICT (one) DO UPDATE SET started = excluded.started, pinned = excluded.pinned, finished = NULL;
			COMMIT`, prefix, verifyRunTable, verifiedTable, r.pinned))
		if err != nil {
			return err
		}
		return r.c.QueryRow(ctx, "SELECT started FROM "+verifyRunTable).Scan(&r.started)
	}
	var exists bool
	if err := r.c.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", verifyRunTable).Scan(&exists); err != nil {
		return err
	}
	var wasPinned bool
	var finished *time.Time
	err := pgx.ErrNoRows
	if exists {
		err = r.c.QueryRow(ctx, "SELECT started, pinned, finished FROM "+verifyRunTable).Scan(&r.started, &wasPinned, &finished)
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return errors.New("no verify of this move was recorded: nothing to resume (run verify without --resume)")
	case err != nil:
		return err
	case finished != nil:
		return fmt.Errorf("the last verify, started %s, finished at %s: nothing to resume (run verify without --resume to compare again)",
			r.started.UTC().Format(time.DateTime), finished.UTC().Format(time.DateTime))
	case wasPinned != r.pinned:
		return fmt.Errorf("the verify started %s was %s: resume it %s", r.started.UTC().Format(time.DateTime),
			map[bool]string{true: "pinned", false: "not pinned"}[wasPinned], map[bool]string{true: "with --pin", false: "without --pin"}[wasPinned])
	}
	rows, err := r.c.Query(ctx, "SELECT src, dst, tbl, next, done, diff FROM "+verifiedTable)
	if err != nil {
		return err
	}
	var k [3]string
	var rec verifiedTableRecord
	var raw []byte
	_, err = pgx.ForEachRow(rows, []any{&k[0], &k[1], &k[2], &rec.Next, &rec.Done, &raw}, func() error {
		rec.Diff = RowDiff{}
		if err := json.Unmarshal(raw, &rec.Diff); err != nil {
			return err
		}
		r.tables[k] = rec
		return nil
	})
	return err
}

// table returns what the resumed verify recorded of one table of one stream.
func (r *verifyRun) table(from, to, table string) (verifiedTableRecord, bool) {
	rec, ok := r.tables[[3]string{from, to, table}]
	return rec, ok
}

// note records how far the comparison of one table of one stream got.
func (r *verifyRun) note(ctx context.Context, rd *RowDiff, next string, done bool) error {
	raw, err := json.Marshal(rd)
	if err == nil {
		_, err = r.c.Exec(ctx, "INSERT INTO "+verifiedTable+` (src, dst, tbl, next, done, diff) VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (src, dst, tbl) DO UPDATE SET next = excluded.next, done = excluded.done, diff = excluded.diff`,
			rd.From, rd.To, rd.Table, next, done, raw)
	}
	if err != nil {
		return fmt.Errorf("data source %s: recording what verify compared: %w", r.ds, err)
	}
	return nil
}

// chunkDone counts a chunk recorded, and cuts the verify short where a test asks.
func (r *verifyRun) chunkDone() error {
	if r.chunks++; r.stopAfter > 0 && r.chunks >= r.stopAfter {
		return errCrashed
	}
	return nil
}

// finish records that the verify compared everything.
func (r *verifyRun) finish(ctx context.Context) error {
	if _, err := r.c.Exec(ctx, "UPDATE "+verifyRunTable+" SET finished = now()"); err != nil {
		return fmt.Errorf("data source %s: recording what verify compared: %w", r.ds, err)
	}
	return nil
}

func (r *verifyRun) close() { r.c.Close(context.Background()) }
