package shardsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/internal/sqldiff"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/shardsql"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

func openDriver(t *testing.T, c *rules.Compiled, twoPhase bool) *sql.DB {
	t.Helper()
	db, err := shardsql.Open(shardsql.Config{Rules: c, TwoPhase: twoPhase})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestDifferentialThroughDriver runs the core's differential suite through
// database/sql: pgx's driver on one unsharded database against shardlab's driver on
// the sharded layouts, comparing the Go values each hands out.
func TestDifferentialThroughDriver(t *testing.T) {
	for _, layout := range sqldiff.Layouts() {
		t.Run(layout.Name, func(t *testing.T) {
			env := sqldiff.NewEnv(t, layout, "")
			ref, err := sql.Open("pgx", env.RefDSN)
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			env.Ref = sqldiff.SQLRunner{DB: ref}
			env.Modes = []string{"simple", "text"}
			// UPDATE and DELETE whose subqueries span shards run in steps, as through
			// the proxy.
			env.InSteps = true
			sharded := sqldiff.SQLRunner{DB: openDriver(t, env.Rules, false)}
			env.Load(t, sharded)
			env.CheckPlacement(t)
			reads := env.RunReads(t, sharded, append(sqldiff.Queries(), sqldiff.Random(7, 30)...))
			writes := env.RunWrites(t, sharded)
			t.Logf("%s through database/sql: %d reads (%d equal, %d refused), %d writes (%d equal, %d refused)",
				layout.Name, reads.Total, reads.Equal, reads.Refused, writes.Total, writes.Equal, writes.Refused)
		})
	}
}

// kv spreads table kv (k int primary key, v text) over dsns by k mod n.
func kv(t testing.TB, dsns []string) *rules.Compiled {
	t.Helper()
	r := rules.Rules{Tables: []rules.Table{{Name: "kv", Strategy: rules.Strategy{Column: "k", Type: rules.TypeInt4, Algorithm: rules.AlgorithmMod}}}}
	for i, d := range dsns {
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d})
	}
	c, err := rules.Compile(r)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func countRows(t *testing.T, dsns []string) []int {
	t.Helper()
	return countOn(t, dsns, "kv")
}

// countOn counts table's rows on each data source.
func countOn(t *testing.T, dsns []string, table string) []int {
	t.Helper()
	var out []int
	for _, d := range dsns {
		db, err := sql.Open("pgx", d)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := db.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		db.Close()
		out = append(out, n)
	}
	return out
}

// TestTransactions: a transaction commits, and rolls back, on every shard it touched;
// prepared statements keep one plan; rows scan into Go values.
func TestTransactions(t *testing.T) {
	ctx := context.Background()
	var dsns []string
	for i := range 3 {
		dsns = append(dsns, pgtest.NewDatabase(t, fmt.Sprintf("drv%d", i)))
	}
	db := openDriver(t, kv(t, dsns), false)
	if _, err := db.Exec("CREATE TABLE kv (k int PRIMARY KEY, v text, at timestamptz DEFAULT now())"); err != nil {
		t.Fatal(err)
	}
	ins, err := db.Prepare("INSERT INTO kv (k, v) VALUES ($1, $2)")
	if err != nil {
		t.Fatal(err)
	}
	defer ins.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k := range 6 {
		if _, err := tx.Stmt(ins).Exec(k, fmt.Sprint("v", k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if got := countRows(t, dsns); fmt.Sprint(got) != "[0 0 0]" {
		t.Errorf("after rollback: %v", got)
	}
	tx, _ = db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	for k := range 6 {
		if _, err := tx.Exec("INSERT INTO kv (k, v) VALUES ($1, $2)", k, fmt.Sprint("v", k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := countRows(t, dsns); fmt.Sprint(got) != "[2 2 2]" {
		t.Errorf("after commit: %v", got)
	}
	var (
		k  int
		v  string
		at time.Time
	)
	if err := db.QueryRow("SELECT k, v, at FROM kv WHERE k = $1", 4).Scan(&k, &v, &at); err != nil || k != 4 || v != "v4" || at.IsZero() {
		t.Errorf("scan: %d %q %v %v", k, v, at, err)
	}
	var n int64
	if err := db.QueryRow("SELECT count(*) FROM kv").Scan(&n); err != nil || n != 6 {
		t.Errorf("count across shards: %d %v", n, err)
	}
	res, err := db.Exec("UPDATE kv SET v = 'x' WHERE k > $1", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := res.RowsAffected(); got != 4 {
		t.Errorf("rows affected across shards: %d, want 4", got)
	}
	// A refusal is a *pgconn.PgError with SQLSTATE 0A000.
	var pe *pgconn.PgError
	if _, err := db.Exec("INSERT INTO kv (v) VALUES ('no key')"); !errors.As(err, &pe) || pe.Code != "0A000" {
		t.Errorf("insert without a key: %v", err)
	}
}

// TestDeadShardFailsOnlyItsStatements stops the server of one data source: statements
// routed elsewhere keep working, and those that need it fail with an error naming it.
func TestDeadShardFailsOnlyItsStatements(t *testing.T) {
	a := pgtest.StartCluster(t)
	b := pgtest.StartCluster(t)
	dsns := []string{a.NewDatabase("alive"), b.NewDatabase("dying")}
	db := openDriver(t, kv(t, dsns), false)
	if _, err := db.Exec("CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO kv VALUES (0, 'a'), (1, 'b'), (2, 'c'), (3, 'd')"); err != nil {
		t.Fatal(err)
	}
	b.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var v string
	if err := db.QueryRowContext(ctx, "SELECT v FROM kv WHERE k = $1", 2).Scan(&v); err != nil || v != "c" {
		t.Errorf("a read on the live shard: %q %v", v, err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO kv VALUES ($1, 'e')", 4); err != nil {
		t.Errorf("a write on the live shard: %v", err)
	}
	_, err := db.ExecContext(ctx, "UPDATE kv SET v = 'z' WHERE k = $1", 3)
	var se *sqlexec.ShardError
	if !errors.As(err, &se) || se.Name != "ds_1" || se.SQLState() != "08006" {
		t.Errorf("a write on the dead shard: %v (want a ShardError naming ds_1, SQLSTATE 08006)", err)
	}
	if _, err := db.QueryContext(ctx, "SELECT count(*) FROM kv"); !errors.As(err, &se) || se.Name != "ds_1" {
		t.Errorf("a read across shards: %v (want a ShardError naming ds_1)", err)
	}
	b.Start()
	if _, err := db.ExecContext(ctx, "UPDATE kv SET v = 'z' WHERE k = $1", 3); err != nil {
		t.Errorf("after the shard came back: %v", err)
	}
}

// TestCancelReachesEveryShard cancels a statement running on every shard: each
// shard's query stops, not only the client's wait.
func TestCancelReachesEveryShard(t *testing.T) {
	var dsns []string
	for i := range 3 {
		dsns = append(dsns, pgtest.NewDatabase(t, fmt.Sprintf("cancel%d", i)))
	}
	db := openDriver(t, kv(t, dsns), false)
	if _, err := db.Exec("CREATE TABLE kv (k int PRIMARY KEY, v text); INSERT INTO kv VALUES (0, 'a'), (1, 'b'), (2, 'c')"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := db.QueryContext(ctx, "SELECT k, pg_sleep(30) FROM kv WHERE v > $1", "")
	if err == nil || time.Since(start) > 10*time.Second {
		t.Fatalf("the statement was not cancelled: %v after %v", err, time.Since(start))
	}
	// No shard may still be sleeping.
	deadline := time.Now().Add(5 * time.Second)
	for _, d := range dsns {
		check, _ := sql.Open("pgx", d)
		for {
			var n int
			if err := check.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE '%pg_sleep%' AND state = 'active' AND pid <> pg_backend_pid()").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s still runs the cancelled query", d)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		check.Close()
	}
}

// TestRegisteredDriver opens the database through sql.Open("shardlab", rules file).
func TestRegisteredDriver(t *testing.T) {
	dsn := pgtest.NewDatabase(t, "registered")
	file := filepath.Join(t.TempDir(), "rules.toml")
	content := fmt.Sprintf("[[data_source]]\nname = \"ds_0\"\ndsn = %q\n\n[[sharded_table]]\nname = \"kv\"\ncolumn = \"k\"\n", dsn)
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open(shardsql.DriverName, file+"?max_conns=4")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE kv (k bigint PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO kv VALUES ($1, $2)", int64(7), "seven"); err != nil {
		t.Fatal(err)
	}
	var v string
	if err := db.QueryRow("SELECT v FROM kv WHERE k = $1", 7).Scan(&v); err != nil || v != "seven" {
		t.Errorf("%q %v", v, err)
	}
	for _, bad := range []string{"", file + "?two_phase=maybe", file + "?colour=red", file + "?settle_interval=0s", file + "?settle_interval=soon", filepath.Join(t.TempDir(), "missing.toml")} {
		db, err := sql.Open(shardsql.DriverName, bad)
		if err == nil {
			err = db.Ping()
			db.Close()
		}
		if err == nil {
			t.Errorf("sql.Open(%q) was accepted", bad)
		}
	}
	if cfg, err := shardsql.ParseDSN(file + "?two_phase=true&max_conns=3&settle_interval=250ms&max_held=1048576"); err != nil || cfg.SettleInterval != 250*time.Millisecond || cfg.MaxHeld != 1<<20 {
		t.Errorf("%+v %v", cfg, err)
	}
	if _, err := shardsql.ParseDSN(file + "?max_held=1MB"); err == nil || !strings.Contains(err.Error(), "max_held") {
		t.Errorf("max_held=1MB: %v, want an error naming it", err)
	}
}

// TestMaxHeld: the driver bounds what a statement holds to merge, as the proxy does:
// DISTINCT across shards over the bound fails with 54000 and leaves the handle usable;
// a streamed answer of the same size passes; the default bound takes it.
func TestMaxHeld(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t, "held0"), pgtest.NewDatabase(t, "held1")}
	r := kv(t, dsns)
	db, err := shardsql.Open(shardsql.Config{Rules: r, MaxHeld: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	for start := 0; start < 2000; start += 500 {
		var vals []string
		for i := start; i < start+500; i++ {
			vals = append(vals, fmt.Sprintf("(%d, '%d%s')", i, i, strings.Repeat("x", 100)))
		}
		if _, err := db.Exec("INSERT INTO kv VALUES " + strings.Join(vals, ", ")); err != nil {
			t.Fatal(err)
		}
	}
	count := func(db *sql.DB, q string) (int, error) {
		rows, err := db.Query(q)
		if err != nil {
			return 0, err
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			n++
		}
		return n, rows.Err()
	}
	var pe *pgconn.PgError
	// Groups sorted by an aggregate are gathered before they are sorted: held.
	if _, err := count(db, "SELECT v, count(*) FROM kv GROUP BY v ORDER BY count(*) DESC, v"); !errors.As(err, &pe) || pe.Code != "54000" {
		t.Errorf("groups sorted by count, over 64 KiB held: %v, want 54000", err)
	}
	// DISTINCT and GROUP BY meet each group's rows in the shards' sorted streams: one
	// group held at a time, whatever the answer's size.
	if n, err := count(db, "SELECT DISTINCT v FROM kv"); err != nil || n != 2000 {
		t.Errorf("DISTINCT over the bound, streamed: %d rows, %v", n, err)
	}
	if n, err := count(db, "SELECT v, count(*) FROM kv GROUP BY v ORDER BY v DESC"); err != nil || n != 2000 {
		t.Errorf("GROUP BY over the bound, streamed: %d rows, %v", n, err)
	}
	if n, err := count(db, "SELECT k, v FROM kv"); err != nil || n != 2000 {
		t.Errorf("a streamed answer over the bound: %d rows, %v", n, err)
	}
	if n, err := count(db, "SELECT DISTINCT v FROM kv WHERE k < 50"); err != nil || n != 50 {
		t.Errorf("DISTINCT under the bound: %d rows, %v", n, err)
	}
	// Rows read into memory (a statement on their transaction while they are open)
	// past the bound: the rest is read and dropped, and a shard's error met there is
	// what the rows report, not the bound's (the transaction failed on that shard).
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query("SELECT k, v, 1 / (k - 1990) FROM kv ORDER BY k")
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		rows.Next()
	}
	if _, err := tx.Exec("SELECT 1"); sqlState(err) != "22012" && sqlState(err) != "25P02" {
		t.Errorf("a statement beside rows that failed: %v", err)
	}
	for rows.Next() {
	}
	if err := rows.Err(); sqlState(err) != "22012" {
		t.Errorf("rows read into memory past the bound, a shard error past it: %v, want SQLSTATE 22012", err)
	}
	rows.Close()
	tx.Rollback()
	def := openDriver(t, r, false)
	if n, err := count(def, "SELECT DISTINCT v FROM kv"); err != nil || n != 2000 {
		t.Errorf("DISTINCT under the default bound: %d rows, %v", n, err)
	}
}

func TestExplain(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t, "explain0"), pgtest.NewDatabase(t, "explain1")}
	db := openDriver(t, kv(t, dsns), false)
	if _, err := db.Exec("CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	text, err := shardsql.Explain(context.Background(), conn, "SELECT v FROM kv WHERE k = $1", 3)
	if err != nil || !strings.Contains(text, "ds_1 shard 1: SELECT v FROM kv WHERE k = $1") {
		t.Errorf("explain of a point select: %q %v", text, err)
	}
	text, err = shardsql.Explain(context.Background(), conn, "SELECT k FROM kv ORDER BY v LIMIT 3")
	if err != nil || !strings.Contains(text, "merge: merge-sort") || !strings.Contains(text, "2 targets") {
		t.Errorf("explain of a merge: %q %v", text, err)
	}
}

// TestCloseIdle: CloseIdle gives a handle's server connections back, and the handle
// reconnects on its next statement; Open keeps idle logical connections, so a
// concurrent burst does not churn them.
func TestCloseIdle(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t, "closeidle0"), pgtest.NewDatabase(t, "closeidle1")}
	conn, err := shardsql.NewConnector(context.Background(), shardsql.Config{Rules: kv(t, dsns)})
	if err != nil {
		t.Fatal(err)
	}
	db := shardsql.OpenDB(conn)
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				if _, err := db.Exec("INSERT INTO kv VALUES ($1, 'x')", i*100+j); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if st := db.Stats(); st.MaxIdleClosed != 0 {
		t.Errorf("database/sql closed %d idle logical connections: Open must keep them", st.MaxIdleClosed)
	}
	server, err := sql.Open("pgx", dsns[0])
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	server.SetMaxOpenConns(1)
	backends := func() int {
		var n int
		if err := server.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := backends(); n == 0 {
		t.Fatal("no pooled connection to the first data source after the inserts")
	}
	conn.CloseIdle()
	deadline := time.Now().Add(5 * time.Second)
	for backends() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections to the first data source remain after CloseIdle", backends())
		}
		time.Sleep(20 * time.Millisecond)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM kv").Scan(&n); err != nil || n != 160 {
		t.Errorf("after CloseIdle: count = %d, %v; want 160", n, err)
	}
}

// TestSavepointNamesAsPostgreSQL: a savepoint is named as PostgreSQL's grammar reads
// it ("a b" is one name), on every data source, and a missing one is reported in
// PostgreSQL's words.
func TestSavepointNamesAsPostgreSQL(t *testing.T) {
	ctx := context.Background()
	dsns := []string{pgtest.NewDatabase(t, "sp0"), pgtest.NewDatabase(t, "sp1")}
	db := openDriver(t, kv(t, dsns), false)
	if _, err := db.Exec("CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{"BEGIN", "INSERT INTO kv VALUES (0, 'kept')", `SAVEPOINT "a b"`,
		"INSERT INTO kv VALUES (1, 'undone')", `ROLLBACK TO SAVEPOINT "a b"`, `RELEASE "a b"`, "COMMIT"} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if got := countRows(t, dsns); fmt.Sprint(got) != "[1 0]" {
		t.Errorf("rows per shard after ROLLBACK TO \"a b\": %v, want [1 0]", got)
	}
	ref, err := sql.Open("pgx", dsns[0])
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	missing := func(db interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	}) string {
		if _, err := db.ExecContext(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		_, err := db.ExecContext(ctx, `ROLLBACK TO SAVEPOINT "no such"`)
		db.ExecContext(ctx, "ROLLBACK")
		return fmt.Sprintf("%s %v", sqlplan.Code(err), err)
	}
	refConn, err := ref.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer refConn.Close()
	if got, want := missing(conn), missing(refConn); got != want {
		t.Errorf("a missing savepoint: %s\nPostgreSQL: %s", got, want)
	}
}

// TestMigrationInOneString: DDL and the statements after it in one string, as a
// migration tool sends them, run as PostgreSQL runs such a string: in one transaction,
// each statement planned on the schema the ones before made (the key's type read from
// the transaction's own connection), and an error rolls the whole string back. The
// same in an explicit transaction.
func TestMigrationInOneString(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t, "mig0"), pgtest.NewDatabase(t, "mig1")}
	r := rules.Rules{}
	for i, d := range dsns {
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d})
	}
	for _, name := range []string{"people", "pets", "broken"} {
		r.Tables = append(r.Tables, rules.Table{Name: name, Strategy: rules.Strategy{Column: "id"}}) // no type: the catalog's
	}
	c, err := rules.Compile(r)
	if err != nil {
		t.Fatal(err)
	}
	db := openDriver(t, c, false)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE people (id int PRIMARY KEY, name text); INSERT INTO people VALUES (1, 'a'), (2, 'b'), (3, 'c')"); err != nil {
		t.Fatalf("a migration as one string: %v", err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM people").Scan(&n); err != nil || n != 3 {
		t.Errorf("people: %d, %v", n, err)
	}
	// An error rolls the whole string back, the table it made included.
	if _, err := db.ExecContext(ctx, "CREATE TABLE broken (id int PRIMARY KEY); INSERT INTO broken VALUES (1); INSERT INTO broken VALUES (1)"); sqlplan.Code(err) != "23505" {
		t.Fatalf("a string whose last statement fails: %v", err)
	}
	if _, err := db.ExecContext(ctx, "SELECT * FROM broken"); sqlplan.Code(err) != "42P01" {
		t.Errorf("after the failed string: %v, want 42P01 (the table rolled back)", err)
	}
	// In an explicit transaction; rolled back, then made again with a text key.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"CREATE TABLE pets (id int PRIMARY KEY)", "INSERT INTO pets VALUES (10)"} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	tx.Rollback()
	if _, err := db.ExecContext(ctx, "CREATE TABLE pets (id text PRIMARY KEY); INSERT INTO pets VALUES ('rex')"); err != nil {
		t.Fatalf("the table again, with a text key: %v", err)
	}
	if err := db.QueryRow("SELECT count(*) FROM pets WHERE id = $1", "rex").Scan(&n); err != nil || n != 1 {
		t.Errorf("rex: %d, %v", n, err)
	}
}

// TestTransactionStatementsKeepTheirOptions: BEGIN sent as a statement keeps its
// options on every shard the transaction joins, and COMMIT AND CHAIN and ROLLBACK AND
// CHAIN start a transaction with the same characteristics after committing (or rolling
// back) on every shard, as on PostgreSQL.
func TestTransactionStatementsKeepTheirOptions(t *testing.T) {
	ctx := context.Background()
	dsns := []string{pgtest.NewDatabase(t, "chain0"), pgtest.NewDatabase(t, "chain1")}
	db := openDriver(t, kv(t, dsns), false)
	if _, err := db.Exec("CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	exec := func(q string) {
		t.Helper()
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// The characteristics of the open transaction on shard k mod 2.
	characteristics := func(k int) string {
		t.Helper()
		var s string
		q := "SELECT current_setting('transaction_isolation') || ' ' || current_setting('transaction_read_only') FROM kv WHERE k = $1"
		if err := conn.QueryRowContext(ctx, q, k).Scan(&s); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return s
	}
	exec("BEGIN ISOLATION LEVEL SERIALIZABLE")
	exec("INSERT INTO kv VALUES (0, 'a'), (1, 'b')")
	if got := characteristics(1); got != "serializable off" {
		t.Errorf("after BEGIN ISOLATION LEVEL SERIALIZABLE, shard 1 runs %q", got)
	}
	exec("COMMIT AND CHAIN")
	if got := countRows(t, dsns); fmt.Sprint(got) != "[1 1]" {
		t.Errorf("rows per shard after COMMIT AND CHAIN: %v, want [1 1]", got)
	}
	exec("INSERT INTO kv VALUES (2, 'c'), (3, 'd')")
	for k := range 2 {
		if got := characteristics(k + 2); got != "serializable off" {
			t.Errorf("the chained transaction runs %q on shard %d", got, k)
		}
	}
	exec("ROLLBACK AND CHAIN")
	if got := countRows(t, dsns); fmt.Sprint(got) != "[1 1]" {
		t.Errorf("rows per shard after ROLLBACK AND CHAIN: %v, want [1 1]", got)
	}
	if got := characteristics(0); got != "serializable off" {
		t.Errorf("the transaction chained by ROLLBACK AND CHAIN runs %q", got)
	}
	exec("COMMIT")
	for _, q := range []string{"COMMIT AND CHAIN", "ROLLBACK AND CHAIN"} {
		if _, err := conn.ExecContext(ctx, q); sqlplan.Code(err) != "25P01" {
			t.Errorf("%s outside a transaction: %v, want SQLSTATE 25P01", q, err)
		}
	}
}

// sqlState returns err's SQLSTATE, or "" when it carries none.
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// TestErrorFailsTransaction: a statement that fails inside a transaction fails it, as
// on PostgreSQL, also when it failed before any data source ran it (a refusal): the
// next statement gets 25P02, and Commit commits nothing. pgx's driver on one database
// is the reference.
func TestErrorFailsTransaction(t *testing.T) {
	ctx := context.Background()
	one, err := sql.Open("pgx", pgtest.NewDatabase(t, "drvfail_ref"))
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	dsns := []string{pgtest.NewDatabase(t, "drvfail0"), pgtest.NewDatabase(t, "drvfail1")}
	sharded := openDriver(t, kv(t, dsns), false)
	for name, db := range map[string]*sql.DB{"one database": one, "driver": sharded} {
		if _, err := db.ExecContext(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO kv VALUES (1, 'a'), (2, 'b')"); err != nil {
			t.Fatal(err)
		}
		// Refused by the driver (a key moved by an expression); an error on one
		// database too (a duplicate key), each in its own way.
		if _, err := tx.ExecContext(ctx, "UPDATE kv SET k = k + 1 WHERE k > 0"); err == nil {
			t.Fatalf("%s: the failing statement succeeded", name)
		}
		_, err = tx.ExecContext(ctx, "INSERT INTO kv VALUES (3, 'c')")
		if sqlStateOf(err) != "25P02" {
			t.Errorf("%s: the statement after the failure: %v, want 25P02", name, err)
		}
		if err := tx.Commit(); err == nil {
			t.Errorf("%s: the failed transaction committed", name)
		}
		var n int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM kv").Scan(&n); err != nil || n != 0 {
			t.Errorf("%s: %d rows after the failed transaction, %v", name, n, err)
		}

		// Not every error fails the transaction: arguments that do not fit, found
		// before anything is sent, fail nothing; and the transaction COMMIT AND CHAIN
		// begins after a failed one is a new one.
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, step := range []struct {
			sql  string
			args []any
			ok   bool
		}{
			{"BEGIN", nil, true},
			{"INSERT INTO kv VALUES ($1, $2)", []any{10}, false},
			{"INSERT INTO kv VALUES ($1, $2)", []any{11, "k"}, true},
			{"SELECT 1 / 0", nil, false},
			{"COMMIT AND CHAIN", nil, name == "one database"}, // the driver says 40000: rolled back
			{"INSERT INTO kv VALUES (12, 'l')", nil, true},
			{"COMMIT", nil, true},
		} {
			_, err := conn.ExecContext(ctx, step.sql, step.args...)
			if (err == nil) != step.ok && step.sql != "COMMIT AND CHAIN" {
				t.Errorf("%s: %s: %v", name, step.sql, err)
			}
		}
		conn.Close()
		var rows, key int
		if err := db.QueryRowContext(ctx, "SELECT count(*), min(k) FROM kv").Scan(&rows, &key); err != nil || rows != 1 || key != 12 {
			t.Errorf("%s: %d rows, key %d, after the chained transaction, %v; want key 12 alone", name, rows, key, err)
		}
	}
}
