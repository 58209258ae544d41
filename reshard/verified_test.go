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

	cut := reshard.VerifyOptions{ChunkRows: chunkRows}
	reshard.StopVerifyAfter(&cut, 3)
	if _, err := reshard.Verify(ctx, from, to, cut); !errors.Is(err, reshard.ErrCrashed) || !strings.Contains(err.Error(), "verify --resume continues it") {
		t.Fatalf("the verify cut short: %v, want the cut and how to resume", err)
	}
	// ds_0 -> ds_2 is the first stream; its tables in order: countries (one chunk),
	// then people, whose chunks go by id. Its lowest moving id was compared, its
	// highest was not, nor any row of ds_1 -> ds_3.
	compared := queryInt(t, dsns[2], "SELECT min(id) FROM people")
	later := queryInt(t, dsns[2], "SELECT max(id) FROM people")
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

	again, err := reshard.Verify(ctx, from, to, reshard.VerifyOptions{ChunkRows: chunkRows})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := differ(again), ids(compared, later, notBegun); !slices.Equal(got, want) || !again.Resumed.IsZero() {
		t.Errorf("a whole verify found %v different (resumed %v), want %v", got, again.Resumed, want)
	}
}
