package shardsql_test

import (
	"context"
	"errors"
	"testing"

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
