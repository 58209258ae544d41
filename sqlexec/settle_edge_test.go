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

// deadInstance is an instance id no coordinator of these tests holds: its
// transactions belong to a coordinator that died.
const deadInstance = 0x0badf00d

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

// prepareKV prepares, on dsn, a transaction named gid that inserts row k into kv.
func prepareKV(t *testing.T, dsn, gid string, k int) {
	t.Helper()
	runSQL(t, dsn, "BEGIN", fmt.Sprintf("INSERT INTO kv VALUES (%d, 'x')", k), "PREPARE TRANSACTION '"+gid+"'")
}

// prepared lists the prepared transactions of dsn's database.
func prepared(t *testing.T, dsn string) []string {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	rows, _ := c.Query(ctx, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() ORDER BY gid")
	gids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return gids
}

// decisionRows counts gid's rows in dsn's decision table.
func decisionRows(t *testing.T, dsn, gid string) int {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM "+sqlexec.DecisionTable+" WHERE gid = $1", gid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
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

// TestSettleWithOtherRules: a dead coordinator's transaction is committed (its
// decision row on data source A) with its part on B still prepared. Settlers whose
// rules name the data sources in another order, or only some of them, must neither
// roll that part back nor delete the decision row it needs; a settler that reaches
// both commits it.
func TestSettleWithOtherRules(t *testing.T) {
	cl := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	ctx := context.Background()
	a, b, c := cl.NewDatabase("rules_a"), cl.NewDatabase("rules_b"), cl.NewDatabase("rules_c")
	for _, d := range []string{a, b, c} {
		runSQL(t, d, "CREATE TABLE kv (k int PRIMARY KEY, v text)",
			"CREATE TABLE "+sqlexec.DecisionTable+" (gid text PRIMARY KEY, decided_at timestamptz NOT NULL DEFAULT now())")
	}
	// The dead coordinator's rules were [A, B]: the coordinator part on A (index 0),
	// the other on B (index 1).
	gid := fmt.Sprintf("%s%08x_%016x_0", sqlexec.GIDPrefix, deadInstance, 0x1234)
	runSQL(t, a, "INSERT INTO "+sqlexec.DecisionTable+" (gid) VALUES ('"+gid+"')", "INSERT INTO kv VALUES (0, 'x')")
	prepareKV(t, b, gid+"_1", 1)

	for _, tc := range []struct {
		name string
		dsns []string
	}{
		{"without the coordinator's data source", []string{b, c}},
		{"without the participant's data source", []string{a, c}},
		{"with another data source first", []string{c, b}},
	} {
		db := openKV(t, tc.dsns)
		if _, _, err := db.Recover(ctx); err != nil {
			t.Logf("%s: recover: %v", tc.name, err)
		}
		db.Close()
		if p := prepared(t, b); len(p) != 1 {
			t.Fatalf("%s: prepared on B %v, want the committed transaction's part left alone", tc.name, p)
		}
		if n := decisionRows(t, a, gid); n != 1 {
			t.Fatalf("%s: the decision row is gone while a part is still prepared", tc.name)
		}
	}
	db := openKV(t, []string{a, b}) // its first pass settles
	if st := db.Settler().Stats(); st.Committed != 1 || st.RolledBack != 0 {
		t.Errorf("settler over A and B: %+v; want 1 part committed", st)
	}
	if rows, p := countOn(t, []string{a, b}); fmt.Sprint(rows) != "[1 1]" || fmt.Sprint(p) != "[0 0]" {
		t.Errorf("rows %v, prepared %v; want the transaction committed on both", rows, p)
	}
}

// TestSettleLegacyGIDs: a GID from before instance ids names no coordinator whose
// liveness a settler could check, so without a decision row it is left for an
// operator; with one it is committed.
func TestSettleLegacyGIDs(t *testing.T) {
	cl := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	ctx := context.Background()
	dsns := []string{cl.NewDatabase("legacy_0"), cl.NewDatabase("legacy_1")}
	db := openKV(t, dsns)

	undecided := fmt.Sprintf("%s%016x", sqlexec.GIDPrefix, 0xaaaa)
	prepareKV(t, dsns[0], undecided+"_0", 0)
	prepareKV(t, dsns[1], undecided+"_1", 1)
	decided := fmt.Sprintf("%s%016x", sqlexec.GIDPrefix, 0xbbbb)
	runSQL(t, dsns[0], "INSERT INTO "+sqlexec.DecisionTable+" (gid) VALUES ('"+decided+"')", "INSERT INTO kv VALUES (2, 'x')")
	prepareKV(t, dsns[1], decided+"_1", 3)

	committed, rolledBack, err := db.Recover(ctx)
	if committed != 1 || rolledBack != 0 {
		t.Errorf("recover: %d committed, %d rolled back (%v); want the decided one committed, nothing rolled back", committed, rolledBack, err)
	}
	for i, d := range dsns {
		if p := prepared(t, d); fmt.Sprint(p) != fmt.Sprintf("[%s_%d]", undecided, i) {
			t.Errorf("prepared on data source %d: %v, want the undecided legacy part left", i, p)
		}
	}
	if st := db.Settler().Stats(); st.InDoubt != 1 {
		t.Errorf("in doubt %d, want the undecided legacy transaction", st.InDoubt)
	}
	for i, d := range dsns {
		runSQL(t, d, fmt.Sprintf("ROLLBACK PREPARED '%s_%d'", undecided, i))
	}
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
	// The server ends a session a moment after its client closes it (Terminate is
	// not answered): wait a little for the lock to go, not forever.
	var n int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2",
			sqlexec.InstanceLockClass, inst).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 || time.Now().After(deadline) {
			break
		}
	}
	if n != 0 {
		t.Errorf("%d sessions hold the closed settler's instance lock 5 s after Close", n)
	}
}
