package proxy_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// TestShardDown: with one shard's server stopped, the statements that need it fail
// with 08006 naming it, and everything else goes on; when it comes back, so do they.
func TestShardDown(t *testing.T) {
	cluster := pgtest.StartCluster(t)
	dsns := []string{pgtest.NewDatabase(t, "down_s0"), cluster.NewDatabase("down_s1")}
	e := startProxyOn(t, shardedRules(dsns, []string{"kv=k"}, nil), withPool(4, 5*time.Second))
	c := e.connect(t)
	ctx := context.Background()
	exec1(t, c, "CREATE TABLE kv (k int PRIMARY KEY, v text)")
	// Keys on each shard.
	var on [2][]int
	for k := 1; len(on[0]) < 3 || len(on[1]) < 3; k++ {
		exec1(t, c, "INSERT INTO kv VALUES ($1, 'x')", k)
		for i := range 2 {
			if queryInt(t, e.shard(t, i), "SELECT count(*) FROM kv WHERE k = $1", k) == 1 {
				on[i] = append(on[i], k)
			}
		}
	}
	cluster.Stop()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, k := range on[0] {
		var v string
		if err := c.QueryRow(tctx, "SELECT v FROM kv WHERE k = $1", k).Scan(&v); err != nil {
			t.Errorf("key %d on the shard that is up: %v", k, err)
		}
	}
	check := func(what string, err error) {
		t.Helper()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "08006" || !strings.Contains(pe.Message, "ds_1") {
			t.Errorf("%s with ds_1 down: %v, want 08006 naming ds_1", what, err)
		}
	}
	var v string
	check("point read", c.QueryRow(tctx, "SELECT v FROM kv WHERE k = $1", on[1][0]).Scan(&v))
	_, err := c.Exec(tctx, "SELECT count(*) FROM kv")
	check("cross-shard read", err)
	pc := e.pgconnect(t)
	_, err = pc.Exec(tctx, "INSERT INTO kv VALUES ("+strconv.Itoa(on[1][1]+1000)+", 'y')").ReadAll()
	if err != nil && sqlState(err) != "08006" {
		t.Errorf("simple insert: %v", err)
	}
	_, err = pc.Exec(tctx, "SELECT v FROM kv WHERE k = "+strconv.Itoa(on[1][0])).ReadAll()
	check("simple point read", err)
	// The proxy and the other shard still answer.
	if _, err := pc.Exec(tctx, "SELECT v FROM kv WHERE k = "+strconv.Itoa(on[0][0])).ReadAll(); err != nil {
		t.Errorf("after the failures, a read on the shard that is up: %v", err)
	}
	cluster.Start()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := c.QueryRow(tctx, "SELECT v FROM kv WHERE k = $1", on[1][0]).Scan(&v)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ds_1 is back, but the read still fails: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM kv"); n < 6 {
		t.Errorf("count %d after the shard came back", n)
	}
}

// TestGracefulShutdown: on shutdown an idle client is disconnected with 57P01, a
// client in a transaction may finish it, and new clients are turned away.
func TestGracefulShutdown(t *testing.T) {
	dsn := pgtest.NewDatabase(t, "shutdown")
	e := startProxyOn(t, shardedRules([]string{dsn}, nil, nil))
	ctx := context.Background()
	idle := e.pgconnect(t)
	busy := e.connect(t)
	exec1(t, busy, "CREATE TABLE t (x int)")
	exec1(t, busy, "BEGIN")
	exec1(t, busy, "INSERT INTO t VALUES (1)")
	done := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		done <- e.srv.Shutdown(sctx)
	}()
	// The idle client is told and disconnected.
	deadline := time.Now().Add(10 * time.Second)
	for !idle.IsClosed() && time.Now().Before(deadline) {
		_, err := idle.Exec(ctx, "SELECT 1").ReadAll()
		if err != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := idle.Exec(ctx, "SELECT 1").ReadAll(); err == nil {
		t.Error("an idle client still works during shutdown")
	}
	// New clients are refused (the listener is closed).
	if c, err := pgx.Connect(ctx, e.url("")); err == nil {
		c.Close(ctx)
		t.Error("a new client connected during shutdown")
	}
	// The client in a transaction finishes it.
	exec1(t, busy, "INSERT INTO t VALUES (2)")
	exec1(t, busy, "COMMIT")
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("shutdown: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("shutdown did not finish after the last transaction ended")
	}
	direct := e.shard(t, 0)
	if n := queryInt(t, direct, "SELECT count(*) FROM t"); n != 2 {
		t.Errorf("%d rows committed, want 2", n)
	}
}

// TestShutdownCutsOffAtDeadline: a transaction still open at the deadline is rolled
// back and its client disconnected.
func TestShutdownCutsOffAtDeadline(t *testing.T) {
	e := startProxy(t, 1, nil, nil)
	ctx := context.Background()
	c := e.connect(t)
	exec1(t, c, "CREATE TABLE t (x int)")
	exec1(t, c, "BEGIN")
	exec1(t, c, "INSERT INTO t VALUES (1)")
	sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := e.srv.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("shutdown with an open transaction: %v, want the deadline", err)
	}
	if _, err := c.Exec(ctx, "COMMIT"); err == nil {
		t.Error("COMMIT succeeded after the proxy cut the client off")
	}
	direct := e.shard(t, 0)
	if n := queryInt(t, direct, "SELECT count(*) FROM t"); n != 0 {
		t.Errorf("%d rows of the cut-off transaction were committed", n)
	}
	// A closed connection's server process may take a moment to go.
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := queryInt(t, direct, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%d server connections left open after shutdown", n)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestShutdownInterruptsAStatementInProgress: at the deadline, a statement still
// running is cut off too (the pools watch the frontend's context once per connection,
// not once per statement): Shutdown returns at once and the client gets an error.
func TestShutdownInterruptsAStatementInProgress(t *testing.T) {
	e := startProxy(t, 1, nil, nil)
	c := e.connect(t)
	exec1(t, c, "SELECT 1") // a pooled connection exists before the shutdown
	direct := e.shard(t, 0)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), "SELECT pg_sleep(60)")
		errc <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for queryInt(t, direct, "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)' AND state = 'active'") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the statement never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := e.srv.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("shutdown with a statement running: %v, want the deadline", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("shutdown took %v: the statement in progress was not cut off", took)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Error("the cut-off statement succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Error("the client's statement still runs after the shutdown")
	}
	// The server process sleeps on; cancel it so the test's database can go.
	exec1(t, direct, "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)'")
}

// TestCrossShardDeadlock: two clients' transactions wait for each other on two shards
// (one holds a row on ds_0 and wants one on ds_1, the other the reverse). No server
// sees the cycle; the proxy's detector ends one transaction with 40P01, the other
// commits, and only the winner's writes remain.
func TestCrossShardDeadlock(t *testing.T) {
	e := startProxy(t, 2, []string{"kv=k"}, nil)
	c1, c2 := e.connect(t), e.connect(t)
	ctx := context.Background()
	exec1(t, c1, "CREATE TABLE kv (k int PRIMARY KEY, v text)")
	// A key on each shard.
	var keys [2]int
	found := [2]bool{}
	for k := 1; !found[0] || !found[1]; k++ {
		exec1(t, c1, "INSERT INTO kv VALUES ($1, 'a')", k)
		for i := range 2 {
			if !found[i] && queryInt(t, e.shard(t, i), "SELECT count(*) FROM kv WHERE k = $1", k) == 1 {
				keys[i], found[i] = k, true
			}
		}
	}
	const update = "UPDATE kv SET v = v || 'x' WHERE k = $1"
	for _, c := range []*pgx.Conn{c1, c2} {
		exec1(t, c, "BEGIN")
	}
	exec1(t, c1, update, keys[0])
	exec1(t, c2, update, keys[1])
	type outcome struct {
		c   *pgx.Conn
		err error
	}
	done := make(chan outcome, 2)
	go func() { _, err := c1.Exec(ctx, update, keys[1]); done <- outcome{c1, err} }()
	time.Sleep(50 * time.Millisecond)
	go func() { _, err := c2.Exec(ctx, update, keys[0]); done <- outcome{c2, err} }()
	var victim, winner *pgx.Conn
	for range 2 {
		select {
		case o := <-done:
			switch sqlState(o.err) {
			case "40P01":
				if victim != nil {
					t.Fatal("both transactions were ended")
				}
				victim = o.c
				exec1(t, victim, "ROLLBACK")
			case "":
				winner = o.c
			default:
				t.Fatalf("unexpected error: %v", o.err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the deadlock across shards was not broken")
		}
	}
	if victim == nil || winner == nil {
		t.Fatalf("victim %v, winner %v", victim, winner)
	}
	exec1(t, winner, "COMMIT")
	for _, k := range keys {
		var v string
		if err := c1.QueryRow(ctx, "SELECT v FROM kv WHERE k = $1", k).Scan(&v); err != nil || v != "ax" {
			t.Errorf("key %d after the winner committed: %q, %v; want ax", k, v, err)
		}
	}
	if n := e.srv.Router().DeadlockVictims(); n != 1 {
		t.Errorf("the proxy counts %d deadlock victims, want 1", n)
	}
}
