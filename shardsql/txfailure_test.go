package shardsql_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
)

// TestFailedQueryKeepsTheTransaction: a query that fails on one data source while
// another is still answering it fails the transaction as on one database, and no more:
// ROLLBACK TO SAVEPOINT recovers it and COMMIT keeps the writes made before. Up to this
// change the failure cancelled the other data source's query by breaking its
// connection, which lost that data source's part of the transaction.
func TestFailedQueryKeepsTheTransaction(t *testing.T) {
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: pgtest.NewDatabase(t, "drvtxf_s0")}, {Name: "ds_1", DSN: pgtest.NewDatabase(t, "drvtxf_s1")}},
		Tables:      []rules.Table{{Name: "items", Strategy: rules.Strategy{Column: "id"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	db := openDriver(t, c, false)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE items (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, q := range []string{"INSERT INTO items SELECT g FROM generate_series(1, 20) g", "SAVEPOINT s"} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// The data source of id 1 fails at its first row; the other one sleeps 20 ms a
	// row, and is still answering.
	rows, err := tx.QueryContext(ctx, "SELECT CASE WHEN id = 1 THEN 1 / (id - 1) ELSE (pg_sleep(0.02) IS NULL)::int END FROM items ORDER BY id")
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
		rows.Close()
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "22012" {
		t.Fatalf("%v, want 22012", err)
	}
	if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT s"); err != nil {
		t.Fatalf("ROLLBACK TO SAVEPOINT: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("COMMIT: %v", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM items").Scan(&n); err != nil || n != 20 {
		t.Fatalf("%d rows after COMMIT (%v), want 20", n, err)
	}
}

// TestFailedQueryInTransactionEnds: a query over several targets per data source that
// fails on one data source, inside a transaction, ends with the error. A review found
// that the first version of the change above waited for ever: it drained the targets
// one after another, while a data source with two targets waited to send the second's
// rows until the first's channel was read to its close.
func TestFailedQueryInTransactionEnds(t *testing.T) {
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: pgtest.NewDatabase(t, "drvtxe_s0")}, {Name: "ds_1", DSN: pgtest.NewDatabase(t, "drvtxe_s1")}},
		Tables: []rules.Table{{Name: "items", TablesPerDataSource: 2,
			Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt8, Algorithm: rules.AlgorithmRange, Bounds: []int64{1000, 2000, 3000}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	db := openDriver(t, c, false)
	ctx := context.Background()
	for _, q := range []string{"CREATE TABLE items (id bigint PRIMARY KEY)", "INSERT INTO items SELECT g FROM generate_series(1, 10000) g"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			done <- err
			return
		}
		defer tx.Rollback()
		rows, err := tx.QueryContext(ctx, "SELECT 1 / (id - 1) FROM items")
		if err == nil {
			for rows.Next() {
			}
			err = rows.Err()
			rows.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "22012" {
			t.Fatalf("%v, want 22012", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the failed query has not ended after 60 s")
	}
}

// TestBufferedFailureKeepsTheTransaction: the driver reads an open answer whole before
// another statement on the same transaction (database/sql allows one while rows are
// open); a failure met there keeps the other data sources' part of the transaction too.
func TestBufferedFailureKeepsTheTransaction(t *testing.T) {
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: pgtest.NewDatabase(t, "drvtxb_s0")}, {Name: "ds_1", DSN: pgtest.NewDatabase(t, "drvtxb_s1")}},
		Tables:      []rules.Table{{Name: "items", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt8, Algorithm: rules.AlgorithmRange, Bounds: []int64{100}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	db := openDriver(t, c, false)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE items (id bigint PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, q := range []string{"INSERT INTO items SELECT g FROM generate_series(1, 20) g", "INSERT INTO items SELECT g FROM generate_series(101, 120) g", "SAVEPOINT s"} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// ds_0 fails at id 5; ds_1 sleeps 20 ms a row.
	rows, err := tx.QueryContext(ctx, "SELECT CASE WHEN id = 5 THEN 1 / (id - 5) WHEN id > 100 THEN (pg_sleep(0.02) IS NULL)::int ELSE 0 END FROM items")
	if err != nil {
		t.Fatal(err)
	}
	rows.Next()
	tx.ExecContext(ctx, "SELECT 1") // reads the open answer whole first, and fails with it
	for rows.Next() {
	}
	rows.Close()
	if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT s"); err != nil {
		t.Fatalf("ROLLBACK TO SAVEPOINT: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("COMMIT: %v", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM items").Scan(&n); err != nil || n != 40 {
		t.Fatalf("%d rows after COMMIT (%v), want 40", n, err)
	}
}
