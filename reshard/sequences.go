package reshard

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/rules"
)

// Logical replication carries rows, not sequences: a table the move copies to a new
// data source comes with its own sequence (pg_dump makes it) at its start, or behind,
// while its rows carry the values the source's sequence gave. Once a hold stopped the
// streams, before any write of the layout it switches to, each sequence a stream's
// table uses (serial, identity, or a DEFAULT nextval(...)) is set on the destination to
// no less than the source's (setval to the greater of the two). A destination fed by
// several sources ends at the greatest. Sequences that count down are left alone.
//
// A unique column fed by a sequence that is not the sharding key (a bigserial id in a
// table sharded by customer) gets the same values on an old and a new data source
// after the cutover (as it does on two data sources before the move: global keys are
// issue 21's): on the way back such rows collide, and a revert cannot catch up.

// tableSequences lists the sequences a table's columns take values from, by name.
const tableSequences = `SELECT DISTINCT format('%I.%I', n.nspname, s.relname) FROM pg_class s JOIN pg_sequence q ON q.seqrelid = s.oid
	JOIN pg_namespace n ON n.oid = s.relnamespace
	WHERE q.seqincrement > 0 AND s.oid IN (
		SELECT d.refobjid FROM pg_attrdef ad JOIN pg_depend d ON d.classid = 'pg_attrdef'::regclass AND d.objid = ad.oid
			AND d.refclassid = 'pg_class'::regclass WHERE ad.adrelid = to_regclass($1)
		UNION
		SELECT d.objid FROM pg_depend d WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = to_regclass($1)
			AND d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))`

// seqSync is one sequence to carry from a stream's source to its destination.
type seqSync struct {
	s   stream
	seq string // qualified, quoted as an identifier
}

// findSequences lists the sequences of the tables each stream carries, on its source
// (catalog reads, before a hold: in it, syncSequences only reads and sets them).
func findSequences(ctx context.Context, streams []stream, conns map[string]*pgx.Conn, progress io.Writer) ([]seqSync, error) {
	var out []seqSync
	for _, s := range streams {
		src, dst := conns[s.from], conns[s.to]
		rows, err := dst.Query(ctx, `SELECT r.srrelid::regclass::text FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid
			WHERE s.subname = $1 AND s.subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND r.srrelid <> to_regclass($2)`, s.name, markerTable)
		if err != nil {
			return nil, fmt.Errorf("data source %s: %w", s.to, err)
		}
		tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("data source %s: %w", s.to, err)
		}
		for _, table := range tables {
			rows, err := src.Query(ctx, tableSequences, table)
			if err != nil {
				return nil, fmt.Errorf("data source %s: the sequences of %s: %w", s.from, table, err)
			}
			seqs, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return nil, fmt.Errorf("data source %s: the sequences of %s: %w", s.from, table, err)
			}
			for _, seq := range seqs {
				var exists bool
				if err := dst.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", seq).Scan(&exists); err != nil {
					return nil, fmt.Errorf("data source %s: %w", s.to, err)
				}
				if !exists {
					fmt.Fprintf(progress, "reshard: %s has no sequence %s, which %s of %s uses: not set\n", s.to, seq, table, s.from)
					continue
				}
				out = append(out, seqSync{s: s, seq: seq})
			}
		}
	}
	return out, nil
}

// syncSequences sets each destination sequence of seqs to no less than its source's.
// The streams must have stopped.
func syncSequences(ctx context.Context, seqs []seqSync, conns map[string]*pgx.Conn) error {
	for _, q := range seqs {
		src, dst, seq := conns[q.s.from], conns[q.s.to], q.seq
		var last int64
		var called bool
		if err := src.QueryRow(ctx, "SELECT last_value, is_called FROM "+seq).Scan(&last, &called); err != nil {
			return fmt.Errorf("data source %s: sequence %s: %w", q.s.from, seq, err)
		}
		if !called {
			continue // never used there
		}
		// The destination's own last value: one before its next when it was never
		// called.
		if _, err := dst.Exec(ctx, fmt.Sprintf(`SELECT setval('%[1]s', greatest($1::bigint,
			(SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - q.seqincrement END
				FROM %[2]s s, pg_sequence q WHERE q.seqrelid = '%[1]s'::regclass)), true)`, strings.ReplaceAll(seq, "'", "''"), seq), last); err != nil {
			return fmt.Errorf("data source %s: setting sequence %s: %w", q.s.to, seq, err)
		}
	}
	return nil
}

// madeStreams lists the copy's streams whose subscription exists.
func madeStreams(ctx context.Context, from, to *rules.Compiled, conns map[string]*pgx.Conn) ([]stream, error) {
	var out []stream
	for _, src := range from.DataSources() {
		for _, dst := range to.DataSources() {
			if src.Name == dst.Name {
				continue
			}
			name := streamName(src, dst)
			var exists bool
			if err := conns[dst.Name].QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_subscription WHERE subname = $1
				AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database()))`, name).Scan(&exists); err != nil {
				return nil, fmt.Errorf("data source %s: %w", dst.Name, err)
			}
			if exists {
				out = append(out, stream{from: src.Name, to: dst.Name, name: name})
			}
		}
	}
	return out, nil
}
