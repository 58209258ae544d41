package reshard_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/reshard"
)

// TestCopyRateBounded grows 2 data sources to 4 with the copy bounded to 1,000 rows a
// second while a writer inserts, updates and deletes where the current layout places
// each key: Start copies the rows itself from each slot's exported snapshot, takes at
// least as long as the bound allows, and meanwhile status shows a stream copying with
// its subscription disabled. Once the writer stops, each new data source holds exactly
// the rows the target places there, as they are on the source (the snapshot and the
// stream after it meet: no write lost, none applied twice), verify (bounded as well)
// finds nothing, and cancel leaves nothing.
func TestCopyRateBounded(t *testing.T) {
	dsns := fourDatabases(t)
	const rows, rate = 3000, 1000
	fill(t, dsns[:2], 2, rows)
	from, to := layout(t, dsns[:2]), layout(t, dsns)
	ctx := context.Background()
	var moving int64
	for k := 2; k < 4; k++ {
		moving += queryInt(t, dsns[k-2], fmt.Sprintf("SELECT count(*) FROM people WHERE satisfies_hash_partition('hash_oracle'::regclass, 4, %d, id)", k))
	}

	var stop atomic.Bool
	var wg sync.WaitGroup
	var writes atomic.Int64
	wg.Go(func() {
		var conns []*pgx.Conn
		for _, d := range dsns[:2] {
			cn, err := pgx.Connect(ctx, d)
			if err != nil {
				t.Error(err)
				return
			}
			defer cn.Close(ctx)
			conns = append(conns, cn)
		}
		for id := rows + 1; !stop.Load(); id++ {
			for i, cn := range conns {
				for _, sql := range []string{
					`INSERT INTO people SELECT $1::bigint, 'new' WHERE satisfies_hash_partition('hash_oracle'::regclass, 2, $2::int, $1::bigint)`,
					`UPDATE people SET name = name || '+' WHERE id = $1::bigint % 3000 AND $2::int >= 0`,
					`DELETE FROM people WHERE id = ($1::bigint * 7) % 3000 AND $2::int >= 0`,
				} {
					if _, err := cn.Exec(ctx, sql, id, i); err != nil {
						t.Error(err)
						return
					}
				}
				writes.Add(3)
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
	// Status while Start copies.
	var copying atomic.Bool
	started := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-started:
				return
			case <-time.After(50 * time.Millisecond):
			}
			st, err := reshard.GetStatus(ctx, from, to)
			if err != nil {
				continue // before Start recorded the move, or between its steps
			}
			for _, s := range st.Streams {
				if !s.Enabled && s.CopyRunning && !st.Ready() {
					copying.Store(true)
				}
			}
		}
	})
	began := time.Now()
	_, err := reshard.Start(ctx, from, to, reshard.CopyOptions{CopyRate: rate})
	took := time.Since(began)
	close(started)
	if err != nil {
		stop.Store(true)
		wg.Wait()
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	t.Logf("start took %v for %d moving people at most %d rows/s; %d writes meanwhile", took, moving, rate, writes.Load())
	if least := time.Duration(float64(moving) / rate * float64(time.Second)); took < least {
		t.Errorf("start copied %d rows in %v, faster than %d rows a second allows (%v)", moving, took, rate, least)
	}
	if writes.Load() < 100 {
		t.Errorf("only %d writes during the copy", writes.Load())
	}
	if !copying.Load() {
		t.Error("status never showed a stream copying with its subscription disabled")
	}
	waitReady(t, from, to)

	sum := "SELECT coalesce(md5(string_agg(id || ':' || name, ',' ORDER BY id)), '') || ' ' || count(*) FROM people"
	deadline := time.Now().Add(30 * time.Second)
	for k := 2; k < 4; k++ {
		want := queryString(t, dsns[k-2], sum+fmt.Sprintf(" WHERE satisfies_hash_partition('hash_oracle'::regclass, 4, %d, id)", k))
		for got := queryString(t, dsns[k], sum); got != want; got = queryString(t, dsns[k], sum) {
			if time.Now().After(deadline) {
				t.Fatalf("ds_%d holds %s, want %s (the rows of ds_%d that the target places there)", k, got, want, k-2)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if n := queryInt(t, dsns[k], "SELECT count(*) FROM countries"); n != 3 {
			t.Errorf("ds_%d has %d countries, want the broadcast table's 3", k, n)
		}
	}
	// Verify bounded too: no faster than its rate allows, and as clean.
	const verifyRate = 500
	d, err := reshard.Verify(ctx, from, to, reshard.VerifyOptions{ChunkRows: 500, Rate: verifyRate})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Clean() {
		t.Errorf("verify after a bounded copy: %+v", d.Tables)
	}
	var compared int64
	for _, tb := range d.Tables {
		compared += tb.Rows
	}
	if least := time.Duration(float64(compared) / verifyRate * float64(time.Second)); d.Took < least || compared == 0 {
		t.Errorf("verify compared %d rows in %v, faster than %d rows a second allows (%v)", compared, d.Took, verifyRate, least)
	}
	if err := reshard.Cancel(ctx, from, to, reshard.Options{}); err != nil {
		t.Fatal(err)
	}
	for k, d := range dsns {
		if n := queryString(t, d, `SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_subscription) +
			(SELECT count(*) FROM pg_replication_slots)`); n != "0" {
			t.Errorf("ds_%d: %s publications, subscriptions or slots left after cancel", k, n)
		}
	}
}
