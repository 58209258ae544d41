package reshard_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardlab/shardlab/reshard"
)

// TestVerifyResumes cuts a verify of 2 data sources growing to 4 short after three
// chunks (the broadcast table of the first stream and two chunks of its people), then
// changes three rows on the destinations: one in a chunk already compared, one in a
// chunk of the same table not compared yet, one in a stream not begun. The resumed
// verify finds the last two and not the first (it did not compare that chunk again),
// reports every table with the rows and chunks of a whole verify, and says what it
// took from the verify it resumed; a whole verify then finds all three. A finished
// verify has nothing to resume, nor has a move never verified, and a verify cut short
// unpinned is not resumed pinned.
func TestVerifyResumes(t *testing.T) {
	dsns := fourDatabases(t)
	fill(t, dsns[:2], 2, 3000)
	from, to := layout(t, dsns[:2]), layout(t, dsns)
	ctx := context.Background()
	startMove(t, from, to, reshard.CopyOptions{})

	const chunkRows = 100
	if _, err := reshard.Verify(ctx, from, to, reshard.VerifyOptions{ChunkRows: chunkRows, Resume: true}); err == nil || !strings.Contains(err.Error(), "no verify of this move was recorded") {
		t.Errorf("resuming before any verify: %v, want nothing to resume", err)
	}
	whole, err := reshard.Verify(ctx, from, to, reshard.VerifyOptions{ChunkRows: chunkRows})
	if err != nil || !whole.Clean() || len(whole.Tables) != 4 {
		t.Fatalf("the whole verify: %v, %+v", err, whole)
	}
	if _, err := reshard.Verify(ctx, from, to, reshard.VerifyOptions{ChunkRows: chunkRows, Resume: true}); err == nil || !strings.Contains(err.Error(), "nothing to resume") {
		t.Errorf("resuming a finished verify: %v, want nothing to resume", err)
	}

	// A row on ds_2 that the target places on ds_0: counted once, by the first
	// stream into ds_2, before its first chunk.
	misplaced := queryInt(t, dsns[0], `SELECT min(g) FROM generate_series(100001, 100100) g
		WHERE satisfies_hash_partition('hash_oracle'::regclass, 4, 0, g::bigint)`)
	exec(t, dsns[2], fmt.Sprintf("INSERT INTO people VALUES (%d, 'misplaced')", misplaced))
	extra := func(d *reshard.Diff) (n int64) {
		for _, rd := range d.Tables {
			n += rd.ExtraN
		}
		return n
	}

	cut := reshard.VerifyOptions{ChunkRows: chunkRows}
	reshard.StopVerifyAfter(&cut, 3)
	if _, err := reshard.Verify(ctx, from, to, cut); !errors.Is(err, reshard.ErrCrashed) || !strings.Contains(err.Error(), "verify --resume continues it") {
		t.Fatalf("the verify cut short: %v, want the cut and how to resume", err)
	}
	// A verify's lock goes with its server session, which ends a moment after the
	// verify closed it.
	ended := func() *reshard.Status {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			st, err := reshard.GetStatus(ctx, from, to)
			if err != nil {
				t.Fatal(err)
			}
			if st.Verify == nil || !st.Verify.Running || time.Now().After(deadline) {
				return st
			}
		}
	}
	if st := ended(); st.Verify == nil || st.Verify.Running || !st.Verify.Finished.IsZero() || st.Verify.Chunks != 3 {
		t.Errorf("status after the cut: verify %+v; want 3 chunks, cut short", st.Verify)
	} else {
		var b strings.Builder
		st.WriteText(&b)
		if !strings.Contains(b.String(), "3 chunks of 2 tables compared (1 whole): 0 missing, 1 extra, 0 different; cut short (reshard verify --resume") {
			t.Errorf("status does not say the verify was cut short:\n%s", b.String())
		}
	}
	// ds_0 -> ds_2 is the first stream; its tables in order: countries (one chunk),
	// then people, whose chunks go by id. Its lowest moving id was compared, its
	// highest was not, nor any row of ds_1 -> ds_3.
	compared := queryInt(t, dsns[2], "SELECT min(id) FROM people")
	later := queryInt(t, dsns[2], "SELECT max(id) FROM people WHERE name <> 'misplaced'")
	notBegun := queryInt(t, dsns[3], "SELECT max(id) FROM people")
	for _, x := range []struct {
		dsn string
		id  int64
	}{{dsns[2], compared}, {dsns[2], later}, {dsns[3], notBegun}} {
		exec(t, x.dsn, fmt.Sprintf("UPDATE people SET name = 'changed by hand' WHERE id = %d", x.id))
	}
	differ := func(d *reshard.Diff) []string {
		var keys []string
		for _, rd := range d.Tables {
			keys = append(keys, rd.Different...)
		}
		slices.Sort(keys)
		return keys
	}
	ids := func(ids ...int64) []string {
		var keys []string
		for _, id := range ids {
			keys = append(keys, fmt.Sprint(id))
		}
		slices.Sort(keys)
		return keys
	}

	if _, err := reshard.Verify(ctx, from, to, reshard.VerifyOptions{ChunkRows: chunkRows, Resume: true, Pin: 5 * time.Second}); err == nil || !strings.Contains(err.Error(), "resume it without --pin") {
		t.Errorf("resuming pinned a verify cut short unpinned: %v", err)
	}
	resumed, err := reshard.Verify(ctx, from, to, reshard.VerifyOptions{ChunkRows: chunkRows, Resume: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := differ(resumed), ids(later, notBegun); !slices.Equal(got, want) {
		t.Errorf("the resumed verify found %v different, want %v (the chunks it had not compared; %d was compared before the cut)", got, want, compared)
	}
	if n := extra(resumed); n != 1 {
		t.Errorf("the resumed verify counts %d extra rows, want the 1 misplaced on ds_2, counted before the cut", n)
	}
	if resumed.Resumed.IsZero() || resumed.ResumedChunks != 3 {
		t.Errorf("the resumed verify says it resumed from %v, taking %d chunks; want the cut verify's 3", resumed.Resumed, resumed.ResumedChunks)
	}
	if len(resumed.Tables) != len(whole.Tables) {
		t.Fatalf("the resumed verify reports %d tables, the whole one %d", len(resumed.Tables), len(whole.Tables))
	}
	for i, rd := range resumed.Tables {
		w := whole.Tables[i]
		if rd.From != w.From || rd.To != w.To || rd.Table != w.Table || rd.Rows != w.Rows || rd.Chunks != w.Chunks {
			t.Errorf("resumed %s -> %s %s: %d rows in %d chunks; the whole verify: %s -> %s %s, %d rows in %d chunks",
				rd.From, rd.To, rd.Table, rd.Rows, rd.Chunks, w.From, w.To, w.Table, w.Rows, w.Chunks)
		}
	}
	var b strings.Builder
	if err := resumed.WriteText(&b); err != nil || !strings.Contains(b.String(), "resumed the verify started") || !strings.Contains(b.String(), ": 3 of the chunks compared by it") {
		t.Errorf("the report does not say what was resumed (%v):\n%s", err, b.String())
	}

	if st := ended(); st.Verify == nil || st.Verify.Finished.IsZero() || st.Verify.Different != 2 || st.Verify.Extra != 1 || st.Verify.Done != 4 {
		t.Errorf("status after the resumed verify: verify %+v; want it finished, 4 tables whole, 2 different, 1 extra", st.Verify)
	}
	again, err := reshard.Verify(ctx, from, to, reshard.VerifyOptions{ChunkRows: chunkRows})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := differ(again), ids(compared, later, notBegun); !slices.Equal(got, want) || extra(again) != 1 || !again.Resumed.IsZero() {
		t.Errorf("a whole verify found %v different and %d extra (resumed %v), want %v and 1", got, extra(again), again.Resumed, want)
	}

	// One verify at a time: while one runs (slowly, under --rate), another, or a
	// resume, is refused naming it, and status says it runs; stopped, it is cut short.
	slow, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() {
		_, err := reshard.Verify(slow, from, to, reshard.VerifyOptions{ChunkRows: chunkRows, Rate: 200})
		done <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); ; {
		st, err := reshard.GetStatus(ctx, from, to)
		if err != nil {
			t.Fatal(err)
		}
		if v := st.Verify; v != nil && v.Running && v.Finished.IsZero() && v.Chunks >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed the slow verify running: %+v", st.Verify)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, o := range []reshard.VerifyOptions{{ChunkRows: chunkRows}, {ChunkRows: chunkRows, Resume: true}} {
		if _, err := reshard.Verify(ctx, from, to, o); err == nil || !strings.Contains(err.Error(), "a verify of this move is running (server process ") {
			t.Errorf("a verify (resume %v) beside a running one: %v, want it refused", o.Resume, err)
		}
	}
	stop()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "verify --resume continues it") {
		t.Errorf("the slow verify, stopped: %v", err)
	}
	if st := ended(); st.Verify == nil || st.Verify.Running || !st.Verify.Finished.IsZero() {
		t.Errorf("status after the slow verify stopped: %+v; want it cut short", st.Verify)
	}
}
