package shardsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/shardsql"
)

// oneShard opens the driver over two databases: kv sharded by k (mod 2), and plain, a
// table without a rule, on the first data source, each with keys 1 to n.
func oneShard(t *testing.T, prefix string, n int, maxHeld int64) (*sql.DB, []string) {
	t.Helper()
	dsns := []string{pgtest.NewDatabase(t, prefix+"_s0"), pgtest.NewDatabase(t, prefix+"_s1")}
	db, err := shardsql.Open(shardsql.Config{Rules: kv(t, dsns), MaxHeld: maxHeld})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var values []string
	for k := 1; k <= n; k++ {
		values = append(values, fmt.Sprintf("(%d, 'v%d')", k, k))
	}
	for _, q := range []string{
		"CREATE TABLE kv (k int PRIMARY KEY, v text)",
		"INSERT INTO kv VALUES " + strings.Join(values, ", "),
		fmt.Sprintf("CREATE TABLE plain AS SELECT g AS k, repeat('v', 100) AS v FROM generate_series(1, %d) g", n),
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	return db, dsns
}

// TestOneShardRowsStream: an answer from one data source reaches rows.Next as it
// arrives, and its size bounds nothing. Before, the driver read it whole first, within
// max_held: past it, 54000; and no row came while the server was still at work.
func TestOneShardRowsStream(t *testing.T) {
	db, dsns := oneShard(t, "one_stream", 4000, 64<<10) // about 400 kB through a 64 kB bound
	ctx := context.Background()
	n := 0
	rows, err := db.QueryContext(ctx, "SELECT k, v FROM plain ORDER BY k")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k int
		var v string
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		n++
		if k != n || len(v) != 100 {
			t.Fatalf("row %d: %d %q", n, k, v)
		}
	}
	if err := rows.Err(); err != nil || n != 4000 {
		t.Fatalf("%d rows, %v; want 4000 through a bound smaller than the answer", n, err)
	}
	// The first rows come while the server waits, in row 3000, on a lock the test
	// holds.
	holder, err := sql.Open("pgx", dsns[0])
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	hc, err := holder.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	if _, err := hc.ExecContext(ctx, "SELECT pg_advisory_lock(4243)"); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	done := make(chan int, 1)
	go func() {
		rows, err := db.QueryContext(ctx, "SELECT k, CASE WHEN k = 3000 THEN pg_advisory_lock(4243)::text ELSE v END FROM plain ORDER BY k")
		if err != nil {
			first <- err
			done <- 0
			return
		}
		n := 0
		for rows.Next() {
			if n == 0 {
				first <- nil
			}
			n++
		}
		if err := rows.Err(); err != nil {
			t.Error(err)
		}
		done <- n
	}()
	select {
	case err := <-first:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Error("no row reached rows.Next while the server waited")
	}
	if _, err := hc.ExecContext(ctx, "SELECT pg_advisory_unlock(4243)"); err != nil {
		t.Fatal(err)
	}
	if n := <-done; n != 4000 {
		t.Errorf("%d rows, want 4000", n)
	}
}

// TestOneShardRowsInTransaction: a one-data-source answer read on in a transaction
// behaves as a gathered one did. Another statement while the rows are open reads
// their rest into memory first, and the rows go on intact; rows closed early leave
// the transaction usable; a row that fails after the first fails the transaction, so
// that its commit cannot commit the other data source's part alone.
func TestOneShardRowsInTransaction(t *testing.T) {
	db, _ := oneShard(t, "one_tx", 3000, 0)
	ctx := context.Background()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, "SELECT k, v FROM plain ORDER BY k")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var k int
		var v string
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		n++
		if k != n || len(v) != 100 {
			t.Fatalf("row %d: %d %q", n, k, v)
		}
		if n == 10 {
			if _, err := tx.ExecContext(ctx, "UPDATE plain SET v = 'changed' WHERE k = 2999"); err != nil {
				t.Fatalf("a statement while the rows are open: %v", err)
			}
		}
	}
	if err := rows.Err(); err != nil || n != 3000 {
		t.Fatalf("%d rows, %v", n, err)
	}
	// Closed after one row (QueryRow); the transaction goes on and commits.
	var k int
	if err := tx.QueryRowContext(ctx, "SELECT k FROM plain ORDER BY k").Scan(&k); err != nil || k != 1 {
		t.Fatalf("QueryRow: %d %v", k, err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO kv VALUES (3001, 'new')"); err != nil {
		t.Fatalf("after rows closed early: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var v string
	if err := db.QueryRow("SELECT v FROM plain WHERE k = 2999").Scan(&v); err != nil || v != "changed" {
		t.Errorf("the update beside open rows: %q %v", v, err)
	}

	// A row failing after the first: the transaction has failed, so that its commit
	// cannot commit the part on the first data source alone (best effort commits in
	// data source order, and the read ran on the second).
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO kv VALUES (4000, 'first data source')"); err != nil {
		t.Fatal(err)
	}
	var odd []string
	for k := 1; k < 3000; k += 2 {
		odd = append(odd, fmt.Sprint(k))
	}
	// No ORDER BY: a sort would compute every row before the first goes.
	rows, err = tx.QueryContext(ctx, "SELECT k, 1 / (k - 2501) FROM kv WHERE k IN ("+strings.Join(odd, ", ")+")")
	if err != nil {
		t.Fatal(err)
	}
	n = 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); sqlState(err) != "22012" || n == 0 {
		t.Fatalf("%d rows, then %v; want rows, then SQLSTATE 22012", n, err)
	}
	if err := tx.Commit(); err == nil {
		t.Error("the commit of a transaction whose read failed succeeded")
	}
	var count int
	if err := db.QueryRow("SELECT count(*) FROM kv WHERE k = 4000").Scan(&count); err != nil || count != 0 {
		t.Errorf("the failed transaction's insert on the other data source: count %d, %v; want 0", count, err)
	}
}

// TestOneShardRowsDeadlockVictim: a transaction whose rows from one data source wait,
// while they are read, for a lock in a cycle across data sources is the detector's
// victim, and its rows end with 40P01, as a statement that waits inside the session's
// Run does (before the fix, 57014, which clients do not retry).
func TestOneShardRowsDeadlockVictim(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t, "one_dl_s0"), pgtest.NewDatabase(t, "one_dl_s1")}
	db, err := shardsql.Open(shardsql.Config{Rules: kv(t, dsns), DeadlockInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	for _, q := range []string{
		"CREATE TABLE kv (k int PRIMARY KEY, v text)",
		"INSERT INTO kv VALUES (1, 'a'), (2, 'b'), (3, 'c')",
		"CREATE TABLE plain AS SELECT g AS k, repeat('v', 100) AS v FROM generate_series(1, 3000) g",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	older, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Rollback()
	time.Sleep(10 * time.Millisecond)
	younger, err := db.BeginTx(ctx, nil) // the youngest of a cycle gives way
	if err != nil {
		t.Fatal(err)
	}
	defer younger.Rollback()
	for _, step := range []struct {
		tx *sql.Tx
		q  string
	}{
		{younger, "SAVEPOINT s"},
		{younger, "SELECT pg_advisory_xact_lock(1) FROM kv WHERE k = 1"}, // ds_1
		{younger, "SELECT count(*) FROM plain"},                          // joins ds_0
		{older, "SELECT pg_advisory_xact_lock(2) FROM kv WHERE k = 2"},   // ds_0
	} {
		if _, err := step.tx.ExecContext(ctx, step.q); err != nil {
			t.Fatalf("%s: %v", step.q, err)
		}
	}
	olderDone := make(chan error, 1)
	go func() { // waits for the younger on ds_1
		_, err := older.ExecContext(ctx, "SELECT pg_advisory_xact_lock(1) FROM kv WHERE k = 3")
		olderDone <- err
	}()
	time.Sleep(200 * time.Millisecond)
	// The younger's rows wait, in row 2000, for the older on ds_0: a cycle.
	rows, err := younger.QueryContext(ctx, "SELECT k, CASE WHEN k = 2000 THEN pg_advisory_xact_lock(2)::text ELSE v END FROM plain ORDER BY k")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); sqlState(err) != "40P01" || n == 0 {
		t.Errorf("the victim's rows: %d, then %v; want rows, then SQLSTATE 40P01", n, err)
	}
	rows.Close()
	// The victim rolls back to its savepoint (its locks go) and goes on: a later
	// cancel, its own statement timeout, is no deadlock (before, 40P01 again).
	if _, err := younger.ExecContext(ctx, "ROLLBACK TO SAVEPOINT s"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-olderDone:
		if err != nil {
			t.Errorf("the older transaction after the victim rolled back: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Error("the older transaction still waits")
	}
	if _, err := younger.ExecContext(ctx, "SELECT set_config('statement_timeout', '100ms', true)"); err != nil {
		t.Fatal(err)
	}
	if _, err := younger.ExecContext(ctx, "SELECT pg_sleep(5)"); sqlState(err) != "57014" {
		t.Errorf("a statement timeout after the victim went on: %v, want SQLSTATE 57014", err)
	}
	// The victim's connection to the first data source serves on after its
	// transaction: its cancels were used up (before, it was closed).
	if _, err := younger.ExecContext(ctx, "ROLLBACK TO SAVEPOINT s"); err != nil {
		t.Fatal(err)
	}
	var victimPID int
	if err := younger.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&victimPID); err != nil {
		t.Fatal(err)
	}
	if err := younger.Rollback(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	direct, err := sql.Open("pgx", dsns[0])
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	var alive int
	if err := direct.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", victimPID).Scan(&alive); err != nil || alive != 1 {
		t.Errorf("the victim's connection after its transaction: %d backends with its pid, %v; want 1", alive, err)
	}
}

// TestCancelledStatementKeepsConnection: a statement cancelled inside a transaction (a
// statement timeout), rolled back to a savepoint, leaves a connection that serves on
// after the transaction: the cancel is used up (f00381e dropped it, and every such
// transaction cost a new server connection).
func TestCancelledStatementKeepsConnection(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t, "cancel_keep_s0"), pgtest.NewDatabase(t, "cancel_keep_s1")}
	db, err := shardsql.Open(shardsql.Config{Rules: kv(t, dsns), MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	pid := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}) int {
		t.Helper()
		var p int
		if err := q.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	before := pid(db)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, q := range []string{"SELECT set_config('statement_timeout', '100ms', true)", "SAVEPOINT s"} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if _, err := tx.ExecContext(ctx, "SELECT pg_sleep(5)"); sqlState(err) != "57014" {
		t.Fatalf("a statement over its timeout: %v, want SQLSTATE 57014", err)
	}
	if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT s"); err != nil {
		t.Fatal(err)
	}
	if got := pid(tx); got != before {
		t.Fatalf("the transaction's backend %d, want %d", got, before)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if after := pid(db); after != before {
		t.Errorf("backend %d after the transaction, want %d: the connection was dropped", after, before)
	}
}
