package sqlexec_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/sqlexec"
)

// runSQL runs statements on one connection to dsn, in order.
func runSQL(t *testing.T, dsn string, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, s := range stmts {
		if _, err := c.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// openKV opens a two-phase DB over dsns that settles only when asked, and makes
// table kv on each database.
func openKV(t *testing.T, dsns []string) *sqlexec.DB {
	t.Helper()
	db, err := sqlexec.Open(context.Background(), kvRules(t, dsns), sqlexec.Config{TwoPhase: true, SettleInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	for _, d := range dsns {
		runSQL(t, d, "CREATE TABLE IF NOT EXISTS kv (k int PRIMARY KEY, v text)")
	}
	return db
}

// withSearchPath returns dsn with its search_path set to schema.
func withSearchPath(t *testing.T, dsn, schema string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("options", "-csearch_path="+schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestSettleSchemasOfOneDatabase: two data sources that are schemas of one database
// share the instance lock; the settler must take it for its own, and commits must
// work.
func TestSettleSchemasOfOneDatabase(t *testing.T) {
	cl := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	ctx := context.Background()
	base := cl.NewDatabase("schemas")
	runSQL(t, base, "CREATE SCHEMA s0", "CREATE SCHEMA s1", "CREATE TABLE s0.kv (k int PRIMARY KEY, v text)", "CREATE TABLE s1.kv (k int PRIMARY KEY, v text)")
	dsns := []string{withSearchPath(t, base, "s0"), withSearchPath(t, base, "s1")}
	db, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{TwoPhase: true, SettleInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer db.Close()
	// A second coordinator over the same schemas must see the first as alive.
	other, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{TwoPhase: true, SettleInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("open a second coordinator: %v", err)
	}
	defer other.Close()
	for i := range 20 {
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO kv VALUES (%d, 'a'), (%d, 'b')", 2*i, 2*i+1), text(), nil); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("commit %d: %v", i, err)
		}
	}
	if rows, p := countOn(t, dsns); fmt.Sprint(rows) != "[20 20]" || fmt.Sprint(p) != "[0 0]" {
		t.Errorf("rows %v, prepared %v", rows, p)
	}
	for _, s := range []*sqlexec.Settler{db.Settler(), other.Settler()} {
		if st := s.Stats(); st.RolledBack != 0 || st.FailedPasses != 0 {
			t.Errorf("settler %+v: want nothing rolled back, no failed pass", st)
		}
	}
}

// TestSettleAfterClose: a pass asked for after Close fails and leaves no connection
// behind.
func TestSettleAfterClose(t *testing.T) {
	cl := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	ctx := context.Background()
	dsns := []string{cl.NewDatabase("closed_0"), cl.NewDatabase("closed_1")}
	db := openKV(t, dsns)
	inst := db.Committer().Instance()
	db.Close()
	if _, _, err := db.Recover(ctx); err == nil {
		t.Error("recover after close: no error")
	}
	if _, err := db.Settler().Settle(ctx); !errors.Is(err, sqlexec.ErrSettlerClosed) {
		t.Errorf("settle after close: %v, want ErrSettlerClosed", err)
	}
	c, err := pgx.Connect(ctx, dsns[0])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2",
		sqlexec.InstanceLockClass, inst).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d sessions hold the closed settler's instance lock", n)
	}
}
