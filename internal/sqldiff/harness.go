package sqldiff

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
)

// ICUOptions are the CREATE DATABASE options of the ICU layout's databases.
const ICUOptions = "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"

// Env is one layout made ready: the unsharded reference database with the suite's data,
// and the sharded layout's databases (empty: the caller loads them through its runner).
type Env struct {
	Layout Layout
	Rules  *rules.Compiled
	// Ref runs statements on the unsharded reference (a PgConnRunner by default; a test
	// may put another Runner over RefDSN in its place).
	Ref    Runner
	RefDSN string
	DSNs   []string // the sharded layout's data sources
	// Modes are the protocol forms reads run in (default: Modes).
	Modes []string
	// Coordinated: the sharded runner has a coordinator database answer what the
	// merge cannot, so a query the merge must refuse may be answered, and then
	// exactly (Outcome.Coordinated counts those).
	Coordinated bool
	// InSteps: the sharded runner evaluates an UPDATE's or DELETE's subqueries over
	// sharded tables first (the wire proxy, sqlplan.Pre), so the writes marked InSteps
	// are answered, and then exactly; other runners must refuse them.
	InSteps bool
}

// NewEnv creates the databases of a layout (dropped when the test ends) and loads the
// reference. options are CREATE DATABASE options for every database ("" for none).
func NewEnv(t *testing.T, layout Layout, options string) *Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	newDB := func(prefix string) string {
		if options == "" {
			return pgtest.NewDatabase(t, prefix)
		}
		return pgtest.NewDatabaseWithOptions(t, prefix, options)
	}
	env := &Env{Layout: layout}
	refDSN := newDB("diff_ref")
	if layout.Schemas {
		env.DSNs = schemaDSNs(t, newDB("diff_"+layout.Name), layout.DataSources)
	} else {
		for i := range layout.DataSources {
			env.DSNs = append(env.DSNs, newDB(fmt.Sprintf("diff_%s_%d", layout.Name, i)))
		}
	}
	c, err := rules.Compile(layout.Rules(env.DSNs))
	if err != nil {
		t.Fatal(err)
	}
	env.Rules = c
	conn, err := pgconn.Connect(ctx, refDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	env.Ref = PgConnRunner{Conn: conn}
	env.RefDSN = refDSN
	for _, stmt := range append(append([]string{}, Schema...), Data(1)...) {
		if _, err := env.Ref.Simple(ctx, stmt); err != nil {
			t.Fatalf("reference: %s: %v", stmt, err)
		}
	}
	return env
}

// Load creates the schema and loads the data through a sharded runner.
func (e *Env) Load(t *testing.T, sharded Runner) {
	t.Helper()
	ctx := context.Background()
	for _, stmt := range append(append([]string{}, Schema...), Data(1)...) {
		if _, err := sharded.Simple(ctx, stmt); err != nil {
			t.Fatalf("sharded: %s: %v", stmt, err)
		}
	}
}

// CheckPlacement reads every physical table straight from its data source and checks
// that each row of a sharded table sits on the shard the rules name for its key, and
// that every copy of a broadcast table holds the same rows.
func (e *Env) CheckPlacement(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	conns := make([]*pgx.Conn, len(e.DSNs))
	for i, d := range e.DSNs {
		c, err := pgx.Connect(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		conns[i] = c
	}
	total := 0
	for table := range Tables {
		rule := e.Rules.Lookup(table)
		switch rule.Kind {
		case rules.KindSharded:
			col := rule.KeyColumns()[0]
			types := map[string]rules.KeyType{col: rules.TypeInt8}
			if table == "t_user" {
				types[col] = rules.TypeInt4
			}
			for n, node := range rule.Nodes {
				rows, err := conns[node.DataSource].Query(ctx, fmt.Sprintf("SELECT %s::text FROM %s", col, nodeName(node)))
				if err != nil {
					t.Fatal(err)
				}
				keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range keys {
					got, err := rule.ShardsFor(map[string]rules.Key{col: rules.TextKey(k)}, types)
					if err != nil || len(got) != 1 || got[0] != n {
						t.Errorf("%s key %s is on shard %d (%s), the rules say %v (%v)", table, k, n, node.Table, got, err)
					}
				}
				total += len(keys)
			}
		case rules.KindBroadcast:
			var first string
			for _, node := range rule.Nodes {
				var s string
				q := fmt.Sprintf("SELECT coalesce(string_agg(t::text, '|' ORDER BY t::text COLLATE \"C\"), '') FROM %s t", nodeName(node))
				if err := conns[node.DataSource].QueryRow(ctx, q).Scan(&s); err != nil {
					t.Fatal(err)
				}
				if node.DataSource == 0 {
					first = s
				} else if s != first {
					t.Errorf("broadcast table %s differs on data source %d", table, node.DataSource)
				}
			}
		}
	}
	if total == 0 {
		t.Error("no sharded rows found: the placement check checked nothing")
	}
}

// Modes are the protocol forms every read runs in.
var Modes = []string{"simple", "text", "binary"}

// RunReads runs queries in every mode and returns how many were answered equal and how
// many refused.
func (e *Env) RunReads(t *testing.T, sharded Runner, queries []Query) Outcome {
	t.Helper()
	ctx := context.Background()
	var out Outcome
	for i, q := range queries {
		label := fmt.Sprintf("%s query %d", e.Layout.Name, i)
		if q.OtherDatabase && e.Layout.Schemas {
			q.Refused, q.MayRefuse = false, true
		}
		mustRefuse := q.Refused
		if e.Coordinated && q.Refused {
			q.Refused, q.MayRefuse = false, true
		}
		refused := false
		modes := e.Modes
		if modes == nil {
			modes = Modes
		}
		for _, mode := range modes {
			if q.Params == nil && mode == "binary" && i%2 == 1 {
				continue // half the literal-only queries skip binary, to save time
			}
			refused = Compare(ctx, t, label, q, e.Ref, sharded, mode, e.Layout.ByteOrder) || refused
		}
		out.Total++
		if refused {
			out.Refused++
		} else {
			out.Equal++
			if mustRefuse {
				out.Coordinated++
			}
		}
	}
	return out
}

// RunWrites runs the writes in order (alternating protocol forms) and then compares
// every table, and the placement of every row.
func (e *Env) RunWrites(t *testing.T, sharded Runner) Outcome {
	t.Helper()
	ctx := context.Background()
	var out Outcome
	for i, q := range Writes() {
		mode := Modes[i%2]
		if e.Modes != nil {
			mode = e.Modes[i%len(e.Modes)]
		}
		if q.Params != nil {
			mode = "text"
		}
		if q.InSteps && e.InSteps {
			q.Refused = false
		}
		if q.Refused {
			// The reference would carry the write out; only the sharded side runs it.
			_, err := sharded.Simple(ctx, Inline(q.SQL, q.Params))
			if code(err) != "0A000" {
				t.Errorf("%s write %d: must be refused with 0A000: %s (err %v)", e.Layout.Name, i, q.SQL, err)
			}
			out.Total++
			out.Refused++
			continue
		}
		refused := Compare(ctx, t, fmt.Sprintf("%s write %d", e.Layout.Name, i), q, e.Ref, sharded, mode, true)
		out.Total++
		if refused {
			out.Refused++
		} else {
			out.Equal++
		}
	}
	for table, pk := range Tables {
		q := Query{SQL: fmt.Sprintf("SELECT * FROM %s ORDER BY %s", table, pk), Ordered: true}
		Compare(ctx, t, e.Layout.Name+" after writes", q, e.Ref, sharded, "binary", true)
	}
	e.CheckPlacement(t)
	return out
}

// nodeName names a physical table in SQL, schema-qualified when it has a schema.
func nodeName(n rules.Node) string {
	if n.Schema != "" {
		return pgx.Identifier{n.Schema, n.Table}.Sanitize()
	}
	return pgx.Identifier{n.Table}.Sanitize()
}

// schemaDSNs creates schemas s0, s1 ... in the database at dsn and returns a DSN for
// each: dsn with search_path set to it.
func schemaDSNs(t *testing.T, dsn string, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i := range n {
		schema := fmt.Sprintf("s%d", i)
		if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		out = append(out, u.String())
	}
	return out
}
