package sqlexec_test

import (
	"context"
	"errors"
	"testing"

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
