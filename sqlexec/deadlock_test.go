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
