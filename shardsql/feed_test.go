package shardsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/shardsql"
)

// answer runs q on db and writes what came back (see connAnswer).
func answer(ctx context.Context, db *sql.DB, q string, sorted bool, args ...any) string {
	c, err := db.Conn(ctx)
	if err != nil {
		return "error " + err.Error()
	}
	defer c.Close()
	return connAnswer(ctx, c, q, sorted, args...)
}

// TestInsertSelectThroughDriver: INSERT ... SELECT into a sharded table through
// database/sql answers as one database does (pgx's driver on one database beside the
// sharded handle): batches, RETURNING in order, keys drawn from a sequence, a query over
// the table it fills, a query only the coordinator answers, arguments, ON CONFLICT, a
// failing batch that writes nothing, WITH, no rows, a spool spilled to disk, a
// transaction that sees its own rows; a coordinated query in a transaction is refused,
// and a spool past CoordinatorMaxMoved fails with 54000 and leaves nothing. On the old
// code each was refused with 0A000.
func TestInsertSelectThroughDriver(t *testing.T) {
	ctx := context.Background()
	ref, err := sql.Open("pgx", pgtest.NewDatabase(t, "dfeed_ref"))
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	var dsns []string
	for i := range 2 {
		dsns = append(dsns, pgtest.NewDatabase(t, fmt.Sprintf("dfeed_s%d", i)))
	}
	r := rules.Rules{}
	for i, d := range dsns {
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d})
	}
	for _, name := range []string{"src", "dst", "kd"} {
		r.Tables = append(r.Tables, rules.Table{Name: name, Strategy: rules.Strategy{Column: "id"}})
	}
	c, err := rules.Compile(r)
	if err != nil {
		t.Fatal(err)
	}
	db := openCoordinated(t, c, nil)
	setup := []string{
		`CREATE TABLE src (id int PRIMARY KEY, name text, grp int)`,
		`CREATE TABLE dst (id bigint PRIMARY KEY, name text, n numeric)`,
		`CREATE TABLE kd (id bigserial PRIMARY KEY, name text)`,
		`CREATE TABLE plain (code int, label text)`,
		`INSERT INTO plain VALUES (1, 'one'), (2, 'two'), (3, 'three')`,
		`INSERT INTO src SELECT g, 'name' || g, g % 7 FROM generate_series(1, 1200) g`,
	}
	for _, q := range setup {
		for _, h := range []*sql.DB{ref, db} {
			if _, err := h.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	type feedCase struct {
		name   string
		stmts  []string
		args   [][]any
		sorted bool
	}
	cases := []feedCase{
		{name: "two batches", stmts: []string{`INSERT INTO dst (id, name, n) SELECT id, name, grp * 1.5 FROM src WHERE id <= 700`}},
		{name: "no column list, RETURNING in order", stmts: []string{`INSERT INTO dst SELECT id + 5000, upper(name) FROM src WHERE grp = 3 ORDER BY id DESC RETURNING id, name, n`}},
		{name: "keys drawn", stmts: []string{`INSERT INTO kd (name) SELECT name FROM src WHERE grp = 1 ORDER BY id RETURNING id, name`,
			`INSERT INTO kd SELECT id + 100000, name FROM src WHERE grp = 2`}},
		{name: "over the table it fills", stmts: []string{`INSERT INTO dst (id, name) SELECT id, name FROM src WHERE id <= 600`,
			`INSERT INTO dst (id, name, n) SELECT id + 10000, name || '+', n FROM dst`}},
		{name: "coordinated query", sorted: true, stmts: []string{`INSERT INTO dst (id, name) SELECT s.id, t.name FROM src s JOIN src t ON t.grp = s.grp AND t.id = s.id + 7 RETURNING *`}},
		{name: "arguments", sorted: true, stmts: []string{`INSERT INTO dst (id, name, n) SELECT id, $1, $2 FROM src WHERE grp = $3 RETURNING id, name, n`},
			args: [][]any{{"x", 2.5, 4}}},
		{name: "on conflict do nothing", stmts: []string{`INSERT INTO dst (id, name) VALUES (5, 'kept'), (900, 'kept')`,
			`INSERT INTO dst (id, name) SELECT id, name FROM src WHERE id <= 1000 ON CONFLICT (id) DO NOTHING`}},
		{name: "a failing batch writes nothing", stmts: []string{`INSERT INTO dst (id, name) SELECT id % 600, name FROM src`}},
		{name: "with", stmts: []string{`WITH x AS (SELECT id, name FROM src WHERE grp = 2) INSERT INTO dst (id, name) SELECT id, name FROM x ORDER BY id RETURNING id`}},
		{name: "no rows", stmts: []string{`INSERT INTO dst SELECT id, name FROM src WHERE false RETURNING *`, `INSERT INTO dst SELECT id, name FROM src WHERE false`}},
		{name: "a default table joined", sorted: true, stmts: []string{`INSERT INTO dst (id, name) SELECT s.id, p.label FROM src s JOIN plain p ON p.code = s.grp`}},
		{name: "spilled to disk", stmts: []string{`INSERT INTO dst (id, name) SELECT id, repeat(name, 2000) FROM src`,
			`SELECT count(*), sum(length(name)) FROM dst`}},
		{name: "a transaction sees its own rows", stmts: []string{`BEGIN`, `INSERT INTO src VALUES (5000, 'new', 9)`,
			`INSERT INTO dst (id, name) SELECT id, name FROM src WHERE grp = 9 RETURNING *`, `DELETE FROM src WHERE id = 5000`, `COMMIT`}},
	}
	answered := 0
	for _, cs := range cases {
		conns := map[*sql.DB]*sql.Conn{}
		for _, h := range []*sql.DB{ref, db} {
			conn, err := h.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.ExecContext(ctx, `TRUNCATE dst, kd`); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.ExecContext(ctx, `ALTER SEQUENCE kd_id_seq RESTART`); err != nil {
				t.Fatal(err)
			}
			conns[h] = conn
		}
		for i, q := range cs.stmts {
			var args []any
			if i < len(cs.args) {
				args = cs.args[i]
			}
			var got [2]string
			for j, h := range []*sql.DB{ref, db} {
				got[j] = connAnswer(ctx, conns[h], q, cs.sorted, args...)
			}
			if got[0] != got[1] {
				t.Errorf("%s: %s\n  one database: %.300s\n  driver:       %.300s", cs.name, q, got[0], got[1])
			}
			if strings.HasPrefix(q, "INSERT") && !strings.HasPrefix(got[0], "error") {
				answered++
			}
		}
		for _, table := range []string{"dst", "kd"} {
			q := fmt.Sprintf(`SELECT * FROM %s ORDER BY id`, table)
			if want, got := answer(ctx, ref, q, false), answer(ctx, db, q, false); got != want {
				t.Errorf("%s: %s afterwards differs\n  one database: %.300s\n  driver:       %.300s", cs.name, table, want, got)
			}
		}
	}
	if answered < 10 {
		t.Fatalf("%d INSERT ... SELECT answered", answered)
	}

	// A coordinated query in a transaction: read before the writes where the
	// transaction has written nothing yet; after a write, refused, writing nothing.
	coordinatedInsert := `INSERT INTO dst (id, name) SELECT s.id + 50000, t.name FROM src s JOIN src t ON t.grp = s.grp AND t.id = s.id + 7`
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = tx.ExecContext(ctx, coordinatedInsert); err != nil {
		t.Errorf("a coordinated query in a transaction that has not written: %v", err)
	}
	tx.Rollback()
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = tx.ExecContext(ctx, `UPDATE src SET name = name WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	_, err = tx.ExecContext(ctx, coordinatedInsert)
	if sqlStateOf(err) != "0A000" || !strings.Contains(err.Error(), "wrote") {
		t.Errorf("a coordinated query in a transaction that wrote: %v, want 0A000 naming the write", err)
	}
	tx.Rollback()
	if got := answer(ctx, db, `SELECT count(*) FROM dst WHERE id > 50000`, false); got != "0" {
		t.Errorf("%s rows of a rolled back or refused statement", got)
	}

	// Past the bound on RETURNING rows held, after a batch was written, inside the
	// program's transaction: the transaction has failed, and commits nothing.
	held, err := shardsql.Open(shardsql.Config{Rules: c, MaxHeld: 30000})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	tx, err = held.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO dst (id, name) SELECT id + 80000, name FROM src RETURNING id, name, name, name`)
	if sqlStateOf(err) != "54000" {
		t.Errorf("RETURNING past MaxHeld: %v, want 54000", err)
	}
	if err := tx.Commit(); err == nil {
		t.Error("the transaction of a failed INSERT ... SELECT committed")
	}
	if got := answer(ctx, db, `SELECT count(*) FROM dst WHERE id > 80000`, false); got != "0" {
		t.Errorf("rows of a failed INSERT ... SELECT in a transaction: %s", got)
	}

	// The spool is bounded: past it, 54000 naming the setting, nothing written, no
	// file left.
	small := openCoordinated(t, c, func(cfg *shardsql.Config) {
		cfg.CoordinatorMaxMoved = 50000
		cfg.CoordinatorDatabase = "dfeed_small_coordinator"
	})
	before := spoolFiles(t)
	_, err = small.ExecContext(ctx, `INSERT INTO dst (id, name) SELECT id + 70000, repeat(name, 100) FROM src`)
	if sqlStateOf(err) != "54000" || !strings.Contains(err.Error(), "CoordinatorMaxMoved") {
		t.Errorf("over the bound: %v, want 54000 naming the setting", err)
	}
	if got := answer(ctx, db, `SELECT count(*) FROM dst WHERE id > 70000`, false); got != "0" {
		t.Errorf("rows of a statement over the bound: %s", got)
	}
	if after := spoolFiles(t); after > before {
		t.Errorf("%d spool files left behind", after-before)
	}
}

// connAnswer runs q on c and writes what came back: its rows (sorted when the order
// is one database's to choose), or its error's SQLSTATE.
func connAnswer(ctx context.Context, c *sql.Conn, q string, sorted bool, args ...any) string {
	rows, err := c.QueryContext(ctx, q, args...)
	if err != nil {
		return "error " + sqlStateOf(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var lines []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return "error " + err.Error()
		}
		for i, v := range vals {
			if b, ok := v.([]byte); ok {
				vals[i] = string(b)
			}
		}
		lines = append(lines, fmt.Sprint(vals...))
	}
	if err := rows.Err(); err != nil {
		return "error " + sqlStateOf(err)
	}
	if sorted {
		slices.Sort(lines)
	}
	return strings.Join(lines, "|")
}

// spoolFiles counts the temporary files INSERT ... SELECT spools rows to.
func spoolFiles(t *testing.T) int {
	m, err := filepath.Glob(filepath.Join(os.TempDir(), "shardlab-spool-*"))
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}
