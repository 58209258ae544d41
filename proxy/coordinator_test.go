package proxy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/sqldiff"
	"github.com/shardlab/shardlab/proxy"
)

// coordinated makes a layout's databases, serves a proxy with the coordinator over
// them, loads the suite's data through it and returns the environment and a runner
// that speaks to the proxy.
func coordinated(t *testing.T, layout sqldiff.Layout, options string) (*sqldiff.Env, *env, sqldiff.PgConnRunner) {
	t.Helper()
	suite := sqldiff.NewEnv(t, layout, options)
	e := startProxyOn(t, suite.Rules.Rules(), withCoordinator())
	conn, err := pgconn.Connect(context.Background(), e.url(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	r := sqldiff.PgConnRunner{Conn: conn}
	suite.Load(t, r)
	return suite, e, r
}

// runCoordinatedDifferential is runDifferential with the coordinator database on: the
// queries the merge must refuse may now be answered, and each answer must equal the
// unsharded database's in every protocol form.
func runCoordinatedDifferential(t *testing.T, layout sqldiff.Layout, options string) {
	env, _, r := coordinated(t, layout, options)
	env.Coordinated = true
	queries := append(sqldiff.Queries(), sqldiff.Random(uint64(len(layout.Name)), 60)...)
	mustRefuse := 0
	for _, q := range queries {
		if q.Refused {
			mustRefuse++
		}
	}
	reads := env.RunReads(t, r, queries)
	if reads.Coordinated == 0 {
		t.Errorf("the coordinator answered none of the %d queries the merge refuses", mustRefuse)
	}
	t.Logf("%s through the proxy with the coordinator: %d reads, %d answered equal (%d of the %d the merge refuses), %d refused",
		layout.Name, reads.Total, reads.Equal, reads.Coordinated, mustRefuse, reads.Refused)

	// Generated joins, subqueries, CTEs, set operations and window functions: every
	// answer equal to one database's, and the share answered reported.
	generated := append(sqldiff.RandomShapes(uint64(len(layout.Name))+21, randomShapes), sqldiff.RandomJoinAggregates(uint64(len(layout.Name)), 20)...)
	for _, q := range generated {
		// An error both sides raise alike would count as answered: none may have one.
		if _, err := env.Ref.Simple(context.Background(), q.SQL); err != nil {
			t.Errorf("generated query fails on one database: %s: %v", q.SQL, err)
		}
	}
	shapes := env.RunReads(t, r, generated)
	// The same shapes without the coordinator, in one protocol form: what the merge
	// alone answers.
	plain := startProxyOn(t, env.Rules.Rules())
	conn, err := pgconn.Connect(context.Background(), plain.url(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	merge := *env
	merge.Coordinated, merge.Modes = false, []string{"simple"}
	alone := merge.RunReads(t, sqldiff.PgConnRunner{Conn: conn}, generated)
	t.Logf("%s generated shapes: %d of %d answered (%.0f%%), every answer equal to one database's, %d refused; the merge alone answers %d",
		layout.Name, shapes.Equal, shapes.Total, 100*float64(shapes.Equal)/float64(shapes.Total), shapes.Refused, alone.Equal)
	if shapes.Equal < shapes.Total*85/100 || alone.Equal >= shapes.Equal {
		t.Errorf("%d of %d generated shapes answered, %d by the merge alone", shapes.Equal, shapes.Total, alone.Equal)
	}
}

// randomShapes is how many generated queries each layout's coordinated differential
// runs: 80, or SHARDLAB_RANDOM_SHAPES for a longer search.
var randomShapes = func() int {
	if n, err := strconv.Atoi(os.Getenv("SHARDLAB_RANDOM_SHAPES")); err == nil && n > 0 {
		return n
	}
	return 80
}()

// TestCoordinatorDifferential: the differential suite through the proxy with the
// coordinator database, in the layouts of TestDifferentialThroughTheWire (pghash
// tables as hash partitions, crc32, mod and range tables as views, a broadcast table,
// 2 databases x 2 tables) and under ICU's en-US collation.
func TestCoordinatorDifferential(t *testing.T) {
	for _, layout := range sqldiff.Layouts() {
		t.Run(layout.Name, func(t *testing.T) { runCoordinatedDifferential(t, layout, "") })
	}
	t.Run("3shards-icu", func(t *testing.T) { runCoordinatedDifferential(t, sqldiff.ICULayout(), sqldiff.ICUOptions) })
	t.Run("4schemas", func(t *testing.T) { runCoordinatedDifferential(t, sqldiff.SchemaLayout(), "") })
}

// TestCoordinatorInSessionPooling: in session pooling a client keeps its connections
// to the data sources, but not the coordinator's few: with one, two clients in turn
// are both answered.
func TestCoordinatorInSessionPooling(t *testing.T) {
	layout := sqldiff.Layouts()[1]
	suite := sqldiff.NewEnv(t, layout, "")
	e := startProxyOn(t, suite.Rules.Rules(), withCoordinator(), withSessionPooling(), func(c *proxy.Config) {
		c.CoordinatorPoolSize = 1
		c.Pool.CheckoutTimeout = 2 * time.Second
	})
	ctx := context.Background()
	first := sqldiff.PgConnRunner{Conn: e.pgconnect(t)}
	suite.Load(t, first)
	second := sqldiff.PgConnRunner{Conn: e.pgconnect(t)}
	q := sqldiff.Query{SQL: `SELECT count(DISTINCT status) FROM t_order`}
	for i, runner := range []sqldiff.PgConnRunner{first, second, first} {
		if sqldiff.Compare(ctx, t, fmt.Sprintf("client %d", i%2), q, suite.Ref, runner, "simple", layout.ByteOrder) {
			t.Errorf("client %d refused", i%2)
		}
	}
}

// coordinatedQueries are the statements a new user found refused over 2 shards
// (issue 21), each compared with one database.
var coordinatedQueries = []sqldiff.Query{
	{SQL: `SELECT coalesce(sum(amount), 0) FROM t_order`},
	{SQL: `SELECT sum(order_id) + 1 FROM t_order`},
	{SQL: `SELECT round(avg(amount), 2) FROM t_order`},
	{SQL: `SELECT count(*)::int FROM t_order`},
	{SQL: `WITH t AS (SELECT order_id FROM t_order) SELECT count(*) FROM t`},
	{SQL: `SELECT count(*) FROM t_order WHERE order_id IN (SELECT order_id FROM t_order WHERE status = 'paid')`},
	{SQL: `SELECT count(DISTINCT status) FROM t_order`},
	{SQL: `SELECT order_id, rank() OVER (ORDER BY amount DESC NULLS LAST, order_id) FROM t_order ORDER BY 2, 1 LIMIT 20`, Ordered: true},
	{SQL: `SELECT u.city, count(*) FROM t_order o JOIN t_user u ON u.user_id = o.user_id GROUP BY u.city ORDER BY 1 NULLS FIRST`, Ordered: true},
	{SQL: `SELECT status, sum(qty) FILTER (WHERE qty > 2), string_agg(code, ',' ORDER BY order_id) FROM t_order GROUP BY status ORDER BY status COLLATE "C" NULLS FIRST`, Ordered: true},
	{SQL: `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY amount) FROM t_order`},
	{SQL: `SELECT status, count(*) FROM t_order GROUP BY ROLLUP (status) HAVING count(*) > 3 ORDER BY status COLLATE "C" NULLS FIRST, 2`, Ordered: true},
	{SQL: `SELECT DISTINCT ON (user_id) user_id, order_id FROM t_order ORDER BY user_id, order_id DESC`, Ordered: true},
	{SQL: `SELECT user_id FROM t_order INTERSECT SELECT user_id FROM t_user ORDER BY 1`, Ordered: true},
	{SQL: `SELECT order_id FROM t_order ORDER BY qty DESC NULLS LAST FETCH FIRST 3 ROWS WITH TIES`},
	{SQL: `SELECT o.order_id, (SELECT max(i.price) FROM t_order_item i WHERE i.sku = o.note) FROM t_order o ORDER BY 1 LIMIT 30`, Ordered: true},
	{SQL: `SELECT c.k, count(o.order_id) FROM t_config c LEFT JOIN t_order o ON o.status = c.v GROUP BY c.k ORDER BY 1`, Ordered: true},
	{SQL: `SELECT count(*) FROM t_order WHERE user_id = $1 AND amount > (SELECT avg(amount) FROM t_order)`, Params: sqldiff.P("3")},
}

// TestCoordinatorAnswersWhatTheMergeRefuses: the statements of issue 21's report come
// back identical to one database's through the proxy over 2 databases x 2 tables, in
// the simple protocol and the extended one with text and binary results; without the
// coordinator each is refused with 0A000.
func TestCoordinatorAnswersWhatTheMergeRefuses(t *testing.T) {
	layout := sqldiff.Layouts()[0]
	env, _, r := coordinated(t, layout, "")
	plain := startProxyOn(t, env.Rules.Rules())
	ctx := context.Background()
	plainConn, err := pgconn.Connect(ctx, plain.url(""))
	if err != nil {
		t.Fatal(err)
	}
	defer plainConn.Close(ctx)
	for i, q := range coordinatedQueries {
		for _, mode := range sqldiff.Modes {
			if refused := sqldiff.Compare(ctx, t, "coordinated", q, env.Ref, r, mode, layout.ByteOrder); refused {
				t.Errorf("query %d [%s] refused with the coordinator: %s", i, mode, q.SQL)
			}
		}
		_, err := sqldiff.PgConnRunner{Conn: plainConn}.Simple(ctx, sqldiff.Inline(q.SQL, q.Params))
		if sqlState(err) != "0A000" {
			t.Errorf("query %d without the coordinator: %v, want a 0A000 refusal (else it proves nothing here): %s", i, err, q.SQL)
		}
	}
}

// TestCoordinatorInTransactionBlocks: inside a READ COMMITTED transaction block that has
// not written, the coordinator answers as one database does, each statement seeing the
// rows committed when it starts, and the transaction goes on to write and commit. A
// transaction that wrote (whose writes the coordinator could not see), one of another
// isolation level, one that ran SET LOCAL, and one holding a lock that keeps readers
// out get 0A000 naming why. Up to this change every coordinated read in a transaction
// block was refused.
func TestCoordinatorInTransactionBlocks(t *testing.T) {
	layout := sqldiff.Layouts()[0]
	env, e, r := coordinated(t, layout, "")
	ctx := context.Background()
	run := func(sql string) {
		t.Helper()
		if _, err := r.Simple(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		if _, err := env.Ref.Simple(ctx, sql); err != nil {
			t.Fatalf("one database: %s: %v", sql, err)
		}
	}
	for _, begin := range []string{"BEGIN", "START TRANSACTION ISOLATION LEVEL READ COMMITTED, READ ONLY"} {
		run(begin)
		// A read on one shard first: the transaction then spans a data source already.
		run(`SELECT status FROM t_order WHERE order_id = 1`)
		for i, q := range coordinatedQueries {
			for _, mode := range sqldiff.Modes {
				if sqldiff.Compare(ctx, t, begin, q, env.Ref, r, mode, layout.ByteOrder) {
					t.Fatalf("query %d [%s] refused in a transaction block (%s): %s", i, mode, begin, q.SQL)
				}
			}
		}
		run("COMMIT")
	}

	counted := `SELECT count(DISTINCT status), count(*) FROM t_order WHERE order_id > 0`
	count := func() string {
		t.Helper()
		a, err := r.Simple(ctx, counted)
		if err != nil || len(a.Rows) != 1 {
			t.Fatalf("%s: %v", counted, err)
		}
		return string(a.Rows[0][0]) + "/" + string(a.Rows[0][1])
	}
	// Each statement sees what others committed before it started, as READ COMMITTED
	// does; the transaction then writes and commits, the coordinator no part of it.
	other := sqldiff.PgConnRunner{Conn: e.pgconnect(t)}
	if _, err := r.Simple(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	before := count()
	if _, err := other.Simple(ctx, `INSERT INTO t_order (order_id, user_id, status) VALUES (900001, 1, 'in-tx-status')`); err != nil {
		t.Fatal(err)
	}
	after := count()
	if after == before {
		t.Errorf("a coordinated read in a transaction block did not see a row committed before it: %s, then %s", before, after)
	}
	if _, err := r.Simple(ctx, `UPDATE t_order SET note = 'seen' WHERE order_id = 900001`); err != nil {
		t.Fatal(err)
	}
	// Written: the coordinator would not see the write.
	if _, err := r.Simple(ctx, counted); sqlState(err) != "0A000" || !strings.Contains(err.Error(), "wrote") {
		t.Errorf("after a write in the transaction: %v, want 0A000 naming the write", err)
	}
	if _, err := r.Simple(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Simple(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	count()
	if _, err := r.Simple(ctx, `UPDATE t_order SET note = 'seen' WHERE order_id = 900001`); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Simple(ctx, "COMMIT"); err != nil {
		t.Fatalf("COMMIT after a coordinated read: %v", err)
	}
	if a, err := other.Simple(ctx, `SELECT note FROM t_order WHERE order_id = 900001`); err != nil || len(a.Rows) != 1 || string(a.Rows[0][0]) != "seen" {
		t.Errorf("the write after a coordinated read was not committed: %v", err)
	}
	if _, err := other.Simple(ctx, `DELETE FROM t_order WHERE order_id = 900001`); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		setup []string
		want  string
	}{
		{[]string{"BEGIN ISOLATION LEVEL REPEATABLE READ"}, "REPEATABLE READ"},
		{[]string{"BEGIN", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"}, "SET LOCAL"},
		{[]string{"BEGIN", "SET LOCAL TimeZone = 'Asia/Kathmandu'"}, "SET LOCAL"},
		{[]string{"BEGIN", "SELECT order_id FROM t_order WHERE order_id = 1 FOR UPDATE"}, "wrote (or locked rows)"},
		{[]string{"BEGIN", "LOCK TABLE t_config IN ACCESS EXCLUSIVE MODE"}, "lock"}, // with wal_level replica the lock takes a transaction id too
	} {
		for _, sql := range c.setup {
			if _, err := r.Simple(ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		if _, err := r.Simple(ctx, counted); sqlState(err) != "0A000" || !strings.Contains(err.Error(), c.want) {
			t.Errorf("after %q: %v, want 0A000 naming %q", c.setup, err, c.want)
		}
		if _, err := r.Simple(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
	}
	// A statement that fails gets the error it gets outside a transaction block (never
	// 25P02 from the coordinator's own failure), and the transaction has failed, as on
	// one database.
	bad := `SELECT count(*) FROM t_order o JOIN t_user u ON u.city = o.no_such_column`
	_, outside := r.Simple(ctx, bad)
	if _, err := r.Simple(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Simple(ctx, bad); sqlState(err) == "" || sqlState(err) != sqlState(outside) {
		t.Errorf("a failing statement in a transaction block: %v; outside one: %v", err, outside)
	}
	if _, err := r.Simple(ctx, counted); sqlState(err) != "25P02" {
		t.Errorf("after the failure: %v, want 25P02", err)
	}
	if _, err := r.Simple(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	// Another session waiting for a lock the transaction holds (a LOCK TABLE, queued
	// behind the transaction's read): the coordinator's reads would queue behind it,
	// a wait no deadlock detector sees. Refused; the other session goes on once the
	// transaction ends.
	if _, err := r.Simple(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Simple(ctx, `SELECT status FROM t_order WHERE order_id = 1`); err != nil {
		t.Fatal(err)
	}
	locker := sqldiff.PgConnRunner{Conn: e.pgconnect(t)}
	if _, err := locker.Simple(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	locked := make(chan error, 1)
	go func() {
		_, err := locker.Simple(ctx, `LOCK TABLE t_order IN ACCESS EXCLUSIVE MODE`)
		locked <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		a, err := env.Ref.Simple(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND mode = 'AccessExclusiveLock'`)
		if err != nil {
			t.Fatal(err)
		}
		if string(a.Rows[0][0]) != "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the LOCK TABLE never waited for the transaction's read")
		}
	}
	if _, err := r.Simple(ctx, counted); sqlState(err) != "0A000" || !strings.Contains(err.Error(), "waits for a lock") {
		t.Errorf("with another session waiting for the transaction's lock: %v, want 0A000 naming the wait", err)
	}
	if _, err := r.Simple(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; err != nil {
		t.Fatalf("the waiting LOCK TABLE: %v", err)
	}
	if _, err := locker.Simple(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}

	// An implicit transaction (several statements in one query string) that wrote is
	// refused alike, and its write is undone with it.
	if _, err := r.Simple(ctx, `UPDATE t_order SET note = 'implicit' WHERE order_id = 1; `+counted); sqlState(err) != "0A000" {
		t.Errorf("an implicit transaction that wrote: %v, want 0A000", err)
	}
	if a, err := r.Simple(ctx, `SELECT count(*) FROM t_order WHERE note = 'implicit'`); err != nil || string(a.Rows[0][0]) != "0" {
		t.Errorf("the refused implicit transaction's write stayed: %v", err)
	}
}

// TestCoordinatorStaysExact: what the coordinator cannot answer as one database would
// stays refused, and its errors are one database's.
func TestCoordinatorStaysExact(t *testing.T) {
	layout := sqldiff.Layouts()[1] // 3 shards, one table each: the default data source holds every logical name
	suite, e, r := coordinated(t, layout, "")
	env := suite
	ctx := context.Background()
	refused := []string{
		// A float summed in another order of rows than one database's.
		`SELECT sum(weight) + 1 FROM t_order`,
		`SELECT avg(x) FROM (SELECT weight AS x FROM t_order) s`,
		`WITH w AS (SELECT order_id, weight::float8 AS v FROM t_order) SELECT count(*), sum(v) OVER () FROM w GROUP BY v`,
		// The coordinator's own session is not the client's.
		`SELECT current_database(), count(DISTINCT status) FROM t_order`,
		// Locks and writes are the shards' own connections' business.
		`SELECT o.order_id FROM t_order o JOIN t_user u ON u.user_id = o.user_id FOR UPDATE`,
	}
	for _, sql := range refused {
		_, err := r.Simple(ctx, sql)
		if sqlState(err) != "0A000" {
			t.Errorf("%s: %v, want 0A000", sql, err)
		}
	}
	// A GROUP BY of a primary key selecting other columns is valid on one database
	// (functional dependency) but not on the coordinator, whose tables have no keys:
	// refused, never the coordinator's grouping error.
	fd := `SELECT o.order_id, o.status, count(i.item_id) FROM t_order o JOIN t_order_item i ON i.sku = o.note GROUP BY o.order_id ORDER BY 1 LIMIT 5`
	_, refErr := env.Ref.Simple(ctx, fd)
	if refErr != nil {
		t.Fatalf("one database: %v", refErr)
	}
	if _, err := r.Simple(ctx, fd); sqlState(err) != "0A000" {
		t.Errorf("%s: %v, want 0A000", fd, err)
	}
	for _, binary := range []bool{false, true} {
		// Drivers describe a statement before they run it: the description's error is
		// checked as the statement's.
		if _, err := r.Extended(ctx, fd, nil, binary); sqlState(err) != "0A000" {
			t.Errorf("%s (extended, binary %v): %v, want 0A000", fd, binary, err)
		}
	}
	// COPY of such a query: the coordinator writes every byte.
	copied := `COPY (SELECT o.order_id, u.name FROM t_order o JOIN t_user u ON u.user_id = o.user_id ORDER BY 1, 2) TO STDOUT`
	var want, got bytes.Buffer
	if _, err := e.pgconnect(t).CopyTo(ctx, &got, copied); err != nil {
		t.Fatalf("%s: %v", copied, err)
	}
	refConn, err := pgconn.Connect(ctx, suite.RefDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer refConn.Close(ctx)
	if _, err := refConn.CopyTo(ctx, &want, copied); err != nil {
		t.Fatal(err)
	}
	if got.String() != want.String() || got.Len() == 0 {
		t.Errorf("COPY through the coordinator: %d bytes, one database %d", got.Len(), want.Len())
	}
	// A statement wrong on one database gets that database's error.
	for _, bad := range []string{
		`SELECT o.nosuch, count(*) FROM t_order o JOIN t_user u ON u.city = o.note GROUP BY 1`,
		`SELECT o.status, count(*) FROM t_order o JOIN t_user u ON u.city = o.note GROUP BY o.note`,
	} {
		_, want := env.Ref.Simple(ctx, bad)
		_, got := r.Simple(ctx, bad)
		if sqlState(want) == "" || sqlState(got) != sqlState(want) || !strings.Contains(got.Error(), errMessage(want)) {
			t.Errorf("%s:\n  one database: %v\n  proxy:        %v", bad, want, got)
		}
	}
	// Inside a transaction block too, where the coordinator answers: its failure does
	// not fail the transaction before the check against one database runs (it did,
	// and the client got 25P02).
	for _, bad := range []string{
		`SELECT o.nosuch, count(*) FROM t_order o JOIN t_user u ON u.city = o.note GROUP BY 1`,
		fd, // the coordinator's error, one database's answer: refused
	} {
		_, want := r.Simple(ctx, bad) // outside the block, as checked above
		if _, err := r.Simple(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		if _, got := r.Simple(ctx, bad); sqlState(got) != sqlState(want) {
			t.Errorf("%s in a transaction block: %v, outside one: %v", bad, got, want)
		}
		if _, err := r.Simple(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
	}
	// The client's settings follow it to the coordinator: a date and a timestamp come
	// back in its DateStyle and TimeZone, and a float in its extra_float_digits.
	for _, set := range []string{`SET DateStyle = 'SQL, DMY'`, `SET TimeZone = 'Asia/Kathmandu'`, `SET extra_float_digits = 0`} {
		if _, err := r.Simple(ctx, set); err != nil {
			t.Fatal(err)
		}
		if _, err := env.Ref.Simple(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []sqldiff.Query{
		{SQL: `SELECT o.created, o.created::timestamptz, o.weight FROM t_order o JOIN t_user u ON u.city = o.note ORDER BY o.order_id`, Ordered: true},
		{SQL: `SELECT max(created), count(DISTINCT created::timestamptz) FROM t_order`},
	} {
		for _, mode := range sqldiff.Modes {
			if sqldiff.Compare(ctx, t, "settings", q, env.Ref, r, mode, layout.ByteOrder) {
				t.Errorf("refused [%s]: %s", mode, q.SQL)
			}
		}
	}
	// EXPLAIN and the route preview name the coordinator and the SQL it runs.
	joined := `SELECT count(*) FROM t_order o JOIN t_user u ON u.city = o.note`
	a, err := r.Simple(ctx, "EXPLAIN "+joined)
	if err != nil {
		t.Fatalf("EXPLAIN: %v", err)
	}
	var plan strings.Builder
	for _, row := range a.Rows {
		plan.Write(row[0])
		plan.WriteByte('\n')
	}
	if !strings.Contains(plan.String(), "Foreign Scan") {
		t.Errorf("EXPLAIN through the coordinator shows no foreign scan:\n%s", plan.String())
	}
	route, err := e.srv.Router().Route(ctx, joined)
	if err != nil || !strings.Contains(route, "coordinator: "+joined) || !strings.Contains(route, "merge: none, the coordinator database") {
		t.Errorf("route preview: %v\n%s", err, route)
	}
	// A setting the coordinator does not carry (one that names schemas, or its own
	// reading of the shards) refuses the client's coordinated statements until it goes.
	for _, set := range []string{`SET search_path = information_schema, public`, `SET postgres_fdw.application_name = 'x'`} {
		if _, err := r.Simple(ctx, set); err != nil {
			t.Fatalf("%s: %v", set, err)
		}
		if _, err := r.Simple(ctx, joined); sqlState(err) != "0A000" {
			t.Errorf("after %s: %v, want 0A000", set, err)
		}
		if _, err := r.Simple(ctx, "RESET ALL"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Simple(ctx, joined); err != nil {
		t.Errorf("after RESET ALL: %v", err)
	}
	// Startup options are settings too: -c statement_timeout is carried, -c search_path
	// refuses.
	for opt, want := range map[string]string{"-c statement_timeout=5s": "", "-c search_path=information_schema,public": "0A000"} {
		c, err := pgconn.Connect(ctx, e.url("")+"&options="+strings.ReplaceAll(url.QueryEscape(opt), "+", "%20"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = sqldiff.PgConnRunner{Conn: c}.Simple(ctx, joined)
		if sqlState(err) != want {
			t.Errorf("startup options %q: %v, want %q", opt, err, want)
		}
		c.Close(ctx)
	}
	// A session that made a temporary table (which may shadow a table there) is not
	// coordinated: the coordinator's sessions would not see it.
	tmp := sqldiff.PgConnRunner{Conn: e.pgconnect(t)}
	if _, err := tmp.Simple(ctx, `CREATE TEMP TABLE t_region (region_id int, name text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := tmp.Simple(ctx, `SELECT count(*) FROM t_region r JOIN t_order o ON o.user_id = r.region_id`); sqlState(err) != "0A000" {
		t.Errorf("with a temporary table: %v, want 0A000", err)
	}
	// A schema change through the proxy reaches the coordinator.
	for _, stmt := range []string{`ALTER TABLE t_order ADD COLUMN extra int`, `UPDATE t_order SET extra = 1 WHERE order_id = 5`} {
		if _, err := r.Simple(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	a, err = r.Simple(ctx, `SELECT count(DISTINCT extra) FROM t_order`)
	if err != nil {
		t.Fatalf("after ALTER TABLE through the proxy: %v", err)
	}
	if got := string(a.Rows[0][0]); got != "1" {
		t.Errorf("count(DISTINCT extra) = %s, want 1", got)
	}
}

func errMessage(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Message
	}
	return "?"
}

// TestCoordinatorBoundsWhatMoves: a statement that reads more than
// --coordinator-max-moved from the shards into the coordinator fails with 54000 naming
// the flag, stopped while it runs; the proxy goes on serving its clients, and SHOW
// COORDINATOR counts what moved.
func TestCoordinatorBoundsWhatMoves(t *testing.T) {
	layout := sqldiff.Layouts()[1]
	suite := sqldiff.NewEnv(t, layout, "")
	e := startProxyOn(t, suite.Rules.Rules(), withCoordinator(), func(c *proxy.Config) {
		c.CoordinatorMaxMoved = 20000
		c.AdminDatabase = "shardlab"
	})
	ctx := context.Background()
	conn, err := pgconn.Connect(ctx, e.url(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	r := sqldiff.PgConnRunner{Conn: conn}
	suite.Load(t, r)
	adm, err := pgconn.Connect(ctx, strings.Replace(e.url(""), "/"+testDatabase+"?", "/shardlab?", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close(ctx)
	show := func() map[string]string {
		t.Helper()
		res, err := adm.Exec(ctx, "SHOW COORDINATOR").ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for i, f := range res[0].FieldDescriptions {
			out[f.Name] = string(res[0].Rows[0][i])
		}
		return out
	}

	// A filter the shards apply moves only the rows it keeps.
	small := sqldiff.Query{SQL: `SELECT count(*) FROM t_order o JOIN t_user u ON u.city = o.note WHERE o.order_id BETWEEN 10 AND 19`}
	for _, mode := range sqldiff.Modes {
		if sqldiff.Compare(ctx, t, "small", small, suite.Ref, r, mode, layout.ByteOrder) {
			t.Fatalf("refused [%s]: %s", mode, small.SQL)
		}
	}
	st := show()
	if st["coordinator"] != "on" || st["last_rows_moved"] == "0" || st["stopped_past_bound"] != "0" {
		t.Errorf("SHOW COORDINATOR after a small statement: %v", st)
	}
	if n, _ := strconv.Atoi(st["last_rows_moved"]); n >= 246 { // t_order's rows: 246
		t.Errorf("the shards' filter was not applied there: %d rows moved", n)
	}

	// Every row of t_order, twice: past 20,000 bytes.
	_, err = r.Simple(ctx, `SELECT a.*, b.* FROM t_order a JOIN t_order b ON a.note = b.note`)
	if sqlState(err) != "54000" || !strings.Contains(err.Error(), "--coordinator-max-moved") {
		t.Fatalf("past the bound: %v, want 54000 naming --coordinator-max-moved", err)
	}
	st = show()
	if st["stopped_past_bound"] != "1" {
		t.Errorf("SHOW COORDINATOR after the cut: %v", st)
	}
	// The same client, and another, go on.
	other := sqldiff.PgConnRunner{Conn: e.pgconnect(t)}
	for _, runner := range []sqldiff.PgConnRunner{r, other} {
		q := sqldiff.Query{SQL: `SELECT count(DISTINCT status) FROM t_order`}
		if sqldiff.Compare(ctx, t, "after the cut", q, suite.Ref, runner, "simple", layout.ByteOrder) {
			t.Errorf("refused after the cut: %s", q.SQL)
		}
	}
}

// TestCoordinatorAggregatesOnTheShards: statements that aggregate one sharded table
// answer as one database does, in every protocol form, while each shard sends the
// coordinator its groups, not its rows; the route preview shows the shards'
// aggregates. Up to this change every row moved (246 of t_order's).
func TestCoordinatorAggregatesOnTheShards(t *testing.T) {
	for _, layout := range sqldiff.Layouts() {
		t.Run(layout.Name, func(t *testing.T) { aggregatesOnTheShards(t, layout) })
	}
}

func aggregatesOnTheShards(t *testing.T, layout sqldiff.Layout) {
	suite := sqldiff.NewEnv(t, layout, "")
	e := startProxyOn(t, suite.Rules.Rules(), withCoordinator(), func(c *proxy.Config) { c.AdminDatabase = "shardlab" })
	ctx := context.Background()
	r := sqldiff.PgConnRunner{Conn: e.pgconnect(t)}
	suite.Load(t, r)
	adm, err := pgconn.Connect(ctx, strings.Replace(e.url(""), "/"+testDatabase+"?", "/shardlab?", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close(ctx)
	admin := func(sql string) [][][]byte {
		t.Helper()
		res, err := adm.Exec(ctx, sql).ReadAll()
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return res[0].Rows
	}
	// moved returns the rows the last coordinated statement moved, and fails the test
	// when no statement went to the coordinator since the last call.
	statements := 0
	moved := func(what string) int {
		t.Helper()
		res, err := adm.Exec(ctx, "SHOW COORDINATOR").ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		col := map[string]int{}
		for i, f := range res[0].FieldDescriptions {
			n, _ := strconv.Atoi(string(res[0].Rows[0][i]))
			col[f.Name] = n
		}
		if col["statements"] <= statements {
			t.Errorf("not coordinated (SHOW COORDINATOR: %v): %s", col, what)
		}
		statements = col["statements"]
		return col["last_rows_moved"]
	}
	var total int
	for i, q := range sqldiff.ShardAggregated() {
		for _, mode := range sqldiff.Modes {
			if sqldiff.Compare(ctx, t, "shard aggregates", q, suite.Ref, r, mode, layout.ByteOrder) {
				t.Fatalf("query %d [%s] refused: %s", i, mode, q.SQL)
			}
			n := moved(q.SQL)
			total += n
			// A row per group per shard; every row of t_order is 246, of t_user 50.
			if strings.Contains(q.SQL, "t_order") && n >= 246 || n >= 50 && !strings.Contains(q.SQL, "GROUP BY") {
				t.Errorf("query %d [%s] moved %d rows to the coordinator: %s", i, mode, n, q.SQL)
			}
			if mode == "simple" {
				t.Logf("%d rows moved: %s", n, q.SQL)
			}
		}
	}
	t.Logf("%d statements in %d forms moved %d rows to the coordinator in all", len(sqldiff.ShardAggregated()), len(sqldiff.Modes), total)
	// Under joins: each shard joins and aggregates the rows of the tables the aggregates
	// read. (Whether postgres_fdw sends a shard the join, or only its tables' rows, is
	// the coordinator's plan: the rows moved are logged, not bounded.)
	// Within a statement: a CTE, a subquery in FROM, an arm of a set operation.
	for i, q := range append(sqldiff.ShardAggregatedJoins(), sqldiff.ShardAggregatedWithin()...) {
		for _, mode := range sqldiff.Modes {
			if sqldiff.Compare(ctx, t, "shard aggregates under joins or within", q, suite.Ref, r, mode, layout.ByteOrder) {
				t.Fatalf("join query %d [%s] refused: %s", i, mode, q.SQL)
			}
			n := moved(q.SQL)
			if mode == "simple" {
				t.Logf("%d rows moved: %s", n, q.SQL)
			}
		}
		var route []string
		for _, row := range admin("SHOW ROUTE " + strings.ReplaceAll(q.SQL, "$1", "1")) {
			route = append(route, string(row[0]))
		}
		if r := strings.Join(route, "\n"); !strings.Contains(r, "each shard aggregates its own rows") {
			t.Errorf("join query %d: the route preview does not show the shards' aggregates:\n%s", i, r)
		}
	}
	// One table joined with one sharded otherwise by a column of few values (qty: 1 to
	// 5): without statistics its rows go to the coordinator; once ANALYZE has counted
	// them, it aggregates on the shards.
	few := sqldiff.Query{SQL: `SELECT u.city, sum(i.price), count(*) FROM t_order_item i JOIN t_user u ON u.score = i.qty GROUP BY u.city ORDER BY u.city COLLATE "C" NULLS FIRST`, Ordered: true}
	showRoute := func(sql string) string {
		var route []string
		for _, row := range admin("SHOW ROUTE " + sql) {
			route = append(route, string(row[0]))
		}
		return strings.Join(route, "\n")
	}
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			if _, err := r.Simple(ctx, "ANALYZE"); err != nil {
				t.Fatal(err)
			}
			few.SQL += " LIMIT 100" // planned afresh
		}
		for _, mode := range sqldiff.Modes {
			if sqldiff.Compare(ctx, t, "one table by statistics", few, suite.Ref, r, mode, layout.ByteOrder) {
				t.Fatalf("refused: %s", few.SQL)
			}
		}
		if got := strings.Contains(showRoute(few.SQL), "each shard aggregates its own rows"); got != analyzed {
			t.Errorf("analyzed %v: the shards aggregate %v, want %v:\n%s", analyzed, got, analyzed, showRoute(few.SQL))
		}
	}
	var route []string
	for _, row := range admin("SHOW ROUTE " + sqldiff.ShardAggregated()[0].SQL) {
		route = append(route, string(row[0]))
	}
	if r := strings.Join(route, "\n"); !strings.Contains(r, `shardlab_shards."t_order/1"`) || !strings.Contains(r, "each shard aggregates its own rows") {
		t.Errorf("the route preview does not show the shards' aggregates:\n%s", r)
	}
	// What the shards cannot aggregate alone still moves the rows, and is answered.
	distinct := sqldiff.Query{SQL: `SELECT length(string_agg(note, ',' ORDER BY order_id)) FROM t_order`}
	if sqldiff.Compare(ctx, t, "rows", distinct, suite.Ref, r, "simple", layout.ByteOrder) {
		t.Fatalf("refused: %s", distinct.SQL)
	}
	if n := moved(distinct.SQL); n < 246 {
		t.Errorf("string_agg moved %d rows; it needs every row (246)", n)
	}
	// An error of the rewritten statement is one database's, where the default data
	// source holds t_order under its name and where it is split there (analysed as a
	// shard runs it; up to 2026-11-29 a refusal).
	_, err = r.Simple(ctx, `SELECT status, qty, count(*) + 1 FROM t_order GROUP BY status`)
	var pe *pgconn.PgError
	switch {
	case !errors.As(err, &pe):
		t.Errorf("a grouping error: %v", err)
	case pe.Code != "42803" || !strings.Contains(pe.Message, `"t_order.qty" must appear in the GROUP BY clause`):
		t.Errorf("a grouping error: %v, want one database's 42803", err)
	}
}
