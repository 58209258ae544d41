package reshard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
)

// The layout in force is recorded on every data source of a deployment that has been
// resharded, in the table shardlab_layout.layout: a version that each cutover raises, the
// digest of the rules in force (rules.Compiled.Digest), and, between a cutover and
// its finish, the views through which the moved tables are read on the data sources
// that still keep rows which moved away, and the rules the move came from.
//
// Every process that routes by rules tells its servers which (the setting
// shardlab.layout, which the proxy's pools and the driver's connections start with).
// A fence, a statement trigger on every table a move touches, refuses the writes of a
// process whose layout is not the one in force: a proxy or a driver that still routes
// by the old rules after a cutover, or that starts with them, never writes to the
// wrong data source. A session that does not say (psql, pg_dump, the move's own
// replication) is not fenced.

// LayoutSetting is the server setting a process's connections carry: the digest of
// the rules it routes by.
const LayoutSetting = rules.LayoutSetting

// ErrStaleLayout is wrapped when the data sources record another layout in force than
// the rules given.
var ErrStaleLayout = errors.New("reshard: the data sources are at another layout")

// Record is the layout in force on a data source.
type Record struct {
	Version int64
	Digest  string
	// Phase is "cutover" between a move's cutover and its finish or revert,
	// "finishing" once a finish began, "reverting" from a revert's hold until what
	// the move made is removed, else "done".
	Phase string
	// Views are, between cutover and finish, the views that stand for tables on the
	// data sources that keep rows which moved away (rules.Compiled.WithTableNames).
	Views []View `json:",omitempty"`
	// From is, between cutover and finish, the rules the move came from.
	From *rules.Rules `json:",omitempty"`
	// Switched is when the record was written.
	Switched time.Time
	// Switching marks the record of a hold that has not ended: the fence refuses the
	// writes of every process, those of the layout it switches to as well, until the
	// streams have caught up (see hold).
	Switching bool `json:",omitempty"`
}

// fenced is the digest the fence compares with: the record's, or while it is
// switching one that no process routes by.
func (r *Record) fenced() string {
	if r.Switching {
		return "switching to " + r.Digest
	}
	return r.Digest
}

// View is a view that stands for a table on a data source.
type View struct {
	Table      string // logical table
	DataSource string
	Schema     string // the table's schema there ("" for the search path's)
	Name       string // the view's name
}

// layoutSchema holds the record and the fence's function. It outlives every move
// (cancel and finish drop the move's own schema, prefix, and not this one).
const layoutSchema = "shardlab_layout"

const layoutTable = layoutSchema + ".layout"

// createLayoutTable makes the record's table and the fence's function on a data
// source, if they are not there.
func createLayoutTable(ctx context.Context, c *pgx.Conn) error {
	_, err := c.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %[1]s;
		CREATE TABLE IF NOT EXISTS %[2]s (one int PRIMARY KEY DEFAULT 1 CHECK (one = 1), version bigint NOT NULL,
			digest text NOT NULL, phase text NOT NULL, record jsonb NOT NULL);
		CREATE OR REPLACE FUNCTION %[1]s.fence() RETURNS trigger LANGUAGE plpgsql AS $fence$
		DECLARE
			mine text := current_setting('%[3]s', true);
			v bigint;
			d text;
		BEGIN
			IF mine IS NULL OR mine = '' THEN
				RETURN NULL;
			END IF;
			-- Shared until the transaction ends: a new record (writeRecord) waits for
			-- the writes that passed the fence, and those that come after read it.
			PERFORM pg_advisory_xact_lock_shared(%[4]d);
			IF current_setting('transaction_isolation') = 'read committed' THEN
				SELECT version, digest INTO v, d FROM %[2]s; -- a snapshot of its own
			ELSE
				-- The transaction's snapshot may predate a new record: a row lock on it
				-- fails with 40001 if it changed since, and the retry is fenced.
				SELECT version, digest INTO v, d FROM %[2]s FOR KEY SHARE;
			END IF;
			IF FOUND AND d <> mine THEN
				RAISE EXCEPTION 'shardlab: this process routes by layout %%, and the data sources are at layout version %% (%%): its writes are refused; restart it with the rules in force', mine, v, d
					USING ERRCODE = '55000', HINT = 'a resharding move switched the layout';
			END IF;
			RETURN NULL;
		END
		$fence$`, layoutSchema, layoutTable, LayoutSetting, fenceLock))
	return err
}

// readRecord reads a data source's record; nil when it has none.
func readRecord(ctx context.Context, c *pgx.Conn) (*Record, error) {
	var exists bool
	if err := c.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", layoutTable).Scan(&exists); err != nil {
		return nil, err
	}
	if !exists {
		return nil, nil
	}
	var raw []byte
	err := c.QueryRow(ctx, "SELECT record FROM "+layoutTable).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	rec := &Record{}
	if err := json.Unmarshal(raw, rec); err != nil {
		return nil, fmt.Errorf("the layout record: %w", err)
	}
	return rec, nil
}

// fenceLock is the advisory lock key that orders the fence and the record: every
// write that passes the fence holds it shared until its transaction ends; a new
// record is written holding it exclusively.
const fenceLock = 0x5348524c

// recordWait bounds how long writing a record waits for the writes in progress that
// passed the fence (those of other processes: the proxy's were drained).
var recordWait = 2 * time.Second

// writeRecord replaces a data source's record. When it changes the layout, it first
// waits, up to recordWait, for every transaction that passed the fence to end, so that
// once it is written no write routed by the layout it replaces is in progress, and
// none starts.
func writeRecord(ctx context.Context, c *pgx.Conn, rec *Record) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	put := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+layoutTable+` (version, digest, phase, record) VALUES ($1, $2, $3, $4)
			ON CONFLICT (one) DO UPDATE SET version = excluded.version, digest = excluded.digest, phase = excluded.phase, record = excluded.record`,
			rec.Version, rec.fenced(), rec.Phase, raw)
		return err
	}
	return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", recordWait.Milliseconds())); err != nil {
			return err
		}
		// Only a change of layout waits for the writes that passed the fence: a
		// record of the same layout (its phase) lets nothing new through, and while
		// the proxy serves, waiting behind its transactions could close a cycle of
		// waits across data sources that no server sees.
		var was string
		err := tx.QueryRow(ctx, "SELECT digest FROM "+layoutTable).Scan(&was)
		switch {
		case errors.Is(err, pgx.ErrNoRows) || (err == nil && was == rec.fenced()):
			return put(tx)
		case err != nil:
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(fenceLock)); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "55P03" {
				return fmt.Errorf("a transaction that writes through the fence stayed open for %v (see pg_stat_activity): %w", recordWait, err)
			}
			return err
		}
		return put(tx)
	})
}

// installFence puts the fence's trigger on a table of a data source. Making a
// trigger waits for the writes in progress on the table, and the writes that come
// after it wait behind it: each try waits at most 50 ms (lock_timeout), and a table
// that a long transaction holds is tried again for up to fenceWait before the error
// names it.
func installFence(ctx context.Context, c *pgx.Conn, at Place) error {
	sql := fmt.Sprintf(`CREATE OR REPLACE TRIGGER shardlab_layout_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s
		FOR EACH STATEMENT EXECUTE FUNCTION %s.fence()`, at.qualified(), layoutSchema)
	deadline := time.Now().Add(fenceWait)
	for {
		err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '50ms'"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sql)
			return err
		})
		var pe *pgconn.PgError
		if err == nil || !errors.As(err, &pe) || pe.Code != "55P03" {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("a transaction kept table %s locked for %v (see pg_stat_activity on data source %s): %w", at.qualified(), fenceWait, at.DataSource, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// fenceWait bounds how long installFence tries a table that transactions keep locked.
var fenceWait = 30 * time.Second

// InForce returns the rules to route by, given rules l: l itself when its data
// sources record no layout or record l's; between a move's cutover and its finish, l
// with the views that stand for the moved tables (rules.Compiled.WithTableNames). It
// fails with ErrStaleLayout when they record another layout than l: a process that
// routed by l would read and write the wrong data sources. A data source that does not
// answer within a few seconds is skipped (the others tell), and the error lists none.
func InForce(ctx context.Context, l *rules.Compiled) (*rules.Compiled, error) {
	rec, at, err := readLayout(ctx, l)
	if err != nil || rec == nil {
		return l, err
	}
	if rec.Digest != l.Digest() {
		return nil, fmt.Errorf("%w: data source %s is at layout version %d (%s), and these rules are %s: give the rules in force",
			ErrStaleLayout, at, rec.Version, rec.Digest, l.Digest())
	}
	switch {
	case rec.Switching && rec.Phase == phaseReverting:
		return nil, fmt.Errorf("%w: data source %s is switching to layout version %d: run reshard revert again with the same rules files to complete it", ErrRevertIncomplete, at, rec.Version)
	case rec.Switching:
		return nil, fmt.Errorf("%w: data source %s is switching to layout version %d: run reshard cutover again with the same rules files to complete it", ErrCutoverIncomplete, at, rec.Version)
	}
	switch rec.Phase {
	case phaseReverting:
		return l, checkReverted(ctx, l, rec)
	case phaseCutover, phaseFinishing:
	default:
		return l, nil
	}
	if err := checkComplete(ctx, l, rec); err != nil {
		return nil, err
	}
	return withViews(l, rec.Views), nil
}

// checkComplete fails with ErrCutoverIncomplete when the cutover to record rec (of
// layout l) stopped part way: serving l then could meet the old streams' last changes.
func checkComplete(ctx context.Context, l *rules.Compiled, rec *Record) error {
	if rec.From == nil {
		return nil
	}
	fromRules := *rec.From
	fromRules.DataSources = slices.Clone(fromRules.DataSources)
	for i, d := range fromRules.DataSources {
		for _, e := range l.DataSources() {
			if e.Name == d.Name {
				fromRules.DataSources[i].DSN = e.DSN
			}
		}
		if fromRules.DataSources[i].DSN == "" {
			return nil // a data source these rules do not name: cannot be checked from here
		}
	}
	from, err := rules.Compile(fromRules)
	if err != nil {
		return err
	}
	conns, err := connectAll(ctx, from, l)
	if err != nil {
		return err
	}
	defer closeAll(conns)
	left, err := cutoverLeft(ctx, from, l, rec, conns)
	if err != nil {
		return err
	}
	if !left.empty() {
		return fmt.Errorf("%w: layout version %d is recorded on %d of the data sources, %d streams still run, %d streams back are not ready: run reshard cutover again with the same rules files to complete it",
			ErrCutoverIncomplete, rec.Version, len(allDataSources(from, l))-len(left.records), len(left.streams), len(left.reverse))
	}
	return nil
}

// ReadLayout returns the layout record of l's data sources: the highest version among
// those that answer (nil: none records one).
func ReadLayout(ctx context.Context, l *rules.Compiled) (*Record, error) {
	rec, _, err := readLayout(ctx, l)
	return rec, err
}

func readLayout(ctx context.Context, l *rules.Compiled) (*Record, string, error) {
	var found *Record
	var foundAt string
	for _, d := range l.DataSources() {
		cfg, err := pgx.ParseConfig(d.DSN)
		if err != nil {
			return nil, "", fmt.Errorf("data source %s: %w", d.Name, err)
		}
		cfg.ConnectTimeout = 3 * time.Second
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "3D000" {
				return nil, "", fmt.Errorf("data source %s: %w", d.Name, err)
			}
			continue
		}
		rec, err := readRecord(ctx, c)
		c.Close(context.Background())
		if err != nil {
			return nil, "", fmt.Errorf("data source %s: reading the layout record: %w", d.Name, err)
		}
		if newer(rec, found) {
			found, foundAt = rec, d.Name
		}
	}
	return found, foundAt, nil
}

// newer reports whether record a stands over b: a higher version, or the same in a
// later phase than "done" (a finish, or the end of a revert, that stopped part way
// recorded "done" on some data sources only; a finish that began recorded "finishing"
// on some), or switching (a hold that stopped part way wrote its last record on some
// data sources only).
func newer(a, b *Record) bool {
	switch {
	case a == nil:
		return false
	case b == nil || a.Version > b.Version:
		return true
	}
	if a.Version != b.Version {
		return false
	}
	if ra, rb := phaseRank(a.Phase), phaseRank(b.Phase); ra != rb {
		return ra > rb
	}
	return a.Switching && !b.Switching
}

// withViews returns l reading and writing through views (none: l).
func withViews(l *rules.Compiled, views []View) *rules.Compiled {
	if len(views) == 0 {
		return l
	}
	names := map[rules.TableAt]string{}
	for _, v := range views {
		names[rules.TableAt{Table: v.Table, DataSource: v.DataSource}] = v.Name
	}
	return l.WithTableNames(names)
}
