package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
)

// TestHoldPassesOtherTables: a resharding cutover's hold (the proxy's reshard.Proxy,
// paused, switched to a layout of three data sources, resumed) holds only the
// transactions that touch the sharded tables. A new client's statements on a table of
// the default data source run during the hold; one on the sharded table waits, and
// runs on the new layout after the switch, a transaction the client began during the
// hold included; a transaction that began during the hold on the default data
// source's table and then touches the sharded one fails with 40001 after the switch,
// rather than run by the old layout's rules; the transaction open when the hold began
// goes on, and the hold waits for it. The simple protocol and the extended one.
func TestHoldPassesOtherTables(t *testing.T) {
	e := startProxy(t, 2, []string{"t=id"}, nil)
	ctx := context.Background()
	setup := e.connect(t)
	exec1(t, setup, "CREATE TABLE t (id int PRIMARY KEY, v int)")
	exec1(t, setup, "CREATE TABLE d (id int PRIMARY KEY, v int)")
	third := pgtest.NewDatabase(t, "proxy_s2")
	direct := func(dsn string) *pgx.Conn {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(ctx) })
		return c
	}
	if _, err := direct(third).Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY, v int)"); err != nil {
		t.Fatal(err)
	}
	to, err := rules.Compile(shardedRules(append(e.dsns[:2:2], third), []string{"t=id"}, nil))
	if err != nil {
		t.Fatal(err)
	}
	// Keys that the two layouts place apart.
	shardOf := func(l *rules.Compiled, k int) int {
		i, ok, err := l.Lookup("t").ShardOf("id", rules.IntKey(int64(k)), rules.TypeInt4)
		if !ok || err != nil {
			t.Fatalf("placing %d: %v %v", k, ok, err)
		}
		return i
	}
	var moved []int
	for k := 100; len(moved) < 3; k++ {
		if shardOf(e.rules, k) != shardOf(to, k) {
			moved = append(moved, k)
		}
	}
	px := e.srv.ReshardProxy()
	sw, discard, err := px.Prepare(ctx, to)
	if err != nil {
		t.Fatal(err)
	}
	defer discard()

	early, passer, held, begun, mixed := e.connect(t), e.connect(t), e.connect(t), e.connect(t), e.connect(t)
	saver, locker, listener := e.connect(t), e.connect(t), e.connect(t)
	exec1(t, early, "BEGIN")
	exec1(t, early, "INSERT INTO t VALUES (1, 1)")
	type pauseResult struct {
		resume func() error
		err    error
	}
	paused := make(chan pauseResult, 1)
	go func() {
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		resume, err := px.Pause(pctx)
		paused <- pauseResult{resume, err}
	}()
	waitFor(t, "the hold begins", func() bool { p, _ := e.srv.Router().Paused(); return p })

	// Statements on the default data source's table run during the hold, in
	// autocommit and in a transaction.
	exec1(t, passer, "INSERT INTO d VALUES (1, 1)")
	if n := queryInt(t, passer, "SELECT count(*) FROM d"); n != 1 {
		t.Errorf("d holds %d rows, want 1", n)
	}
	exec1(t, mixed, "BEGIN")
	exec1(t, mixed, "UPDATE d SET v = 2 WHERE id = 1")
	// BEGIN through the extended protocol: its unnamed portal stays until the
	// transaction ends, and is bound by no layout.
	if _, err := begun.PgConn().ExecParams(ctx, "BEGIN", nil, nil, nil, nil).Close(); err != nil {
		t.Fatal(err)
	}
	exec1(t, saver, "BEGIN ISOLATION LEVEL REPEATABLE READ")
	exec1(t, saver, "SAVEPOINT s1")
	exec1(t, locker, "BEGIN")
	run := func(c *pgx.Conn, sql string, args ...any) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := c.Exec(ctx, sql, args...)
			done <- err
		}()
		return done
	}
	heldDone := run(held, fmt.Sprintf("INSERT INTO t VALUES (%d, 1)", moved[0]))
	// The extended protocol: planned (and described) during the hold, run after it.
	begunDone := run(begun, "INSERT INTO t VALUES ($1, 1)", moved[1])
	mixedDone := run(mixed, "COPY (SELECT id FROM t) TO STDOUT")
	// Bind without a Describe of the statement first; the savepoint and the BEGIN's
	// options go with the transaction.
	saverDone := run(saver, "INSERT INTO t VALUES ($1, 1)", pgx.QueryExecModeExec, moved[2])
	// Statements whose tables the plan does not list, or that keep the client on a
	// server connection, wait too.
	lockerDone := run(locker, "LOCK TABLE t IN ACCESS SHARE MODE")
	listenerDone := run(listener, "LISTEN ch")
	waiting := map[string]<-chan error{"an insert into the sharded table": heldDone,
		"a transaction begun during the hold, writing the sharded table": begunDone,
		"a transaction begun during the hold, reading the sharded table": mixedDone,
		"an insert after a savepoint":                                    saverDone,
		"LOCK TABLE":                                                     lockerDone, "LISTEN": listenerDone}
	for name, done := range waiting {
		select {
		case err := <-done:
			t.Fatalf("%s ran during the hold: %v", name, err)
		case res := <-paused:
			t.Fatalf("the hold ended its wait with a transaction of before it open: %v", res.err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	// The transaction open when the hold began goes on, and ends.
	exec1(t, early, "UPDATE t SET v = 2 WHERE id = 1")
	exec1(t, early, "COMMIT")
	res := <-paused
	if res.err != nil {
		t.Fatalf("the hold: %v", res.err)
	}
	// The passing transaction does not keep the hold from switching.
	if err := sw(); err != nil {
		t.Fatalf("switching with a transaction that passed the hold open: %v", err)
	}
	if err := res.resume(); err != nil {
		t.Fatal(err)
	}
	for name, done := range map[string]<-chan error{"autocommit insert": heldDone, "insert of a transaction begun in the hold": begunDone,
		"insert after a savepoint": saverDone, "LOCK TABLE": lockerDone, "LISTEN": listenerDone} {
		if err := <-done; err != nil {
			t.Fatalf("%s after the switch: %v", name, err)
		}
	}
	exec1(t, begun, "COMMIT")
	exec1(t, locker, "COMMIT")
	var iso string
	if err := saver.QueryRow(ctx, "SELECT current_setting('transaction_isolation') FROM t LIMIT 1").Scan(&iso); err != nil || iso != "repeatable read" {
		t.Errorf("the isolation level of a transaction carried to the new layout: %q, %v", iso, err)
	}
	exec1(t, saver, "ROLLBACK TO SAVEPOINT s1")
	exec1(t, saver, "COMMIT")
	if n := queryInt(t, listener, "SELECT count(*) FROM t"); n != 3 {
		t.Errorf("after the switch, through the new layout: %d rows, want 3", n)
	}
	var pe *pgconn.PgError
	if err := <-mixedDone; !errors.As(err, &pe) || pe.Code != "40001" {
		t.Errorf("a transaction of the hold that touched d, then t, after the switch: %v, want 40001", err)
	}
	exec1(t, mixed, "ROLLBACK")
	if n := queryInt(t, mixed, "SELECT v FROM d WHERE id = 1"); n != 1 {
		t.Errorf("d's row after the rolled back transaction: v = %d, want 1", n)
	}
	// The rows written after the switch are where the new layout puts them; the one
	// rolled back to the savepoint is nowhere.
	dsns := append(e.dsns[:2:2], third)
	for j, k := range moved {
		want := shardOf(to, k)
		if j == 2 {
			want = -1
		}
		for i, dsn := range dsns {
			var n int
			if err := direct(dsn).QueryRow(ctx, "SELECT count(*) FROM t WHERE id = $1", k).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if (n == 1) != (i == want) {
				t.Errorf("row %d: %d on data source %d; the new layout places it on %d", k, n, i, want)
			}
		}
	}
	exec1(t, mixed, "SELECT count(*) FROM t")
}
