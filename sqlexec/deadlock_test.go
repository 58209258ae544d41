package sqlexec_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// TestCrossShardDeadlock makes two transactions wait for each other across two data
// sources (T1 holds k=0 on ds_0 and wants k=1 on ds_1; T2 the other way round). Neither
// server sees a cycle; the detector does, ends one with 40P01, and the other commits.
func TestCrossShardDeadlock(t *testing.T) {
	ctx := context.Background()
	dsns := []string{pgtest.NewDatabase(t, "dl0"), pgtest.NewDatabase(t, "dl1")}
	db, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{DeadlockInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.SimpleExec(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v text); INSERT INTO kv VALUES (0, 'a'), (1, 'b')"); err != nil {
		t.Fatal(err)
	}
	update := func(tx *sqlexec.Tx, k string) error {
		_, err := tx.Exec(ctx, "UPDATE kv SET v = v || 'x' WHERE k = $1", text(k), nil)
		return err
	}
	t1, _ := db.Begin(ctx)
	t2, _ := db.Begin(ctx)
	if err := update(t1, "0"); err != nil {
		t.Fatal(err)
	}
	if err := update(t2, "1"); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		tx  *sqlexec.Tx
		err error
	}
	done := make(chan outcome, 2)
	go func() { done <- outcome{t1, update(t1, "1")} }() // waits for t2 on ds_1
	time.Sleep(50 * time.Millisecond)
	go func() { done <- outcome{t2, update(t2, "0")} }() // waits for t1 on ds_0: a cycle
	var victim, winner *sqlexec.Tx
	for range 2 {
		select {
		case o := <-done:
			switch sqlplan.Code(o.err) {
			case "40P01":
				if victim != nil {
					t.Fatal("both transactions were ended")
				}
				victim = o.tx
				// The victim's locks go when it rolls back, and the other goes on.
				if err := victim.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
			case "":
				winner = o.tx
			default:
				t.Fatalf("unexpected error: %v", o.err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the deadlock was not broken")
		}
	}
	if victim == nil || winner == nil {
		t.Fatalf("victim %v, winner %v", victim, winner)
	}
	if err := winner.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := db.Exec(ctx, "SELECT v FROM kv ORDER BY k", sqlplan.Args{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The winner updated each row once; the victim's updates rolled back.
	if got := fmt.Sprintf("%s %s", res.Rows[0][0], res.Rows[1][0]); got != "ax bx" {
		t.Errorf("rows after the winner committed: %s, want ax bx", got)
	}
}

// TestDeadlockThroughOneShardTransaction: a cycle across data sources may pass through
// a transaction that stays on one. T1 holds k=0 on ds_0 and wants k=2 (ds_0); T2 holds
// k=2 and wants k=1 (ds_1); T3 holds k=1 and wants k=0. T1 never leaves ds_0, yet the
// three wait for each other; the detector must see the cycle through T1 too.
func TestDeadlockThroughOneShardTransaction(t *testing.T) {
	ctx := context.Background()
	dsns := []string{pgtest.NewDatabase(t, "dl1s0"), pgtest.NewDatabase(t, "dl1s1")}
	db, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{DeadlockInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.SimpleExec(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v text); INSERT INTO kv VALUES (0, 'a'), (1, 'b'), (2, 'c')"); err != nil {
		t.Fatal(err)
	}
	update := func(tx *sqlexec.Tx, k string) error {
		_, err := tx.Exec(ctx, "UPDATE kv SET v = v || 'x' WHERE k = $1", text(k), nil)
		return err
	}
	var txs [3]*sqlexec.Tx
	for i, k := range []string{"0", "2", "1"} { // what each holds
		if txs[i], err = db.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		if err := update(txs[i], k); err != nil {
			t.Fatal(err)
		}
	}
	type outcome struct {
		i   int
		err error
	}
	done := make(chan outcome, 3)
	for i, k := range []string{"2", "1", "0"} { // what each wants
		go func() { done <- outcome{i, update(txs[i], k)} }()
		time.Sleep(50 * time.Millisecond)
	}
	next := func(what string) outcome {
		t.Helper()
		select {
		case o := <-done:
			return o
		case <-time.After(20 * time.Second):
			t.Fatal(what)
		}
		return outcome{}
	}
	// The victim is the youngest, T3. Once it rolls back T2 gets k=1, and once T2
	// commits T1 gets k=2.
	if o := next("the deadlock through a one-shard transaction was not broken"); o.i != 2 || sqlplan.Code(o.err) != "40P01" {
		t.Fatalf("first statement to return: T%d %v, want T3 with 40P01", o.i+1, o.err)
	}
	if err := txs[2].Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for _, want := range []int{1, 0} {
		o := next("a transaction did not go on after the one it waited for ended")
		if o.i != want || o.err != nil {
			t.Fatalf("next statement to return: T%d %v, want T%d with no error", o.i+1, o.err, want+1)
		}
		if err := txs[want].Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	res, err := db.Exec(ctx, "SELECT v FROM kv ORDER BY k", sqlplan.Args{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// T1 updated k=0 and k=2, T2 k=2 and k=1; T3's updates rolled back.
	if got := fmt.Sprintf("%s %s %s", res.Rows[0][0], res.Rows[1][0], res.Rows[2][0]); got != "ax bx cxx" {
		t.Errorf("rows after T1 and T2 committed: %s, want ax bx cxx", got)
	}
	if n := db.DeadlockVictims(); n != 1 {
		t.Errorf("%d victims, want 1", n)
	}
}
