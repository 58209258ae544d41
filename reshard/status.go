package reshard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/rules"
)

// StreamStatus is where one replication stream of a move stands.
type StreamStatus struct {
	From, To string
	// Tables maps each table of the subscription to its state on the destination:
	// "init", "copying", "synced" (copied, catching up) or "ready" (streaming).
	Tables map[string]string
	// Rows holds each table's rows on the destination now: what was copied so far
	// (the destinations are data sources the move adds, which start empty).
	Rows map[string]int64
	// LagBytes is the WAL the destination has yet to confirm from its source's slot.
	LagBytes int64
	// Streaming reports whether the source has a WAL sender on the slot.
	Streaming bool
	// Slot reports whether the stream's slot exists on the source, and Enabled whether
	// its subscription is enabled on the destination.
	Slot, Enabled bool
	// Missing marks a stream the layouts need that is not there.
	Missing bool
	// Copying counts the rows a COPY into the destination's tables has written so far,
	// while Start copies the rows itself (CopyOptions.CopyRate) and the subscription
	// waits disabled; CopyRunning reports whether such a COPY runs.
	Copying     int64
	CopyRunning bool
}

// Ready reports whether every table was copied and is streaming, over a slot that
// exists, by a subscription that is enabled.
func (s StreamStatus) Ready() bool {
	if s.Missing || !s.Slot || !s.Enabled || !s.Streaming {
		return false
	}
	for _, st := range s.Tables {
		if st != "ready" {
			return false
		}
	}
	return len(s.Tables) > 0
}

// Status is where a move stands: its streams (none when no move is under way).
type Status struct {
	Streams []StreamStatus
	// Back are the streams back to the old data sources, which the cutover makes for a
	// revert (none before it).
	Back []StreamStatus
	// Layout is the layout record in force on the data sources (nil: none yet).
	Layout *Record
	// Verify is the record of the move's last verify (nil: none, or VerifyErr says
	// why it could not be read).
	Verify    *VerifyRecord
	VerifyErr string
	At        time.Time
}

// Ready reports whether a move is under way and every stream is streaming.
func (s *Status) Ready() bool {
	for _, st := range s.Streams {
		if !st.Ready() {
			return false
		}
	}
	return len(s.Streams) > 0
}

var subStates = map[string]string{"i": "init", "d": "copying", "f": "copied", "s": "synced", "r": "ready"}

// GetStatus reads where the move from layout from to layout to stands, from the
// servers' own catalogs: the subscriptions it made on the destinations, their tables'
// states, and the lag of their slots on the sources.
func GetStatus(ctx context.Context, from, to *rules.Compiled) (*Status, error) {
	conns, err := connectAll(ctx, from, to)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	if err := checkMove(ctx, from, to, conns); err != nil {
		return nil, err
	}
	st, err := statusOn(ctx, from, to, conns)
	if err != nil {
		return nil, err
	}
	// The last verify's record, for a person: what it cannot read is said, and fails
	// nothing (the record is verify's own, and status serves verify and the cutover).
	first := from.DataSources()[0].Name
	if st.Verify, err = readVerifyRecord(ctx, conns[first], st.Layout); err != nil {
		st.VerifyErr = fmt.Sprintf("data source %s: %v", first, err)
	}
	return st, nil
}

// statusOn is GetStatus over connections to every data source of both layouts.
func statusOn(ctx context.Context, from, to *rules.Compiled, conns map[string]*pgx.Conn) (*Status, error) {
	st := &Status{At: time.Now()}
	defer func() {
		if len(st.Streams) == 0 {
			return // no move under way
		}
		// The streams the layouts need that are not there.
		need, err := neededStreams(ctx, from, to, conns)
		if err != nil {
			return
		}
		for _, k := range need {
			if _, ok := st.Rows(k[0], k[1]); !ok {
				st.Streams = append(st.Streams, StreamStatus{From: k[0], To: k[1], Missing: true})
			}
		}
	}()
	for _, src := range from.DataSources() {
		for _, dst := range to.DataSources() {
			if src.Name == dst.Name {
				continue
			}
			ss, ok, err := streamStatus(ctx, conns[src.Name], conns[dst.Name], src.Name, dst.Name, streamName(src, dst))
			if err != nil {
				return nil, err
			}
			if ok {
				st.Streams = append(st.Streams, ss)
			}
		}
	}
	for _, r := range allReverse(from, to) {
		ss, ok, err := streamStatus(ctx, conns[r.from], conns[r.to], r.from, r.to, r.name)
		if err != nil {
			return nil, err
		}
		if ok {
			st.Back = append(st.Back, ss)
		}
	}
	rec, err := currentRecord(ctx, from, to, conns)
	if err != nil {
		return nil, err
	}
	st.Layout = rec
	return st, nil
}

func streamStatus(ctx context.Context, src, dst *pgx.Conn, from, to, name string) (StreamStatus, bool, error) {
	ss := StreamStatus{From: from, To: to, Tables: map[string]string{}, Rows: map[string]int64{}}
	rows, err := dst.Query(ctx, `SELECT c.oid::regclass::text, r.srsubstate FROM pg_subscription s
		JOIN pg_subscription_rel r ON r.srsubid = s.oid JOIN pg_class c ON c.oid = r.srrelid
		WHERE s.subname = $1 AND s.subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())`, name)
	if err != nil {
		return ss, false, fmt.Errorf("data source %s: %w", to, err)
	}
	var found bool
	for rows.Next() {
		var table, state string
		if err := rows.Scan(&table, &state); err != nil {
			rows.Close()
			return ss, false, err
		}
		found = true
		if table == markerTable {
			continue // the move's own (see catchUp)
		}
		if s, ok := subStates[state]; ok {
			state = s
		}
		ss.Tables[table] = state
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return ss, false, fmt.Errorf("data source %s: %w", to, err)
	}
	if !found {
		var n int
		if err := dst.QueryRow(ctx, "SELECT count(*) FROM pg_subscription WHERE subname = $1 AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())", name).Scan(&n); err != nil || n == 0 {
			return ss, false, err
		}
	}
	for table := range ss.Tables {
		var n int64
		if err := dst.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			return ss, false, fmt.Errorf("data source %s: %w", to, err)
		}
		ss.Rows[table] = n
	}
	if err := dst.QueryRow(ctx, "SELECT subenabled FROM pg_subscription WHERE subname = $1 AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())", name).Scan(&ss.Enabled); err != nil {
		return ss, false, fmt.Errorf("data source %s: %w", to, err)
	}
	if !ss.Enabled {
		tables := slices.Collect(maps.Keys(ss.Tables))
		if err := dst.QueryRow(ctx, `SELECT coalesce(sum(tuples_processed), 0)::bigint, count(*) > 0 FROM pg_stat_progress_copy
			WHERE datname = current_database() AND command = 'COPY FROM' AND relid::regclass::text = ANY($1)`, tables).Scan(&ss.Copying, &ss.CopyRunning); err != nil {
			return ss, false, fmt.Errorf("data source %s: %w", to, err)
		}
	}
	err = src.QueryRow(ctx, `SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint, active
		FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`, name).Scan(&ss.LagBytes, &ss.Streaming)
	switch {
	case err == nil:
		ss.Slot = true
	case errors.Is(err, pgx.ErrNoRows):
	default:
		return ss, false, fmt.Errorf("data source %s: %w", from, err)
	}
	return ss, true, nil
}

// Rows returns the rows on the destination of the stream from -> to (every table), and
// whether the status has that stream.
func (s *Status) Rows(from, to string) (int64, bool) {
	for _, st := range s.Streams {
		if st.From == from && st.To == to {
			var n int64
			for _, r := range st.Rows {
				n += r
			}
			return n, true
		}
	}
	return 0, false
}

// WriteText writes the status for a person; with an earlier status prev, also each
// stream's copy rate since then.
func (s *Status) WriteText(b *strings.Builder, prev ...*Status) {
	if r := s.Layout; r != nil {
		fmt.Fprintf(b, "layout in force: version %d (%s), phase %s", r.Version, r.Digest, r.Phase)
		switch {
		case r.Switching:
			b.WriteString(", switching: a cutover or revert stopped part way (run it again to complete it)")
		case r.Phase == phaseCutover:
			b.WriteString(": cut over; the rows that moved are on the old data sources too, behind views, and the streams back keep them current (reshard finish ends the move, reshard revert returns to the old layout)")
		case r.Phase == phaseFinishing:
			b.WriteString(": a finish began (reshard finish again ends it; it can no longer be reverted)")
		case r.Phase == phaseReverting:
			b.WriteString(": reverted, and what the move made is not all removed yet (run reshard revert again)")
		}
		b.WriteString("\n")
	}
	if s.Layout != nil && s.Layout.Phase == phaseCutover {
		for _, st := range s.Back {
			fmt.Fprintf(b, "%s -> %s (back): lag %d bytes, %s\n", st.From, st.To, st.LagBytes, map[bool]string{true: "streaming", false: "not streaming"}[st.Streaming && st.Enabled])
		}
	}
	if len(s.Streams) == 0 {
		b.WriteString("no move is under way between these layouts\n")
		return
	}
	// A stream disabled: a bounded start (--copy-rate) makes the streams one after
	// another, each disabled until its rows are copied.
	bounded := slices.ContainsFunc(s.Streams, func(st StreamStatus) bool { return !st.Missing && !st.Enabled })
	for _, st := range s.Streams {
		switch {
		case st.Missing && bounded:
			fmt.Fprintf(b, "%s -> %s: not made yet (reshard start --copy-rate makes each stream when its copy comes; if no start runs any more, reshard cancel, then start again)\n", st.From, st.To)
			continue
		case st.Missing:
			fmt.Fprintf(b, "%s -> %s: missing: the move needs this stream and it is not there (reshard cancel, then start again)\n", st.From, st.To)
			continue
		case !st.Slot:
			fmt.Fprintf(b, "%s -> %s: its slot is missing on %s: the stream is broken (reshard cancel, then start again)\n", st.From, st.To, st.From)
		case !st.Enabled && st.CopyRunning:
			fmt.Fprintf(b, "%s -> %s: copying (reshard start --copy-rate copies the rows itself, and enables the subscription on %s after): %d rows into the table being copied now\n", st.From, st.To, st.To, st.Copying)
		case !st.Enabled:
			fmt.Fprintf(b, "%s -> %s: its subscription is disabled on %s (while reshard start --copy-rate copies a stream's rows, it enables the subscription after; if no start runs any more, reshard cancel, then start again)\n", st.From, st.To, st.To)
		default:
			rate := ""
			if len(prev) > 0 && prev[0] != nil {
				now, _ := s.Rows(st.From, st.To)
				if before, ok := prev[0].Rows(st.From, st.To); ok {
					if d := s.At.Sub(prev[0].At).Seconds(); d > 0 {
						rate = fmt.Sprintf(", %.0f rows/s", float64(now-before)/d)
					}
				}
			}
			fmt.Fprintf(b, "%s -> %s: lag %d bytes, %s%s\n", st.From, st.To, st.LagBytes, map[bool]string{true: "streaming", false: "not streaming"}[st.Streaming], rate)
		}
		for _, t := range slices.Sorted(maps.Keys(st.Tables)) {
			fmt.Fprintf(b, "  %s: %s, %s rows on %s\n", t, st.Tables[t], strconv.FormatInt(st.Rows[t], 10), st.To)
		}
	}
	if s.Verify != nil {
		s.Verify.writeText(b)
	}
	if s.VerifyErr != "" {
		fmt.Fprintf(b, "verify: its record could not be read: %s\n", s.VerifyErr)
	}
	if s.Ready() {
		b.WriteString("every table is copied and streaming: the move is ready for the cutover (reshard cutover)\n")
	}
}
