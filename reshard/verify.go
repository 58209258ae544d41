package reshard

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/rules"
)

// VerifyOptions tune Verify.
type VerifyOptions struct {
	Options
	// ChunkRows is how many source rows one checksum covers (default 10,000).
	ChunkRows int
	// Settle is how long a chunk that differs is compared again, while writes that
	// the destination has not applied yet may explain the difference: 0 compares each
	// chunk once, below 0 takes 5 s (the command's default).
	Settle time.Duration
	// MaxRows bounds the rows each kind of difference lists (default 20); the counts
	// are exact.
	MaxRows int
	// Rate, when positive, bounds the rows compared to Rate a second on average over
	// the whole verify: each chunk is read at full speed, then Verify waits until its
	// source rows are due (the scans for the chunks' bounds and for the misplaced rows
	// are not bounded). Reading every moving row on both sides as fast as the servers
	// go takes CPU and I/O from the live load (0: no bound).
	Rate int
	// Pin, when positive, pins each table's comparison to one point of its source's
	// WAL while the load runs (before the cutover): writes to that table on that source
	// wait, at most Pin, until the destination has applied every one committed before
	// them and both sides have taken a snapshot; the chunks are then compared in those
	// snapshots, once each (Settle does not apply), and the writes go on meanwhile.
	// The wait is reported per table (RowDiff.Pinned). 0: not pinned.
	Pin time.Duration
	// PinEvery, with Pin, pins a table's comparison again, between two chunks, once its
	// snapshots have been open PinEvery: each range of chunks is compared at a point of
	// its own, and the snapshots a large table's comparison keeps open (which hold
	// back VACUUM on both sides while the load updates rows) last about PinEvery and a
	// chunk, at the price of a short wait of the table's writes per pin. Each chunk is
	// exact at its point, but the table is not compared at one point: rows written
	// after the first pin into ranges compared already are not compared, and a row
	// whose key moves to an earlier range between two pins is compared in neither.
	// 0: one pin per table.
	PinEvery time.Duration
	// MaxActive, when positive, holds the comparison back between chunks while more
	// than MaxActive other client sessions run a statement on the server of the
	// stream's source or destination (CopyOptions.MaxActive; 0: no such hold).
	MaxActive int
	// Resume continues the last verify of the move, cut short, from the chunk after
	// the last one it compared: the tables and chunks it compared are taken from its
	// record, as they were then. It must be pinned as that one was.
	Resume bool

	noRecord        bool // records nothing of what it compared (the cutover's hold)
	stopAfterChunks int  // a test's cut: the verify stops once it has recorded this many chunks
}

// RowDiff is one table's comparison over one stream.
type RowDiff struct {
	From, To string
	Table    string
	Rows     int64 // compared, on the source
	Chunks   int
	// Missing are keys the destination lacks, Extra keys it has that the source does
	// not (or that the target does not place there), Different keys whose row differs.
	Missing, Extra, Different             []string
	MissingN, ExtraN, DifferentN, Retried int64
	// Pinned is how long writes to the table on the source waited while the comparison
	// was pinned (VerifyOptions.Pin; 0: not pinned), at the longest of its Pins pins
	// (more than one with VerifyOptions.PinEvery).
	Pinned time.Duration
	Pins   int
}

// Clean reports whether nothing differs.
func (d RowDiff) Clean() bool { return d.MissingN+d.ExtraN+d.DifferentN == 0 }

// Diff is what Verify found.
type Diff struct {
	Tables []RowDiff
	Took   time.Duration
	// Pinned reports a comparison pinned to one point per table (VerifyOptions.Pin).
	Pinned bool
	// Held is how long the comparison waited for the servers' load in all
	// (VerifyOptions.MaxActive).
	Held time.Duration
	// Resumed is when the verify this one resumed started (VerifyOptions.Resume; zero:
	// none), and ResumedChunks how many of the chunks reported it had compared.
	Resumed       time.Time
	ResumedChunks int
}

// Clean reports whether every table of every stream matched.
func (d *Diff) Clean() bool {
	for _, t := range d.Tables {
		if !t.Clean() {
			return false
		}
	}
	return true
}

// Verify compares, for every stream of a move under way, the rows the source has that
// the target places on the destination with the rows the destination has: chunked by
// key on the source (ChunkRows rows each), a count and a checksum of every row's text
// per chunk on both sides, and only where they differ the rows themselves, by key.
// It also counts rows on a destination that the target does not place there. A chunk
// that differs is compared again for up to Settle, since the destination applies the
// source's writes a moment later; what still differs is reported. Unpinned, run it
// while the moving tables take no writes, before the cutover and after it; pinned
// (VerifyOptions.Pin), under load before the cutover. It reads only, apart from the
// helper table pghash's filters need on a destination, the marker a pin writes, and
// its own record of the chunks it compared (on the current layout's first data
// source), which lets a verify cut short be resumed (VerifyOptions.Resume).
func Verify(ctx context.Context, from, to *rules.Compiled, opts VerifyOptions) (d *Diff, err error) {
	start := time.Now()
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if opts.ChunkRows <= 0 {
		opts.ChunkRows = 10000
	}
	if opts.Settle < 0 {
		opts.Settle = 5 * time.Second
	}
	if opts.PinEvery < 0 || opts.PinEvery > 0 && opts.Pin <= 0 {
		return nil, fmt.Errorf("reshard: verify: PinEvery %v needs a positive Pin (%v), and is not negative", opts.PinEvery, opts.Pin)
	}
	if opts.MaxRows <= 0 {
		opts.MaxRows = 20
	}
	st, err := GetStatus(ctx, from, to)
	if err != nil {
		return nil, err
	}
	if len(st.Streams) == 0 {
		return nil, fmt.Errorf("reshard: no move is under way between these layouts: nothing to verify")
	}
	if opts.Pin > 0 && st.Layout != nil && (st.Layout.Digest != from.Digest() || st.Layout.Switching) {
		return nil, fmt.Errorf("reshard: verify pinned compares a move before its cutover, while the sources take the writes; layout version %d (phase %s) is in force: verify unpinned while the moved tables take no writes", st.Layout.Version, st.Layout.Phase)
	}
	if opts.Pin > 0 && !st.Ready() {
		var b strings.Builder
		st.WriteText(&b)
		return nil, fmt.Errorf("reshard: verify pinned needs every stream copied and streaming (a table still copying would show rows missing; a stopped stream never catches up):\n%s", b.String())
	}
	conns, err := connectAll(ctx, from, to)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	var locks map[string]*pgx.Conn // a second connection to each source, for the pins' locks
	if opts.Pin > 0 {
		if locks, err = connectAll(ctx, from); err != nil {
			return nil, err
		}
		defer closeAll(locks)
		// A pinned comparison keeps its snapshots open while it reads (and while --rate
		// waits): a server's idle-in-transaction timeout must not end them.
		for _, c := range slices.Concat(slices.Collect(maps.Values(conns)), slices.Collect(maps.Values(locks))) {
			if _, err := c.Exec(ctx, "SET idle_in_transaction_session_timeout = 0"); err != nil {
				return nil, err
			}
		}
	}
	names, err := shardedTables(ctx, from, conns)
	if err != nil {
		return nil, err
	}
	types, err := checkKeyTypes(ctx, from, to, names, conns)
	if err != nil {
		return nil, err
	}
	typeOf := map[string]rules.KeyType{}
	for i, n := range names {
		typeOf[n] = types[i][0]
	}
	var limit *rowLimiter
	if opts.Rate > 0 || opts.MaxActive > 0 {
		limit = newRowLimiter(opts.Rate)
	}
	if opts.MaxActive > 0 {
		g, err := newLoadGate(ctx, opts.MaxActive, from, to, opts.Progress, conns, locks)
		if err != nil {
			return nil, err
		}
		defer g.close()
		g.what = "verify"
		limit.gate = g
	}
	var run *verifyRun // nil: not recorded
	if !opts.noRecord {
		if run, err = openVerifyRun(ctx, from, st.Layout, opts.Pin > 0, opts.Resume); err != nil {
			return nil, err
		}
		defer run.close()
		run.stopAfter = opts.stopAfterChunks
	}
	defer func() {
		if err != nil && run.resumable() {
			err = fmt.Errorf("%w\nverify was cut short: verify --resume continues it from the chunk after the last one compared", err)
		}
	}()
	d = &Diff{Pinned: opts.Pin > 0}
	if opts.Resume && run != nil {
		d.Resumed = run.started
	}
	counted := map[string]bool{}    // destination tables whose misplaced rows were counted
	current := map[[3]string]bool{} // the streams' tables: source, destination, table
	for _, s := range st.Streams {
		for table := range s.Tables {
			current[[3]string{s.From, s.To, unqualified(table)}] = true
		}
	}
	for _, s := range st.Streams {
		for _, table := range slices.Sorted(mapKeys(s.Tables)) {
			name := unqualified(table)
			if limit != nil && limit.gate != nil {
				limit.gate.watchOnly(s.From, s.To)
			}
			v := verifier{ctx: ctx, src: conns[s.From], dst: conns[s.To], opts: opts, limit: limit, run: run}
			rd := RowDiff{From: s.From, To: s.To, Table: name}
			typ, sharded := typeOf[name]
			// What the destination holds that the target does not place there is
			// counted once per destination and table, whatever feeds it; the chunks
			// compare the rest.
			countMisplaced := sharded && !counted[s.To+"\x00"+name] && !run.misplacedCounted(s.To, name, current)
			if sharded {
				counted[s.To+"\x00"+name] = true
			}
			rec, resumed := run.table(s.From, s.To, name)
			if resumed {
				rd = rec.Diff
				d.ResumedChunks += rd.Chunks
				if rec.Done {
					fmt.Fprintf(opts.Progress, "reshard verify: %s -> %s %s: compared by the verify resumed\n", s.From, s.To, name)
					d.Tables = append(d.Tables, rd)
					continue
				}
			}
			if sharded {
				r := from.Lookup(name)
				v.key = pgx.Identifier{r.KeyColumns()[0]}.Sanitize()
				v.keyType = string(typ)
				if typ == rules.TypeText {
					// One order on both sides, whatever their collations: the chunks'
					// bounds come from the source and bound the destination's rows.
					v.order = ` COLLATE "C"`
				}
				v.at = place(from, r.Nodes[nodeOf(from, name, s.From)]).qualified()
				for _, c := range []*pgx.Conn{v.src, v.dst} {
					if err := ensureHashHelper(ctx, c, typ); err != nil {
						return nil, err
					}
				}
				if v.srcFilter, err = rowFilter(to, name, typ, nodeOf(to, name, s.To)); err != nil {
					return nil, err
				}
				if v.dstFilter, err = rowFilter(from, name, typ, nodeOf(from, name, s.From)); err != nil {
					return nil, err
				}
				v.dstFilter = "(" + v.dstFilter + ") AND (" + v.srcFilter + ")"
			} else {
				// A broadcast table, whole.
				key, err := primaryKey(ctx, v.src, table)
				if err != nil {
					return nil, fmt.Errorf("data source %s: %w", s.From, err)
				}
				v.key, v.at, v.srcFilter, v.dstFilter = key, table, "true", "true"
			}
			if opts.Pin > 0 {
				p := pin{lock: locks[s.From], src: v.src, dst: v.dst, stream: streamName(dataSource(from, s.From), dataSource(to, s.To)), table: v.at, bound: opts.Pin}
				take := func() error {
					waited, err := p.take(ctx)
					if err != nil {
						return err
					}
					rd.Pinned = max(rd.Pinned, waited) // a resumed table: its pins before the cut too
					rd.Pins++
					v.pinned = time.Now()
					return nil
				}
				if err := take(); err != nil {
					return nil, fmt.Errorf("%s -> %s, table %s: %w", s.From, s.To, name, err)
				}
				v.opts.Settle = 0 // both sides stand still in their snapshots
				if opts.PinEvery > 0 {
					v.pin = take
					v.unpin = func() error {
						for _, c := range []*pgx.Conn{v.src, v.dst} {
							if _, err := c.Exec(ctx, "COMMIT"); err != nil {
								return err
							}
						}
						return nil
					}
				}
			}
			if countMisplaced {
				if err := v.misplaced(&rd); err != nil {
					return nil, fmt.Errorf("data source %s: %w", s.To, err)
				}
				rec.Misplaced = true
				if err := run.note(ctx, &rd, rec); err != nil {
					return nil, err
				}
			}
			if err := v.compare(&rd, &rec); err != nil {
				return nil, fmt.Errorf("%s -> %s, table %s: %w", s.From, s.To, name, err)
			}
			if opts.Pin > 0 {
				for _, c := range []*pgx.Conn{v.src, v.dst} {
					if _, err := c.Exec(ctx, "COMMIT"); err != nil {
						return nil, err
					}
				}
			}
			fmt.Fprintf(opts.Progress, "reshard verify: %s -> %s %s: %d rows in %d chunks, %d missing, %d extra, %d different\n",
				s.From, s.To, name, rd.Rows, rd.Chunks, rd.MissingN, rd.ExtraN, rd.DifferentN)
			d.Tables = append(d.Tables, rd)
		}
	}
	if limit != nil && limit.gate != nil {
		d.Held = limit.gate.held
	}
	if err := run.finish(ctx); err != nil {
		return nil, err
	}
	d.Took = time.Since(start)
	return d, nil
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// unqualified drops a schema from a table name as regclass prints it.
func unqualified(table string) string {
	if i := strings.LastIndexByte(table, '.'); i >= 0 {
		return strings.Trim(table[i+1:], `"`)
	}
	return strings.Trim(table, `"`)
}

// primaryKey returns a table's primary key columns, quoted and separated by commas.
func primaryKey(ctx context.Context, c *pgx.Conn, table string) (string, error) {
	var cols []string
	rows, err := c.Query(ctx, `SELECT quote_ident(a.attname) FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
		WHERE i.indrelid = to_regclass($1) AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)`, table)
	if err != nil {
		return "", err
	}
	if cols, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return "", err
	}
	if len(cols) == 0 {
		return "", fmt.Errorf("table %s has no primary key to compare its rows by", table)
	}
	return strings.Join(cols, ", "), nil
}

// verifier compares one table's rows of one stream.
type verifier struct {
	ctx                  context.Context
	src, dst             *pgx.Conn
	at                   string // the table, quoted
	key                  string // its key columns, quoted
	keyType              string // the key's type, for chunks; "" compares the table as one chunk
	order                string // the collation clause of text keys, for their order and bounds
	srcFilter, dstFilter string // the stream's rows on each side
	opts                 VerifyOptions
	limit                *rowLimiter // nil: no bound
	run                  *verifyRun  // the record of the chunks compared
	// pinned is when the comparison was last pinned; with PinEvery, unpin ends the
	// snapshots and pin takes new ones.
	pinned     time.Time
	pin, unpin func() error
}

// misplaced notes the rows on the destination that the target does not place there.
func (v *verifier) misplaced(rd *RowDiff) error {
	var n int64
	if err := v.dst.QueryRow(v.ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE NOT (%s)", v.at, v.srcFilter)).Scan(&n); err != nil {
		return err
	}
	rd.ExtraN += n
	rows, err := v.dst.Query(v.ctx, fmt.Sprintf("SELECT (%s)::text FROM %s WHERE NOT (%s) ORDER BY %s LIMIT %d", v.key, v.at, v.srcFilter, v.key, max(0, v.opts.MaxRows-len(rd.Extra))))
	if err != nil {
		return err
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	rd.Extra = append(rd.Extra, keys...)
	return err
}

// compare walks the source's rows in chunks of ChunkRows keys: [the first, the
// ChunkRows+1-th), ... The first chunk is open below and the last above, so that rows
// with keys outside the source's (extra on the destination) fall in one. From a key
// (a resumed verify's next chunk: rec.Next, once rd counts a chunk), the first chunk
// starts at that key instead. Each chunk compared is recorded, with the key the next
// one starts at.
func (v *verifier) compare(rd *RowDiff, rec *verifiedTableRecord) error {
	from, resumed := rec.Next, rd.Chunks > 0
	literal := func(text string) string {
		return "'" + strings.ReplaceAll(text, "'", "''") + "'::" + v.keyType
	}
	var bounds []string
	if v.keyType != "" {
		after := "true"
		if resumed {
			after = fmt.Sprintf("%s%s >= %s", v.key, v.order, literal(from))
		}
		rows, err := v.src.Query(v.ctx, fmt.Sprintf(`SELECT k FROM (SELECT (%s)::text AS k, row_number() OVER (ORDER BY %s%s) AS n
			FROM %s WHERE (%s) AND %s) q WHERE n %% %d = 1 ORDER BY n`, v.key, v.key, v.order, v.at, v.srcFilter, after, v.opts.ChunkRows))
		if err != nil {
			return err
		}
		if bounds, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return err
		}
	}
	if len(bounds) == 0 {
		bounds = []string{""} // one chunk: the whole table, or no rows on the source
	}
	if resumed {
		bounds[0] = from
	}
	reported := time.Now()
	unpinned := false
	for i := range bounds {
		// The next chunks at a new point (PinEvery): the bounds, read in the first
		// snapshot, still split every key between the chunks. Pinned before the chunk,
		// so that its record counts the pin.
		if unpinned {
			if err := v.pin(); err != nil {
				return err
			}
			unpinned = false
		}
		var conds []string
		if i > 0 || resumed {
			conds = append(conds, fmt.Sprintf("%s%s >= %s", v.key, v.order, literal(bounds[i])))
		}
		if i+1 < len(bounds) {
			conds = append(conds, fmt.Sprintf("%s%s < %s", v.key, v.order, literal(bounds[i+1])))
		}
		cond := "true"
		if len(conds) > 0 {
			cond = strings.Join(conds, " AND ")
		}
		rows := rd.Rows
		if err := v.chunk(rd, cond); err != nil {
			return err
		}
		rd.Chunks++
		rec.Next, rec.Done = "", i+1 == len(bounds)
		if !rec.Done {
			rec.Next = bounds[i+1]
		}
		if err := v.run.note(v.ctx, rd, *rec); err != nil {
			return err
		}
		if err := v.run.chunkDone(); err != nil {
			return err
		}
		if time.Since(reported) >= 10*time.Second {
			reported = time.Now()
			fmt.Fprintf(v.opts.Progress, "reshard verify: %s -> %s %s: %d rows in %d chunks so far, %d missing, %d extra, %d different\n",
				rd.From, rd.To, rd.Table, rd.Rows, rd.Chunks, rd.MissingN, rd.ExtraN, rd.DifferentN)
		}
		// The snapshots end before the rate's wait, not after it.
		if v.unpin != nil && i+1 < len(bounds) && time.Since(v.pinned) >= v.opts.PinEvery {
			if err := v.unpin(); err != nil {
				return err
			}
			unpinned = true
		}
		if v.limit != nil {
			if err := v.limit.wait(v.ctx, rd.Rows-rows); err != nil {
				return err
			}
		}
	}
	return nil
}

// chunk compares one chunk, again while it differs and Settle has not passed.
func (v *verifier) chunk(rd *RowDiff, cond string) error {
	sum := func(c *pgx.Conn, filter string) (n int64, h string, err error) {
		// An order-free checksum: the sum (numeric, exact) of 60 bits of each row's md5.
		err = c.QueryRow(v.ctx, fmt.Sprintf(`SELECT count(*), coalesce(sum(('x' || substr(md5(t::text), 1, 15))::bit(60)::bigint), 0)::text
			FROM %s t WHERE (%s) AND (%s)`, v.at, filter, cond)).Scan(&n, &h)
		return n, h, err
	}
	deadline := time.Now().Add(v.opts.Settle)
	for tries := 0; ; tries++ {
		n, h, err := sum(v.src, v.srcFilter)
		if err != nil {
			return err
		}
		m, g, err := sum(v.dst, v.dstFilter)
		if err != nil {
			return err
		}
		if n == m && h == g {
			rd.Rows += n
			return nil
		}
		if time.Now().After(deadline) {
			rd.Rows += n
			break
		}
		if tries == 0 {
			rd.Retried++
		}
		select {
		case <-v.ctx.Done():
			return v.ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	// The rows themselves, by key.
	read := func(c *pgx.Conn, filter string) (map[string]string, error) {
		rows, err := c.Query(v.ctx, fmt.Sprintf("SELECT (%s)::text, md5(t::text) FROM %s t WHERE (%s) AND (%s)", v.key, v.at, filter, cond))
		if err != nil {
			return nil, err
		}
		out := map[string]string{}
		var k, h string
		_, err = pgx.ForEachRow(rows, []any{&k, &h}, func() error { out[k] = h; return nil })
		return out, err
	}
	a, err := read(v.src, v.srcFilter)
	if err != nil {
		return err
	}
	b, err := read(v.dst, v.dstFilter)
	if err != nil {
		return err
	}
	note := func(list *[]string, n *int64, k string) {
		*n++
		if len(*list) < v.opts.MaxRows {
			*list = append(*list, k)
		}
	}
	for _, k := range slices.Sorted(mapKeys(a)) {
		switch h, ok := b[k]; {
		case !ok:
			note(&rd.Missing, &rd.MissingN, k)
		case h != a[k]:
			note(&rd.Different, &rd.DifferentN, k)
		}
	}
	for _, k := range slices.Sorted(mapKeys(b)) {
		if _, ok := a[k]; !ok {
			note(&rd.Extra, &rd.ExtraN, k)
		}
	}
	return nil
}

// WriteText writes the diff for a person.
func (d *Diff) WriteText(w io.Writer) error {
	var b strings.Builder
	for _, t := range d.Tables {
		fmt.Fprintf(&b, "%s -> %s, %s: %d rows in %d chunks: ", t.From, t.To, t.Table, t.Rows, t.Chunks)
		if t.Clean() {
			b.WriteString("the same\n")
			continue
		}
		fmt.Fprintf(&b, "%d missing, %d extra, %d different\n", t.MissingN, t.ExtraN, t.DifferentN)
		for _, l := range []struct {
			what string
			keys []string
		}{{"missing", t.Missing}, {"extra", t.Extra}, {"different", t.Different}} {
			if len(l.keys) > 0 {
				fmt.Fprintf(&b, "  %s: %s\n", l.what, strings.Join(l.keys, ", "))
			}
		}
	}
	var retried int64
	for _, t := range d.Tables {
		retried += t.Retried
	}
	if retried > 0 {
		fmt.Fprintf(&b, "%d chunks differed at first and were compared again (not pinned: writes the destination had not applied yet may explain a difference)\n", retried)
	}
	if d.Clean() {
		b.WriteString("every stream's rows are on its destination, as on its source\n")
	} else {
		b.WriteString("the destinations differ from the sources\n")
	}
	if d.Pinned {
		var longest RowDiff
		pins, tables := 0, 0
		for _, t := range d.Tables {
			if t.Pinned > longest.Pinned {
				longest = t
			}
			if t.Pins > 0 {
				pins, tables = pins+t.Pins, tables+1
			}
		}
		if pins > tables {
			fmt.Fprintf(&b, "pinned: each range of chunks compared at one point of its source (%d pins over %d tables); writes to a table waited at most %s (%s on %s)\n",
				pins, tables, longest.Pinned.Round(time.Microsecond), longest.Table, longest.From)
		} else {
			fmt.Fprintf(&b, "pinned: each table compared at one point of its source; writes to it waited at most %s (%s on %s)\n",
				longest.Pinned.Round(time.Microsecond), longest.Table, longest.From)
		}
	}
	if !d.Resumed.IsZero() {
		fmt.Fprintf(&b, "resumed the verify started %s: %d of the chunks compared by it\n", d.Resumed.UTC().Format(time.DateTime+" UTC"), d.ResumedChunks)
	}
	if d.Held > 0 {
		fmt.Fprintf(&b, "held %s in all while other sessions ran more statements than --max-active allows\n", d.Held.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "compared in %s\n", d.Took.Round(time.Millisecond))
	_, err := io.WriteString(w, b.String())
	return err
}
