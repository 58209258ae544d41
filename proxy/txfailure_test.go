package proxy_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestFailedStatementKeepsTheTransaction: a statement that fails on one data source
// while another is still answering it fails the client's transaction as on one
// database, and no more: ROLLBACK TO SAVEPOINT (psql's ON_ERROR_ROLLBACK sends it after
// every error) recovers it, and COMMIT keeps the writes made before. Up to this change
// the failure cancelled the other data source's statement by breaking its connection,
// which lost that data source's part of the transaction: the next statement got
// "conn closed" and COMMIT rolled back (about half the time, as psql users met it).
func TestFailedStatementKeepsTheTransaction(t *testing.T) {
	e := startProxy(t, 2, []string{"items=id"}, nil)
	ctx := context.Background()
	pc := e.pgconnect(t)
	run := func(sql string) error {
		_, err := pc.Exec(ctx, sql).ReadAll()
		return err
	}
	if err := run("CREATE TABLE items (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		for _, sql := range []string{"BEGIN", "INSERT INTO items SELECT g FROM generate_series(1, 20) g", "SAVEPOINT s"} {
			if err := run(sql); err != nil {
				t.Fatal(err)
			}
		}
		// The data source of id 1 fails at its first row; the other one sleeps
		// 20 ms a row, and is still answering.
		err := run("SELECT CASE WHEN id = 1 THEN 1 / (id - 1) ELSE (pg_sleep(0.02) IS NULL)::int END FROM items ORDER BY id")
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "22012" {
			t.Fatalf("round %d: %v, want 22012", round, err)
		}
		for _, sql := range []string{"ROLLBACK TO SAVEPOINT s", "COMMIT"} {
			if err := run(sql); err != nil {
				t.Fatalf("round %d: %s: %v", round, sql, err)
			}
		}
		res, err := pc.Exec(ctx, "SELECT count(*) FROM items").ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		if got := string(res[0].Rows[0][0]); got != "20" {
			t.Fatalf("round %d: %s rows after COMMIT, want 20", round, got)
		}
		if err := run("DELETE FROM items"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFailedWriteWarnsNothing: a write to several data sources that fails on the first
// one rolls back only the data sources it began on. Up to this change the others got a
// ROLLBACK too, and the client a WARNING "there is no transaction in progress" (25P01)
// before the error, which one database does not send.
func TestFailedWriteWarnsNothing(t *testing.T) {
	e := startProxy(t, 2, []string{"items=id"}, []string{"cities"})
	ctx := context.Background()
	cfg, err := pgconn.ParseConfig(e.url(""))
	if err != nil {
		t.Fatal(err)
	}
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Code+" "+n.Message) }
	pc, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(ctx)
	for _, sql := range []string{
		"CREATE TABLE cities (code text PRIMARY KEY, name text)",
		"CREATE TABLE items (id int PRIMARY KEY, v int CHECK (v > 0))",
		"INSERT INTO cities VALUES ('PAR', 'Paris')",
		"INSERT INTO items SELECT g, 1 FROM generate_series(1, 20) g",
	} {
		if _, err := pc.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ sql, code string }{
		{"INSERT INTO cities VALUES ('PAR', 'Paris again')", "23505"},
		{"UPDATE items SET v = -1", "23514"},
	} {
		notices = nil
		_, err := pc.Exec(ctx, c.sql).ReadAll()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != c.code {
			t.Fatalf("%s: %v, want %s", c.sql, err, c.code)
		}
		if len(notices) > 0 {
			t.Errorf("%s: notices %q, want none", c.sql, notices)
		}
	}
}
