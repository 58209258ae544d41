package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/proxy"
)

// TestSubqueriesFirst: UPDATE and DELETE whose subqueries over sharded tables span
// shards (IN, NOT IN with NULLs, ANY, ALL, EXISTS, a scalar, ARRAY, over the table
// being changed, with parameters, one the coordinator answers, inside a transaction
// that wrote what they read) answer as one database does, in the simple and extended
// protocols, and leave the same rows; so do correlated subqueries evaluated in two steps
// (a scalar one, EXISTS and IN over conditions of any kind, aggregates, parameters);
// a correlated subquery of another shape, and an uncorrelated scalar subquery of
// several rows, are refused with 0A000 and change nothing; an invalid subquery gets
// one database's error. On the old code every one of them was refused.
func TestSubqueriesFirst(t *testing.T) {
	ref := pgtest.NewDatabase(t, "pre_ref")
	var dsns []string
	for i := range 2 {
		dsns = append(dsns, pgtest.NewDatabase(t, fmt.Sprintf("pre_s%d", i)))
	}
	e := startProxyOn(t, shardedRules(dsns, []string{"orders=id", "custs=id", "tags=id", "dtab=id"}, nil), withCoordinator(), func(c *proxy.Config) { c.AdminDatabase = "shardlab" })
	ctx := context.Background()
	one, err := pgx.Connect(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close(ctx)
	px := e.connect(t)
	simple := e.connect(t)
	regions := []string{"north", "south", "east", "west"}
	setup := []string{
		`CREATE TABLE tags (id int PRIMARY KEY, label text COLLATE "C")`,
		`INSERT INTO tags VALUES (1, 'new'), (2, 'vip')`,
		`CREATE DOMAIN nnint AS int NOT NULL`,
		`CREATE TABLE dtab (id int PRIMARY KEY, d nnint)`,
		`INSERT INTO dtab SELECT g, g FROM generate_series(1, 10) g`,
		`CREATE TABLE orders (id int PRIMARY KEY, cust int, status text, amount numeric)`,
		`CREATE TABLE custs (id int PRIMARY KEY, name text, region text)`,
		fmt.Sprintf(`INSERT INTO custs SELECT g, 'c' || g, (ARRAY['%s'])[g %% 4 + 1] FROM generate_series(1, 50) g`, strings.Join(regions, "','")),
	}
	for _, q := range setup {
		exec1(t, one, q)
		exec1(t, simple, q)
	}
	rows := func(c *pgx.Conn, mode pgx.QueryExecMode, q string, args ...any) string {
		return answerOf(c, mode, q, true, args...)
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
		{"parameters", []step{{sql: `UPDATE orders SET status = $1 WHERE cust IN (SELECT id FROM custs WHERE region = $2) RETURNING id, status`, args: []any{"p", "north"}}}},
		{"coordinated", []step{{sql: `DELETE FROM orders WHERE cust IN (SELECT c.id FROM custs c JOIN orders o ON o.cust = c.id WHERE o.amount > 800) RETURNING id`}}},
		{"array", []step{{sql: `UPDATE orders SET status = array_to_string(ARRAY(SELECT name FROM custs WHERE id < 4 ORDER BY id), ',') WHERE id = 5 RETURNING status`}}},
		{"no rows", []step{{sql: `DELETE FROM orders WHERE cust IN (SELECT id FROM custs WHERE false)`},
			{sql: `UPDATE orders SET amount = (SELECT id FROM custs WHERE false) WHERE id = 7 RETURNING amount`}}},
		{"invalid subquery", []step{{sql: `DELETE FROM orders WHERE cust IN (SELECT nosuch FROM custs)`},
			{sql: `DELETE FROM orders o WHERE EXISTS (SELECT nosuch FROM custs c WHERE c.id = o.cust)`}}},
		// Joined on other columns than the keys, by one equality: the other tables are a
		// subquery evaluated first.
		{"update from", []step{{sql: `UPDATE orders o SET status = 'n', amount = o.amount + 1 FROM custs c WHERE c.id = o.cust AND c.region = 'north' RETURNING o.id, o.status`}}},
		{"exists, correlated by one equality", []step{{sql: `DELETE FROM orders o WHERE o.amount > 100 AND EXISTS (SELECT 1 FROM custs c WHERE c.id = o.cust AND c.region = 'north') RETURNING o.id`},
			{sql: `UPDATE orders SET status = 'e' WHERE EXISTS (SELECT * FROM custs WHERE custs.id = orders.cust AND name LIKE 'c2%') RETURNING id, status`},
			// region: a column of custs alone, not in the statement's scope.
			{sql: `DELETE FROM orders o WHERE region = 'north' AND EXISTS (SELECT 1 FROM custs c WHERE c.id = o.cust)`}}},
		// NOT EXISTS: a NULL status joins no row, and a cust of NULL name none either
		// (without the subquery's IS NOT NULL, NOT IN would keep every row).
		{"not exists, correlated by one equality", []step{{sql: `UPDATE orders SET status = 'c' || cust WHERE id <= 300`},
			{sql: `UPDATE orders SET status = NULL WHERE id IN (4, 5)`}, {sql: `INSERT INTO custs VALUES (51, NULL, 'north')`},
			{sql: `DELETE FROM orders o WHERE NOT EXISTS (SELECT 1 FROM custs c WHERE c.name = o.status AND c.region <> 'west') RETURNING o.id, o.status`},
			{sql: `DELETE FROM custs WHERE id = 51`}}},
		// Joined otherwise than by one equality: EXISTS, in two steps.
		{"joined otherwise", []step{{sql: `DELETE FROM orders o USING custs c WHERE c.id < o.cust AND c.region = 'north' AND o.id > 300 RETURNING o.id`},
			{sql: `UPDATE orders o SET status = 'two' FROM custs c WHERE c.id = o.cust AND c.name <> o.status AND c.region IN ('north', 'east') RETURNING o.*`}}},
		{"delete using", []step{{sql: `DELETE FROM orders USING custs WHERE custs.id = orders.cust AND custs.name LIKE 'c1%' AND orders.amount > 100 RETURNING orders.id`}}},
		{"update from two tables, parameters", []step{{sql: `UPDATE orders o SET status = $1 FROM custs c JOIN tags t ON t.id = 1 WHERE o.cust = c.id AND c.region <> t.label AND c.region = $2`, args: []any{"p", "south"}}}},
		{"update from, in a transaction that wrote", []step{{sql: `BEGIN`}, {sql: `INSERT INTO custs VALUES (901, 'new', 'far')`},
			{sql: `INSERT INTO orders VALUES (602, 901, 'x', 1)`},
			{sql: `UPDATE orders o SET status = 'far' FROM custs c WHERE o.cust = c.id AND c.region = 'far' RETURNING o.*`},
			{sql: `DELETE FROM custs WHERE id = 901`}, {sql: `COMMIT`}}},
		// Correlated otherwise: the columns of its tables the subquery reads, first,
		// then the subquery over them in the statement.
		{"update from, the SET list from the joined table", []step{
			{sql: `UPDATE orders o SET status = c.name FROM custs c WHERE c.id = o.cust AND c.region = $1 AND o.id > 20 RETURNING o.id, o.status`, args: []any{"north"}},
			{sql: `UPDATE orders o SET status = c.region || '-' || o.status, amount = c.id * 2 + o.amount FROM custs c WHERE o.cust = c.id AND c.name <> o.status AND c.region IN ('south', 'east') RETURNING o.*`},
			// Several rows join each: every one of them gives the same value.
			{sql: `UPDATE orders o SET status = c.region FROM custs c WHERE c.id > o.cust AND c.region = 'west' AND o.id < 300 RETURNING o.id, o.status`},
			// Two other tables, joined to each other.
			{sql: `UPDATE orders o SET status = c2.name FROM custs c JOIN custs c2 ON c2.id = c.id + 1 WHERE c.id = o.cust AND c2.region = 'north' RETURNING o.id, o.status`},
			// The changed table joined to itself; a numeric taken as it is.
			{sql: `UPDATE orders o SET status = p.status || 'x', amount = p.amount FROM orders p WHERE p.cust < o.cust AND p.id = 1 RETURNING o.id, o.amount`},
			// The SET list fails on a joined pair: one database's error.
			{sql: `UPDATE orders o SET amount = 10 / (c.id - 7) FROM custs c WHERE c.id = o.cust`}}},
		{"correlated scalar", []step{{sql: `UPDATE orders o SET status = (SELECT c.name FROM custs c WHERE c.id = o.cust AND c.region <> 'west') WHERE o.id <= 300 RETURNING o.id, o.status`}}},
		{"correlated, several conditions", []step{{sql: `UPDATE orders SET status = 'c' || cust WHERE id % 3 = 0`},
			{sql: `DELETE FROM orders o WHERE EXISTS (SELECT 1 FROM custs c WHERE c.id < o.cust AND c.region = 'north' AND c.name = o.status) RETURNING o.id`},
			{sql: `DELETE FROM orders o WHERE o.id > 500 AND NOT EXISTS (SELECT * FROM custs WHERE id >= o.cust AND id <= o.id AND region <> 'east') RETURNING id`}}},
		{"correlated aggregates", []step{{sql: `UPDATE orders o SET amount = (SELECT count(*) + sum(c.id) + max(c.id) FROM custs c WHERE c.region = 'south' AND (c.id < o.cust OR c.name = o.status)) WHERE o.id < 100 RETURNING o.*`}}},
		{"correlated in, the changed table's column", []step{{sql: `DELETE FROM orders WHERE status IN (SELECT status FROM custs WHERE region = 'north')`},
			{sql: `UPDATE orders o SET status = 'q' WHERE o.cust NOT IN (SELECT c.id FROM custs c WHERE c.name LIKE 'c1%' AND c.id <> o.id) RETURNING o.id`}}},
		{"correlated, parameters", []step{{sql: `UPDATE orders o SET status = $1 WHERE o.cust = ANY (SELECT c.id FROM custs c WHERE c.region = $2 AND (c.id > o.id OR c.id < 20)) RETURNING o.id, o.status`, args: []any{"p", "north"}}}},
		// Ordered and limited (the latest row): the statement sorts the same rows. The
		// sort keys are unique here, so that one database's answer is the only right one.
		{"correlated, ordered and limited", []step{{sql: `UPDATE orders o SET status = (SELECT c.name FROM custs c WHERE c.id < o.cust AND c.region <> 'west' ORDER BY c.id DESC LIMIT 1) WHERE o.id <= 300 RETURNING o.id, o.status`},
			{sql: `UPDATE orders o SET amount = (SELECT c.id FROM custs c WHERE c.region = 'north' AND c.id > o.cust ORDER BY c.name DESC NULLS FIRST, c.id OFFSET 1 FETCH FIRST 1 ROW ONLY) WHERE o.id > 400 RETURNING o.*`},
			{sql: `DELETE FROM orders o WHERE o.cust IN (SELECT c.id FROM custs c WHERE c.region <> o.status ORDER BY c.region, c.id LIMIT 3) RETURNING o.id`},
			{sql: `DELETE FROM orders o WHERE o.id > 590 AND NOT EXISTS (SELECT 1 FROM custs c WHERE c.id = o.cust LIMIT 0) RETURNING o.id`}}},
		// One database raises 21000 when it evaluates a scalar subquery of two rows: so
		// does the statement, which evaluates it.
		{"correlated, values computed over the subquery's tables", []step{
			{sql: `UPDATE orders o SET status = (SELECT c.name || '/' || c.region FROM custs c WHERE c.id = o.cust AND c.region <> 'west') WHERE o.id <= 300 RETURNING o.id, o.status`},
			{sql: `UPDATE orders o SET amount = (SELECT sum(c.id * 2 + 1) + count(DISTINCT c.region || 'x') + max(CASE WHEN c.region = 'north' THEN c.id END) FROM custs c WHERE c.id < o.cust) WHERE o.id < 100 RETURNING o.*`}}},
		{"correlated, grouped", []step{
			{sql: `DELETE FROM orders o WHERE o.id > 550 AND EXISTS (SELECT 1 FROM custs c WHERE c.id < o.cust GROUP BY c.region HAVING count(*) > 10) RETURNING o.id`},
			{sql: `UPDATE orders o SET status = (SELECT max(c.name) FROM custs c WHERE c.id < o.cust GROUP BY c.region HAVING c.region = 'north' AND count(*) > 2) WHERE o.id <= 300 RETURNING o.id, o.status`},
			{sql: `UPDATE orders o SET status = 'grp' WHERE o.id < 200 AND 'north' IN (SELECT c.region FROM custs c WHERE c.id < o.cust GROUP BY c.region HAVING count(*) >= 3) RETURNING o.id`},
			{sql: `UPDATE orders o SET amount = (SELECT count(*) FROM custs c WHERE c.id < o.cust GROUP BY c.region) WHERE o.id < 5`},
			// A numeric group key compared by ALL: any of equal values answers alike.
			{sql: `UPDATE custs c SET name = c.name || '+' WHERE c.id < ALL (SELECT o.amount FROM orders o WHERE o.cust = c.id AND o.amount > 30 GROUP BY o.amount) RETURNING c.id, c.name`}}},
		{"correlated, PostgreSQL's functions", []step{
			{sql: `UPDATE orders o SET amount = (SELECT round(avg(c.id), 1) + abs(min(c.id - 50)) + length(o.status) FROM custs c WHERE c.id < o.cust) WHERE o.id < 100 RETURNING o.*`},
			{sql: `UPDATE orders o SET status = (SELECT upper(c.name) || length(c.region) FROM custs c WHERE c.id < o.cust ORDER BY lower(c.region) DESC, c.id % 5, c.id LIMIT 1) WHERE o.id <= 300 RETURNING o.id, o.status`}}},
		{"correlated, ordered by a bare name", []step{
			{sql: `UPDATE orders o SET status = (SELECT c.name AS name FROM custs c WHERE c.id < o.cust AND c.region <> 'west' ORDER BY name DESC LIMIT 1) WHERE o.id <= 300 RETURNING o.id, o.status`},
			{sql: `UPDATE orders o SET amount = (SELECT c.id * 2 FROM custs c WHERE c.id < o.cust ORDER BY name LIMIT 1) WHERE o.id > 300 RETURNING o.*`}}},
		{"correlated scalar of several rows", []step{{sql: `UPDATE orders o SET amount = (SELECT c.id FROM custs c WHERE c.id > o.cust) WHERE o.id < 5`},
			{sql: `UPDATE orders o SET amount = (SELECT c.id FROM custs c WHERE c.id > o.cust) WHERE o.id = 49`}}},
		// The same shape with other literals: each statement's own (a plan is shared
		// by every text of its shape).
		{"one shape, two texts", []step{{sql: `DELETE FROM orders WHERE id < 100 AND cust IN (SELECT id FROM custs WHERE region = 'north')`},
			{sql: `DELETE FROM orders WHERE id < 300 AND cust IN (SELECT id FROM custs WHERE region = 'south')`}}},
		{"a transaction sees its own writes", []step{{sql: `BEGIN`}, {sql: `INSERT INTO custs VALUES (900, 'new', 'far')`},
			{sql: `INSERT INTO orders VALUES (601, 900, 'x', 1)`},
			{sql: `DELETE FROM orders WHERE cust IN (SELECT id FROM custs WHERE region = 'far') RETURNING *`},
			{sql: `DELETE FROM custs WHERE id = 900`}, {sql: `COMMIT`}}},
	}
	modes := []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec}
	reset := func(c *pgx.Conn) {
		exec1(t, c, `TRUNCATE orders`)
		exec1(t, c, `INSERT INTO orders SELECT g, g % 53, 'new', g * 1.5 FROM generate_series(1, 600) g`)
	}
	for _, c := range cases {
		for _, mode := range modes {
			pc := px
			if mode == pgx.QueryExecModeSimpleProtocol {
				pc = simple
			}
			reset(one)
			reset(pc)
			for _, st := range c.steps {
				if mode == pgx.QueryExecModeSimpleProtocol && len(st.args) > 0 {
					continue
				}
				want, got := rows(one, mode, st.sql, st.args...), rows(pc, mode, st.sql, st.args...)
				if got != want {
					t.Errorf("%s (%v): %s\n  one database: %.300s\n  proxy:        %.300s", c.name, mode, st.sql, want, got)
				}
			}
			q := `SELECT * FROM orders ORDER BY id`
			if want, got := rows(one, mode, q), rows(pc, mode, q); got != want {
				t.Errorf("%s (%v): the rows afterwards differ\n  one database: %.300s\n  proxy:        %.300s", c.name, mode, want, got)
			}
		}
	}

	// UPDATE ... FROM where each row joins several rows of different values: one
	// database takes one of them, which it does not define; so does the proxy, the
	// same row for every item of the SET list, and it changes the same rows.
	joinedSeveral := `UPDATE orders o SET status = c.region, amount = c.id FROM custs c WHERE c.id > o.cust AND c.region <> 'west'`
	reset(one)
	reset(px)
	exec1(t, one, joinedSeveral)
	exec1(t, px, joinedSeveral)
	changed := `SELECT count(*) FROM orders WHERE status <> 'new'`
	if want, got := queryInt(t, one, changed), queryInt(t, px, changed); want == 0 || got != want {
		t.Errorf("%s: %d rows changed, want %d", joinedSeveral, got, want)
	}
	if n := queryInt(t, px, `SELECT count(*) FROM orders o WHERE o.status <> 'new' AND NOT EXISTS (SELECT 1 FROM custs c WHERE c.region = o.status AND c.id = o.amount AND c.id > o.cust AND c.region <> 'west')`); n != 0 {
		t.Errorf("%s: %d rows took their values from no one joined row", joinedSeveral, n)
	}

	// Refused, changing nothing: a correlated subquery not of the shape evaluated in
	// two steps, a scalar subquery of several rows (one database raises 21000 only if
	// it evaluates it), and a subquery only the coordinator answers inside a
	// transaction block.
	reset(px)
	for _, q := range []string{
		// Ordered and limited: by an expression that fails when computed first (22012
		// on a row one database may never sort); by a bare name that reads the output
		// column o.id (every row ties: 21000 on one database); a numeric selected and
		// sorted by (max, whose equal 1.0 and 1.00 differ).
		`UPDATE orders o SET amount = (SELECT c.id FROM custs c WHERE c.id < o.cust ORDER BY c.id / (c.id - 1) DESC LIMIT 1)`,
		`UPDATE orders o SET amount = (SELECT o.id FROM custs c WHERE c.id > o.cust ORDER BY id FETCH FIRST 1 ROW WITH TIES) WHERE o.id < 5`,
		`UPDATE orders o SET amount = (SELECT p.amount FROM orders p WHERE p.cust < o.cust ORDER BY p.amount DESC LIMIT 1)`,
		`UPDATE orders o SET status = (SELECT to_char(c.id, '9G999') FROM custs c WHERE c.id = o.cust)`,           // a function that reads the session's settings, called first
		`UPDATE orders o SET status = (SELECT c.name FROM custs c WHERE c.id < o.cust ORDER BY random() LIMIT 1)`, // a volatile sort key
		`UPDATE orders o SET amount = (SELECT sum(c.id::float8) FROM custs c WHERE c.id < o.cust)`,                // floats added in another order
		`UPDATE orders o SET status = (SELECT c.label FROM tags c WHERE c.id = o.cust)`,                           // a collation of the column's own
		`UPDATE orders o SET amount = (SELECT max(p.amount) FROM orders p WHERE p.cust = o.cust - 1)`,             // max of 1.0 and 1.00: the later one
		`UPDATE orders o SET amount = (SELECT c.id FROM custs c WHERE c.id = o.cust AND c.id / (c.id - 1) > 0)`,   // a condition that may fail
		// A domain's value, read as its base type's, would be checked again where
		// assigned (NULL into a NOT NULL domain: 23502), where one database does not.
		`UPDATE dtab SET d = (SELECT d.d FROM dtab d WHERE d.id = dtab.id + 100)`,
		`UPDATE dtab SET d = (SELECT d FROM dtab WHERE id = -1)`,
		`UPDATE orders SET amount = (SELECT id FROM custs) WHERE id = 1`,
		// A collation the subquery's column carries, which a parameter would not.
		`UPDATE orders SET status = 'x' WHERE status IN (SELECT label FROM tags)`,
		`UPDATE orders SET status = 'x' WHERE status IN (SELECT name COLLATE "C" FROM custs)`,
		// The other tables read elsewhere, or joined by a condition that may fail.
		`UPDATE orders o SET amount = (SELECT sum(c.id ^ 2) FROM custs c WHERE c.id < o.cust)`, // a computed float added in another order
		// A value computed over a column sorted by under a limit: a numeric (1.0 and 1.00 tie).
		`UPDATE orders o SET status = (SELECT (p.amount + 0)::text FROM orders p WHERE p.cust < o.cust ORDER BY p.amount LIMIT 1)`,
		`UPDATE orders o SET status = (SELECT c.name FROM custs c WHERE c.id = o.cust GROUP BY c.id)`,                            // one database reads c.name through c.id, the primary key
		`UPDATE orders o SET amount = (SELECT 1 / (count(*) - 2) FROM custs c WHERE c.id < o.cust GROUP BY c.region)`,            // computed per group, in the groups' order
		`UPDATE orders o SET amount = (SELECT abs(p.amount) FROM orders p WHERE p.cust < o.cust ORDER BY abs(p.amount) LIMIT 1)`, // min(abs(p.amount)) in another form
		`UPDATE orders o SET status = (SELECT c.name FROM custs c WHERE c.id < o.cust ORDER BY c.name::name LIMIT 1)`,            // a name array's elements sort under C
		`UPDATE orders o SET amount = (SELECT 10 / (c.id - 7) FROM custs c WHERE c.id = o.cust)`,                                 // computed first: 22012 on a row one database may never read
		`UPDATE orders o SET status = lower(c.name) FROM custs c WHERE c.id = o.cust`,                                            // a function, maybe volatile
		`UPDATE orders o SET status = DEFAULT FROM custs c WHERE c.id < o.cust`,                                                  // a default (nextval) once per joined pair
		`UPDATE orders o SET status = c.name FROM custs c WHERE c.id = o.cust RETURNING c.region`,                                // numeric(12,2) would lose its modifier
		`UPDATE orders o SET status = c.label FROM tags c WHERE c.id = o.cust`,                                                   // a collation of the column's own
		`UPDATE orders o SET id = c.id FROM custs c WHERE c.id = o.cust`,                                                         // the sharding key
		`UPDATE orders o SET status = c.name FROM custs c WHERE o.cust = c.id + 0`,                                               // the join compares an expression
		`DELETE FROM orders o USING custs c WHERE c.id < o.cust AND c.region = 'north' AND o.amount / (c.id - 1) > 0`,            // a condition that may fail
	} {
		for _, mode := range modes {
			_, err := px.Exec(ctx, q, mode)
			if sqlState(err) != "0A000" {
				t.Errorf("%s (%v): %v, want 0A000", q, mode, err)
			}
		}
	}
	// A subquery only the coordinator answers, in a transaction block: read first, where
	// the transaction has written nothing yet; after a write, refused naming it.
	coordinatedDelete := `DELETE FROM orders WHERE cust IN (SELECT c.id FROM custs c JOIN orders o ON o.cust = c.id WHERE o.amount > 800)`
	exec1(t, px, `BEGIN`)
	if _, err = px.Exec(ctx, coordinatedDelete); err != nil {
		t.Errorf("a coordinated subquery in a transaction block that has not written: %v", err)
	}
	exec1(t, px, `ROLLBACK`)
	exec1(t, px, `BEGIN`)
	exec1(t, px, `UPDATE orders SET status = status WHERE id = 1`)
	_, err = px.Exec(ctx, coordinatedDelete)
	if sqlState(err) != "0A000" || !strings.Contains(err.Error(), "wrote") {
		t.Errorf("a coordinated subquery in a transaction block that wrote: %v, want 0A000 naming the write", err)
	}
	exec1(t, px, `ROLLBACK`)
	// A correlated subquery inside a transaction block: refused, and the transaction
	// has failed, as one database's would with its error.
	exec1(t, px, `BEGIN`)
	if _, err = px.Exec(ctx, `DELETE FROM orders o WHERE o.cust = (SELECT c.id FROM custs c WHERE c.id < o.cust ORDER BY c.id DESC LIMIT 1)`); sqlState(err) != "0A000" {
		t.Errorf("a correlated subquery in a transaction block: %v, want 0A000", err)
	}
	if _, err = px.Exec(ctx, `SELECT 1`); sqlState(err) != "25P02" {
		t.Errorf("after the refusal in a transaction block: %v, want 25P02", err)
	}
	exec1(t, px, `ROLLBACK`)
	if _, err = px.Exec(ctx, `DELETE FROM orders WHERE cust IN (SELECT nosuch FROM custs)`); sqlState(err) != "42703" {
		t.Errorf("an invalid subquery after the rollback: %v, want 42703", err)
	}
	// * beside GROUP BY names columns no key holds: one database's 42803, not an
	// EXISTS answered as if its select list were never read.
	if _, err = px.Exec(ctx, `DELETE FROM orders o WHERE EXISTS (SELECT * FROM custs c WHERE c.id < o.cust GROUP BY c.region)`); sqlState(err) != "42803" {
		t.Errorf("EXISTS (SELECT * ... GROUP BY): %v, want 42803", err)
	}
	if n := queryInt(t, px, `SELECT count(*) FROM orders WHERE status = 'new' AND amount = id * 1.5`); n != 600 {
		t.Errorf("%d of 600 rows unchanged after the refusals", n)
	}

	// A subquery's rows are held within --max-held-memory.
	small := startProxyOn(t, shardedRules(dsns, []string{"orders=id", "custs=id", "tags=id"}, nil), func(c *proxy.Config) { c.MaxHeld = 1000 })
	if _, err := small.connect(t).Exec(ctx, `DELETE FROM orders WHERE cust IN (SELECT id FROM custs)`); sqlState(err) != "54000" {
		t.Errorf("a subquery over the bound: %v, want 54000", err)
	}
	if n := queryInt(t, px, `SELECT count(*) FROM orders`); n != 600 {
		t.Errorf("%d of 600 rows after a statement over the bound", n)
	}

	// The route preview shows the steps.
	adm, err := pgconn.Connect(ctx, strings.Replace(e.url(""), "/"+testDatabase+"?", "/shardlab?", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close(ctx)
	showRoute := func(q string) string {
		res, err := adm.Exec(ctx, "SHOW ROUTE "+q).ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		var route string
		for _, r := range res[0].Rows {
			route += string(r[0]) + "\n"
		}
		return route
	}
	route := showRoute(`DELETE FROM orders WHERE cust IN (SELECT id FROM custs WHERE region = 'north')`)
	if !strings.Contains(route, "delete in steps") || !strings.Contains(route, "$1 (array of values): SELECT id FROM custs WHERE region = 'north'") ||
		!strings.Contains(route, "then: DELETE FROM orders WHERE cust = ANY($1)") {
		t.Errorf("route preview:\n%s", route)
	}
	route = showRoute(`UPDATE orders o SET status = (SELECT c.name FROM custs c WHERE c.id = o.cust)`)
	if !strings.Contains(route, "$1 ... $2 (arrays of the columns a correlated subquery reads): SELECT c.name, c.id FROM custs c") ||
		!strings.Contains(route, "then: UPDATE orders o SET status = (SELECT shardlab_pre.shardlab_1 FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) ) shardlab_pre(shardlab_1, shardlab_2) WHERE shardlab_pre.shardlab_2 = o.cust)") {
		t.Errorf("route preview of a correlated subquery:\n%s", route)
	}
	route = showRoute(`UPDATE orders o SET status = c.name FROM custs c WHERE c.id = o.cust`)
	if !strings.Contains(route, "$1 ... $2 (arrays of the columns of the rows the statement joins): SELECT c.name, c.id FROM custs c") {
		t.Errorf("route preview of UPDATE ... FROM over rows read first:\n%s", route)
	}

	// Once the database defines a function named as one of PostgreSQL's (upper of an
	// int, volatile), no value that calls one is computed first: an answered statement
	// is refused; dropped, it is answered again.
	reset(px)
	upper := `UPDATE orders o SET status = (SELECT upper(c.name) FROM custs c WHERE c.id = o.cust) WHERE o.id < 100`
	exec1(t, px, upper)
	exec1(t, px, `CREATE FUNCTION upper(int) RETURNS int LANGUAGE sql VOLATILE AS 'SELECT $1'`)
	if _, err := px.Exec(ctx, upper); sqlState(err) != "0A000" {
		t.Errorf("%s, with an upper of the user's: %v, want 0A000", upper, err)
	}
	exec1(t, px, `DROP FUNCTION upper(int)`)
	exec1(t, px, upper)

	// Once the database defines an operator of its own (a volatile function that
	// writes), no value is computed first: the same statement that was answered above
	// is refused, and so is one that calls the operator.
	reset(px)
	computedSum := `UPDATE orders o SET amount = (SELECT sum(c.id * 2 + 1) FROM custs c WHERE c.id < o.cust) WHERE o.id < 100`
	exec1(t, px, computedSum)
	exec1(t, px, `CREATE FUNCTION bump(int, int) RETURNS int LANGUAGE sql VOLATILE AS 'SELECT $1 + $2'`)
	exec1(t, px, `CREATE OPERATOR ### (FUNCTION = bump, LEFTARG = int, RIGHTARG = int)`)
	for _, q := range []string{computedSum, `UPDATE orders o SET amount = (SELECT sum(c.id ### 2) FROM custs c WHERE c.id < o.cust) WHERE o.id < 4`} {
		if _, err := px.Exec(ctx, q); sqlState(err) != "0A000" {
			t.Errorf("%s, with an operator of the user's: %v, want 0A000", q, err)
		}
	}
}
