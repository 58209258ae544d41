package shardsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/shardsql"
)

// TestSubqueriesFirstThroughDriver: UPDATE and DELETE whose subqueries over sharded
// tables span shards (IN, NOT IN with NULLs, ANY, ALL, EXISTS, a scalar, ARRAY, over
// the table being changed, with arguments, one the coordinator answers, inside a
// transaction that wrote what they read) answer through database/sql as pgx's driver
// on one database does, and leave the same rows, correlated subqueries evaluated in
// two steps too; a correlated subquery of another shape, an uncorrelated scalar
// subquery of several rows and a collated column are refused with 0A000 and change
// nothing; an invalid subquery gets one database's error; rows past MaxHeld fail with
// 54000. On the old code every one of them was refused.
func TestSubqueriesFirstThroughDriver(t *testing.T) {
	ctx := context.Background()
	ref, err := sql.Open("pgx", pgtest.NewDatabase(t, "dpre_ref"))
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	var dsns []string
	for i := range 2 {
		dsns = append(dsns, pgtest.NewDatabase(t, fmt.Sprintf("dpre_s%d", i)))
	}
	r := rules.Rules{}
	for i, d := range dsns {
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d})
	}
	for _, name := range []string{"orders", "custs", "tags"} {
		r.Tables = append(r.Tables, rules.Table{Name: name, Strategy: rules.Strategy{Column: "id"}})
	}
	c, err := rules.Compile(r)
	if err != nil {
		t.Fatal(err)
	}
	db := openCoordinated(t, c, nil)
	setup := []string{
		`CREATE TABLE tags (id int PRIMARY KEY, label text COLLATE "C")`,
		`INSERT INTO tags VALUES (1, 'new'), (2, 'vip')`,
		`CREATE TABLE orders (id int PRIMARY KEY, cust int, status text, amount numeric)`,
		`CREATE TABLE custs (id int PRIMARY KEY, name text, region text)`,
		`INSERT INTO custs SELECT g, 'c' || g, (ARRAY['north','south','east','west'])[g % 4 + 1] FROM generate_series(1, 50) g`,
	}
	for _, q := range setup {
		for _, h := range []*sql.DB{ref, db} {
			if _, err := h.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	type step struct {
		sql  string
		args []any
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"in", []step{{sql: `DELETE FROM orders WHERE cust IN (SELECT id FROM custs WHERE region = 'north')`}}},
		{"any, returning", []step{{sql: `UPDATE orders SET status = 'vip' WHERE cust = ANY (SELECT id FROM custs WHERE name LIKE 'c1%') RETURNING id, status`}}},
		{"scalar", []step{{sql: `UPDATE orders SET amount = (SELECT max(id) FROM custs) WHERE id <= 10 RETURNING *`}}},
		{"exists", []step{{sql: `DELETE FROM orders WHERE id < 100 AND EXISTS (SELECT 1 FROM custs WHERE region = 'south')`},
			{sql: `DELETE FROM orders WHERE id < 200 AND NOT EXISTS (SELECT 1 FROM custs WHERE region = 'nowhere')`}}},
		{"not in with nulls", []step{{sql: `DELETE FROM orders WHERE cust NOT IN (SELECT CASE WHEN region = 'west' THEN NULL ELSE id END FROM custs)`},
			{sql: `DELETE FROM orders WHERE cust NOT IN (SELECT id FROM custs WHERE region <> 'east')`}}},
		{"all, over the table changed", []step{{sql: `UPDATE orders SET status = 'big' WHERE amount > ALL (SELECT amount FROM orders WHERE cust = 3) RETURNING id`}}},
		{"arguments", []step{{sql: `UPDATE orders SET status = $1 WHERE cust IN (SELECT id FROM custs WHERE region = $2) RETURNING id, status`, args: []any{"p", "north"}}}},
		{"update from", []step{{sql: `UPDATE orders o SET status = $1 FROM custs c WHERE c.id = o.cust AND c.region = $2 RETURNING o.*`, args: []any{"n", "north"}}}},
		{"update from, the SET list from the joined table", []step{{sql: `UPDATE orders o SET status = c.name, amount = c.id FROM custs c WHERE c.id = o.cust AND c.region = $1 RETURNING o.*`, args: []any{"north"}}}},
		{"joined otherwise", []step{{sql: `DELETE FROM orders o USING custs c WHERE c.id < o.cust AND c.region = $1 AND o.id > 300 RETURNING o.id`, args: []any{"north"}}}},
		{"delete using", []step{{sql: `DELETE FROM orders USING custs WHERE custs.id = orders.cust AND custs.name LIKE 'c1%' RETURNING orders.id`}}},
		{"not exists, correlated by one equality", []step{{sql: `DELETE FROM orders o WHERE NOT EXISTS (SELECT 1 FROM custs c WHERE c.id = o.cust AND c.region <> $1) RETURNING o.id`, args: []any{"west"}}}},
		{"exists, correlated by one equality", []step{{sql: `DELETE FROM orders o WHERE o.amount > $1 AND EXISTS (SELECT 1 FROM custs c WHERE c.id = o.cust AND c.region = 'north') RETURNING o.id`, args: []any{100}}}},
		{"coordinated", []step{{sql: `DELETE FROM orders WHERE cust IN (SELECT c.id FROM custs c JOIN orders o ON o.cust = c.id WHERE o.amount > 800) RETURNING id`}}},
		// Correlated otherwise: the columns its tables give first, then the subquery over them.
		{"correlated scalar", []step{{sql: `UPDATE orders o SET status = (SELECT c.name FROM custs c WHERE c.id = o.cust AND c.region <> $1) WHERE o.id <= 300 RETURNING o.id, o.status`, args: []any{"west"}}}},
		{"correlated, several conditions", []step{{sql: `DELETE FROM orders o WHERE EXISTS (SELECT 1 FROM custs c WHERE c.id < o.cust AND c.region = 'north' AND (c.id >= 10 OR o.id > 300)) RETURNING o.id`}}},
		{"correlated in, aggregates", []step{{sql: `DELETE FROM orders WHERE status IN (SELECT status FROM custs WHERE region = 'north') AND id > 590`},
			{sql: `UPDATE orders o SET amount = (SELECT count(*) + sum(c.id) FROM custs c WHERE c.id < o.cust) WHERE o.id < 100 RETURNING o.*`}}},
		{"correlated, values computed over the subquery's tables", []step{{sql: `UPDATE orders o SET amount = (SELECT sum(c.id * 2) + count(DISTINCT c.region || 'x') FROM custs c WHERE c.id < o.cust) WHERE o.id < $1 RETURNING o.*`, args: []any{100}}}},
		{"correlated, PostgreSQL's functions", []step{
			{sql: `UPDATE orders o SET amount = (SELECT round(avg(c.id), 1) + abs(min(c.id - 50)) FROM custs c WHERE c.id < o.cust) WHERE o.id < 100 RETURNING o.*`},
			{sql: `UPDATE orders o SET status = (SELECT upper(c.name) || length(c.region) FROM custs c WHERE c.id < o.cust ORDER BY lower(c.region) DESC, c.id % 5, c.id LIMIT 1) WHERE o.id <= $1 RETURNING o.id, o.status`, args: []any{300}}}},
		{"correlated scalar of several rows", []step{{sql: `UPDATE orders o SET amount = (SELECT c.id FROM custs c WHERE c.id > o.cust) WHERE o.id < 5`}}},
		{"correlated, ordered and limited", []step{{sql: `UPDATE orders o SET status = (SELECT c.name FROM custs c WHERE c.id < o.cust AND c.region <> $1 ORDER BY c.id DESC LIMIT 1) WHERE o.id <= 300 RETURNING o.id, o.status`, args: []any{"west"}},
			{sql: `DELETE FROM orders o WHERE o.cust IN (SELECT c.id FROM custs c WHERE c.region <> o.status ORDER BY c.region DESC, c.id OFFSET 2 LIMIT 3) RETURNING o.id`}}},
		{"array", []step{{sql: `UPDATE orders SET status = array_to_string(ARRAY(SELECT name FROM custs WHERE id < 4 ORDER BY id), ',') WHERE id = 5 RETURNING status`}}},
		{"no rows", []step{{sql: `DELETE FROM orders WHERE cust IN (SELECT id FROM custs WHERE false)`},
			{sql: `UPDATE orders SET amount = (SELECT id FROM custs WHERE false) WHERE id = 7 RETURNING amount`}}},
		{"invalid subquery", []step{{sql: `DELETE FROM orders WHERE cust IN (SELECT nosuch FROM custs)`}}},
		{"one shape, two texts", []step{{sql: `DELETE FROM orders WHERE id < 100 AND cust IN (SELECT id FROM custs WHERE region = 'north')`},
			{sql: `DELETE FROM orders WHERE id < 300 AND cust IN (SELECT id FROM custs WHERE region = 'south')`}}},
		{"a transaction sees its own writes", []step{{sql: `BEGIN`}, {sql: `INSERT INTO custs VALUES (900, 'new', 'far')`},
			{sql: `INSERT INTO orders VALUES (601, 900, 'x', 1)`},
			{sql: `DELETE FROM orders WHERE cust IN (SELECT id FROM custs WHERE region = 'far') RETURNING *`},
			{sql: `DELETE FROM custs WHERE id = 900`}, {sql: `COMMIT`}}},
	}
	reset := func(c *sql.Conn) {
		for _, q := range []string{`TRUNCATE orders`, `INSERT INTO orders SELECT g, g % 53, 'new', g * 1.5 FROM generate_series(1, 600) g`} {
			if _, err := c.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
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
			reset(conn)
			conns[h] = conn
		}
		for _, st := range cs.steps {
			want, got := connAnswer(ctx, conns[ref], st.sql, true, st.args...), connAnswer(ctx, conns[db], st.sql, true, st.args...)
			if got != want {
				t.Errorf("%s: %s\n  one database: %.300s\n  driver:       %.300s", cs.name, st.sql, want, got)
			}
			if !strings.HasPrefix(want, "error") && (strings.HasPrefix(st.sql, "DELETE") || strings.HasPrefix(st.sql, "UPDATE")) {
				answered++
			}
		}
		q := `SELECT * FROM orders ORDER BY id`
		if want, got := answer(ctx, ref, q, false), answer(ctx, db, q, false); got != want {
			t.Errorf("%s: the rows afterwards differ\n  one database: %.300s\n  driver:       %.300s", cs.name, want, got)
		}
	}
	if answered < 20 {
		t.Errorf("%d statements answered", answered)
	}

	// Refused, changing nothing.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reset(conn)
	for _, q := range []string{
		`DELETE FROM orders o WHERE o.cust = (SELECT c.id FROM custs c WHERE c.id < o.cust ORDER BY c.id DESC LIMIT 1)`, // a correlated scalar subquery in WHERE
		`UPDATE orders o SET amount = (SELECT sum(c.id::float8) FROM custs c WHERE c.id < o.cust)`,                      // floats added in another order
		`UPDATE orders o SET status = (SELECT c.label FROM tags c WHERE c.id = o.cust)`,                                 // a collation of the column's own
		`UPDATE orders SET amount = (SELECT id FROM custs) WHERE id = 1`,
		`UPDATE orders SET status = 'x' WHERE status IN (SELECT label FROM tags)`,
		`UPDATE orders SET status = 'x' WHERE status IN (SELECT name COLLATE "C" FROM custs)`,
	} {
		if _, err := db.ExecContext(ctx, q); sqlStateOf(err) != "0A000" {
			t.Errorf("%s: %v, want 0A000", q, err)
		}
	}
	// A subquery only the coordinator answers, in a transaction: read first where the
	// transaction has written nothing yet; after a write, refused naming it.
	coordinatedDelete := `DELETE FROM orders WHERE cust IN (SELECT c.id FROM custs c JOIN orders o ON o.cust = c.id WHERE o.amount > 800)`
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = tx.ExecContext(ctx, coordinatedDelete); err != nil {
		t.Errorf("a coordinated subquery in a transaction that has not written: %v", err)
	}
	tx.Rollback()
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = tx.ExecContext(ctx, `UPDATE orders SET status = status WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	_, err = tx.ExecContext(ctx, coordinatedDelete)
	if sqlStateOf(err) != "0A000" || !strings.Contains(err.Error(), "wrote") {
		t.Errorf("a coordinated subquery in a transaction that wrote: %v, want 0A000 naming the write", err)
	}
	tx.Rollback()
	if got := answer(ctx, db, `SELECT count(*) FROM orders WHERE status = 'new' AND amount = id * 1.5`, false); got != "600" {
		t.Errorf("%s of 600 rows unchanged after the refusals", got)
	}

	// A subquery's rows are held within MaxHeld.
	small, err := shardsql.Open(shardsql.Config{Rules: c, MaxHeld: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	if _, err := small.ExecContext(ctx, `DELETE FROM orders WHERE cust IN (SELECT id FROM custs)`); sqlStateOf(err) != "54000" {
		t.Errorf("a subquery over the bound: %v, want 54000", err)
	}
	if got := answer(ctx, db, `SELECT count(*) FROM orders`, false); got != "600" {
		t.Errorf("%s of 600 rows after a statement over the bound", got)
	}
}
