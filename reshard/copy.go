package reshard

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/postgresdb"
	"github.com/shardlab/shardlab/rules"
)

// ErrUnderWay is wrapped when Start finds a move between the two layouts started
// already (its publications exist).
var ErrUnderWay = errors.New("reshard: a move is under way")

// ErrNotYet is wrapped when a move needs a part of resharding that is not built yet.
var ErrNotYet = errors.New("reshard: not supported yet")

// prefix names everything a move creates on the servers: publications, slots,
// subscriptions, the schema of the hash helpers.
const prefix = "shardlab_reshard"

// createdComment marks a table the move created on a destination, so that Cancel drops
// it and no other.
const createdComment = "created by shardlab reshard; dropped by reshard cancel"

// streamName names a stream's publication, slot and subscription. Slot and
// subscription names are the server's, not the database's: a digest of the two data
// sources' DSNs keeps two deployments on one server apart.
//
// PostgreSQL cuts names at 63 bytes (and refuses a slot name that long in CREATE
// SUBSCRIPTION): the data source names are shortened to fit, the digest, over both
// names and DSNs, keeps the whole name apart.
func streamName(from, to rules.DataSource) string {
	return nameStream("", from, to)
}

// reverseName names the stream back from a data source a move adds to one it came
// from, which a cutover makes for a revert.
func reverseName(from, to rules.DataSource) string {
	return nameStream("r", from, to)
}

func nameStream(kind string, from, to rules.DataSource) string {
	key := from.Name + "\x00" + from.DSN + "\x00" + to.Name + "\x00" + to.DSN
	p := prefix + "_"
	if kind != "" {
		key += "\x00" + kind
		p += kind + "_"
	}
	sum := sha256.Sum256([]byte(key))
	names := from.Name + "_" + to.Name
	room := 63 - len(p) - 1 - 8
	if len(names) > room {
		names = names[:room]
	}
	return p + names + "_" + hex.EncodeToString(sum[:4])
}

// dataSource returns layout l's data source named name.
func dataSource(l *rules.Compiled, name string) rules.DataSource {
	for _, d := range l.DataSources() {
		if d.Name == name {
			return d
		}
	}
	return rules.DataSource{Name: name}
}

// CopyOptions tune Start.
type CopyOptions struct {
	Options
	// ReplicaIdentityFull lets Start give a published table without a replica identity
	// that covers its key (no primary key, as pgbench_history) REPLICA IDENTITY FULL,
	// so that its UPDATEs and DELETEs go on during the move; Cancel (or a failed Start)
	// restores what it had. Without it, Start refuses such a table. FULL logs whole old
	// rows for updates and deletes of that table while the move runs.
	ReplicaIdentityFull bool
	// PGDump and PSQL are the programs that copy a table's definition to a destination
	// that lacks it (default "pg_dump" and "psql" on PATH).
	PGDump, PSQL string
	// CopyRate bounds the copy to that many rows a second, for the whole move, so
	// that it cannot starve the load the current layout serves. PostgreSQL's table
	// synchronization has no such setting, so with a bound Start copies the rows itself
	// (see copyStream) and returns once they are all copied and the streams run; 0
	// leaves the copy to the subscriptions, at the servers' full speed.
	CopyRate int
	// MaxActive, when positive, holds the copy back while more than MaxActive other
	// client sessions run a statement on the server of the stream's source or
	// destination (see loadGate): the copy goes as fast as the live load leaves room
	// for, under CopyRate if that is set too. Start then copies the rows itself, as
	// with CopyRate.
	MaxActive int
}

// Start begins the move from layout from to layout to: for every replication stream of
// the plan, a publication on its source whose row filter keeps the rows the target
// places on the destination, a logical replication slot, and a subscription on the
// destination that copies those rows and then keeps them current while writes go on
// where the current layout sends them. Tables missing on a destination are created
// there from the source's definition (pg_dump --schema-only). The current layout keeps
// serving every read and write.
//
// This step supports moves into data sources the current layout does not use (growing,
// such as 2 to 4), for tables sharded by one column with pghash, mod or range and one
// table per data source. Anything else is refused with ErrNotYet before anything is
// made. On an error part way, what was made is removed (Cancel).
func Start(ctx context.Context, from, to *rules.Compiled, opts CopyOptions) (*Plan, error) {
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	p, err := MakePlan(ctx, from, to, opts.Options)
	if err != nil {
		return nil, err
	}
	if err := checkCopyable(p, from, to); err != nil {
		return p, err
	}
	conns, err := connectAll(ctx, from, to)
	if err != nil {
		return p, err
	}
	defer closeAll(conns)
	if err := checkMove(ctx, from, to, conns); err != nil {
		return p, err
	}
	switch cur, err := currentRecord(ctx, from, to, conns); {
	case err != nil:
		return p, err
	case cur != nil && (cur.Phase == phaseCutover || cur.Phase == phaseFinishing):
		return p, fmt.Errorf("%w: the move to layout version %d (%s) was cut over and not finished: finish it first", ErrUnderWay, cur.Version, cur.Digest)
	case cur != nil && cur.Phase == phaseReverting:
		return p, fmt.Errorf("%w: a revert to layout version %d stopped part way: run reshard revert again to complete it", ErrUnderWay, cur.Version)
	case cur != nil && cur.Digest != from.Digest():
		return p, fmt.Errorf("%w: layout version %d (%s) is in force, not the current rules given (%s)", ErrStaleLayout, cur.Version, cur.Digest, from.Digest())
	}
	for _, st := range p.Streams {
		var n int
		name := streamName(dataSource(from, st.From), dataSource(to, st.To))
		if err := conns[st.From].QueryRow(ctx, "SELECT count(*) FROM pg_publication WHERE pubname = $1", name).Scan(&n); err != nil {
			return p, fmt.Errorf("data source %s: %w", st.From, err)
		}
		if n > 0 {
			return p, fmt.Errorf("%w: data source %s has publication %s (reshard status shows it; reshard cancel ends it)", ErrUnderWay, st.From, name)
		}
	}
	// After the move under way is looked for: its own workers count as busy in the
	// plan's problems.
	if !p.Runnable() {
		return p, fmt.Errorf("reshard: the move cannot start:\n  - %s", strings.Join(p.Problems, "\n  - "))
	}
	if len(p.Streams) == 0 {
		return p, errors.New("reshard: nothing moves: the two layouts place every row alike, on the same data sources")
	}
	needFull, err := checkReplicaIdentities(ctx, p, from, to, conns, opts.ReplicaIdentityFull)
	if err != nil {
		return p, err
	}
	if opts.MaxActive > 0 {
		if err := canSeeSessions(ctx, conns); err != nil {
			return p, err
		}
	}
	made := &made{}
	err = recordMove(ctx, from, to, conns)
	if err == nil {
		err = setIdentities(ctx, conns, needFull, made, opts.Progress)
	}
	if err == nil {
		err = start(ctx, p, from, to, conns, opts, made)
	}
	if err != nil {
		// Fresh connections: a cancelled context closes the ones a statement was on.
		// The others go first: a transaction one of them left open on a source would
		// keep a table-sync worker's slot creation waiting there, and the DROP
		// SUBSCRIPTION below waiting for that worker.
		closeAll(conns)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		fresh, cerr := connectAll(cctx, from, to)
		if cerr == nil {
			defer closeAll(fresh)
			cerr = made.undo(cctx, fresh, opts.Progress)
		}
		if cerr != nil {
			return p, fmt.Errorf("%w (and removing what the start made failed too: %v; reshard cancel removes it)", err, cerr)
		}
		return p, err
	}
	return p, nil
}

// made records what a start created, so that a start that fails part way removes
// that and nothing else (never rows or tables that were there before it).
type made struct {
	streams    []madeStream
	tables     []madeTable
	identities []Place     // tables given REPLICA IDENTITY FULL
	fed        []madeTable // tables that were there, empty, and that streams feed
}

type madeStream struct{ from, to, name string }

type madeTable struct {
	ds string
	at Place
}

// undo removes what the start made: its streams (subscriptions, slots, publications),
// then the tables it created, with the rows copied into them.
func (m *made) undo(ctx context.Context, conns map[string]*pgx.Conn, progress io.Writer) error {
	var errs []error
	for _, s := range slices.Backward(m.streams) {
		errs = append(errs, dropStream(ctx, conns[s.from], conns[s.to], s.from, s.to, s.name, progress))
	}
	for _, t := range m.tables {
		if _, err := conns[t.ds].Exec(ctx, "DROP TABLE IF EXISTS "+t.at.qualified()); err != nil {
			errs = append(errs, fmt.Errorf("data source %s: %w", t.ds, err))
		}
	}
	for _, t := range m.fed {
		if _, err := conns[t.ds].Exec(ctx, "DELETE FROM "+t.at.qualified()); err != nil {
			errs = append(errs, fmt.Errorf("data source %s: %w", t.ds, err))
		}
	}
	for _, at := range m.identities {
		errs = append(errs, restoreIdentities(ctx, conns[at.DataSource], at.DataSource, progress))
	}
	// The helper schemas it made (hash helpers, marks, recorded identities).
	if errors.Join(errs...) == nil {
		for name, c := range conns {
			if _, err := c.Exec(ctx, "DROP SCHEMA IF EXISTS "+prefix+" CASCADE"); err != nil {
				errs = append(errs, fmt.Errorf("data source %s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// checkCopyable refuses what this step of resharding cannot move yet.
func checkCopyable(p *Plan, from, to *rules.Compiled) error {
	var errs []string
	current := map[string]bool{}
	for _, d := range from.DataSources() {
		current[d.Name] = true
	}
	for _, st := range p.Streams {
		if current[st.To] {
			errs = append(errs, fmt.Sprintf("rows would move into %s, which the current layout reads: its readers would see them twice while they are copied: move into new databases (on the same servers if need be)", st.To))
		}
	}
	for _, t := range p.Tables {
		if t.Misplaced > 0 {
			errs = append(errs, fmt.Sprintf("table %s has %d rows that are not where the current layout places them (reshard plan counts them): move or delete them first", t.Name, t.Misplaced))
		}
		for _, l := range []*rules.Compiled{from, to} {
			r := l.Lookup(t.Name)
			if len(r.KeyColumns()) != 1 || r.ShardCount() != len(distinctSources(l, r)) {
				errs = append(errs, fmt.Sprintf("table %s: a layout with several tables per data source or separate database and table strategies", t.Name))
				break
			}
			switch a := r.Algorithm(r.KeyColumns()[0]); a {
			case rules.AlgorithmPGHash, rules.AlgorithmMod, rules.AlgorithmRange, "":
			default:
				errs = append(errs, fmt.Sprintf("table %s: algorithm %s cannot be written as a publication's row filter (pghash, mod and range can)", t.Name, a))
			}
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		errs = slices.Compact(errs)
		return fmt.Errorf("%w:\n  - %s", ErrNotYet, strings.Join(errs, "\n  - "))
	}
	return nil
}

func distinctSources(l *rules.Compiled, r *rules.TableRule) []int {
	var ds []int
	for _, n := range r.Nodes {
		if !slices.Contains(ds, n.DataSource) {
			ds = append(ds, n.DataSource)
		}
	}
	return ds
}

// checkReplicaIdentities refuses a move whose publications would break the writes the
// current layout goes on taking: PostgreSQL refuses an UPDATE or DELETE on a published
// table without a replica identity, and on one whose row filter reads a column the
// replica identity does not cover.
//
// With full, it returns the tables that lack a replica identity (or one covering their
// key) instead of refusing them, for setIdentities.
func checkReplicaIdentities(ctx context.Context, p *Plan, from, to *rules.Compiled, conns map[string]*pgx.Conn, full bool) ([]Place, error) {
	var errs []string
	var needFull []Place
	check := func(at Place, key string) error {
		if only, err := onlyOf(ctx, conns[at.DataSource], at); err != nil {
			return err
		} else if only == "" {
			errs = append(errs, fmt.Sprintf("%s is a partitioned table: moving one is not supported yet", at))
			return nil
		}
		has, covered, err := replicaIdentity(ctx, conns[at.DataSource], at, key)
		if err != nil {
			return err
		}
		if !covered && full {
			if !slices.Contains(needFull, at) {
				needFull = append(needFull, at)
			}
			return nil
		}
		if !covered {
			what := "has no replica identity (no primary key)"
			if has {
				what = "has a replica identity that does not cover its key column " + key
			}
			errs = append(errs, fmt.Sprintf("%s %s: published, its UPDATEs and DELETEs would fail while rows move; give it a primary key (with %s), or start with --replica-identity-full", at, what, cmp.Or(key, "its columns")))
		}
		return nil
	}
	for _, t := range p.Tables {
		for _, n := range from.Lookup(t.Name).Nodes {
			if err := check(place(from, n), t.Keys[0]); err != nil {
				return nil, err
			}
		}
	}
	for _, b := range p.Broadcast {
		seen := map[Place]bool{}
		for _, ds := range b.To {
			if at := broadcastSource(from, to, b.Name, ds); !seen[at] {
				seen[at] = true
				if err := check(at, ""); err != nil {
					return nil, err
				}
			}
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("reshard: the move cannot start:\n  - %s", strings.Join(errs, "\n  - "))
	}
	return needFull, nil
}

// replicaIdentity reports whether table at has a replica identity, and whether it
// covers column key ("": any identity).
func replicaIdentity(ctx context.Context, c *pgx.Conn, at Place, key string) (has, covered bool, err error) {
	err = c.QueryRow(ctx, `WITH ident AS (
			SELECT a.attname FROM pg_class c JOIN pg_index i ON i.indrelid = c.oid
			JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY (i.indkey)
			WHERE c.oid = to_regclass($1) AND (i.indisprimary AND c.relreplident = 'd' OR i.indisreplident AND c.relreplident = 'i'))
		SELECT c.relreplident = 'f' OR EXISTS (SELECT FROM ident),
			c.relreplident = 'f' OR EXISTS (SELECT FROM ident WHERE $2 = '' OR attname = $2)
		FROM pg_class c WHERE c.oid = to_regclass($1)`, at.qualified(), key).Scan(&has, &covered)
	if err != nil {
		return false, false, fmt.Errorf("%s: its replica identity: %w", at, err)
	}
	return has, covered, nil
}

// resolvedName is the schema-qualified name of the table that $1 (a name as a Place
// quotes it) names on a connection, through its search_path. The move's own tables of
// records (identities changed, tables fed) name tables so: two data sources that are
// schemas of one database share those records, and each has a table of the same
// unqualified name.
const resolvedName = "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)"

// setIdentities gives each table REPLICA IDENTITY FULL, first recording the identity
// it had in the helper schema of its data source, where restoreIdentities finds it.
func setIdentities(ctx context.Context, conns map[string]*pgx.Conn, tables []Place, m *made, progress io.Writer) error {
	for _, at := range tables {
		c := conns[at.DataSource]
		_, err := c.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %[1]s;
			CREATE TABLE IF NOT EXISTS %[1]s.identities (tbl text PRIMARY KEY, ident "char" NOT NULL)`, prefix))
		if err == nil {
			_, err = c.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.identities SELECT (%s), relreplident FROM pg_class
				WHERE oid = to_regclass($1) ON CONFLICT DO NOTHING`, prefix, resolvedName), at.qualified())
		}
		if err != nil {
			return fmt.Errorf("data source %s: %w", at.DataSource, err)
		}
		if !slices.Contains(m.identities, at) {
			m.identities = append(m.identities, at)
		}
		fmt.Fprintf(progress, "reshard: %s: REPLICA IDENTITY FULL while rows move\n", at)
		if _, err := c.Exec(ctx, "ALTER TABLE "+at.qualified()+" REPLICA IDENTITY FULL"); err != nil {
			return fmt.Errorf("data source %s: %w", at.DataSource, err)
		}
	}
	return nil
}

// restoreIdentities gives the tables setIdentities changed on a data source the
// replica identity they had (the default, their primary key, or nothing).
func restoreIdentities(ctx context.Context, c *pgx.Conn, ds string, progress io.Writer) error {
	var exists bool
	if err := c.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", prefix+".identities").Scan(&exists); err != nil || !exists {
		return err
	}
	rows, err := c.Query(ctx, "SELECT tbl, ident::text FROM "+prefix+".identities WHERE to_regclass(tbl) IS NOT NULL")
	if err != nil {
		return fmt.Errorf("data source %s: %w", ds, err)
	}
	type ident struct{ Table, Kind string }
	idents, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ident])
	if err != nil {
		return fmt.Errorf("data source %s: %w", ds, err)
	}
	for _, id := range idents {
		what := map[string]string{"d": "DEFAULT", "n": "NOTHING", "f": "FULL"}[id.Kind]
		if what == "" {
			return fmt.Errorf("data source %s: table %s had replica identity %q, which reshard does not restore", ds, id.Table, id.Kind)
		}
		fmt.Fprintf(progress, "reshard: %s: %s back to REPLICA IDENTITY %s\n", ds, id.Table, what)
		if _, err := c.Exec(ctx, "ALTER TABLE "+id.Table+" REPLICA IDENTITY "+what); err != nil {
			return fmt.Errorf("data source %s: %w", ds, err)
		}
		if _, err := c.Exec(ctx, "DELETE FROM "+prefix+".identities WHERE tbl = $1", id.Table); err != nil {
			return fmt.Errorf("data source %s: %w", ds, err)
		}
	}
	return nil
}

// rowFilter is the condition that keeps a table's rows that layout to places on node i.
func rowFilter(l *rules.Compiled, name string, typ rules.KeyType, i int) (string, error) {
	r := l.Lookup(name)
	col := r.KeyColumns()[0]
	key := pgx.Identifier{col}.Sanitize()
	n := r.ShardCount()
	switch a := r.Algorithm(col); a {
	case rules.AlgorithmPGHash, "":
		return fmt.Sprintf("satisfies_hash_partition('%s.hash_%s'::regclass, %d, %d, %s)", prefix, typ, n, i, key), nil
	case rules.AlgorithmMod:
		return fmt.Sprintf("((%s %% %d) + %d) %% %d = %d", key, n, n, n, i), nil
	case rules.AlgorithmRange:
		var conds []string
		if b, ok := rangeBounds(l, name); ok {
			if i > 0 {
				conds = append(conds, fmt.Sprintf("%s >= %d", key, b[i-1]))
			}
			if i < len(b) {
				conds = append(conds, fmt.Sprintf("%s < %d", key, b[i]))
			}
			if len(conds) == 0 {
				return "true", nil
			}
			return strings.Join(conds, " AND "), nil
		}
		return "", fmt.Errorf("table %s: no range rule", name)
	default:
		return "", fmt.Errorf("%w: table %s: algorithm %s", ErrNotYet, name, a)
	}
}

// rangeBounds returns the range bounds of table name under layout l: those of the rule
// Lookup takes (the exact one, else the longest pattern that matches).
func rangeBounds(l *rules.Compiled, name string) ([]int64, bool) {
	tables := slices.Clone(l.Rules().Tables)
	slices.SortStableFunc(tables, func(a, b rules.Table) int {
		return cmp.Or(-cmp.Compare(boolInt(a.Name == name), boolInt(b.Name == name)), -cmp.Compare(len(a.Name), len(b.Name)))
	})
	for _, s := range tables {
		if s.Name != name && !(strings.HasSuffix(s.Name, "*") && strings.HasPrefix(name, strings.TrimSuffix(s.Name, "*"))) {
			continue
		}
		if s.DatabaseStrategy != nil {
			return s.DatabaseStrategy.Bounds, true
		}
		return s.Strategy.Bounds, true
	}
	return nil, false
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// nodeOf is the index of the node of a table that layout l has on data source ds.
func nodeOf(l *rules.Compiled, name, ds string) int {
	for i, n := range l.Lookup(name).Nodes {
		if l.DataSources()[n.DataSource].Name == ds {
			return i
		}
	}
	return -1
}

// streamSource is where stream st copies table from: a sharded table's place on the
// stream's source, a broadcast table's (broadcastSource).
func streamSource(from, to *rules.Compiled, st Stream, table string) Place {
	if from.Lookup(table).Kind == rules.KindBroadcast {
		return broadcastSource(from, to, table, st.To)
	}
	return place(from, from.Lookup(table).Nodes[nodeOf(from, table, st.From)])
}

func start(ctx context.Context, p *Plan, from, to *rules.Compiled, conns map[string]*pgx.Conn, opts CopyOptions, m *made) error {
	types := map[string]rules.KeyType{}
	for _, t := range p.Tables {
		types[t.Name] = t.KeyTypes[0]
	}
	sourceOf := func(st Stream, table string) Place { return streamSource(from, to, st, table) }
	// Every destination's tables first, each once, before any subscription copies
	// into one (a destination may be fed by several sources).
	ready := map[string]bool{}
	for _, st := range p.Streams {
		for _, table := range st.Tables {
			if ready[st.To+"\x00"+table] {
				continue
			}
			ready[st.To+"\x00"+table] = true
			at := sourceOf(st, table)
			created, err := ensureTable(ctx, conns[st.To], st.To, fromDSN(to, st.To), at, fromDSN(from, at.DataSource), opts)
			if created {
				m.tables = append(m.tables, madeTable{ds: st.To, at: at})
			}
			if err != nil {
				return err
			}
			if !created {
				// A table that was there, empty: marked, so that a cancel (even one
				// run again after a crash) knows the rows in it are the move's.
				m.fed = append(m.fed, madeTable{ds: st.To, at: at})
				_, err := conns[st.To].Exec(ctx, fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %[1]s;
					CREATE TABLE IF NOT EXISTS %[1]s.fed (tbl text PRIMARY KEY)`, prefix))
				if err == nil {
					_, err = conns[st.To].Exec(ctx, "INSERT INTO "+prefix+".fed VALUES (("+resolvedName+")) ON CONFLICT DO NOTHING", at.qualified())
				}
				if err != nil {
					return fmt.Errorf("data source %s: %w", st.To, err)
				}
			}
		}
	}
	// DDL on the tables is refused from here on, before any row is copied (a bounded
	// copy may take hours).
	if err := guardDDL(ctx, p, from, to, conns); err != nil {
		return err
	}
	// The marker table on every data source of a stream: a cutover writes a row in it
	// on each source once the transactions in flight ended, and a destination that has
	// the row has applied every change committed before it (see catchUp).
	for _, st := range p.Streams {
		for _, ds := range []string{st.From, st.To} {
			if err := ensureMarker(ctx, conns[ds]); err != nil {
				return fmt.Errorf("data source %s: %w", ds, err)
			}
		}
	}
	limit := newRowLimiter(opts.CopyRate)
	if opts.MaxActive > 0 {
		g, err := newLoadGate(ctx, opts.MaxActive, from, to, opts.Progress, conns)
		if err != nil {
			return err
		}
		defer g.close()
		limit.gate = g
	}
	for _, st := range p.Streams {
		src, dst := conns[st.From], conns[st.To]
		name := streamName(dataSource(from, st.From), dataSource(to, st.To))
		members := []string{markerMember(name)}
		var copies []tableCopy
		for _, table := range st.Tables {
			at := sourceOf(st, table)
			member := at.qualified()
			c := tableCopy{at: at, filter: "true"}
			if typ, sharded := types[table]; sharded {
				if err := ensureHashHelper(ctx, src, typ); err != nil {
					return fmt.Errorf("data source %s: %w", st.From, err)
				}
				f, err := rowFilter(to, table, typ, nodeOf(to, table, st.To))
				if err != nil {
					return err
				}
				member += " WHERE (" + f + ")"
				c.filter = f
			}
			members = append(members, member)
			copies = append(copies, c)
		}
		m.streams = append(m.streams, madeStream{from: st.From, to: st.To, name: name})
		fmt.Fprintf(opts.Progress, "reshard: %s -> %s: publication and slot %s\n", st.From, st.To, name)
		// Row filters do not apply to TRUNCATE: a TRUNCATE on one source would empty a
		// destination's rows from all of them. Not published; the copy carries rows.
		if _, err := src.Exec(ctx, "CREATE PUBLICATION "+name+" FOR TABLE "+strings.Join(members, ", ")+" WITH (publish = 'insert, update, delete')"); err != nil {
			return fmt.Errorf("data source %s: creating publication %s: %w", st.From, name, err)
		}
		if opts.CopyRate > 0 || opts.MaxActive > 0 {
			if limit.gate != nil {
				limit.gate.watchOnly(st.From, st.To)
			}
			if err := copyStream(ctx, from, st, name, src, dst, copies, limit, opts.Progress); err != nil {
				return err
			}
			crashPoint("start-stream")
			continue
		}
		// The slot first, then a subscription that uses it: a subscription that made
		// its own slot on a server it shares with its publisher would wait for itself.
		if _, err := src.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", name); err != nil {
			return fmt.Errorf("data source %s: creating slot %s: %w", st.From, name, err)
		}
		conninfo, err := subscriptionConninfo(from, st.From)
		if err != nil {
			return err
		}
		if _, err := dst.Exec(ctx, fmt.Sprintf("CREATE SUBSCRIPTION %s CONNECTION %s PUBLICATION %s WITH (create_slot = false, slot_name = '%s', copy_data = true)",
			name, conninfo, name, name)); err != nil {
			return fmt.Errorf("data source %s: creating subscription %s: %w", st.To, name, err)
		}
		crashPoint("start-stream")
	}
	return nil
}

// ddlSetting is set on the move's own connections: the DDL guard lets them through.
const ddlSetting = "shardlab.reshard"

// guardDDL makes, on every data source of both layouts, an event trigger that refuses
// DDL on a table the move carries (ALTER TABLE, CREATE INDEX on it, DROP TABLE ...):
// logical replication does not carry DDL, so a change made on one side only would
// break the stream or the rows. The move's schema holds the trigger's function:
// cancel and finish drop both with it.
func guardDDL(ctx context.Context, p *Plan, from, to *rules.Compiled, conns map[string]*pgx.Conn) error {
	for _, ds := range allDataSources(from, to) {
		var tables []string
		for _, l := range []*rules.Compiled{from, to} {
			for _, t := range p.Tables {
				for _, n := range l.Lookup(t.Name).Nodes {
					if at := place(l, n); at.DataSource == ds && !slices.Contains(tables, at.qualified()) {
						tables = append(tables, at.qualified())
					}
				}
			}
			for _, b := range p.Broadcast {
				for _, n := range l.Lookup(b.Name).Nodes {
					if at := place(l, n); at.DataSource == ds && !slices.Contains(tables, at.qualified()) {
						tables = append(tables, at.qualified())
					}
				}
			}
		}
		quoted := make([]string, len(tables))
		for i, t := range tables {
			quoted[i] = "'" + strings.ReplaceAll(t, "'", "''") + "'"
		}
		_, err := conns[ds].Exec(ctx, fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %[1]s;
			CREATE TABLE IF NOT EXISTS %[1]s.moving (rel oid PRIMARY KEY);
			INSERT INTO %[1]s.moving SELECT to_regclass(t)::oid FROM unnest(ARRAY[%[2]s]::text[]) t WHERE to_regclass(t) IS NOT NULL ON CONFLICT DO NOTHING;
			CREATE OR REPLACE FUNCTION %[1]s.refuse_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $guard$
			DECLARE
				rel oid;
			BEGIN
				IF current_setting('%[3]s', true) = 'on' THEN
					RETURN;
				END IF;
				IF TG_EVENT = 'sql_drop' THEN
					SELECT objid INTO rel FROM pg_event_trigger_dropped_objects() d
						WHERE d.classid = 'pg_class'::regclass AND d.objid IN (SELECT m.rel FROM %[1]s.moving m) LIMIT 1;
				ELSE
					SELECT c.objid INTO rel FROM pg_event_trigger_ddl_commands() c
						WHERE c.classid = 'pg_class'::regclass AND (c.objid IN (SELECT m.rel FROM %[1]s.moving m)
							OR c.objid IN (SELECT i.indexrelid FROM pg_index i WHERE i.indrelid IN (SELECT m.rel FROM %[1]s.moving m))) LIMIT 1;
				END IF;
				IF rel IS NOT NULL THEN
					RAISE EXCEPTION 'shardlab: %% on a table a resharding move carries is refused until the move is finished or cancelled (logical replication does not carry DDL)', TG_TAG
						USING ERRCODE = '55006';
				END IF;
			END
			$guard$;
			DROP EVENT TRIGGER IF EXISTS shardlab_reshard_ddl;
			DROP EVENT TRIGGER IF EXISTS shardlab_reshard_drop;
			CREATE EVENT TRIGGER shardlab_reshard_ddl ON ddl_command_end EXECUTE FUNCTION %[1]s.refuse_ddl();
			CREATE EVENT TRIGGER shardlab_reshard_drop ON sql_drop EXECUTE FUNCTION %[1]s.refuse_ddl()`,
			prefix, strings.Join(quoted, ", "), ddlSetting))
		if err != nil {
			return fmt.Errorf("data source %s: the DDL guard: %w", ds, err)
		}
	}
	return nil
}

// markerTable is the table a cutover marks each stream's end in (see catchUp).
const markerTable = prefix + ".marker"

// markerMember is the marker table as stream name publishes it: its own rows only (the
// cutover's, and verify's pins). A database's marker table holds the rows of every
// stream from it, and of every stream into it; carrying the others' too, a stream
// would apply them where another stream applies them as well (two streams from one
// database into another), or carry them back to where they were written (two
// databases that stream into each other).
func markerMember(name string) string {
	return fmt.Sprintf("%s WHERE (stream = '%s' OR stream = '%s')", markerTable, strings.ReplaceAll(name, "'", "''"), strings.ReplaceAll(name+pinMarker, "'", "''"))
}

// ensureMarker makes the marker table on a data source.
func ensureMarker(ctx context.Context, c *pgx.Conn) error {
	_, err := c.Exec(ctx, fmt.Sprintf("CREATE SCHEMA IF NOT EXISTS %s; CREATE TABLE IF NOT EXISTS %s (stream text PRIMARY KEY, token bigint NOT NULL)", prefix, markerTable))
	return err
}

// subscriptionConninfo is data source ds's DSN as a subscription's CONNECTION takes
// it: for libpq, quoted.
func subscriptionConninfo(l *rules.Compiled, ds string) (string, error) {
	info, err := postgresdb.LibpqDSN(fromDSN(l, ds))
	if err != nil {
		return "", fmt.Errorf("data source %s: %w", ds, err)
	}
	return "'" + strings.ReplaceAll(info, "'", "''") + "'", nil
}

func fromDSN(l *rules.Compiled, ds string) string {
	for _, d := range l.DataSources() {
		if d.Name == ds {
			return d.DSN
		}
	}
	return ""
}

// ensureHashHelper creates on a source the hash-partitioned table of the key's type
// that pghash's row filters name (satisfies_hash_partition needs one).
func ensureHashHelper(ctx context.Context, c *pgx.Conn, typ rules.KeyType) error {
	_, err := c.Exec(ctx, fmt.Sprintf("CREATE SCHEMA IF NOT EXISTS %s; CREATE TABLE IF NOT EXISTS %s.hash_%s (k %s) PARTITION BY HASH (k)", prefix, prefix, typ, typ))
	return err
}

// ensureTable makes sure the destination has the table, empty: it copies the
// definition from the source with pg_dump when it is missing (and marks it as the
// move's), and refuses one that has rows already.
func ensureTable(ctx context.Context, dst *pgx.Conn, dstName, dstDSN string, at Place, srcDSN string, opts CopyOptions) (created bool, err error) {
	var exists bool
	if err := dst.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", at.qualified()).Scan(&exists); err != nil {
		return false, fmt.Errorf("data source %s: %w", dstName, err)
	}
	if exists {
		var any bool
		if err := dst.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+at.qualified()+")").Scan(&any); err != nil {
			return false, fmt.Errorf("data source %s: %w", dstName, err)
		}
		if any {
			return false, fmt.Errorf("data source %s: table %s has rows already; a data source the move adds must start without them", dstName, at.Table)
		}
		return false, nil
	}
	dump := opts.PGDump
	if dump == "" {
		dump = "pg_dump"
	}
	// pg_dump's --table takes a pattern: each part quoted, so that it names one table.
	pattern := pgx.Identifier{at.Table}.Sanitize()
	if at.Schema != "" {
		pattern = pgx.Identifier{at.Schema, at.Table}.Sanitize()
	}
	srcInfo, err := postgresdb.LibpqDSN(srcDSN)
	if err != nil {
		return false, fmt.Errorf("data source %s: %w", at.DataSource, err)
	}
	dstInfo, err := postgresdb.LibpqDSN(dstDSN)
	if err != nil {
		return false, fmt.Errorf("data source %s: %w", dstName, err)
	}
	cmd := exec.CommandContext(ctx, dump, "--schema-only", "--no-owner", "--no-privileges", "--no-publications", "--no-subscriptions",
		"--table", pattern, "--dbname", srcInfo)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return false, fmt.Errorf("pg_dump of %s: %v: %s", at, err, ee.Stderr)
		}
		return false, fmt.Errorf("pg_dump of %s: %w", at, err)
	}
	fmt.Fprintf(opts.Progress, "reshard: %s: creating table %s from %s's definition\n", dstName, at.Table, at.DataSource)
	// pg_dump writes a psql script (recent versions open it with \restrict): psql runs it.
	// In one transaction with the comment that marks it as the move's: a table is
	// there, marked, or not at all.
	load := exec.CommandContext(ctx, cmp.Or(opts.PSQL, "psql"), "-X", "-q", "-1", "-v", "ON_ERROR_STOP=1", "--dbname", dstInfo)
	script := append(out, fmt.Sprintf("\nRESET search_path;\nCOMMENT ON TABLE %s IS '%s';\n", at.qualified(), createdComment)...)
	load.Stdin = bytes.NewReader(script)
	if msg, err := load.CombinedOutput(); err != nil {
		return false, fmt.Errorf("data source %s: creating %s from pg_dump's definition: %v: %s", dstName, at.Table, err, msg)
	}
	return true, nil
}
