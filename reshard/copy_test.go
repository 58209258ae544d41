package reshard_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/reshard"
	"github.com/shardlab/shardlab/rules"
)

// logicalCluster is a throwaway cluster that can carry a move of 2 data sources to 4.
func logicalCluster(t *testing.T, settings ...string) *pgtest.Cluster {
	return pgtest.StartClusterWith(t, append([]string{"wal_level = logical", "max_logical_replication_workers = 10", "max_worker_processes = 16",
		"max_replication_slots = 20", "max_wal_senders = 20"}, settings...)...)
}

// TestCopyGrowsUnderWrites starts a move of 2 data sources to 4 while a writer inserts,
// updates and deletes rows where the current layout places them (by PostgreSQL's own
// hash partitioning): the new data sources get the tables (from the sources'
// definitions), and once the writer stops each holds exactly the rows the target
// places there, as they are on the source (a checksum of every row), and the broadcast
// table. Status shows the streams ready; a second start is refused; cancel removes
// every publication, slot, subscription, helper and copied table, and leaves the
// sources as they were.
func TestCopyGrowsUnderWrites(t *testing.T) {
	c := logicalCluster(t)
	var dsns []string
	for range 4 {
		dsns = append(dsns, c.NewDatabase("reshard"))
	}
	const rows = 2000
	fill(t, dsns[:2], 2, rows)
	// notes is empty when the move starts: its rows all come during it.
	withNotes := func(r *rules.Rules) {
		r.Tables = append(r.Tables, rules.Table{Name: "notes", Strategy: rules.Strategy{Column: "id"}})
	}
	for _, d := range dsns[:2] {
		exec(t, d, "CREATE TABLE notes (id bigint PRIMARY KEY, body text)")
	}
	from, to := layout(t, dsns[:2], withNotes), layout(t, dsns, withNotes)
	ctx := context.Background()

	var stop atomic.Bool
	var wg sync.WaitGroup
	var writes atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
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
				// Each write goes where the current layout places its key.
				if _, err := cn.Exec(ctx, `INSERT INTO people SELECT $1::bigint, 'new'
					WHERE satisfies_hash_partition('hash_oracle'::regclass, 2, $2::int, $1::bigint)`, id, i); err != nil {
					t.Error(err)
					return
				}
				if _, err := cn.Exec(ctx, `INSERT INTO notes SELECT $1::bigint, 'note'
					WHERE satisfies_hash_partition('hash_oracle'::regclass, 2, $2::int, $1::bigint)`, id, i); err != nil {
					t.Error(err)
					return
				}
				if _, err := cn.Exec(ctx, "UPDATE people SET name = name || '+' WHERE id = $1", id%rows); err != nil {
					t.Error(err)
					return
				}
				if _, err := cn.Exec(ctx, "DELETE FROM people WHERE id = $1", (id*7)%rows); err != nil {
					t.Error(err)
					return
				}
				writes.Add(3)
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)
	if _, err := reshard.Start(ctx, from, to, reshard.CopyOptions{}); err != nil {
		stop.Store(true)
		wg.Wait()
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	stop.Store(true)
	wg.Wait()
	if writes.Load() < 100 {
		t.Fatalf("only %d writes during the copy", writes.Load())
	}
	if _, err := reshard.Start(ctx, from, to, reshard.CopyOptions{}); !errors.Is(err, reshard.ErrUnderWay) {
		t.Errorf("a second start: %v, want ErrUnderWay", err)
	}

	sum := "SELECT coalesce(md5(string_agg(id || ':' || name, ',' ORDER BY id)), '') || ' ' || count(*) FROM people"
	deadline := time.Now().Add(60 * time.Second)
	for k := 2; k < 4; k++ {
		want := queryString(t, dsns[k-2], sum+fmt.Sprintf(" WHERE satisfies_hash_partition('hash_oracle'::regclass, 4, %d, id)", k))
		for {
			got := queryString(t, dsns[k], sum)
			if got == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("ds_%d holds %s, want %s (the rows of ds_%d that the target places there)", k, got, want, k-2)
			}
			time.Sleep(200 * time.Millisecond)
		}
		notes := "SELECT coalesce(md5(string_agg(id || ':' || body, ',' ORDER BY id)), '') || ' ' || count(*) FROM notes"
		wantNotes := queryString(t, dsns[k-2], notes+fmt.Sprintf(" WHERE satisfies_hash_partition('hash_oracle'::regclass, 4, %d, id)", k))
		for got := queryString(t, dsns[k], notes); got != wantNotes; got = queryString(t, dsns[k], notes) {
			if time.Now().After(deadline) {
				t.Fatalf("ds_%d holds notes %s, want %s (a table empty when the move began)", k, got, wantNotes)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if strings.HasSuffix(wantNotes, " 0") {
			t.Errorf("no notes for ds_%d were written during the move", k)
		}
		if n := queryInt(t, dsns[k], "SELECT count(*) FROM countries"); n != 3 {
			t.Errorf("ds_%d has %d countries, want the broadcast table's 3", k, n)
		}
	}
	// Status, verify and cancel given another target refuse, and the move goes on.
	other := layout(t, dsns[:3], withNotes)
	if err := reshard.Cancel(ctx, from, other, reshard.Options{}); !errors.Is(err, reshard.ErrOtherMove) {
		t.Errorf("cancel with another target: %v, want ErrOtherMove", err)
	}
	if _, err := reshard.GetStatus(ctx, from, other); !errors.Is(err, reshard.ErrOtherMove) {
		t.Errorf("status with another target: %v, want ErrOtherMove", err)
	}
	var st *reshard.Status
	for {
		var err error
		st, err = reshard.GetStatus(ctx, from, to)
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready() || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(st.Streams) != 3 || !st.Ready() {
		t.Errorf("status %+v: want 3 streams, every table ready", st.Streams)
	}

	d, err := reshard.Verify(ctx, from, to, reshard.VerifyOptions{ChunkRows: 100})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Clean() || len(d.Tables) != 6 {
		t.Errorf("verify after the copy caught up: %+v, want 6 tables clean (people, notes and countries from ds_0 to ds_2, countries from ds_0 to ds_3, people and notes from ds_1 to ds_3)", d.Tables)
	}
	var chunks int
	for _, rd := range d.Tables {
		chunks += rd.Chunks
	}
	if chunks < 10 {
		t.Errorf("%d chunks of 100 rows over about 1,000 moving rows", chunks)
	}
	// A destination that differs: a row changed, one lost, one that does not belong.
	changed := queryInt(t, dsns[2], "SELECT min(id) FROM people")
	lost := queryInt(t, dsns[2], "SELECT max(id) FROM people")
	stray := queryInt(t, dsns[0], "SELECT g FROM generate_series(1, 1000) g WHERE NOT satisfies_hash_partition('hash_oracle'::regclass, 4, 2, g::bigint) LIMIT 1")
	exec(t, dsns[2], fmt.Sprintf("UPDATE people SET name = 'tampered' WHERE id = %d", changed), fmt.Sprintf("DELETE FROM people WHERE id = %d", lost),
		fmt.Sprintf("INSERT INTO people VALUES (%d, 'stray')", stray))
	d, err = reshard.Verify(ctx, from, to, reshard.VerifyOptions{ChunkRows: 100, Settle: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rd := range d.Tables {
		if !rd.Clean() {
			got = append(got, fmt.Sprintf("%s->%s %s: missing %v extra %v different %v", rd.From, rd.To, rd.Table, rd.Missing, rd.Extra, rd.Different))
		}
	}
	if want := fmt.Sprintf("[ds_0->ds_2 people: missing [%d] extra [%d] different [%d]]", lost, stray, changed); fmt.Sprint(got) != want || d.Clean() {
		t.Errorf("verify of a tampered destination: %v, want %s", got, want)
	}

	before := []int64{queryInt(t, dsns[0], "SELECT count(*) FROM people"), queryInt(t, dsns[1], "SELECT count(*) FROM people")}
	if err := reshard.Cancel(ctx, from, to, reshard.Options{}); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c.DSN(), "SELECT count(*) FROM pg_replication_slots"); n != 0 {
		t.Errorf("%d slots left after cancel", n)
	}
	if n := queryInt(t, c.DSN(), "SELECT count(*) FROM pg_subscription"); n != 0 {
		t.Errorf("%d subscriptions left after cancel", n)
	}
	for i, d := range dsns {
		if n := queryInt(t, d, "SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_namespace WHERE nspname = 'shardlab_reshard')"); n != 0 {
			t.Errorf("ds_%d: %d publications and helper schemas left after cancel", i, n)
		}
		if i < 2 {
			if n := queryInt(t, d, "SELECT count(*) FROM people"); n != before[i] {
				t.Errorf("ds_%d has %d people after cancel, %d before", i, n, before[i])
			}
		} else if n := queryInt(t, d, "SELECT count(*) FROM pg_class WHERE relname IN ('people', 'countries', 'notes')"); n != 0 {
			t.Errorf("ds_%d keeps %d of the tables the move created", i, n)
		}
	}
	if st, err := reshard.GetStatus(ctx, from, to); err != nil || len(st.Streams) != 0 {
		t.Errorf("status after cancel: %+v, %v", st, err)
	}
}

// TestCopyRefusesWhatIsNotBuilt: a move into a data source the current layout reads
// (2 to 3 under pghash exchanges rows between the old two), and one whose publication
// would break the sources' UPDATEs (no replica identity), are refused before anything
// is made.
func TestCopyRefusesWhatIsNotBuilt(t *testing.T) {
	c := logicalCluster(t)
	dsns := []string{c.NewDatabase("reshard"), c.NewDatabase("reshard"), c.NewDatabase("reshard")}
	fill(t, dsns[:2], 2, 300)
	p, err := reshard.MakePlan(context.Background(), layout(t, dsns[:2]), layout(t, dsns), reshard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Runnable() || !slices.ContainsFunc(p.Problems, func(s string) bool {
		return strings.HasPrefix(s, "start cannot do this yet: rows would move into ds_0")
	}) {
		t.Errorf("the plan of 2 to 3: problems %q, want what start cannot do yet", p.Problems)
	}
	if _, err := reshard.Start(context.Background(), layout(t, dsns[:2]), layout(t, dsns[:2]), reshard.CopyOptions{}); err == nil || !strings.Contains(err.Error(), "nothing moves") {
		t.Errorf("a start to the same layout: %v, want nothing moves", err)
	}
	_, err = reshard.Start(context.Background(), layout(t, dsns[:2]), layout(t, dsns), reshard.CopyOptions{})
	if !errors.Is(err, reshard.ErrNotYet) || !containsAll(err.Error(), "rows would move into ds_0, which the current layout reads", "rows would move into ds_1", "move into new databases") {
		t.Errorf("2 to 3: %v, want ErrNotYet naming ds_0 and ds_1", err)
	}
	// A sharded table without a primary key: published, its UPDATEs and DELETEs on
	// the sources would fail while the move runs.
	exec(t, dsns[0], "ALTER TABLE people DROP CONSTRAINT people_pkey")
	_, err = reshard.Start(context.Background(), layout(t, dsns[:2]), layout(t, []string{dsns[0], dsns[1], c.NewDatabase("reshard"), c.NewDatabase("reshard")}), reshard.CopyOptions{})
	if err == nil || !containsAll(err.Error(), "ds_0.people has no replica identity", "--replica-identity-full") {
		t.Errorf("a table without a primary key: %v, want a refusal naming it", err)
	}
	for i, d := range dsns {
		if n := queryInt(t, d, "SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_subscription)"); n != 0 {
			t.Errorf("ds_%d: %d publications, slots and subscriptions after a refused start", i, n)
		}
	}
	// A new data source whose table has rows already: refused, and its rows stay (a
	// refused start removes what it made, and nothing else).
	exec(t, dsns[0], "ALTER TABLE people ADD PRIMARY KEY (id)")
	d3, d4 := c.NewDatabase("reshard"), c.NewDatabase("reshard")
	exec(t, d3, "CREATE TABLE people (id bigint PRIMARY KEY, name text)", "INSERT INTO people VALUES (-1, 'mine')")
	_, err = reshard.Start(context.Background(), layout(t, dsns[:2]), layout(t, []string{dsns[0], dsns[1], d3, d4}), reshard.CopyOptions{})
	if err == nil || !strings.Contains(err.Error(), "has rows already") {
		t.Errorf("a destination with rows: %v, want a refusal", err)
	}
	if n := queryInt(t, d3, "SELECT count(*) FROM people WHERE id = -1"); n != 1 {
		t.Errorf("the refused start removed the destination's own row")
	}
	for _, d := range append(dsns, d4) {
		if n := queryInt(t, d, "SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_subscription) + (SELECT count(*) FROM pg_class WHERE relname = 'countries' AND obj_description(oid, 'pg_class') IS NOT NULL)"); n != 0 {
			t.Errorf("%d publications, slots, subscriptions or created tables after a refused start", n)
		}
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestCopyReplicaIdentityFull: a sharded table without a primary key (as
// pgbench_history) is refused by a plain start; with ReplicaIdentityFull it gets
// REPLICA IDENTITY FULL, its UPDATEs and DELETEs on the sources go on during the move
// and reach the destinations; cancel gives it back its default identity.
func TestCopyReplicaIdentityFull(t *testing.T) {
	c := logicalCluster(t)
	var dsns []string
	for range 4 {
		dsns = append(dsns, c.NewDatabase("reshard"))
	}
	fill(t, dsns[:2], 2, 200)
	hist := func(r *rules.Rules) {
		r.Tables = append(r.Tables, rules.Table{Name: "history", Strategy: rules.Strategy{Column: "aid"}})
	}
	for i, d := range dsns[:2] {
		exec(t, d, "CREATE TABLE history (aid bigint, delta int)", fmt.Sprintf(`INSERT INTO history SELECT g, 1 FROM generate_series(1, 400) g
			WHERE satisfies_hash_partition('hash_oracle'::regclass, 2, %d, g::bigint)`, i))
	}
	from, to := layout(t, dsns[:2], hist), layout(t, dsns, hist)
	ctx := context.Background()
	if _, err := reshard.Start(ctx, from, to, reshard.CopyOptions{}); err == nil || !containsAll(err.Error(), "ds_0.history has no replica identity", "--replica-identity-full") {
		t.Fatalf("a table without a primary key: %v, want a refusal naming the option", err)
	}
	if _, err := reshard.Start(ctx, from, to, reshard.CopyOptions{ReplicaIdentityFull: true}); err != nil {
		t.Fatal(err)
	}
	for _, d := range dsns[:2] {
		if got := queryString(t, d, "SELECT relreplident::text FROM pg_class WHERE relname = 'history'"); got != "f" {
			t.Errorf("history's replica identity during the move: %q, want f", got)
		}
		exec(t, d, "UPDATE history SET delta = delta + 1 WHERE aid % 3 = 0", "DELETE FROM history WHERE aid % 5 = 0")
	}
	sum := "SELECT coalesce(md5(string_agg(aid || ':' || delta, ',' ORDER BY aid)), '') || ' ' || count(*) FROM history"
	deadline := time.Now().Add(60 * time.Second)
	for k := 2; k < 4; k++ {
		want := queryString(t, dsns[k-2], sum+fmt.Sprintf(" WHERE satisfies_hash_partition('hash_oracle'::regclass, 4, %d, aid)", k))
		for got := queryString(t, dsns[k], sum); got != want; got = queryString(t, dsns[k], sum) {
			if time.Now().After(deadline) {
				t.Fatalf("ds_%d holds history %s, want %s", k, got, want)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if err := reshard.Cancel(ctx, from, to, reshard.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, d := range dsns[:2] {
		if got := queryString(t, d, "SELECT relreplident::text FROM pg_class WHERE relname = 'history'"); got != "d" {
			t.Errorf("history's replica identity after cancel: %q, want d (its default)", got)
		}
	}
}

// TestStreamNames: names fit PostgreSQL's 63 bytes whatever the data source names,
// and differ where the DSNs do.
func TestStreamNames(t *testing.T) {
	long := strings.Repeat("customers_primary_", 3)
	a := reshard.StreamName(rules.DataSource{Name: long + "0", DSN: "postgres://a/x"}, rules.DataSource{Name: long + "1", DSN: "postgres://a/y"})
	b := reshard.StreamName(rules.DataSource{Name: long + "0", DSN: "postgres://b/x"}, rules.DataSource{Name: long + "1", DSN: "postgres://b/y"})
	if len(a) > 63 || len(b) > 63 || a == b {
		t.Errorf("%q (%d bytes) and %q (%d bytes): want both at most 63 bytes and apart", a, len(a), b, len(b))
	}
}

// TestCancelAfterACutShortCancel: a destination table that was there, empty, and that
// a stream fed keeps the move's mark, so that a cancel run again after one that
// stopped between dropping the subscription and clearing the rows still clears them;
// the table itself, not the move's, stays.
func TestCancelAfterACutShortCancel(t *testing.T) {
	c := logicalCluster(t)
	dsns := []string{c.NewDatabase("reshard"), c.NewDatabase("reshard")}
	fill(t, dsns[:1], 1, 300)
	exec(t, dsns[1], "CREATE TABLE people (id bigint PRIMARY KEY, name text)", "CREATE TABLE countries (code text PRIMARY KEY, name text)")
	from, to := layout(t, dsns[:1]), layout(t, dsns)
	ctx := context.Background()
	if _, err := reshard.Start(ctx, from, to, reshard.CopyOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for queryInt(t, dsns[1], "SELECT count(*) FROM people") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("nothing copied in 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// What a cancel cut short after dropping the subscription leaves.
	name := queryString(t, dsns[1], "SELECT subname FROM pg_subscription WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())")
	exec(t, dsns[1], "ALTER SUBSCRIPTION "+name+" DISABLE", "ALTER SUBSCRIPTION "+name+" SET (slot_name = NONE)", "DROP SUBSCRIPTION "+name)
	if err := reshard.Cancel(ctx, from, to, reshard.Options{}); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, dsns[1], "SELECT (SELECT count(*) FROM people) + (SELECT count(*) FROM countries)"); n != 0 {
		t.Errorf("%d copied rows left after the second cancel", n)
	}
	if n := queryInt(t, dsns[1], "SELECT count(*) FROM pg_class WHERE relname IN ('people', 'countries')"); n != 2 {
		t.Errorf("the destination's own tables: %d of 2 left", n)
	}
	if n := queryInt(t, c.DSN(), "SELECT count(*) FROM pg_replication_slots"); n != 0 {
		t.Errorf("%d slots left", n)
	}
}

// TestStartCancelledPartWay: a start whose context ends part way (after its first
// stream, as its second is made) removes what it made: the first stream's
// subscription, slot and publication, the tables it created, its helper schemas.
func TestStartCancelledPartWay(t *testing.T) {
	c := logicalCluster(t)
	var dsns []string
	for range 4 {
		dsns = append(dsns, c.NewDatabase("reshard"))
	}
	fill(t, dsns[:2], 2, 300)
	// The context ends when the second stream's publication is being made (its
	// progress line is written just before).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &cancelAfter{n: 2, cancel: cancel}
	_, err := reshard.Start(ctx, layout(t, dsns[:2]), layout(t, dsns), reshard.CopyOptions{Options: reshard.Options{Progress: w}})
	if err == nil {
		t.Fatal("a start whose context ended succeeded")
	}
	if strings.Contains(err.Error(), "removing what the start made failed") {
		t.Fatalf("%v", err)
	}
	if n := queryInt(t, c.DSN(), "SELECT (SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_subscription)"); n != 0 {
		t.Errorf("%d slots and subscriptions left", n)
	}
	for i, d := range dsns {
		if n := queryInt(t, d, "SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_namespace WHERE nspname = 'shardlab_reshard')"); n != 0 {
			t.Errorf("ds_%d: %d publications and helper schemas left", i, n)
		}
		if i >= 2 {
			if n := queryInt(t, d, "SELECT count(*) FROM pg_class WHERE relname IN ('people', 'countries')"); n != 0 {
				t.Errorf("ds_%d keeps %d tables the start created", i, n)
			}
		}
	}
}

// cancelAfter cancels once it has been written n lines about publications.
type cancelAfter struct {
	mu     sync.Mutex
	n      int
	cancel func()
}

func (w *cancelAfter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if strings.Contains(string(b), "publication and slot") {
		if w.n--; w.n == 0 {
			w.cancel()
		}
	}
	return len(b), nil
}
