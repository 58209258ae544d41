package shardsql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// TestRowsStream: rows.Next hands out a cross-shard answer's rows as they arrive.
// The second data source's scan waits on an advisory lock the test holds there; the
// first data source's rows must reach the caller meanwhile (before, the driver
// gathered every shard's answer first, and no row came until the lock was released).
func TestRowsStream(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t, "stream_s0"), pgtest.NewDatabase(t, "stream_s1")}
	db := openDriver(t, kv(t, dsns), false)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	for k := range 400 {
		if _, err := db.ExecContext(ctx, "INSERT INTO kv VALUES ($1, repeat('v', 100))", k); err != nil {
			t.Fatal(err)
		}
	}
	holder, err := sql.Open("pgx", dsns[1])
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	hc, err := holder.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	if _, err := hc.ExecContext(ctx, "SELECT pg_advisory_lock(4242)"); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			if _, err := hc.ExecContext(ctx, "SELECT pg_advisory_unlock(4242)"); err != nil {
				t.Error(err)
			}
		}
	}
	defer release()
	first := make(chan error, 1)
	done := make(chan int, 1)
	go func() {
		qctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		rows, err := db.QueryContext(qctx, "SELECT k, v FROM kv WHERE pg_advisory_xact_lock_shared(4242)::text = ''")
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
		if err := rows.Close(); err != nil || n == 0 {
			first <- err
		}
		done <- n
	}()
	select {
	case err := <-first:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Error("no row reached rows.Next while one shard's answer waited")
	}
	release()
	if n := <-done; n != 400 {
		t.Errorf("%d rows, want 400", n)
	}
}
