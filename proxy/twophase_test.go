package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/proxy"
	"github.com/shardlab/shardlab/sqlexec"
)

// settleSlack is what settling may take beyond the settler's interval (and the time a
// data source was out of reach): a commit's tries on fresh connections and one pass
// on a loaded two-core machine.
const settleSlack = 2 * time.Second

// preparedCount counts the prepared transactions of every database; ok is false when
// one cannot be reached.
func preparedCount(dsns []string) (n int, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, d := range dsns {
		c, err := pgx.Connect(ctx, d)
		if err != nil {
			return 0, false
		}
		var p int
		err = c.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()").Scan(&p)
		c.Close(ctx)
		if err != nil {
			return 0, false
		}
		n += p
	}
	return n, true
}

// oldestPrepared polls pg_prepared_xacts of every database until stop is closed, and
// sends the greatest age of a prepared transaction it saw.
func oldestPrepared(dsns []string, stop <-chan struct{}) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	go func() {
		var oldest time.Duration
		defer func() { out <- oldest }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			for _, d := range dsns {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				if c, err := pgx.Connect(ctx, d); err == nil {
					var secs float64
					if c.QueryRow(ctx, "SELECT coalesce(max(extract(epoch FROM now() - prepared)), 0)::float8 FROM pg_prepared_xacts WHERE database = current_database()").Scan(&secs) == nil {
						oldest = max(oldest, time.Duration(secs*float64(time.Second)))
					}
					c.Close(ctx)
				}
				cancel()
			}
		}
	}()
	return out
}

// terminateBackends ends every other backend of the database dsn names.
func terminateBackends(dsn string) (int, error) {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer c.Close(ctx)
	var n int
	err = c.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()").Scan(&n)
	return n, err
}

// adminRow runs an admin console statement and returns its one row by column name.
func adminRow(t *testing.T, e *env, sql string) map[string]string {
	t.Helper()
	ctx := context.Background()
	adm, err := pgconn.Connect(ctx, strings.Replace(e.url(""), "/"+testDatabase+"?", "/shardlab?", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close(ctx)
	res, err := adm.Exec(ctx, sql).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		t.Fatalf("%s: %d results", sql, len(res))
	}
	row := map[string]string{}
	for i, f := range res[0].FieldDescriptions {
		row[f.Name] = string(res[0].Rows[0][i])
	}
	return row
}

func metrics(e *env) string {
	rec := httptest.NewRecorder()
	e.srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	return string(body)
}

// TestTwoPhaseSettlesWhileRunning is the bank transfer that found two-phase commits left
// prepared while the proxy kept running: money moves between accounts on three shards
// with --two-phase while the backends of one shard are terminated five times between
// the phases, and then while another shard's server is down. Without a restart of the
// proxy, nothing stays prepared longer than the settler's interval after its shard is
// reachable, the sum of the balances read through the proxy is right, and the admin
// console and /metrics count what was in doubt meanwhile.
func TestTwoPhaseSettlesWhileRunning(t *testing.T) {
	a := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	b := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	dsns := []string{a.NewDatabase("settle_s0"), a.NewDatabase("settle_s1"), b.NewDatabase("settle_s2")}
	e := startProxyOn(t, shardedRules(dsns, []string{"accounts=id"}, nil), func(c *proxy.Config) {
		c.TwoPhase, c.AdminDatabase = true, "shardlab"
	})
	ctx := context.Background()
	c := e.connect(t)
	exec1(t, c, "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)")
	const accounts = 30
	for id := range accounts {
		exec1(t, c, "INSERT INTO accounts VALUES ($1, 100)", id)
	}
	// Where each account lives.
	on := map[int][]int{}
	for ds := range dsns {
		rows, err := e.shard(t, ds).Query(ctx, "SELECT id FROM accounts ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id int
			rows.Scan(&id)
			on[ds] = append(on[ds], id)
		}
		rows.Close()
		if len(on[ds]) < 2 {
			t.Fatalf("data source %d holds accounts %v; the test wants two or more", ds, on[ds])
		}
	}
	sum := func() int64 { return queryInt(t, c, "SELECT sum(balance) FROM accounts") }
	// A transfer that waits 10 s fails: a prepared transaction left behind holds
	// its rows.
	move := func(from, to int) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance - 1 WHERE id = $1", from); err != nil {
			tx.Rollback(ctx)
			return err
		}
		if _, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = $1", to); err != nil {
			tx.Rollback(ctx)
			return err
		}
		return tx.Commit(ctx)
	}
	blocked := func(err error) bool { return errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) }
	committer := e.srv.Router().Committer()
	stop := make(chan struct{})
	oldest := oldestPrepared(dsns, stop)

	// Part 1: the backends of shard 1 are terminated between the phases of five
	// transfers (before the decision three times, after it twice).
	var hook struct {
		sync.Mutex
		stage      string
		terminated int
		err        error
	}
	committer.SetPhaseHook(func(stage string) {
		hook.Lock()
		defer hook.Unlock()
		if stage == hook.stage {
			hook.stage = ""
			n, err := terminateBackends(dsns[1])
			hook.terminated += n
			if err != nil {
				hook.err = err
			}
		}
	})
	for i, stage := range []string{sqlexec.StagePrepared, sqlexec.StageCommitted, sqlexec.StagePrepared, sqlexec.StageCommitted, sqlexec.StagePrepared} {
		hook.Lock()
		hook.stage = stage
		hook.Unlock()
		from, to := on[0][i%len(on[0])], on[1][i%len(on[1])]
		var err error
		for attempt := 0; attempt < 20; attempt++ {
			if err = move(from, to); err == nil {
				break
			}
			if blocked(err) {
				t.Fatalf("transfer %d waited 10 s for its rows: %v", i, err)
			}
			// A statement on a server connection terminated by an earlier round
			// fails before the commit; the client retries, as a bank would.
			time.Sleep(20 * time.Millisecond)
			hook.Lock()
			pending := hook.stage != ""
			hook.Unlock()
			if !pending {
				t.Errorf("transfer %d: the commit failed after shard 1's backends were terminated at %s: %v", i, stage, err)
				break
			}
		}
		if err != nil && t.Failed() {
			break
		}
	}
	committer.SetPhaseHook(nil)
	// Under the hook's lock: a commit under way may still be in the hook.
	hook.Lock()
	terminated, hookErr := hook.terminated, hook.err
	hook.Unlock()
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	deadline := time.Now().Add(sqlexec.DefaultSettleInterval + settleSlack)
	for {
		n, ok := preparedCount(dsns)
		if ok && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d prepared transactions left %v after the terminations", n, sqlexec.DefaultSettleInterval+settleSlack)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := sum(); got != accounts*100 {
		t.Errorf("sum of the balances after the terminations: %d, want %d", got, accounts*100)
	}
	t.Logf("part 1: %d backends terminated", terminated)

	// Part 2: shard 2's server stops after a transfer's decision, and comes back
	// 2 s later. The client's commit succeeds; the part on shard 2 stays prepared
	// while it is down, and is committed when it is back.
	reached, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	committer.SetPhaseHook(func(stage string) {
		if stage == sqlexec.StageCommitted {
			once.Do(func() {
				close(reached)
				<-proceed
			})
		}
	})
	committed := make(chan error, 1)
	go func() { committed <- move(on[0][0], on[2][0]) }()
	select {
	case <-reached:
	case err := <-committed:
		t.Fatalf("the transfer ended before its decision: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the transfer did not reach its decision")
	}
	b.Stop() // Cluster methods belong to the test's goroutine
	downAt := time.Now()
	close(proceed)
	if err := <-committed; err != nil {
		t.Errorf("commit while shard 2 went down after the decision (blocked: %v): %v", blocked(err), err)
	}
	committer.SetPhaseHook(nil)
	time.Sleep(sqlexec.DefaultSettleInterval + 500*time.Millisecond) // a pass finds shard 2 out of reach
	row := adminRow(t, e, "SHOW TWO_PHASE")
	if row["two_phase"] != "on" || row["in_doubt"] != "1" || row["unreachable_data_sources"] != "1" {
		t.Errorf("SHOW TWO_PHASE while shard 2 is down: %v", row)
	}
	if age, _ := strconv.Atoi(row["oldest_in_doubt_ms"]); age < 1000 {
		t.Errorf("SHOW TWO_PHASE: the oldest in doubt is %d ms old, want 1000 or more", age)
	}
	m := metrics(e)
	for _, want := range []string{"shardlab_proxy_twophase_in_doubt 1", "shardlab_proxy_twophase_unreachable_data_sources 1"} {
		if !strings.Contains(m, want+"\n") {
			t.Errorf("/metrics while shard 2 is down lacks %q", want)
		}
	}
	time.Sleep(2*time.Second - time.Since(downAt))
	b.Start()
	unreachable := time.Since(downAt)
	restarted := time.Now()
	for {
		n, ok := preparedCount(dsns)
		if ok && n == 0 {
			break
		}
		if time.Since(restarted) > sqlexec.DefaultSettleInterval+settleSlack {
			t.Fatalf("%d prepared transactions left %v after shard 2 came back", n, time.Since(restarted))
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(restarted)
	close(stop)
	longest := <-oldest
	t.Logf("part 2: shard 2 down for %v, settled %v after it came back; oldest prepared transaction seen %v", unreachable, took, longest)
	if longest > unreachable+sqlexec.DefaultSettleInterval+settleSlack {
		t.Errorf("a transaction stayed prepared for %v: longer than the outage (%v) plus the interval", longest, unreachable)
	}
	if got := sum(); got != accounts*100 {
		t.Errorf("sum of the balances after the outage: %d, want %d", got, accounts*100)
	}
	for deadline := time.Now().Add(sqlexec.DefaultSettleInterval + settleSlack); ; time.Sleep(50 * time.Millisecond) {
		row = adminRow(t, e, "SHOW TWO_PHASE")
		if row["in_doubt"] == "0" && row["unreachable_data_sources"] == "0" || time.Now().After(deadline) {
			break
		}
	}
	if row["in_doubt"] != "0" || row["oldest_in_doubt_ms"] != "0" || row["committed"] == "0" {
		t.Errorf("SHOW TWO_PHASE after shard 2 came back: %v", row)
	}
	m = metrics(e)
	for _, want := range []string{"shardlab_proxy_twophase_in_doubt 0\n", `shardlab_proxy_twophase_settled_total{outcome="commit"} `} {
		if !strings.Contains(m, want) || strings.Contains(m, `shardlab_proxy_twophase_settled_total{outcome="commit"} 0`+"\n") {
			t.Errorf("/metrics after shard 2 came back lacks %q", want)
		}
	}
	if !strings.Contains(adminHelp(t, e), "SHOW TWO_PHASE") {
		t.Error("SHOW HELP does not list SHOW TWO_PHASE")
	}
}

func adminHelp(t *testing.T, e *env) string {
	t.Helper()
	ctx := context.Background()
	adm, err := pgconn.Connect(ctx, strings.Replace(e.url(""), "/"+testDatabase+"?", "/shardlab?", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close(ctx)
	res, err := adm.Exec(ctx, "SHOW HELP").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, r := range res[0].Rows {
		lines = append(lines, string(r[0]))
	}
	return fmt.Sprint(lines)
}

// TestReadInPartsOneByOne: a row-limited SELECT over several shards alone in its batch
// runs in an implicit transaction (its shards' portals are fetched in parts) that
// commits each data source on its own, as autocommit would have: under --two-phase it
// takes no decision record and prepares nothing, so it answers under
// default_transaction_read_only as PostgreSQL does.
func TestReadInPartsOneByOne(t *testing.T) {
	a := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	dsns := []string{a.NewDatabase("oneby_s0"), a.NewDatabase("oneby_s1")}
	e := startProxyOn(t, shardedRules(dsns, []string{"pt=id"}, nil), func(c *proxy.Config) {
		c.TwoPhase, c.AdminDatabase = true, "shardlab"
	})
	c := e.connect(t)
	exec1(t, c, "CREATE TABLE pt (id int PRIMARY KEY)")
	exec1(t, c, "INSERT INTO pt SELECT g FROM generate_series(1, 100) g")
	pc := e.pgconnect(t)
	ctx := context.Background()
	if _, err := pc.Exec(ctx, "SET default_transaction_read_only = on").ReadAll(); err != nil {
		t.Fatal(err)
	}
	fe := pc.Frontend()
	for range 3 {
		fe.Send(&pgproto3.Parse{Query: "SELECT id FROM pt ORDER BY id"})
		fe.Send(&pgproto3.Bind{})
		fe.Send(&pgproto3.Execute{MaxRows: 2})
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			msg, err := fe.Receive()
			if err != nil {
				t.Fatal(err)
			}
			switch m := msg.(type) {
			case *pgproto3.DataRow:
				got = append(got, string(m.Values[0]))
			case *pgproto3.PortalSuspended:
				got = append(got, "suspended")
			case *pgproto3.ErrorResponse:
				got = append(got, "error "+m.Code+" "+m.Message)
			}
			if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
				break
			}
		}
		if strings.Join(got, ",") != "1,2,suspended" {
			t.Fatalf("read-only, two rows of a cross-shard SELECT: %q, want 1, 2, suspended", got)
		}
	}
	for ds := range dsns {
		if n := queryInt(t, e.shard(t, ds), "SELECT count(*) FROM pg_prepared_xacts"); n != 0 {
			t.Errorf("data source %d: %d prepared transactions", ds, n)
		}
	}
}
