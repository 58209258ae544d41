// Package reshard moves a sharded deployment from one layout (a rules.Compiled) to
// another while it serves: plan, copy and catch up with PostgreSQL's logical
// replication, verify, cut over, then finish or revert (issue 23).
//
// This first step builds the plan: which rows move from where to where and how much
// data that is, measured by reading every sharded table's keys, and whether the
// servers can carry the move (wal_level, replication slots, WAL senders, logical
// replication workers). Making a plan changes nothing.
package reshard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
)

// ErrLayout is wrapped by every refusal of a target layout: a change that is not a
// reshard (a table lost, a key column or type changed), found before anything is read.
var ErrLayout = errors.New("reshard: the target layout is not a reshard of the current one")

// Place is one physical table: a data source (by name, as both layouts name it) and
// the table in it.
type Place struct {
	DataSource string
	Schema     string // empty: the one the data source's search_path finds
	Table      string
}

func (p Place) String() string {
	if p.Schema != "" {
		return p.DataSource + "." + p.Schema + "." + p.Table
	}
	return p.DataSource + "." + p.Table
}

// Move is the rows of one table that go from one place to another (or stay, when
// From equals To).
type Move struct {
	From, To Place
	Rows     int64
	Bytes    int64 // the rows' size as stored (pg_column_size of each row)
}

// Stays reports whether the rows stay where they are.
func (m Move) Stays() bool { return m.From == m.To }

// TablePlan is what happens to one sharded logical table.
type TablePlan struct {
	Name      string
	Keys      []string // its sharding columns
	KeyTypes  []rules.KeyType
	Algorithm rules.Algorithm // the target's (of its first key column)
	Moves     []Move          // by source, then destination; rows that stay included
	// Misplaced counts rows that are not where the current layout places them: rows a
	// change of the rules without a reshard left stranded. They are planned by the
	// target layout like the others.
	Misplaced int64
}

// Rows returns the table's rows and those that move.
func (t TablePlan) Rows() (all, moving int64) {
	for _, m := range t.Moves {
		all += m.Rows
		if !m.Stays() {
			moving += m.Rows
		}
	}
	return all, moving
}

// Bytes returns the table's size and the size of what moves.
func (t TablePlan) Bytes() (all, moving int64) {
	for _, m := range t.Moves {
		all += m.Bytes
		if !m.Stays() {
			moving += m.Bytes
		}
	}
	return all, moving
}

// BroadcastPlan is a broadcast table copied to the data sources the target adds.
type BroadcastPlan struct {
	Name    string
	From    Place    // the first data source that has it (Rows and Bytes are its)
	To      []string // data sources that get a copy
	Sources []Place  // where each of To copies it from (broadcastSource), in To's order
	Rows    int64
	Bytes   int64
}

// Stream is one replication stream the move needs: a publication on From's data
// source and a subscription on To's, carrying Tables.
type Stream struct {
	From, To string // data sources
	Tables   []string
	// PhysicalTables counts the tables the subscription copies (one per logical table
	// with one table per data source).
	PhysicalTables int
}

// Server is one PostgreSQL server the move touches, and what it has for it.
type Server struct {
	Addr        string   // host:port, as the first data source's DSN names it
	DataSources []string // of either layout, on this server
	WALLevel    string
	// Slots and senders the move's streams take on this server as a publisher (one
	// each per stream, and one each per table being copied at a time), and logical
	// replication workers it takes as a subscriber (an apply worker per stream and its
	// table-copying workers); beside what the server has free.
	SlotsNeeded, SlotsFree     int
	SendersNeeded, SendersFree int
	WorkersNeeded, WorkersFree int
	// Origins a subscriber keeps, one per subscription and per table being copied;
	// max_replication_slots bounds them too.
	OriginsNeeded, OriginsFree int
}

// Plan is a move from one layout to another, measured.
type Plan struct {
	Tables    []TablePlan
	Broadcast []BroadcastPlan
	Streams   []Stream
	Servers   []Server
	// Problems are why the move cannot start as things are; each says what to change.
	Problems []string
	Took     time.Duration // reading the keys and the servers' settings
}

// Runnable reports whether nothing stands in the move's way.
func (p *Plan) Runnable() bool { return len(p.Problems) == 0 }

// Options tune MakePlan.
type Options struct {
	// Progress receives a line per table read, and one every few seconds on long ones.
	Progress io.Writer
}

// MakePlan measures the move from layout from to layout to: it checks that to is a
// reshard of from, connects to every data source of both (failing, naming the one that
// does not answer), reads the keys of every sharded table where from places it, and
// reads the servers' replication settings. It writes nothing anywhere. Cancelling ctx
// stops it.
func MakePlan(ctx context.Context, from, to *rules.Compiled, opts Options) (*Plan, error) {
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	start := time.Now()
	if err := checkDataSources(from, to); err != nil {
		return nil, err
	}
	conns, err := connectAll(ctx, from, to)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range conns {
			c.Close(context.Background())
		}
	}()
	names, err := shardedTables(ctx, from, conns)
	if err != nil {
		return nil, err
	}
	others, err := defaultTables(ctx, from, conns)
	if err != nil {
		return nil, err
	}
	if err := checkTables(from, to, names, others); err != nil {
		return nil, err
	}
	types, err := checkKeyTypes(ctx, from, to, names, conns)
	if err != nil {
		return nil, err
	}
	p := &Plan{}
	for i, name := range names {
		tp, err := planTable(ctx, from, to, name, types[i], conns, opts.Progress)
		if err != nil {
			return nil, err
		}
		p.Tables = append(p.Tables, tp)
	}
	for _, name := range from.Rules().Broadcast {
		bp, err := planBroadcast(ctx, from, to, name, conns)
		if err != nil {
			return nil, err
		}
		if len(bp.To) > 0 {
			p.Broadcast = append(p.Broadcast, bp)
		}
	}
	p.Streams = streams(p, from, to)
	if err := checkServers(ctx, p, from, to, conns); err != nil {
		return nil, err
	}
	if err := checkSchemas(ctx, p, from, to, conns); err != nil {
		return nil, err
	}
	// What start cannot do yet is a problem of the plan too.
	if err := checkCopyable(p, from, to); err != nil {
		for _, line := range strings.Split(err.Error(), "\n  - ")[1:] {
			p.Problems = append(p.Problems, "start cannot do this yet: "+line)
		}
	}
	p.Took = time.Since(start)
	return p, nil
}

// checkSchemas notes as a problem each table a stream would carry into a schema its
// destination does not read: logical replication carries a table's rows into the
// table of the same schema and name on the subscriber, and a data source that is a
// schema of its database (a DSN with search_path) reads the table its search_path
// finds. A table the move makes on the destination is made in the source's schema
// (pg_dump names it): the destination must read that schema first.
func checkSchemas(ctx context.Context, p *Plan, from, to *rules.Compiled, conns map[string]*pgx.Conn) error {
	const schemaOf = "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)"
	for _, st := range p.Streams {
		for _, table := range st.Tables {
			src := streamSource(from, to, st, table)
			var have string
			if err := conns[src.DataSource].QueryRow(ctx, schemaOf, src.qualified()).Scan(&have); err != nil {
				return fmt.Errorf("%s: its schema: %w", src, err)
			}
			dst := place(to, to.Lookup(table).Nodes[nodeOf(to, table, st.To)])
			var reads *string
			err := conns[st.To].QueryRow(ctx, schemaOf, dst.qualified()).Scan(&reads)
			if errors.Is(err, pgx.ErrNoRows) {
				// No schema it reads has the table: the one the move makes in the source's
				// schema is found if its search_path names that schema.
				err = conns[st.To].QueryRow(ctx, "SELECT CASE WHEN $1 = ANY (current_schemas(false)) THEN $1 ELSE current_schema() END", have).Scan(&reads)
			}
			if err != nil {
				return fmt.Errorf("data source %s: the schema it reads %s in: %w", st.To, dst.Table, err)
			}
			if reads == nil || *reads != have {
				what := "no schema (its search_path names none that exists)"
				if reads != nil {
					what = "schema " + *reads
				}
				p.Problems = append(p.Problems, fmt.Sprintf("%s is in schema %s, and data source %s reads %s in %s: logical replication carries rows only into the table of the same schema and name; give %s a search_path that reads schema %s",
					src, have, st.To, dst.Table, what, st.To, have))
			}
		}
	}
	return nil
}

// checkDataSources refuses a data source name that the two layouts give two DSNs.
func checkDataSources(from, to *rules.Compiled) error {
	dsn := map[string]string{}
	for _, d := range from.DataSources() {
		dsn[d.Name] = d.DSN
	}
	for _, d := range to.DataSources() {
		if old, ok := dsn[d.Name]; ok && old != d.DSN {
			return fmt.Errorf("%w: data source %s is %q in the current layout and %q in the target: a data source keeps its name and its DSN, a new one needs a new name", ErrLayout, d.Name, old, d.DSN)
		}
	}
	return nil
}

// connectAll opens one connection to every data source of either layout, by name.
func connectAll(ctx context.Context, layouts ...*rules.Compiled) (map[string]*pgx.Conn, error) {
	conns := map[string]*pgx.Conn{}
	for _, l := range layouts {
		for _, d := range l.DataSources() {
			if conns[d.Name] != nil {
				continue
			}
			c, err := connectOne(ctx, d)
			if err != nil {
				closeAll(conns)
				return nil, err
			}
			conns[d.Name] = c
		}
	}
	return conns, nil
}

// connectOne opens a connection to one data source, for the move's own work.
func connectOne(ctx context.Context, d rules.DataSource) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(d.DSN)
	if err != nil {
		return nil, fmt.Errorf("data source %s: %w", d.Name, err)
	}
	// The move's own DDL passes the guard that refuses the users' on the tables it
	// moves (guardDDL).
	cfg.RuntimeParams[ddlSetting] = "on"
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "3D000":
		return nil, fmt.Errorf("data source %s: its database %q does not exist (create it: a data source the move adds starts as an empty database): %w", d.Name, cfg.Database, err)
	case err != nil:
		return nil, fmt.Errorf("data source %s does not answer, and a reshard needs every data source of both layouts: %w", d.Name, err)
	}
	return c, nil
}

func closeAll(conns map[string]*pgx.Conn) {
	for _, c := range conns {
		c.Close(context.Background())
	}
}

// shardedTables lists the current layout's sharded tables: each exact rule, and the
// tables a pattern rule (sbtest*) matches on its first data source.
func shardedTables(ctx context.Context, from *rules.Compiled, conns map[string]*pgx.Conn) ([]string, error) {
	var names []string
	for _, t := range from.Rules().Tables {
		prefix, ok := strings.CutSuffix(t.Name, "*")
		if !ok {
			if !slices.Contains(names, t.Name) {
				names = append(names, t.Name)
			}
			continue
		}
		ds := from.DataSources()[0].Name
		if len(t.DataSources) > 0 {
			ds = t.DataSources[0]
		}
		rows, err := conns[ds].Query(ctx, `SELECT c.relname FROM pg_class c
			WHERE c.relkind IN ('r', 'p') AND pg_table_is_visible(c.oid) AND starts_with(c.relname, $1)
			ORDER BY c.relname`, prefix)
		if err != nil {
			return nil, fmt.Errorf("data source %s: listing the tables of rule %s: %w", ds, t.Name, err)
		}
		matched, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("data source %s: listing the tables of rule %s: %w", ds, t.Name, err)
		}
		for _, m := range matched {
			if t.TablesPerDataSource > 1 {
				// The physical tables of a logical one are NAME_0, NAME_1 ...
				i := strings.LastIndexByte(m, '_')
				if i < 0 {
					continue
				}
				if _, err := strconv.Atoi(m[i+1:]); err != nil {
					continue
				}
				m = m[:i]
			}
			if r := from.Lookup(m); r.Kind == rules.KindSharded && !slices.Contains(names, m) {
				names = append(names, m)
			}
		}
	}
	return names, nil
}

// defaultTables lists the tables on the current layout's default data source.
func defaultTables(ctx context.Context, from *rules.Compiled, conns map[string]*pgx.Conn) ([]string, error) {
	ds := from.DataSources()[from.DefaultDataSource()].Name
	rows, err := conns[ds].Query(ctx, `SELECT c.relname FROM pg_class c
		WHERE c.relkind IN ('r', 'p') AND pg_table_is_visible(c.oid) AND NOT c.relispartition ORDER BY c.relname`)
	if err != nil {
		return nil, fmt.Errorf("data source %s: listing its tables: %w", ds, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("data source %s: listing its tables: %w", ds, err)
	}
	return names, nil
}

// checkTables refuses a target that is not a reshard of the current layout: a sharded
// or broadcast table that it loses or turns into another kind, or a sharded table
// whose key columns or declared types change.
func checkTables(from, to *rules.Compiled, sharded, others []string) error {
	var errs []string
	// Tables on the default data source that a pattern of the target would shard.
	for _, name := range others {
		if from.Lookup(name).Kind == rules.KindDefault && to.Lookup(name).Kind == rules.KindSharded && !slices.Contains(to.Rules().Broadcast, name) {
			if !slices.ContainsFunc(to.Rules().Tables, func(t rules.Table) bool { return t.Name == name }) {
				errs = append(errs, fmt.Sprintf("table %s would be sharded (by a pattern of the target) and is on the default data source now: sharding a table is not a reshard", name))
			}
		}
	}
	for _, name := range sharded {
		a, b := from.Lookup(name), to.Lookup(name)
		if b.Kind != rules.KindSharded {
			errs = append(errs, fmt.Sprintf("table %s is sharded now and would be %s: a reshard keeps every table's kind", name, kindName(b.Kind)))
			continue
		}
		if ka, kb := slices.Sorted(slices.Values(a.KeyColumns())), slices.Sorted(slices.Values(b.KeyColumns())); !slices.Equal(ka, kb) {
			errs = append(errs, fmt.Sprintf("table %s is sharded by %s now and would be by %s: a reshard keeps the sharding columns",
				name, strings.Join(a.KeyColumns(), ", "), strings.Join(b.KeyColumns(), ", ")))
			continue
		}
		// Key types are compared once the catalog has said what an undeclared one is
		// (checkKeyTypes).
	}
	for _, name := range from.Rules().Broadcast {
		if k := to.Lookup(name).Kind; k != rules.KindBroadcast {
			errs = append(errs, fmt.Sprintf("table %s is broadcast now and would be %s: a reshard keeps every table's kind", name, kindName(k)))
		}
	}
	for _, t := range to.Rules().Tables {
		if !strings.HasSuffix(t.Name, "*") && from.Lookup(t.Name).Kind != rules.KindSharded {
			errs = append(errs, fmt.Sprintf("table %s would be sharded and is %s now: sharding a table is not a reshard", t.Name, kindName(from.Lookup(t.Name).Kind)))
		}
	}
	for _, name := range to.Rules().Broadcast {
		if k := from.Lookup(name).Kind; k != rules.KindBroadcast && !slices.Contains(errsTables(errs), name) {
			errs = append(errs, fmt.Sprintf("table %s would be broadcast and is %s now: a reshard keeps every table's kind", name, kindName(k)))
		}
	}
	if dfrom, dto := from.DataSources()[from.DefaultDataSource()].Name, to.DataSources()[to.DefaultDataSource()].Name; dfrom != dto {
		errs = append(errs, fmt.Sprintf("the default data source is %s now and would be %s: a reshard moves sharded and broadcast tables, not the others", dfrom, dto))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w:\n  - %s", ErrLayout, strings.Join(errs, "\n  - "))
	}
	return nil
}

// errsTables returns the table each message names (its second word).
func errsTables(errs []string) []string {
	var out []string
	for _, e := range errs {
		if f := strings.Fields(e); len(f) > 1 {
			out = append(out, f[1])
		}
	}
	return out
}

func kindName(k rules.Kind) string {
	switch k {
	case rules.KindSharded:
		return "sharded"
	case rules.KindBroadcast:
		return "broadcast"
	}
	return "on the default data source (not in the rules)"
}

// place names a node of a layout.
func place(l *rules.Compiled, n rules.Node) Place {
	return Place{DataSource: l.DataSources()[n.DataSource].Name, Schema: n.Schema, Table: n.Table}
}

// qualified quotes a place's table for SQL.
func (p Place) qualified() string {
	if p.Schema != "" {
		return pgx.Identifier{p.Schema, p.Table}.Sanitize()
	}
	return pgx.Identifier{p.Table}.Sanitize()
}

// keyTypes returns the type of each key column: the rule's, or the catalog's on the
// data source of the table's first place.
func keyTypes(ctx context.Context, r *rules.TableRule, conn *pgx.Conn, at Place) ([]rules.KeyType, error) {
	var out []rules.KeyType
	for _, col := range r.KeyColumns() {
		if t := r.KeyType(col); t != rules.TypeUnknown {
			out = append(out, t)
			continue
		}
		var name string
		err := conn.QueryRow(ctx, `SELECT format_type(a.atttypid, NULL) FROM pg_attribute a
			WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND NOT a.attisdropped`, at.qualified(), col).Scan(&name)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("%s has no column %s (or no such table)", at, col)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: the type of %s: %w", at, col, err)
		}
		t, err := rules.ParseKeyType(name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", at, err)
		}
		out = append(out, t)
	}
	return out, nil
}

// checkKeyTypes returns the key columns' types of each table (the current rules', or
// the catalog's), and refuses a target whose rules declare another.
func checkKeyTypes(ctx context.Context, from, to *rules.Compiled, names []string, conns map[string]*pgx.Conn) ([][]rules.KeyType, error) {
	var out [][]rules.KeyType
	var errs []string
	for _, name := range names {
		a, b := from.Lookup(name), to.Lookup(name)
		first := place(from, a.Nodes[0])
		types, err := keyTypes(ctx, a, conns[first.DataSource], first)
		if err != nil {
			return nil, err
		}
		for i, col := range a.KeyColumns() {
			if tb := b.KeyType(col); tb != rules.TypeUnknown && tb != types[i] {
				errs = append(errs, fmt.Sprintf("table %s: key column %s is %s now and would be %s: a reshard keeps the key's type", name, col, types[i], tb))
			}
		}
		out = append(out, types)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w:\n  - %s", ErrLayout, strings.Join(errs, "\n  - "))
	}
	return out, nil
}

// planTable reads every key of one sharded table where the current layout keeps it
// and places it by both layouts.
func planTable(ctx context.Context, from, to *rules.Compiled, name string, types []rules.KeyType, conns map[string]*pgx.Conn, progress io.Writer) (TablePlan, error) {
	a, b := from.Lookup(name), to.Lookup(name)
	cols := a.KeyColumns()
	typeOf := map[string]rules.KeyType{}
	for i, c := range cols {
		typeOf[c] = types[i]
	}
	tp := TablePlan{Name: name, Keys: cols, KeyTypes: types, Algorithm: b.Algorithm(cols[0])}
	moves := map[[2]Place]*Move{}
	for i, n := range a.Nodes {
		src := place(from, n)
		var sel []string
		for _, c := range cols {
			sel = append(sel, pgx.Identifier{c}.Sanitize()+"::text")
		}
		only, err := onlyOf(ctx, conns[src.DataSource], src)
		if err != nil {
			return TablePlan{}, err
		}
		sql := fmt.Sprintf("SELECT %s, pg_column_size(t.*) FROM %s%s t", strings.Join(sel, ", "), only, src.qualified())
		rows, err := conns[src.DataSource].Query(ctx, sql, pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			return TablePlan{}, fmt.Errorf("%s: reading its keys: %w", src, err)
		}
		read, last := int64(0), time.Now()
		keys := make([]*string, len(cols))
		dest := make([]any, len(cols)+1)
		for j := range keys {
			dest[j] = &keys[j]
		}
		var size int64
		dest[len(cols)] = &size
		values := map[string]rules.Key{}
		for rows.Next() {
			if err := rows.Scan(dest...); err != nil {
				rows.Close()
				return TablePlan{}, fmt.Errorf("%s: %w", src, err)
			}
			for j, c := range cols {
				if keys[j] == nil {
					values[c] = rules.NullKey()
					continue
				}
				k, err := rules.ParseKey(types[j], *keys[j])
				if err != nil {
					rows.Close()
					return TablePlan{}, fmt.Errorf("%s: key %q: %w", src, *keys[j], err)
				}
				values[c] = k
			}
			now, err := placeOf(a, values, typeOf)
			if err != nil {
				rows.Close()
				return TablePlan{}, fmt.Errorf("%s: placing key %v by the current layout: %w", src, values, err)
			}
			if now != i {
				tp.Misplaced++
			}
			next, err := placeOf(b, values, typeOf)
			if err != nil {
				rows.Close()
				return TablePlan{}, fmt.Errorf("%s: placing key %v by the target layout: %w", src, values, err)
			}
			dst := place(to, b.Nodes[next])
			m := moves[[2]Place{src, dst}]
			if m == nil {
				m = &Move{From: src, To: dst}
				moves[[2]Place{src, dst}] = m
			}
			m.Rows++
			m.Bytes += size
			read++
			if time.Since(last) > 5*time.Second {
				fmt.Fprintf(progress, "reshard plan: %s: %d rows read\n", src, read)
				last = time.Now()
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return TablePlan{}, fmt.Errorf("%s: reading its keys: %w", src, err)
		}
		fmt.Fprintf(progress, "reshard plan: %s: %d rows\n", src, read)
	}
	for _, m := range moves {
		tp.Moves = append(tp.Moves, *m)
	}
	slices.SortFunc(tp.Moves, func(x, y Move) int {
		return cmp.Or(cmp.Compare(x.From.String(), y.From.String()), cmp.Compare(x.To.String(), y.To.String()))
	})
	return tp, nil
}

// onlyOf is "ONLY " for a plain table, whose inheritance children (if any) are other
// tables, and "" for a partitioned one, whose rows are all in its partitions.
func onlyOf(ctx context.Context, c *pgx.Conn, at Place) (string, error) {
	var kind string
	if err := c.QueryRow(ctx, "SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)", at.qualified()).Scan(&kind); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return "", fmt.Errorf("%s: no such table", at)
		}
		return "", fmt.Errorf("%s: %w", at, err)
	}
	if kind == "p" {
		return "", nil
	}
	return "ONLY ", nil
}

// placeOf is the index of the one node of r that holds a row with these keys.
func placeOf(r *rules.TableRule, values map[string]rules.Key, types map[string]rules.KeyType) (int, error) {
	shards, err := r.ShardsFor(values, types)
	if err != nil {
		return 0, err
	}
	if len(shards) != 1 {
		return 0, fmt.Errorf("the rules place it on %d shards", len(shards))
	}
	return shards[0], nil
}

// planBroadcast plans copying a broadcast table to the data sources the target adds.
func planBroadcast(ctx context.Context, from, to *rules.Compiled, name string, conns map[string]*pgx.Conn) (BroadcastPlan, error) {
	src := place(from, from.Lookup(name).Nodes[0])
	bp := BroadcastPlan{Name: name, From: src}
	have := map[string]bool{}
	for _, n := range from.Lookup(name).Nodes {
		have[place(from, n).DataSource] = true
	}
	for _, n := range to.Lookup(name).Nodes {
		if ds := place(to, n).DataSource; !have[ds] {
			bp.To = append(bp.To, ds)
			bp.Sources = append(bp.Sources, broadcastSource(from, to, name, ds))
		}
	}
	if len(bp.To) == 0 {
		return bp, nil
	}
	only, err := onlyOf(ctx, conns[src.DataSource], src)
	if err != nil {
		return bp, err
	}
	err = conns[src.DataSource].QueryRow(ctx, "SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0) FROM "+only+src.qualified()+" t").Scan(&bp.Rows, &bp.Bytes)
	if err != nil {
		return bp, fmt.Errorf("%s: %w", src, err)
	}
	return bp, nil
}

// streams groups the moves into one replication stream per pair of data sources, and
// notes as problems the moves logical replication cannot carry: inside one data source
// (a change of tables per data source), and into a table of another name (logical
// replication matches tables by schema and name).
//
// The streams follow from the layouts, not from the rows there are now: a pair of a
// source and a destination that no row joins today still carries the rows written
// during the move. A pair is left out only where the algorithm proves no key can join
// them (pghash and mod: a key on i of N can go to j of M only if i and j are equal
// modulo gcd(N, M)).
func streams(p *Plan, from, to *rules.Compiled) []Stream {
	tables := map[[2]string][]string{}
	physical := map[[2]string]map[string]bool{}
	add := func(from, to, table, phys string) {
		k := [2]string{from, to}
		if !slices.Contains(tables[k], table) {
			tables[k] = append(tables[k], table)
		}
		if physical[k] == nil {
			physical[k] = map[string]bool{}
		}
		physical[k][phys] = true
	}
	for _, t := range p.Tables {
		for _, m := range t.Moves {
			switch {
			case m.Stays() || m.Rows == 0:
			case m.From.DataSource == m.To.DataSource:
				p.Problems = append(p.Problems, fmt.Sprintf("%d rows of %s move inside data source %s, from %s to %s: moves inside one data source (a change of tables per data source) are not supported yet",
					m.Rows, t.Name, m.From.DataSource, m.From.Table, m.To.Table))
			case m.From.Table != m.To.Table || m.From.Schema != m.To.Schema:
				p.Problems = append(p.Problems, fmt.Sprintf("%d rows of %s move from %s to %s: logical replication carries rows only into a table of the same schema and name",
					m.Rows, t.Name, m.From, m.To))
			}
		}
		a, b := from.Lookup(t.Name), to.Lookup(t.Name)
		for i, n := range a.Nodes {
			for j, o := range b.Nodes {
				src, dst := place(from, n), place(to, o)
				if src.DataSource != dst.DataSource && mayMove(from, to, t.Name, i, j) {
					add(src.DataSource, dst.DataSource, t.Name, dst.Table)
				}
			}
		}
	}
	for _, b := range p.Broadcast {
		for _, ds := range b.To {
			src := broadcastSource(from, to, b.Name, ds)
			add(src.DataSource, ds, b.Name, src.Table)
		}
	}
	var out []Stream
	for k, ts := range tables {
		slices.Sort(ts)
		out = append(out, Stream{From: k[0], To: k[1], Tables: ts, PhysicalTables: len(physical[k])})
	}
	slices.SortFunc(out, func(a, b Stream) int { return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To)) })
	return out
}

// neededStreams lists the pairs of data sources (from, to) a move between the two
// layouts streams rows over, from the layouts alone (without reading any row).
func neededStreams(ctx context.Context, from, to *rules.Compiled, conns map[string]*pgx.Conn) ([][2]string, error) {
	names, err := shardedTables(ctx, from, conns)
	if err != nil {
		return nil, err
	}
	seen := map[[2]string]bool{}
	var out [][2]string
	add := func(a, b string) {
		if k := [2]string{a, b}; a != b && !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	for _, name := range names {
		a, b := from.Lookup(name), to.Lookup(name)
		for i, n := range a.Nodes {
			for j, o := range b.Nodes {
				if mayMove(from, to, name, i, j) {
					add(place(from, n).DataSource, place(to, o).DataSource)
				}
			}
		}
	}
	for _, name := range from.Rules().Broadcast {
		have := map[string]bool{}
		for _, n := range from.Lookup(name).Nodes {
			have[place(from, n).DataSource] = true
		}
		for _, n := range to.Lookup(name).Nodes {
			if ds := place(to, n).DataSource; !have[ds] {
				add(broadcastSource(from, to, name, ds).DataSource, ds)
			}
		}
	}
	return out, nil
}

// mayMove reports whether a key of table name on node i of layout from can belong on
// node j of layout to.
func mayMove(from, to *rules.Compiled, name string, i, j int) bool {
	a, b := from.Lookup(name), to.Lookup(name)
	cols := a.KeyColumns()
	if len(cols) != 1 || a.ShardCount() != len(distinctSources(nil, a)) || b.ShardCount() != len(distinctSources(nil, b)) {
		return true
	}
	switch alg := a.Algorithm(cols[0]); {
	case alg != b.Algorithm(cols[0]):
		return true
	case alg == rules.AlgorithmPGHash || alg == rules.AlgorithmMod || alg == "":
		g := gcd(a.ShardCount(), b.ShardCount())
		return i%g == j%g
	case alg == rules.AlgorithmRange:
		// The two nodes' key intervals overlap.
		ba, okA := rangeBounds(from, name)
		bb, okB := rangeBounds(to, name)
		if !okA || !okB {
			return true
		}
		// [lo, hi) of each; an open end is no bound.
		lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
		openTop := true
		if i > 0 {
			lo = max(lo, ba[i-1])
		}
		if j > 0 {
			lo = max(lo, bb[j-1])
		}
		if i < len(ba) {
			hi, openTop = min(hi, ba[i]), false
		}
		if j < len(bb) {
			hi, openTop = min(hi, bb[j]), false
		}
		return lo < hi || openTop
	}
	return true
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// serverAddr is a data source's server, host:port.
func serverAddr(dsn string) (string, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "", err
	}
	return cfg.Host + ":" + strconv.Itoa(int(cfg.Port)), nil
}
