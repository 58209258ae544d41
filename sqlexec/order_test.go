package sqlexec_test

import (
	"context"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// TestBroadcastWritesTakeDataSourcesInOrder: transactions that update the same row of
// a broadcast table lock its copies one data source at a time in one order, so they
// queue instead of deadlocking across data sources (each server would see only half of
// such a cycle and wait forever). Run concurrently, the copies are locked in any order
// and this test hangs until its deadline.
func TestBroadcastWritesTakeDataSourcesInOrder(t *testing.T) {
	var dss []rules.DataSource
	for _, name := range []string{"ds_0", "ds_1", "ds_2"} {
		dss = append(dss, rules.DataSource{Name: name, DSN: pgtest.NewDatabase(t, "order_"+name)})
	}
	r, err := rules.Compile(rules.Rules{DataSources: dss, Broadcast: []string{"counter"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sqlexec.Open(ctx, r, sqlexec.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{"CREATE TABLE counter (k int PRIMARY KEY, n int NOT NULL)", "INSERT INTO counter VALUES (1, 0)"} {
		if _, err := db.SimpleExec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	const workers, rounds = 6, 30
	var g errgroup.Group
	for range workers {
		g.Go(func() error {
			for range rounds {
				tx, err := db.Begin(ctx)
				if err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, "UPDATE counter SET n = n + 1 WHERE k = 1", sqlplan.Args{}, nil); err != nil {
					tx.Rollback(context.Background())
					return err
				}
				if err := tx.Commit(ctx); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("concurrent broadcast updates: %v (a deadlock across data sources ends in the deadline)", err)
	}
	res, err := db.Exec(ctx, "SELECT n FROM counter WHERE k = 1", sqlplan.Args{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.Rows[0][0]); got != "180" {
		t.Errorf("counter = %s, want %d", got, workers*rounds)
	}
}
