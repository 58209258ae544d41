package proxy_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/proxy"
)

// feedCase is a sequence of statements run alike on one database and through the
// proxy, from the same state; sorted compares answers whose order one database leaves
// open (a SELECT without ORDER BY).
type feedCase struct {
	name   string
	stmts  []string
	args   [][]any
	sorted bool
}

// TestInsertSelectIntoSharded: INSERT ... SELECT into a sharded table (a query of any
// shape, its rows routed one by one) answers as one database does, in the simple and
// extended protocols, with RETURNING, ON CONFLICT, keys drawn from a sequence, a WITH
// clause, a query over the table it fills, and a query only the coordinator answers; a
// failure in any batch leaves no row; every row is on the shard its key names. On the
// old code each was refused with 0A000.
func TestInsertSelectIntoSharded(t *testing.T) {
	ref := pgtest.NewDatabase(t, "feed_ref")
	var dsns []string
	for i := range 2 {
		dsns = append(dsns, pgtest.NewDatabase(t, fmt.Sprintf("feed_s%d", i)))
	}
	e := startProxyOn(t, shardedRules(dsns, []string{"src=id", "dst=id", "kd=id"}, nil), withCoordinator())
	ctx := context.Background()
	one, err := pgx.Connect(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close(ctx)
	px := e.connect(t)
	simple := e.connect(t)
	setup := []string{
		`CREATE TABLE src (id int PRIMARY KEY, name text, grp int)`,
		`CREATE TABLE dst (id bigint PRIMARY KEY, name text, n numeric)`,
		`CREATE TABLE kd (id bigserial PRIMARY KEY, name text)`,
		`CREATE TABLE plain (code int, label text)`,
		`INSERT INTO plain VALUES (1, 'one'), (2, 'two'), (3, 'three')`,
		// The first INSERT ... SELECT of all: generate_series into a sharded table.
		`INSERT INTO src SELECT g, 'name' || g, g % 7 FROM generate_series(1, 1200) g`,
	}
	for _, q := range setup {
		exec1(t, one, q)
		exec1(t, simple, q)
	}

	rows := func(c *pgx.Conn, mode pgx.QueryExecMode, q string, sorted bool, args ...any) string {
		return answerOf(c, mode, q, sorted, args...)
	}
	cases := []feedCase{
		{name: "two batches", stmts: []string{`INSERT INTO dst (id, name, n) SELECT id, name, grp * 1.5 FROM src WHERE id <= 700`}},
		{name: "no column list, RETURNING in order", stmts: []string{`INSERT INTO dst SELECT id + 5000, upper(name) FROM src WHERE grp = 3 ORDER BY id DESC RETURNING id, name, n`}},
		{name: "keys drawn", stmts: []string{`INSERT INTO kd (name) SELECT name FROM src WHERE grp = 1 ORDER BY id RETURNING id, name`,
			`INSERT INTO kd SELECT id + 100000, name FROM src WHERE grp = 2`}},
		{name: "over the table it fills", stmts: []string{`INSERT INTO dst (id, name) SELECT id, name FROM src WHERE id <= 600`,
			`INSERT INTO dst (id, name, n) SELECT id + 10000, name || '+', n FROM dst`}},
		{name: "coordinated query", sorted: true, stmts: []string{`INSERT INTO dst (id, name) SELECT s.id, t.name FROM src s JOIN src t ON t.grp = s.grp AND t.id = s.id + 7 RETURNING *`}},
		{name: "parameters", sorted: true, stmts: []string{`INSERT INTO dst (id, name, n) SELECT id, $1, $2 FROM src WHERE grp = $3 RETURNING id, name, n, $1`},
			args: [][]any{{"x", 2.5, 4}}},
		{name: "on conflict do nothing", stmts: []string{`INSERT INTO dst (id, name) VALUES (5, 'kept'), (900, 'kept')`,
			`INSERT INTO dst (id, name) SELECT id, name FROM src WHERE id <= 1000 ON CONFLICT (id) DO NOTHING`}},
		{name: "on conflict do update", sorted: true, stmts: []string{`INSERT INTO dst (id, name) VALUES (5, 'old')`,
			`INSERT INTO dst (id, name) SELECT id, name FROM src WHERE id <= 20 ON CONFLICT (id) DO UPDATE SET name = excluded.name || '!' RETURNING *`}},
		{name: "a failing batch writes nothing", stmts: []string{`INSERT INTO dst (id, name) SELECT id % 600, name FROM src`}},
		{name: "with", stmts: []string{`WITH x AS (SELECT id, name FROM src WHERE grp = 2) INSERT INTO dst (id, name) SELECT id, name FROM x ORDER BY id RETURNING id`}},
		{name: "no rows", stmts: []string{`INSERT INTO dst SELECT id, name FROM src WHERE false RETURNING *`, `INSERT INTO dst SELECT id, name FROM src WHERE false`}},
		{name: "a default table joined", sorted: true, stmts: []string{`INSERT INTO dst (id, name) SELECT s.id, p.label FROM src s JOIN plain p ON p.code = s.grp`}},
		{name: "spilled to disk", stmts: []string{`INSERT INTO dst (id, name) SELECT id, repeat(name, 2000) FROM src`,
			`SELECT count(*), sum(length(name)) FROM dst`}},
		{name: "untyped literals and NULL", stmts: []string{`INSERT INTO dst (id, name, n) SELECT id, 'lit', '1.5' FROM src WHERE id < 5`,
			`INSERT INTO dst SELECT id + 100, NULL, NULL FROM src WHERE id < 5 RETURNING *`,
			`INSERT INTO dst (n, name, id) SELECT '2.5', 'key from text', '4242'`,
			`INSERT INTO dst (id, n) SELECT id + 200, 'x' FROM src WHERE id < 3`}},
		{name: "a literal sorted on is text, as alone", stmts: []string{`INSERT INTO dst (id, name, n) SELECT id, name, '1.5' FROM src WHERE id < 3 ORDER BY 3`}},
		{name: "remainders of powers of two", stmts: []string{`INSERT INTO dst (id, name) SELECT id, name FROM src WHERE id <= 1103 ORDER BY id RETURNING id`}},
		{name: "a transaction sees its own rows", stmts: []string{`BEGIN`, `INSERT INTO src VALUES (5000, 'new', 9)`,
			`INSERT INTO dst (id, name) SELECT id, name FROM src WHERE grp = 9 RETURNING *`, `DELETE FROM src WHERE id = 5000`, `COMMIT`}},
	}
	modes := []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec}
	answered := 0
	for _, c := range cases {
		for _, mode := range modes {
			pc := px
			if mode == pgx.QueryExecModeSimpleProtocol {
				pc = simple
			}
			for _, db := range []*pgx.Conn{one, pc} {
				exec1(t, db, `TRUNCATE dst, kd`)
			}
			for i, q := range c.stmts {
				var args []any
				if i < len(c.args) {
					args = c.args[i]
				}
				if mode == pgx.QueryExecModeSimpleProtocol && len(args) > 0 {
					continue // pgx would inline them as literals of other types
				}
				want := rows(one, mode, q, c.sorted, args...)
				got := rows(pc, mode, q, c.sorted, args...)
				if got != want {
					t.Errorf("%s (%v): %s\n  one database: %.300s\n  proxy:        %.300s", c.name, mode, q, want, got)
				}
				if strings.HasPrefix(q, "INSERT") && !strings.HasPrefix(want, "error") {
					answered++
				}
			}
			for _, table := range []string{"dst", "kd"} {
				q := fmt.Sprintf(`SELECT * FROM %s ORDER BY id`, table)
				if want, got := rows(one, mode, q, false), rows(pc, mode, q, false); got != want {
					t.Errorf("%s (%v): %s afterwards differs\n  one database: %.300s\n  proxy:        %.300s", c.name, mode, table, want, got)
				}
			}
		}
	}
	if answered == 0 {
		t.Fatal("no INSERT ... SELECT answered")
	}

	// Every row is on the shard its key names: a point read finds it.
	exec1(t, px, `TRUNCATE dst`)
	exec1(t, px, `INSERT INTO dst (id, name) SELECT s.id, t.name FROM src s JOIN src t ON t.grp = s.grp AND t.id = s.id + 7`)
	ids, err := pgx.CollectRows(mustQuery(t, px, `SELECT id FROM dst`), pgx.RowTo[int64])
	if err != nil || len(ids) < 1000 {
		t.Fatalf("%d rows, %v", len(ids), err)
	}
	for _, id := range ids[:200] {
		if n := queryInt(t, px, `SELECT count(*) FROM dst WHERE id = $1`, id); n != 1 {
			t.Errorf("dst id %d: a point read through the proxy finds %d rows", id, n)
		}
	}
	onShards := queryInt(t, e.shard(t, 0), `SELECT count(*) FROM dst`) + queryInt(t, e.shard(t, 1), `SELECT count(*) FROM dst`)
	if onShards != int64(len(ids)) {
		t.Errorf("%d rows on the shards, %d through the proxy", onShards, len(ids))
	}

	// psql, the real client: a statement in steps without RETURNING describes no
	// columns (it printed an empty table before its tag).
	psql := needTool(t, "psql")
	for _, c := range [][2]string{
		{`INSERT INTO dst (id, name) SELECT id + 40000, name FROM src WHERE id <= 3`, "INSERT 0 3\n"},
		{`DELETE FROM dst WHERE id IN (SELECT id + 40000 FROM src WHERE grp = 1 AND id <= 3)`, "DELETE 1\n"},
	} {
		q, want := c[0], c[1]
		out, err := exec.Command(psql, "-X", "-d", e.url(""), "-c", q).CombinedOutput()
		if err != nil || string(out) != want {
			t.Errorf("psql -c %q: %q (%v), want %q", q, out, err, want)
		}
	}

	// What stays refused, with 0A000 naming why; the session goes on.
	for _, q := range []string{
		`INSERT INTO dst (id, name) SELECT id::numeric, name FROM src`,
		`INSERT INTO dst (id, name) SELECT id, name FROM src ON CONFLICT (id) DO UPDATE SET name = 'twice'`,
		`INSERT INTO dst (id, name) SELECT id, name FROM src WHERE pg_try_advisory_lock(id)`,
		`WITH c AS (SELECT 1 AS k) INSERT INTO dst (id, name) SELECT id, name FROM src RETURNING id, (SELECT k FROM c)`,
		`INSERT INTO kd SELECT FROM src`,
		`INSERT INTO dst SELECT *, NULL FROM kd`,
	} {
		_, err := px.Exec(ctx, q)
		if sqlState(err) != "0A000" {
			t.Errorf("%s: %v, want 0A000", q, err)
		}
	}
	// A query only the coordinator answers, in a transaction block: read before the
	// writes, where the transaction has written nothing yet; after a write, refused
	// naming it, and nothing of it written.
	coordinatedInsert := `INSERT INTO dst (id, name) SELECT s.id + 50000, t.name FROM src s JOIN src t ON t.grp = s.grp AND t.id = s.id + 7`
	exec1(t, px, `BEGIN`)
	if _, err = px.Exec(ctx, coordinatedInsert); err != nil {
		t.Errorf("a coordinated query in a transaction block that has not written: %v", err)
	}
	if n := queryInt(t, px, `SELECT count(*) FROM dst WHERE id > 50000`); n == 0 {
		t.Errorf("the transaction does not see the rows it inserted")
	}
	exec1(t, px, `ROLLBACK`)
	exec1(t, px, `BEGIN`)
	exec1(t, px, `UPDATE src SET name = name WHERE id = 1`)
	_, err = px.Exec(ctx, coordinatedInsert)
	if sqlState(err) != "0A000" || !strings.Contains(err.Error(), "wrote") {
		t.Errorf("a coordinated query in a transaction block that wrote: %v, want 0A000 naming the write", err)
	}
	exec1(t, px, `ROLLBACK`)
	if n := queryInt(t, px, `SELECT count(*) FROM dst WHERE id > 50000`); n != 0 {
		t.Errorf("%d rows of a rolled back or refused statement", n)
	}

	// The spool of the query's rows is bounded; the proxy stays healthy for others.
	small := startProxyOn(t, shardedRules(dsns, []string{"src=id", "dst=id", "kd=id"}, nil), func(c *proxy.Config) { c.CoordinatorMaxMoved = 50000 })
	sc := small.connect(t)
	before := spoolFiles(t)
	_, err = sc.Exec(ctx, `INSERT INTO dst (id, name) SELECT id + 70000, repeat(name, 100) FROM src`)
	if sqlState(err) != "54000" || !strings.Contains(err.Error(), "--coordinator-max-moved") {
		t.Errorf("over the bound: %v, want 54000 naming the setting", err)
	}
	if n := queryInt(t, sc, `SELECT count(*) FROM dst WHERE id > 70000`); n != 0 {
		t.Errorf("%d rows of a statement over the bound", n)
	}
	if after := spoolFiles(t); after > before {
		t.Errorf("%d spool files left behind", after-before)
	}
}

// spoolFiles counts the temporary files INSERT ... SELECT spools rows to.
func spoolFiles(t *testing.T) int {
	m, err := filepath.Glob(filepath.Join(os.TempDir(), "shardlab-spool-*"))
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

// TestInsertSelectTwoPhase: with --two-phase an INSERT ... SELECT that writes to several
// shards commits with PREPARE TRANSACTION on each; its shard's backends terminated
// between the phases, the statement is all or nothing once settled, and nothing stays
// prepared. The route preview names the query and how its rows are placed.
func TestInsertSelectTwoPhase(t *testing.T) {
	cl := pgtest.StartClusterWith(t, "max_prepared_transactions = 10")
	dsns := []string{cl.NewDatabase("feed2pc_s0"), cl.NewDatabase("feed2pc_s1")}
	e := startProxyOn(t, shardedRules(dsns, []string{"src=id", "dst=id"}, nil), func(c *proxy.Config) {
		c.TwoPhase, c.AdminDatabase = true, "shardlab"
	})
	ctx := context.Background()
	c := e.connect(t)
	exec1(t, c, `CREATE TABLE src (id int PRIMARY KEY, grp int)`)
	exec1(t, c, `CREATE TABLE dst (id int PRIMARY KEY, grp int)`)
	exec1(t, c, `INSERT INTO src SELECT g, g % 5 FROM generate_series(1, 800) g`)
	if n := queryInt(t, c, `SELECT count(*) FROM src`); n != 800 {
		t.Fatalf("%d rows", n)
	}
	committer := e.srv.Router().Committer()
	var mu sync.Mutex
	var stages []string
	committer.SetPhaseHook(func(stage string) {
		mu.Lock()
		defer mu.Unlock()
		stages = append(stages, stage)
	})
	exec1(t, c, `INSERT INTO dst SELECT id, grp FROM src WHERE grp < 3`)
	committer.SetPhaseHook(nil)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(stages, "prepared") || !slices.Contains(stages, "committed") {
		t.Errorf("commit stages %v, want a two-phase commit", stages)
	}
	if n := queryInt(t, c, `SELECT count(*) FROM dst`); n != 480 {
		t.Errorf("%d rows in dst, want 480", n)
	}

	// Shard 1's backends go between the phases: the statement fails or not, but once
	// the settler has run, either every row is there or none.
	committer.SetPhaseHook(func(stage string) {
		if stage == "prepared" {
			terminateBackends(dsns[1])
		}
	})
	_, err := c.Exec(ctx, `INSERT INTO dst SELECT id + 1000, grp FROM src WHERE grp >= 3`)
	committer.SetPhaseHook(nil)
	for try := 0; ; try++ {
		_, err := e.srv.Router().Settler().Settle(ctx)
		if err == nil {
			break
		}
		if try == 3 {
			t.Fatalf("settle: %v", err)
		}
	}
	n := queryInt(t, e.connect(t), `SELECT count(*) FROM dst WHERE id > 1000`)
	t.Logf("after a failure between the phases: %d rows, statement error %v", n, err)
	if n != 0 && n != 320 {
		t.Errorf("%d of 320 rows after a failure between the phases (statement error: %v)", n, err)
	}
	if p, ok := preparedCount(dsns); !ok || p != 0 {
		t.Errorf("%d transactions left prepared (shards reachable: %v)", p, ok)
	}

	// The route preview.
	adm, err := pgx.Connect(ctx, strings.Replace(e.url(""), "/"+testDatabase+"?", "/shardlab?", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close(ctx)
	res, err := adm.PgConn().Exec(ctx, `SHOW ROUTE INSERT INTO dst SELECT id, grp FROM src WHERE id = 7`).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var route string
	for _, r := range res[0].Rows {
		route += string(r[0]) + "\n"
	}
	if !strings.Contains(route, "insert of dst from a query") || !strings.Contains(route, "query route: select of src") || !strings.Contains(route, "shard") {
		t.Errorf("route preview:\n%s", route)
	}
}

// answerOf runs q on c in mode and prints the answer: its column names, its rows (sorted
// when the order is open) and its command tag, or the error's SQLSTATE alone.
func answerOf(c *pgx.Conn, mode pgx.QueryExecMode, q string, sorted bool, args ...any) string {
	rs, err := c.Query(context.Background(), q, append([]any{mode}, args...)...)
	if err != nil {
		return "error " + sqlState(err)
	}
	var out []string
	for rs.Next() {
		vals, err := rs.Values()
		if err != nil {
			return "error " + err.Error()
		}
		out = append(out, fmt.Sprint(vals))
	}
	if err := rs.Err(); err != nil {
		return "error " + sqlState(err)
	}
	if sorted {
		slices.Sort(out)
	}
	var names []string
	for _, f := range rs.FieldDescriptions() {
		names = append(names, f.Name)
	}
	return fmt.Sprintf("%v %s [%s]", names, strings.Join(out, "; "), rs.CommandTag())
}
