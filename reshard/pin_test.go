package reshard_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/reshard"
)

// TestVerifyPinnedUnderLoad grows 2 data sources to 4 and verifies while a writer on
// each source updates moving rows, inserts and deletes others, and updates the
// broadcast table, in transactions of several statements, without pause. Pinned, each
// table is compared at one point of its source's WAL: every chunk matches at its first
// comparison (no settling: unpinned, or pinned without waiting for the destination,
// which a transaction there keeps behind for a while, the writer's changes that the
// destination has not applied yet make chunks differ), the writes go on (they wait for
// a pin, never fail), and each table reports its pin's wait. A row changed on a destination by hand
// is found under the same load, exactly, and nothing else, and so it is by a verify
// that pins again after every chunk (each range at a point of its own). A pin that cannot lock
// within its bound (a transaction left open on the table) gives up with a clear
// error, and that transaction commits afterwards.
func TestVerifyPinnedUnderLoad(t *testing.T) {
	dsns := fourDatabases(t)
	const rows = 3000
	fill(t, dsns[:2], 2, rows)
	from, to := layout(t, dsns[:2]), layout(t, dsns)
	ctx := context.Background()
	startMove(t, from, to, reshard.CopyOptions{})

	var stop atomic.Bool
	var writes atomic.Int64
	var wg sync.WaitGroup
	for i, d := range dsns[:2] {
		wg.Go(func() {
			cn, err := pgx.Connect(ctx, d)
			if err != nil {
				t.Error(err)
				return
			}
			defer cn.Close(ctx)
			for n := int64(1); !stop.Load(); n++ {
				// A tenth of rows 1..2000 is updated in each transaction (every chunk
				// changes all the time; the hand-made difference below is not among
				// them); new rows past 3000, each deleted a few loops later.
				id := rows + n*2 + int64(i)
				_, err := cn.Exec(ctx, fmt.Sprintf(`BEGIN;
					UPDATE people SET name = left(name || '+', 60) WHERE id <= 2000 AND id %% 10 = %[1]d %% 10;
					INSERT INTO people SELECT %[2]d, 'new' WHERE satisfies_hash_partition('hash_oracle'::regclass, 2, %[3]d, %[2]d::bigint);
					DELETE FROM people WHERE id = %[4]d;
					UPDATE countries SET name = left(name || '+', 60) WHERE code = 'fr';
					COMMIT`, n*7, id, i, id-10))
				if err != nil {
					t.Errorf("a writer's transaction failed: %v", err)
					return
				}
				writes.Add(1)
				time.Sleep(time.Millisecond)
			}
		})
	}
	halt := func() {
		if !stop.Load() {
			stop.Store(true)
			wg.Wait()
		}
	}
	defer halt()

	// The destination ds_2 falls behind on purpose: a transaction there keeps the
	// table that the writer on ds_0 updates, so ds_0's stream waits for it for a
	// while. The pins must wait for the stream to apply what came before them; a pin
	// that did not would compare a destination behind its source.
	const behind = 800 * time.Millisecond
	keep, err := pgx.Connect(ctx, dsns[2])
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close(ctx)
	if _, err := keep.Exec(ctx, "BEGIN; LOCK TABLE people IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() {
		time.Sleep(behind)
		_, err := keep.Exec(ctx, "COMMIT")
		released <- err
	}()
	pinned := reshard.VerifyOptions{ChunkRows: 200, Pin: 5 * time.Second}
	before := writes.Load()
	d, err := reshard.Verify(ctx, from, to, pinned)
	if rerr := <-released; rerr != nil {
		t.Error(rerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	during := writes.Load() - before
	if !d.Clean() || !d.Pinned || len(d.Tables) != 4 {
		t.Errorf("pinned verify under load: %+v, want 4 tables clean (people and countries from ds_0 to ds_2, countries from ds_0 to ds_3, people from ds_1 to ds_3)", d.Tables)
	}
	for _, rd := range d.Tables {
		if rd.Pinned <= 0 || rd.Pinned > pinned.Pin {
			t.Errorf("%s -> %s %s: pinned for %v, want a wait within the bound %v", rd.From, rd.To, rd.Table, rd.Pinned, pinned.Pin)
		}
	}
	if during < 10 {
		t.Errorf("only %d write transactions during the pinned verify: the load did not go on", during)
	}
	var b strings.Builder
	if err := d.WriteText(&b); err != nil || !strings.Contains(b.String(), "pinned: each table compared at one point of its source") {
		t.Errorf("the report does not say the comparison was pinned (%v):\n%s", err, b.String())
	}
	t.Logf("%d write transactions during the pinned verify:\n%s", during, b.String())

	// A difference made by hand, under the same load: found, and nothing else.
	changed := queryInt(t, dsns[2], "SELECT max(id) FROM people WHERE id BETWEEN 2100 AND 3000")
	exec(t, dsns[2], fmt.Sprintf("UPDATE people SET name = 'changed by hand' WHERE id = %d", changed))
	d, err = reshard.Verify(ctx, from, to, pinned)
	if err != nil {
		t.Fatal(err)
	}
	var differ []string
	var missing, extra int64
	for _, rd := range d.Tables {
		differ = append(differ, rd.Different...)
		missing += rd.MissingN
		extra += rd.ExtraN
	}
	if want := fmt.Sprint(changed); len(differ) != 1 || differ[0] != want || missing+extra != 0 {
		t.Errorf("pinned verify after changing row %s on ds_2: different %v, %d missing, %d extra; want only %s different", want, differ, missing, extra, want)
	}

	// Pinned again after every chunk (PinEvery): each range of chunks at a point of its
	// own, under the same load; the same one difference, and nothing else.
	every := pinned
	every.PinEvery = time.Nanosecond
	d, err = reshard.Verify(ctx, from, to, every)
	if err != nil {
		t.Fatal(err)
	}
	differ, missing, extra = nil, 0, 0
	for _, rd := range d.Tables {
		differ = append(differ, rd.Different...)
		missing += rd.MissingN
		extra += rd.ExtraN
		if rd.Pins != rd.Chunks || rd.Pinned <= 0 || rd.Pinned > pinned.Pin {
			t.Errorf("%s -> %s %s re-pinned after every chunk: %d pins over %d chunks, writes waited at most %v", rd.From, rd.To, rd.Table, rd.Pins, rd.Chunks, rd.Pinned)
		}
	}
	if want := fmt.Sprint(changed); len(differ) != 1 || differ[0] != want || missing+extra != 0 {
		t.Errorf("verify pinned after every chunk: different %v, %d missing, %d extra; want only %s different", differ, missing, extra, want)
	}
	b.Reset()
	if err := d.WriteText(&b); err != nil || !strings.Contains(b.String(), "pinned: each range of chunks compared at one point of its source") {
		t.Errorf("the report does not say each range of chunks was pinned (%v):\n%s", err, b.String())
	}
	t.Logf("pinned again after every chunk:\n%s", b.String())

	// A transaction that keeps the table the first pin locks (countries, on ds_0): the
	// pin gives up within its bound.
	open, err := pgx.Connect(ctx, dsns[0])
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close(ctx)
	if _, err := open.Exec(ctx, "BEGIN; UPDATE countries SET name = name WHERE code = 'de'"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, err = reshard.Verify(ctx, from, to, reshard.VerifyOptions{ChunkRows: 200, Pin: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "could not be pinned") || !strings.Contains(err.Error(), "did not end within 200ms") {
		t.Errorf("verify pinned while a transaction keeps the table: %v, want the pin given up", err)
	}
	if took := time.Since(began); took > 30*time.Second {
		t.Errorf("a pin bounded to 200 ms took %v to give up", took)
	}
	if _, err := open.Exec(ctx, "COMMIT"); err != nil {
		t.Errorf("the transaction that kept the table: %v", err)
	}
	if !strings.Contains(fmt.Sprint(err), "held by client backend") {
		t.Errorf("the pin's error does not name what kept the table: %v", err)
	}

	// A stream that is not streaming: pinned verify refuses at once, naming it.
	sub := queryString(t, dsns[2], "SELECT subname FROM pg_subscription ORDER BY 1 LIMIT 1")
	exec(t, dsns[2], "ALTER SUBSCRIPTION "+sub+" DISABLE")
	if _, err := reshard.Verify(ctx, from, to, pinned); err == nil || !strings.Contains(err.Error(), "needs every stream copied and streaming") {
		t.Errorf("verify pinned with a subscription disabled: %v", err)
	}
	exec(t, dsns[2], "ALTER SUBSCRIPTION "+sub+" ENABLE")
	halt()
	if writes.Load() == 0 {
		t.Error("no write transaction")
	}
}
