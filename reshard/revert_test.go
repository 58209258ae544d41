package reshard_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/proxy"
	"github.com/shardlab/shardlab/reshard"
	"github.com/shardlab/shardlab/rules"
)

// TestRevertThroughProxy grows a deployment from 2 data sources to 4 through a running
// proxy and then reverts it, while clients write through the proxy the whole time:
// one inserts people (updating and deleting some of its own), the others transfer
// money between accounts, a reader counts the accounts. The proxy's RESHARD REVERT
// holds new transactions and returns them to the old layout. No client transaction
// fails, the count never changes, every write acknowledged before, during and after
// the cutover is on the data source the old layout places its row on (the streams
// back carried the writes the new layout made), and nothing of the move is left.
//
// The inserter runs across the cutover: a stream back that also carried the copy's
// own changes back (its slot not moved past them) would meet its inserts as
// duplicates, and the revert would not catch up.
func TestRevertThroughProxy(t *testing.T) {
	dsns := fourDatabases(t)
	const rows = 1000
	fill(t, dsns, 2, 200)
	withAccountsOn(t, dsns, rows)
	from, to := layout(t, dsns[:2], withAccounts), layout(t, dsns, withAccounts)
	toPath := rulesFile(t, to)
	ctx := context.Background()
	addr, srv, err := serve(t, from)
	if err != nil {
		t.Fatal(err)
	}
	startMove(t, from, to, reshard.CopyOptions{})
	c := newClients(t, addr)
	c.transfers(3, rows)
	c.reader(rows)
	var inserts atomic.Int64
	// people 1..200 are there; the inserter adds from 1001 on, renames every fifth
	// one it added and deletes every seventh.
	want := map[int64]string{}
	for id := int64(1); id <= 200; id++ {
		want[id] = strings.Repeat("x", int(id%50))
	}
	c.wg.Go(func() {
		cn := c.connect()
		if cn == nil {
			return
		}
		defer cn.Close(ctx)
		for id := int64(1001); !c.stop.Load(); id++ {
			sql := fmt.Sprintf("INSERT INTO people VALUES (%d, 'p%d')", id, id)
			if _, err := cn.Exec(ctx, sql); err != nil {
				c.fail("%s: %v", sql, err)
				return
			}
			want[id] = fmt.Sprintf("p%d", id)
			if id%5 == 0 {
				sql = fmt.Sprintf("UPDATE people SET name = 'renamed' WHERE id = %d", id-2)
				if _, err := cn.Exec(ctx, sql); err != nil {
					c.fail("%s: %v", sql, err)
					return
				}
				if _, ok := want[id-2]; ok {
					want[id-2] = "renamed"
				}
			}
			if id%7 == 0 {
				sql = fmt.Sprintf("DELETE FROM people WHERE id = %d", id-3)
				if _, err := cn.Exec(ctx, sql); err != nil {
					c.fail("%s: %v", sql, err)
					return
				}
				delete(want, id-3)
			}
			inserts.Add(1)
		}
	})
	progressed := func(what string) {
		t.Helper()
		before, ins := c.txs.Load(), inserts.Load()
		time.Sleep(500 * time.Millisecond)
		if c.txs.Load() == before || inserts.Load() == ins {
			t.Errorf("no transfer or insert %s", what)
		}
	}
	progressed("before the cutover")
	res, err := c.admin("RESHARD CUTOVER '" + toPath + "'")
	if err != nil {
		c.halt()
		t.Fatalf("RESHARD CUTOVER: %v", err)
	}
	for _, row := range res[0].Rows {
		t.Logf("cutover %s: %s", row[0], row[1])
	}
	progressed("after the cutover")
	res, err = c.admin("RESHARD REVERT")
	if err != nil {
		c.halt()
		t.Fatalf("RESHARD REVERT: %v", err)
	}
	for _, row := range res[0].Rows {
		t.Logf("revert %s: %s", row[0], row[1])
	}
	progressed("after the revert")
	c.halt()
	t.Logf("%d transfers, %d inserts", c.txs.Load(), inserts.Load())

	if got := srv.Router().Rules().Digest(); got != from.Digest() {
		t.Errorf("the proxy routes by %s after the revert, want the old layout %s", got, from.Digest())
	}
	// Every row on the data source the old layout places it on, as acknowledged.
	got := map[int64]string{}
	var accounts, money int64
	for k, d := range dsns[:2] {
		cn, err := pgx.Connect(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		var stray int64
		if err := cn.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT count(*) FROM people WHERE NOT satisfies_hash_partition('hash_oracle'::regclass, 2, %[1]d, id))
			+ (SELECT count(*) FROM accounts WHERE NOT satisfies_hash_partition('hash_oracle'::regclass, 2, %[1]d, id))`, k)).Scan(&stray); err != nil {
			t.Fatal(err)
		}
		if stray != 0 {
			t.Errorf("ds_%d holds %d rows the old layout places elsewhere", k, stray)
		}
		var n, s int64
		if err := cn.QueryRow(ctx, "SELECT count(*), sum(bal) FROM accounts").Scan(&n, &s); err != nil {
			t.Fatal(err)
		}
		accounts, money = accounts+n, money+s
		rs, err := cn.Query(ctx, "SELECT id, name FROM people")
		if err != nil {
			t.Fatal(err)
		}
		for rs.Next() {
			var id int64
			var name string
			if err := rs.Scan(&id, &name); err != nil {
				t.Fatal(err)
			}
			got[id] = name
		}
		if err := rs.Err(); err != nil {
			t.Fatal(err)
		}
		cn.Close(ctx)
	}
	if accounts != rows || money != rows*100 {
		t.Errorf("the old data sources hold %d accounts with %d, want %d with %d", accounts, money, rows, rows*100)
	}
	if !maps.Equal(got, want) {
		var missing, extra, differ []int64
		for id, v := range want {
			if g, ok := got[id]; !ok {
				missing = append(missing, id)
			} else if g != v {
				differ = append(differ, id)
			}
		}
		for id := range got {
			if _, ok := want[id]; !ok {
				extra = append(extra, id)
			}
		}
		slices.Sort(missing)
		slices.Sort(extra)
		slices.Sort(differ)
		t.Errorf("people on the old data sources: %d missing %v, %d extra %v, %d different %v", len(missing), missing[:min(len(missing), 10)],
			len(extra), extra[:min(len(extra), 10)], len(differ), differ[:min(len(differ), 10)])
	}
	for k, d := range dsns {
		if n := queryString(t, d, `SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_subscription) +
			(SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_views WHERE viewname LIKE '%shardlab%') +
			(SELECT count(*) FROM pg_event_trigger)`); n != "0" {
			t.Errorf("ds_%d: %s publications, subscriptions, slots, views or event triggers of the move are left", k, n)
		}
	}
	// The table the move made there is dropped; those that were there, empty, are
	// empty again.
	for k, d := range dsns[2:] {
		if n := queryString(t, d, "SELECT (SELECT count(*) FROM pg_tables WHERE tablename = 'accounts') + (SELECT count(*) FROM people) + (SELECT count(*) FROM countries)"); n != "0" {
			t.Errorf("ds_%d keeps the accounts table the move made, or rows of people or countries (%s in all)", k+2, n)
		}
	}
	// A proxy given the target rules refuses to start, and a process that routes by
	// them is refused its writes; the old rules serve; the move can start again.
	if _, _, err := serve(t, to); !errors.Is(err, reshard.ErrStaleLayout) {
		t.Errorf("a proxy given the target rules after the revert: %v, want ErrStaleLayout", err)
	}
	stale, err := pgconn.Connect(ctx, dsns[0]+"&options=-c%20"+reshard.LayoutSetting+"%3D"+to.Digest())
	if err != nil {
		t.Fatal(err)
	}
	var pe *pgconn.PgError
	if _, err := stale.Exec(ctx, "UPDATE accounts SET bal = bal WHERE id = 1").ReadAll(); !errors.As(err, &pe) || pe.Code != "55000" {
		t.Errorf("a write of a process on the target layout after the revert: %v, want the fence's 55000", err)
	}
	stale.Close(ctx)
	if _, _, err := serve(t, from); err != nil {
		t.Errorf("a proxy given the old rules after the revert: %v", err)
	}
	startMove(t, from, to, reshard.CopyOptions{})
	if err := reshard.Cancel(ctx, from, to, reshard.Options{}); err != nil {
		t.Fatal(err)
	}
}

// TestRevertCompletesAfterACrash: a revert killed once it recorded the old layout again
// (its streams back still running) leaves a state no proxy may serve, until the revert
// is run again, which completes it. The writes the new layout made after the cutover
// are on the old data sources then. The cutover before it was itself killed and
// completed, so the slots back were moved past the copy by the completion.
func TestRevertCompletesAfterACrash(t *testing.T) {
	dsns := fourDatabases(t)
	fill(t, dsns, 2, 500)
	from, to := layout(t, dsns[:2]), layout(t, dsns)
	ctx := context.Background()
	startMove(t, from, to, reshard.CopyOptions{})
	crash := reshard.CutoverOptions{}
	reshard.CrashAfterRecord(&crash)
	if _, err := reshard.Cutover(ctx, from, to, nil, crash); !errors.Is(err, reshard.ErrCrashed) {
		t.Fatalf("the crashed cutover: %v", err)
	}
	// Rows the copy carries, written on the old layout before the cutover completes:
	// the fence lets a session that does not say its layout through.
	exec(t, dsns[0], "INSERT INTO people SELECT g, 'late' FROM generate_series(2001, 2100) g WHERE satisfies_hash_partition('hash_oracle'::regclass, 2, 0, g::bigint)")
	exec(t, dsns[1], "INSERT INTO people SELECT g, 'late' FROM generate_series(2001, 2100) g WHERE satisfies_hash_partition('hash_oracle'::regclass, 2, 1, g::bigint)")
	if _, err := reshard.Cutover(ctx, from, to, nil, reshard.CutoverOptions{}); err != nil {
		t.Fatalf("the cutover run again: %v", err)
	}
	// The new layout writes: inserts and updates of rows that moved.
	for k, d := range dsns[2:] {
		c, err := pgconn.Connect(ctx, d+"&options=-c%20"+reshard.LayoutSetting+"%3D"+to.Digest())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, fmt.Sprintf(`UPDATE people SET name = 'after' WHERE id <= 2100;
			INSERT INTO people SELECT g, 'new' FROM generate_series(3001, 3100) g WHERE satisfies_hash_partition('hash_oracle'::regclass, 4, %d, g::bigint)`, k+2)).ReadAll(); err != nil {
			t.Fatal(err)
		}
		c.Close(ctx)
	}
	if _, err := reshard.Revert(ctx, from, to, nil, crash); !errors.Is(err, reshard.ErrCrashed) {
		t.Fatalf("the crashed revert: %v", err)
	}
	// Until the streams back caught up, no process writes, whichever layout it routes
	// by: one on the old layout would have its writes overwritten by the new layout's
	// last ones still on their way back.
	for _, w := range []struct {
		dsn    string
		digest string
	}{{dsns[0], from.Digest()}, {dsns[2], to.Digest()}} {
		c, err := pgconn.Connect(ctx, w.dsn+"&options=-c%20"+reshard.LayoutSetting+"%3D"+w.digest)
		if err != nil {
			t.Fatal(err)
		}
		var pe *pgconn.PgError
		if _, err := c.Exec(ctx, "UPDATE people SET name = name WHERE id = 1").ReadAll(); !errors.As(err, &pe) || pe.Code != "55000" {
			t.Errorf("a write of a process on layout %s while the revert is cut short: %v, want the fence's 55000", w.digest, err)
		}
		c.Close(ctx)
	}
	if _, _, err := serve(t, from); !errors.Is(err, reshard.ErrRevertIncomplete) {
		t.Errorf("a proxy given the old rules after the crash: %v, want ErrRevertIncomplete", err)
	}
	if _, _, err := serve(t, to); !errors.Is(err, reshard.ErrStaleLayout) {
		t.Errorf("a proxy given the target rules after the crash: %v, want ErrStaleLayout", err)
	}
	if _, err := reshard.Cutover(ctx, from, to, nil, reshard.CutoverOptions{}); !errors.Is(err, reshard.ErrRevertIncomplete) {
		t.Errorf("a cutover after the crashed revert: %v, want ErrRevertIncomplete", err)
	}
	if _, err := reshard.Revert(ctx, from, to, nil, reshard.CutoverOptions{}); err != nil {
		t.Fatalf("the revert run again: %v", err)
	}
	if _, _, err := serve(t, from); err != nil {
		t.Errorf("a proxy given the old rules after the revert completed: %v", err)
	}
	var after, added, stray int64
	for k, d := range dsns[:2] {
		after += queryInt(t, d, "SELECT count(*) FROM people WHERE name = 'after'")
		added += queryInt(t, d, "SELECT count(*) FROM people WHERE name = 'new'")
		stray += queryInt(t, d, fmt.Sprintf("SELECT count(*) FROM people WHERE NOT satisfies_hash_partition('hash_oracle'::regclass, 2, %d, id)", k))
	}
	// The updates on ds_2 and ds_3 touched the rows the new layout placed there: about
	// half of the 500 and of the late 100.
	var moved int64
	for k := range 2 {
		moved += queryInt(t, dsns[k], fmt.Sprintf(`SELECT count(*) FROM people WHERE id <= 2100
			AND satisfies_hash_partition('hash_oracle'::regclass, 4, %d, id)`, k+2))
	}
	if after != moved || moved == 0 {
		t.Errorf("%d rows updated after the cutover are on the old data sources, want the %d that moved", after, moved)
	}
	if want := queryInt(t, dsns[0], `SELECT count(*) FROM generate_series(3001, 3100) g
		WHERE satisfies_hash_partition('hash_oracle'::regclass, 4, 2, g::bigint) OR satisfies_hash_partition('hash_oracle'::regclass, 4, 3, g::bigint)`); added != want {
		t.Errorf("%d rows inserted after the cutover are on the old data sources, want %d", added, want)
	}
	if stray != 0 {
		t.Errorf("%d rows on an old data source that the old layout places elsewhere", stray)
	}
	if _, err := reshard.Revert(ctx, from, to, nil, reshard.CutoverOptions{}); err == nil {
		t.Error("a third revert did not refuse")
	}
}

// TestSequencesFollowTheRows: logical replication carries rows, not sequences. A table
// whose key is a bigserial moves with its rows to the new data sources; once the
// cutover stopped the streams, each new data source's sequence is no less than its
// source's (else its next insert could take a key the rows copied there hold), and
// after a revert each old data source's is no less than the one it takes the writes
// back from.
func TestSequencesFollowTheRows(t *testing.T) {
	dsns := fourDatabases(t)
	fill(t, dsns, 2, 100)
	withTickets := func(r *rules.Rules) {
		r.Tables = append(r.Tables, rules.Table{Name: "tickets", Strategy: rules.Strategy{Column: "id"}})
	}
	// Each old data source numbers its own tickets, from its own start, and keeps
	// those the old layout places there.
	for i, d := range dsns[:2] {
		exec(t, d, "CREATE TABLE tickets (id bigserial PRIMARY KEY, note text)",
			fmt.Sprintf("ALTER SEQUENCE tickets_id_seq RESTART %d", 1+i*1000000),
			"INSERT INTO tickets (note) SELECT 'old' FROM generate_series(1, 400)",
			fmt.Sprintf("DELETE FROM tickets WHERE NOT satisfies_hash_partition('hash_oracle'::regclass, 2, %d, id)", i))
	}
	from, to := layout(t, dsns[:2], withTickets), layout(t, dsns, withTickets)
	ctx := context.Background()
	startMove(t, from, to, reshard.CopyOptions{})
	if _, err := reshard.Cutover(ctx, from, to, nil, reshard.CutoverOptions{}); err != nil {
		t.Fatal(err)
	}
	seq := func(dsn string) int64 {
		return queryInt(t, dsn, "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM tickets_id_seq")
	}
	for k := range 2 {
		if old, now := seq(dsns[k]), seq(dsns[k+2]); now < old {
			t.Errorf("after the cutover the sequence of ds_%d is at %d, behind that of ds_%d, %d", k+2, now, k, old)
		}
	}
	// The new layout inserts with the sequences of the new data sources.
	for k, d := range dsns[2:] {
		c, err := pgconn.Connect(ctx, d+"&options=-c%20"+reshard.LayoutSetting+"%3D"+to.Digest())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, fmt.Sprintf(`INSERT INTO tickets (note) SELECT 'new' FROM generate_series(1, 300);
			DELETE FROM tickets WHERE note = 'new' AND NOT satisfies_hash_partition('hash_oracle'::regclass, 4, %d, id)`, k+2)).ReadAll(); err != nil {
			t.Fatal(err)
		}
		c.Close(ctx)
	}
	if _, err := reshard.Revert(ctx, from, to, nil, reshard.CutoverOptions{}); err != nil {
		t.Fatal(err)
	}
	for k := range 2 {
		want := queryInt(t, dsns[k], "SELECT max(id) FROM tickets")
		if now := seq(dsns[k]); now < want {
			t.Errorf("after the revert the sequence of ds_%d is at %d, behind the keys it holds (up to %d)", k, now, want)
		}
	}
	// The old layout inserts on: no key taken twice.
	for _, d := range dsns[:2] {
		exec(t, d, "INSERT INTO tickets (note) SELECT 'after' FROM generate_series(1, 100)")
	}
}

// TestRevertRefusedOnceFinishBegan: a finish cut short while it deletes the rows that
// moved has dropped the streams back, and deleted some of those rows: a revert then
// would serve the old data sources without the writes made since the cutover. It is
// refused, naming the finish, and the finish run again ends the move.
func TestRevertRefusedOnceFinishBegan(t *testing.T) {
	dsns := fourDatabases(t)
	fill(t, dsns, 2, 1000)
	from, to := layout(t, dsns[:2]), layout(t, dsns)
	ctx := context.Background()
	startMove(t, from, to, reshard.CopyOptions{})
	if _, err := reshard.Cutover(ctx, from, to, nil, reshard.CutoverOptions{}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := reshard.Finish(short, from, to, nil, reshard.FinishOptions{Batch: 10, Rate: 20}); err == nil {
		t.Fatal("a finish deleting 20 rows a second ended within 2 s")
	}
	if _, err := reshard.Revert(ctx, from, to, nil, reshard.CutoverOptions{}); err == nil || !strings.Contains(err.Error(), "a finish of the move") {
		t.Errorf("a revert after a finish began: %v, want it refused, naming the finish", err)
	}
	if _, err := reshard.Finish(ctx, from, to, nil, reshard.FinishOptions{}); err != nil {
		t.Fatalf("the finish run again: %v", err)
	}
	for k, d := range dsns {
		if n := queryString(t, d, fmt.Sprintf("SELECT count(*) FROM people WHERE NOT satisfies_hash_partition('hash_oracle'::regclass, 4, %d, id)", k)); n != "0" {
			t.Errorf("ds_%d keeps %s rows the new layout places elsewhere", k, n)
		}
	}
}

// TestMoveWithTwoPhaseAndDeadlocks: a proxy that commits transactions across data
// sources with two-phase commit, and runs its deadlock detector across them, is cut
// over and reverted while clients transfer money: no transfer fails, the money adds
// up, no prepared transaction is left; on the new layout, and again on the old one, two
// clients that lock two accounts of two data sources in opposite orders meet the
// detector: one ends with 40P01, the other commits.
func TestMoveWithTwoPhaseAndDeadlocks(t *testing.T) {
	dsns := fourDatabases(t, "max_prepared_transactions = 20")
	const rows = 1000
	fill(t, dsns, 2, 100)
	withAccountsOn(t, dsns, rows)
	from, to := layout(t, dsns[:2], withAccounts), layout(t, dsns, withAccounts)
	addr, _, err := serve(t, from, func(c *proxy.Config) {
		c.TwoPhase, c.DeadlockInterval, c.SettleInterval = true, 100*time.Millisecond, time.Second
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	startMove(t, from, to, reshard.CopyOptions{})
	c := newClients(t, addr)
	// The transfers keep off the last 100 accounts, where the deadlocks below are made:
	// a transfer queued behind one of them can be PostgreSQL's victim instead.
	c.transfers(3, rows-100)
	// Two accounts on two data sources of layout l (by PostgreSQL's hash partitioning).
	pair := func(n int, first, second int) (int64, int64) {
		var a, b int64
		q := `SELECT min(g) FILTER (WHERE satisfies_hash_partition('hash_oracle'::regclass, $1, $2, g::bigint)),
			min(g) FILTER (WHERE satisfies_hash_partition('hash_oracle'::regclass, $1, $3, g::bigint)) FROM generate_series(901, 1000) g`
		cn, err := pgx.Connect(ctx, dsns[0])
		if err != nil {
			t.Fatal(err)
		}
		defer cn.Close(ctx)
		if err := cn.QueryRow(ctx, q, n, first, second).Scan(&a, &b); err != nil {
			t.Fatal(err)
		}
		return a, b
	}
	deadlock := func(what string, a, b int64) {
		t.Helper()
		errs := make(chan error, 2)
		var ready sync.WaitGroup
		ready.Add(2)
		for _, ids := range [][2]int64{{a, b}, {b, a}} {
			go func() {
				cn, err := pgx.Connect(ctx, c.url("app"))
				if err != nil {
					ready.Done()
					errs <- err
					return
				}
				defer cn.Close(ctx)
				errs <- pgx.BeginFunc(ctx, cn, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "UPDATE accounts SET bal = bal WHERE id = $1", ids[0])
					ready.Done()
					ready.Wait()
					if err == nil {
						_, err = tx.Exec(ctx, "UPDATE accounts SET bal = bal WHERE id = $1", ids[1])
					}
					return err
				})
			}()
		}
		var victims, committed int
		for range 2 {
			var pe *pgconn.PgError
			switch err := <-errs; {
			case err == nil:
				committed++
			case errors.As(err, &pe) && pe.Code == "40P01":
				victims++
			default:
				t.Errorf("%s: %v", what, err)
			}
		}
		if victims != 1 || committed != 1 {
			t.Errorf("%s: %d victims and %d commits, want one of each", what, victims, committed)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := c.admin("RESHARD CUTOVER '" + rulesFile(t, to) + "'"); err != nil {
		c.halt()
		t.Fatalf("RESHARD CUTOVER: %v", err)
	}
	a, b := pair(4, 0, 2)
	deadlock("on the new layout", a, b)
	if _, err := c.admin("RESHARD REVERT"); err != nil {
		c.halt()
		t.Fatalf("RESHARD REVERT: %v", err)
	}
	a, b = pair(2, 0, 1)
	deadlock("on the old layout again", a, b)
	time.Sleep(300 * time.Millisecond)
	c.halt()
	t.Logf("%d transfers", c.txs.Load())
	var money, prepared int64
	for _, d := range dsns[:2] {
		money += queryInt(t, d, "SELECT sum(bal) FROM accounts")
		prepared += queryInt(t, d, "SELECT count(*) FROM pg_prepared_xacts")
	}
	if money != rows*100 || prepared != 0 {
		t.Errorf("after the revert: %d in the accounts (want %d), %d prepared transactions left", money, rows*100, prepared)
	}
}
