package reshard_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
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

// lockedBuffer is a buffer that several goroutines may write.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestCopyHeldByLoad grows 2 data sources to 4 with the copy held while the server
// runs more than 1 statement of other sessions (CopyOptions.MaxActive): 4 sessions
// sleep in a statement as Start begins, and the copy waits for them (it says why,
// naming them), until they are cancelled a second and a half after it said so; then
// every row arrives. It counts exactly those 4: neither the move's own sessions (its
// COPY runs meanwhile) nor a session waiting for a lock. Verify holds between chunks
// the same way, and says how long.
func TestCopyHeldByLoad(t *testing.T) {
	dsns := fourDatabases(t)
	fill(t, dsns[:2], 2, 3000)
	from, to := layout(t, dsns[:2]), layout(t, dsns)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	// busy starts 4 sessions that sleep in a statement, and, once progress says that
	// what is held waits, cancels them a second and a half later.
	busy := func(progress *lockedBuffer) {
		for range 4 {
			wg.Go(func() {
				c, err := pgx.Connect(ctx, dsns[0])
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close(context.Background())
				if _, err := c.Exec(ctx, "SELECT pg_sleep(60)"); err == nil || !strings.Contains(err.Error(), "57014") {
					t.Errorf("a sleeper: %v, want it cancelled", err)
				}
			})
		}
		for queryInt(t, dsns[0], "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)' AND state = 'active'") < 4 {
			time.Sleep(10 * time.Millisecond)
		}
		wg.Go(func() {
			for !strings.Contains(progress.String(), " waits: ") {
				select {
				case <-ctx.Done():
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
			time.Sleep(1500 * time.Millisecond)
			exec(t, dsns[0], "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)'")
		})
	}
	// A session waiting for a lock, which does not count.
	waiter, err := pgx.Connect(ctx, dsns[1])
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close(context.Background())
	locker, err := pgx.Connect(ctx, dsns[1])
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	if _, err := locker.Exec(ctx, "BEGIN; SELECT pg_advisory_xact_lock(7)"); err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		if _, err := waiter.Exec(ctx, "SELECT pg_advisory_lock(7)"); err != nil {
			t.Error(err)
		}
	})
	for queryInt(t, dsns[1], "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_advisory_lock(7)' AND wait_event_type = 'Lock'") < 1 {
		time.Sleep(10 * time.Millisecond)
	}

	var progress lockedBuffer
	busy(&progress)
	_, err = reshard.Start(ctx, from, to, reshard.CopyOptions{Options: reshard.Options{Progress: &progress}, MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	out := progress.String()
	if !regexp.MustCompile(`the copy waits: 4 other sessions run a statement on the server of ds_0 \(--max-active 1\): pid \d+ .*SELECT pg_sleep\(60\)`).MatchString(out) {
		t.Errorf("start's progress does not say the copy waited for the 4 sessions, naming them:\n%s", out)
	}
	m := regexp.MustCompile(`held (\S+) in all while other sessions kept more than 1 statements running`).FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		t.Fatalf("start's progress does not say how long the copy was held:\n%s", out)
	}
	held, err := time.ParseDuration(m[len(m)-1][1])
	if err != nil || held < time.Second {
		t.Errorf("the copy was held %v (%v), want at least the second and a half before the sessions were cancelled:\n%s", held, err, out)
	}
	waitReady(t, from, to)

	var vprogress lockedBuffer
	busy(&vprogress)
	d, err := reshard.Verify(ctx, from, to, reshard.VerifyOptions{Options: reshard.Options{Progress: &vprogress}, ChunkRows: 500, MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Clean() {
		t.Errorf("verify after a held copy: %+v", d.Tables)
	}
	if !strings.Contains(vprogress.String(), "verify waits: 4 other sessions") || d.Held < time.Second {
		t.Errorf("verify with --max-active 1 while 4 sessions sleep was held %v, want at least a second:\n%s", d.Held, vprogress.String())
	}
	if _, err := locker.Exec(ctx, "COMMIT"); err != nil {
		t.Error(err)
	}
	wg.Wait()
}

// TestMaxActiveNeedsStats: a start with MaxActive whose role cannot see other roles'
// sessions (not a superuser, not in pg_read_all_stats) is refused naming the data
// source, before anything is made: its gate would count nothing.
func TestMaxActiveNeedsStats(t *testing.T) {
	dsns := fourDatabases(t)
	fill(t, dsns[:2], 2, 300)
	exec(t, dsns[0], "CREATE ROLE watcher LOGIN REPLICATION")
	var plain []string
	for _, d := range dsns {
		if !strings.Contains(d, "postgres@") {
			t.Fatalf("a DSN without the user postgres: %s", d)
		}
		exec(t, d, "GRANT SELECT ON ALL TABLES IN SCHEMA public TO watcher")
		plain = append(plain, strings.Replace(d, "postgres@", "watcher@", 1))
	}
	from, to := layout(t, plain[:2]), layout(t, plain)
	_, err := reshard.Start(context.Background(), from, to, reshard.CopyOptions{MaxActive: 4})
	if err == nil || !strings.Contains(err.Error(), "shows only to a superuser or a member of pg_read_all_stats") {
		t.Fatalf("start with MaxActive as a role without pg_read_all_stats: %v", err)
	}
	for k, d := range dsns {
		if n := queryString(t, d, `SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_subscription) +
			(SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'shardlab%')`); n != "0" {
			t.Errorf("ds_%d: %s publications, subscriptions, slots or schemas made by a refused start", k, n)
		}
	}
}
