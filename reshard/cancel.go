package reshard

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/rules"
)

// Cancel ends a move between two layouts before its cutover and removes everything it
// made: subscriptions on the destinations, slots (the tables' copying slots too) and
// publications on the sources, the hash helpers, the tables it created on the data
// sources it adds, and the rows copied into them. The current layout never stopped
// serving, and nothing it reads is touched. Cancelling a move that is not under way
// (or was cancelled part way, by a crash) does what is left to do, and nothing else.
func Cancel(ctx context.Context, from, to *rules.Compiled, opts Options) error {
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	conns, err := connectAll(ctx, from, to)
	if err != nil {
		return err
	}
	defer closeAll(conns)
	if err := checkMove(ctx, from, to, conns); err != nil {
		return err
	}
	if cur, err := currentRecord(ctx, from, to, conns); err != nil {
		return err
	} else if cur != nil && cur.Digest == to.Digest() {
		return fmt.Errorf("reshard: the move was cut over (layout version %d is in force): a cancel no longer applies; finish it, or revert it", cur.Version)
	} else if cur != nil && cur.Phase == phaseReverting {
		return fmt.Errorf("%w: run reshard revert again to complete it", ErrRevertIncomplete)
	}
	return removeMove(ctx, from, to, conns, opts.Progress)
}

// removeMove removes what a move made, but for the layout record: the streams both
// ways, the views, the tables it created on the data sources it adds (the rows it
// copied into tables that were there), the replica identities it changed, its helper
// schemas.
func removeMove(ctx context.Context, from, to *rules.Compiled, conns map[string]*pgx.Conn, progress io.Writer) error {
	// The data sources the current layout serves, known by what they are (server,
	// database, and the schema a schema shard reads), not by the names the layouts give
	// them: nothing in them is cleared.
	current := map[string]bool{}
	for _, d := range from.DataSources() {
		id, err := dataSourceID(ctx, conns[d.Name])
		if err != nil {
			return fmt.Errorf("data source %s: %w", d.Name, err)
		}
		current[id] = true
	}
	if err := dropAllReverse(ctx, from, to, conns, progress); err != nil {
		return err
	}
	for _, src := range from.DataSources() {
		for _, dst := range to.DataSources() {
			if src.Name == dst.Name {
				continue
			}
			name := streamName(src, dst)
			if err := dropStream(ctx, conns[src.Name], conns[dst.Name], src.Name, dst.Name, name, progress); err != nil {
				return err
			}
		}
	}
	names, err := shardedTables(ctx, from, conns)
	if err != nil {
		return err
	}
	// The views of a cutover that gave up (the move's own, by their comment).
	for _, name := range names {
		for _, n := range from.Lookup(name).Nodes {
			at := place(from, n)
			vq := Place{Schema: at.Schema, Table: at.Table + viewSuffix}.qualified()
			if _, err := conns[at.DataSource].Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
				IF obj_description(to_regclass('%[1]s'), 'pg_class') = '%[2]s' THEN DROP VIEW %[3]s; END IF; END $$`,
				strings.ReplaceAll(vq, "'", "''"), viewComment, vq)); err != nil {
				return fmt.Errorf("data source %s: dropping view %s: %w", at.DataSource, vq, err)
			}
		}
	}
	names = append(names, from.Rules().Broadcast...)
	for _, dst := range to.DataSources() {
		id, err := dataSourceID(ctx, conns[dst.Name])
		if err != nil {
			return fmt.Errorf("data source %s: %w", dst.Name, err)
		}
		if current[id] {
			continue
		}
		for _, table := range names {
			if err := clearCopy(ctx, conns[dst.Name], dst.Name, to, table, progress); err != nil {
				return err
			}
		}
	}
	// The replica identities a start changed, then the helper schemas: the hash
	// helpers on the sources (for the publications) and destinations (for verify), and
	// the marks of what the move fed.
	for name, c := range conns {
		if err := restoreIdentities(ctx, c, name, progress); err != nil {
			return err
		}
	}
	for name, c := range conns {
		if _, err := c.Exec(ctx, "DROP SCHEMA IF EXISTS "+prefix+" CASCADE"); err != nil {
			return fmt.Errorf("data source %s: %w", name, err)
		}
	}
	return nil
}

// databaseID names the database a connection is to: its server's system identifier
// (or address) and port, and the database.
func databaseID(ctx context.Context, c *pgx.Conn) (string, error) {
	st, err := readServer(ctx, c)
	if err != nil {
		return "", err
	}
	return st.id + "/" + st.database, nil
}

// dataSourceID names what a connection reads: its database (databaseID) and, for a
// schema shard (a DSN that sets search_path), the first schema of its search_path.
func dataSourceID(ctx context.Context, c *pgx.Conn) (string, error) {
	id, err := databaseID(ctx, c)
	if err != nil || c.Config().RuntimeParams["search_path"] == "" {
		return id, err
	}
	var schema *string
	if err := c.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return "", err
	}
	if schema != nil {
		id += "/" + *schema
	}
	return id, nil
}

// dropStream removes one stream: the subscription (stopping its workers), then every
// slot it used on the source, then the publication.
func dropStream(ctx context.Context, src, dst *pgx.Conn, from, to, name string, progress io.Writer) error {
	var subOID uint32
	err := dst.QueryRow(ctx, "SELECT oid FROM pg_subscription WHERE subname = $1 AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())", name).Scan(&subOID)
	switch {
	case err == pgx.ErrNoRows:
	case err != nil:
		return fmt.Errorf("data source %s: %w", to, err)
	default:
		fmt.Fprintf(progress, "reshard: %s: dropping subscription %s\n", to, name)
		// Detached from its slot first, so that dropping it needs no connection to the
		// source; the slots are dropped there below.
		for _, sql := range []string{"ALTER SUBSCRIPTION " + name + " DISABLE", "ALTER SUBSCRIPTION " + name + " SET (slot_name = NONE)"} {
			if _, err := dst.Exec(ctx, sql); err != nil {
				return fmt.Errorf("data source %s: %s: %w", to, sql, err)
			}
		}
		// A table-sync worker may be waiting on the source for its slot, whose
		// creation waits for every running transaction of that server to end: with
		// the source and destination on one server, DROP SUBSCRIPTION's own among
		// them, while DROP SUBSCRIPTION waits for the worker. The source's ends of
		// the subscription's connections go first, and the worker with them.
		if _, err := src.Exec(ctx, `SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
			WHERE backend_type = 'walsender' AND datname = current_database() AND (application_name = $1 OR application_name LIKE $2)`,
			name, fmt.Sprintf("pg\\_%d\\_sync\\_%%", subOID)); err != nil {
			return fmt.Errorf("data source %s: %w", from, err)
		}
		if _, err := dst.Exec(ctx, "DROP SUBSCRIPTION "+name); err != nil {
			return fmt.Errorf("data source %s: DROP SUBSCRIPTION %s: %w", to, name, err)
		}
	}
	// The stream's slot, and those its tables were being copied on when the copy was
	// cut short (pg_<subscription oid>_sync_<table oid>_<system id>).
	pattern := name
	if subOID != 0 {
		pattern = fmt.Sprintf("pg\\_%d\\_sync\\_%%", subOID)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		rows, err := src.Query(ctx, `SELECT slot_name, active_pid FROM pg_replication_slots
			WHERE database = current_database() AND (slot_name = $1 OR slot_name LIKE $2)`, name, pattern)
		if err != nil {
			return fmt.Errorf("data source %s: %w", from, err)
		}
		type slot struct {
			name string
			pid  *int32
		}
		slots, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (slot, error) {
			var s slot
			return s, r.Scan(&s.name, &s.pid)
		})
		if err != nil {
			return fmt.Errorf("data source %s: %w", from, err)
		}
		if len(slots) == 0 {
			break
		}
		busy := false
		for _, s := range slots {
			if s.pid != nil {
				// The subscription's WAL sender outlives it for a moment.
				busy = true
				src.Exec(ctx, "SELECT pg_terminate_backend($1)", *s.pid)
				continue
			}
			if _, err := src.Exec(ctx, "SELECT pg_drop_replication_slot($1)", s.name); err != nil {
				busy = true
			} else {
				fmt.Fprintf(progress, "reshard: %s: dropped slot %s\n", from, s.name)
			}
		}
		if !busy {
			continue
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("data source %s: the slots of %s stay in use after 30 s", from, name)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Its tables first, then the publication: a write to a published table that
	// builds the table's list of publications while DROP PUBLICATION commits can find
	// the publication gone and fail ("cache lookup failed for publication", XX000,
	// PostgreSQL 15), and the current layout's clients write those tables. Once the
	// tables are out of it, no write looks the publication up.
	var tables []string
	rows, err := src.Query(ctx, "SELECT format('%I.%I', schemaname, tablename) FROM pg_publication_tables WHERE pubname = $1", name)
	if err == nil {
		tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err == nil && len(tables) > 0 {
		_, err = src.Exec(ctx, "ALTER PUBLICATION "+name+" DROP TABLE "+strings.Join(tables, ", "))
	}
	if err == nil {
		_, err = src.Exec(ctx, "DROP PUBLICATION IF EXISTS "+name)
	}
	if err != nil {
		return fmt.Errorf("data source %s: dropping publication %s: %w", from, name, err)
	}
	return nil
}

// clearCopy removes what a move copied into a data source it adds: the table itself
// when the move created it; else its rows, when start marked it as fed by the move
// (the table was empty when the move began); else nothing.
func clearCopy(ctx context.Context, c *pgx.Conn, ds string, to *rules.Compiled, table string, progress io.Writer) error {
	r := to.Lookup(table)
	i := nodeOf(to, table, ds)
	if i < 0 {
		return nil
	}
	at := place(to, r.Nodes[i])
	var comment *string
	var exists bool
	if err := c.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL, obj_description(to_regclass($1), 'pg_class')", at.qualified()).Scan(&exists, &comment); err != nil {
		return fmt.Errorf("data source %s: %w", ds, err)
	}
	var fed bool
	if exists {
		if err := c.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", prefix+".fed").Scan(&fed); err != nil {
			return fmt.Errorf("data source %s: %w", ds, err)
		}
		if fed {
			// Or as a start before schema-qualified records named it.
			if err := c.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+prefix+".fed WHERE tbl = ("+resolvedName+") OR tbl = $1)", at.qualified()).Scan(&fed); err != nil {
				return fmt.Errorf("data source %s: %w", ds, err)
			}
		}
	}
	switch {
	case !exists:
	case comment != nil && *comment == createdComment:
		fmt.Fprintf(progress, "reshard: %s: dropping table %s, which the move created\n", ds, at.Table)
		if _, err := c.Exec(ctx, "DROP TABLE "+at.qualified()); err != nil {
			return fmt.Errorf("data source %s: %w", ds, err)
		}
	case !fed:
	default:
		fmt.Fprintf(progress, "reshard: %s: deleting the rows copied into %s\n", ds, at.Table)
		if _, err := c.Exec(ctx, "DELETE FROM "+at.qualified()); err != nil {
			return fmt.Errorf("data source %s: %w", ds, err)
		}
	}
	return nil
}
