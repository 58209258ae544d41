package shardsql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/shardsql"
)

func streamKV(t *testing.T, prefix string, n int, maxConns int) *sql.DB {
	t.Helper()
	dsns := []string{pgtest.NewDatabase(t, prefix+"_s0"), pgtest.NewDatabase(t, prefix+"_s1")}
	db, err := shardsql.Open(shardsql.Config{Rules: kv(t, dsns), MaxConns: maxConns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	tx, _ := db.BeginTx(ctx, nil)
	for k := range n {
		if _, err := tx.ExecContext(ctx, "INSERT INTO kv VALUES ($1, repeat('v', 100))", k); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return db
}

// QueryRow (one Next, then Close) on a cross-shard SELECT inside a transaction must not
// abort the transaction.
func TestStreamTxQueryRowAbortsTx(t *testing.T) {
	db := streamKV(t, "st_qr", 3000, 0)
	ctx := context.Background()
	for _, q := range []string{
		"SELECT k FROM kv",                    // concatenation
		"SELECT k FROM kv ORDER BY k",         // sort merge
		"SELECT k FROM kv ORDER BY k LIMIT 1", // LIMIT satisfied by the one row read
	} {
		t.Run(q, func(t *testing.T) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			var k int
			if err := tx.QueryRowContext(ctx, q).Scan(&k); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM kv").Scan(&n); err != nil {
				t.Fatalf("statement after QueryRow in the transaction: %v", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatalf("commit: %v", err)
			}
		})
	}
}

// Iterating a cross-shard answer inside a transaction while running other statements
// on the same transaction (allowed by database/sql; worked when rows were gathered).
func TestStreamTxExecWhileRowsOpen(t *testing.T) {
	db := streamKV(t, "st_ex", 3000, 0)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, "SELECT k FROM kv")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var k int
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		if n < 3 {
			if _, err := tx.ExecContext(ctx, "UPDATE kv SET v = 'x' WHERE k = $1", k); err != nil {
				t.Fatalf("exec while rows open: %v", err)
			}
		}
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("rows: %v", err)
	}
	if n != 3000 {
		t.Fatalf("%d rows", n)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestStreamTextOrderPoolOfOne: with a pool of one connection per data source, a
// cross-shard ORDER BY on text asks the catalog for the text's collation before the
// stream takes the data source's only connection, and under a collation that does not
// compare bytes, gives its connections back before the ranks are asked for.
func TestStreamTextOrderPoolOfOne(t *testing.T) {
	db := streamKV(t, "st_p1", 10, 1)
	for _, q := range []string{
		"SELECT k, v FROM kv ORDER BY v, k",
		`SELECT k, v FROM kv ORDER BY v COLLATE "en-US-x-icu", k`,
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			cancel()
			t.Fatalf("%s: %v", q, err)
		}
		n := 0
		for rows.Next() {
			n++
		}
		if err := rows.Close(); err != nil || rows.Err() != nil || n != 10 {
			t.Errorf("%s: %d rows, %v %v", q, n, err, rows.Err())
		}
		cancel()
	}
}

// Outside a transaction, on one *sql.Conn: a statement while a streamed answer is open.
func TestStreamConnExecWhileRowsOpen(t *testing.T) {
	db := streamKV(t, "st_cx", 3000, 0)
	ctx := context.Background()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rows, err := c.QueryContext(ctx, "SELECT k FROM kv")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		if n == 0 {
			var x int
			if err := c.QueryRowContext(ctx, "SELECT count(*) FROM kv").Scan(&x); err != nil {
				t.Errorf("query while rows open: %v", err)
			}
		}
		n++
	}
	if err := rows.Err(); err != nil {
		t.Errorf("rows: %v", err)
	}
	rows.Close()
	if n != 3000 {
		t.Errorf("%d rows, want 3000", n)
	}
}

// A write, then a streamed read left early (defer rows.Close after Commit, a common
// pattern), then Commit: database/sql closes the rows (tx ctx cancelled) before the
// driver's Commit.
func TestStreamCommitWithOpenRows(t *testing.T) {
	db := streamKV(t, "st_cm", 3000, 0)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO kv VALUES (100000, 'new')"); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.QueryContext(ctx, "SELECT k FROM kv ORDER BY k")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	rows.Next()
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM kv WHERE k = 100000").Scan(&n); err != nil || n != 1 {
		t.Fatalf("committed row: n=%d err=%v", n, err)
	}
}

// Outside a transaction: QueryRow on a cross-shard answer (Close after one row) leaves
// the pooled shard connections usable; none is closed and dialled again.
func TestStreamQueryRowChurnsConnections(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t, "st_ch_s0"), pgtest.NewDatabase(t, "st_ch_s1")}
	db, err := shardsql.Open(shardsql.Config{Rules: kv(t, dsns)})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	for k := range 3000 {
		if _, err := db.ExecContext(ctx, "INSERT INTO kv VALUES ($1, repeat('v', 100))", k); err != nil {
			t.Fatal(err)
		}
	}
	direct, err := sql.Open("pgx", dsns[0])
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	sessions := func() int64 {
		var n int64
		direct.QueryRowContext(ctx, "SELECT pg_stat_clear_snapshot()").Scan(new(any))
		if err := direct.QueryRowContext(ctx, "SELECT sessions FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := sessions()
	for range 20 {
		var k int
		if err := db.QueryRowContext(ctx, "SELECT k FROM kv").Scan(&k); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1500 * time.Millisecond) // stats flush
	if d := sessions() - before; d > 3 {
		t.Errorf("%d new sessions on ds_0 for 20 QueryRow calls", d)
	}
}

// Every row of a LIMIT read (exactly LIMIT Next calls), then Close: the transaction
// goes on.
func TestStreamTxReadExactlyLimit(t *testing.T) {
	db := streamKV(t, "st_lim", 6000, 0)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, "SELECT k FROM kv ORDER BY k LIMIT 2000")
	if err != nil {
		t.Fatal(err)
	}
	for range 2000 {
		if !rows.Next() {
			t.Fatal("short")
		}
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "UPDATE kv SET v = 'y' WHERE k = 1"); err != nil {
		t.Fatalf("after reading the whole LIMIT: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}
