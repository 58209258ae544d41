package reshard_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/proxy"
	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/reshard"
	"github.com/shardlab/shardlab/rules"
)

// withAccounts adds the accounts table, sharded by id, to a layout.
func withAccounts(r *rules.Rules) {
	r.Tables = append(r.Tables, rules.Table{Name: "accounts", Strategy: rules.Strategy{Column: "id"}})
}

// rulesFile writes layout l as a rules file.
func rulesFile(t *testing.T, l *rules.Compiled) string {
	t.Helper()
	var b strings.Builder
	r := l.Rules()
	fmt.Fprintf(&b, "broadcast = [%q]\n", r.Broadcast[0])
	for _, d := range r.DataSources {
		fmt.Fprintf(&b, "\n[[data_source]]\nname = %q\ndsn = %q\n", d.Name, d.DSN)
	}
	for _, tb := range r.Tables {
		fmt.Fprintf(&b, "\n[[sharded_table]]\nname = %q\ncolumn = %q\n", tb.Name, tb.Strategy.Column)
		if len(tb.DataSources) > 0 {
			fmt.Fprintf(&b, "data_sources = [%q%s]\n", tb.DataSources[0], strings.Join(quotedTail(tb.DataSources), ""))
		}
	}
	path := filepath.Join(t.TempDir(), "to.toml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := rules.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest() != l.Digest() {
		t.Fatalf("the rules file is another layout: %s, want %s", got.Digest(), l.Digest())
	}
	return path
}

func quotedTail(names []string) []string {
	var out []string
	for _, n := range names[1:] {
		out = append(out, fmt.Sprintf(", %q", n))
	}
	return out
}

// serve runs a proxy over layout l (checking the layout the data sources record) and
// returns its address, or New's error.
func serve(t *testing.T, l *rules.Compiled, with ...func(*proxy.Config)) (string, *proxy.Server, error) {
	t.Helper()
	cfg := proxy.Config{Rules: l, Database: "app", AdminDatabase: "shardlab_admin", CheckLayout: true,
		Pool: backend.Options{Size: 10, CheckoutTimeout: 10 * time.Second}, DeadlockInterval: -1}
	for _, w := range with {
		w(&cfg)
	}
	srv, err := proxy.New(context.Background(), cfg)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return ln.Addr().String(), srv, nil
}

// TestCutoverThroughProxy grows a deployment from 2 data sources to 4 through a running
// proxy while clients transfer money between accounts through it and a reader counts
// them: the proxy's RESHARD CUTOVER holds new transactions, switches and releases them
// onto the new layout, and RESHARD FINISH deletes the moved rows from where they were.
// No client transaction fails, the count of accounts never changes (no read sees a
// moved row twice, nor misses one), the money adds up after, every row ends on the
// data source the new layout places it on and on no other, and nothing of the move
// is left on the servers. A proxy given the old rules refuses to start, and a
// process that routes by them is refused its writes (the fence).
func TestCutoverThroughProxy(t *testing.T) {
	dsns := fourDatabases(t)
	const rows = 2000
	fill(t, dsns, 2, 200)
	withAccountsOn(t, dsns, rows)
	from, to := layout(t, dsns[:2], withAccounts), layout(t, dsns, withAccounts)
	toPath := rulesFile(t, to)
	ctx := context.Background()

	addr, srv, err := serve(t, from)
	if err != nil {
		t.Fatal(err)
	}
	startMove(t, from, to, reshard.CopyOptions{})
	c := newClients(t, addr)
	c.transfers(4, rows)
	c.reader(rows)
	time.Sleep(500 * time.Millisecond)
	before := c.txs.Load()
	// A verify cut short before the cutover is not resumed after it: what it compared
	// may have changed since.
	cut := reshard.VerifyOptions{}
	reshard.StopVerifyAfter(&cut, 1)
	if _, err := reshard.Verify(ctx, from, to, cut); !errors.Is(err, reshard.ErrCrashed) {
		c.halt()
		t.Fatalf("a verify cut short: %v", err)
	}
	// Verified in the hold, pinned: nothing writes then.
	res, err := c.admin("RESHARD CUTOVER '" + toPath + "' VERIFY 30")
	if err != nil {
		c.halt()
		t.Fatalf("RESHARD CUTOVER: %v", err)
	}
	verified := false
	for _, row := range res[0].Rows {
		t.Logf("cutover %s: %s", row[0], row[1])
		verified = verified || string(row[0]) == "catch_up.verify"
	}
	if !verified {
		t.Error("RESHARD CUTOVER ... VERIFY 30 did not verify in its hold")
	}
	if _, err := reshard.Verify(ctx, from, to, reshard.VerifyOptions{Resume: true}); err == nil || !strings.Contains(err.Error(), "is in force now: what it compared may have changed since") {
		t.Errorf("resuming after the cutover a verify cut short before it: %v, want it refused", err)
	}
	if st, err := reshard.GetStatus(ctx, from, to); err != nil || st.Verify == nil || !st.Verify.Stale {
		t.Errorf("status after the cutover of a verify cut short before it: %v, %+v; want it not resumable", err, st.Verify)
	} else {
		var b strings.Builder
		st.WriteText(&b)
		if !strings.Contains(b.String(), "another in force now: not resumable") {
			t.Errorf("status does not say the verify cut short is not resumable:\n%s", b.String())
		}
	}
	readsAt := c.reads.Load()
	time.Sleep(700 * time.Millisecond)
	if c.txs.Load() == before || c.reads.Load() == readsAt {
		t.Errorf("no transfer or read after the cutover (%d transfers, %d reads in all)", c.txs.Load(), c.reads.Load())
	}
	// The new layout's router was warmed with the old one's plans before the hold: the
	// clients' statements, all sent before the cutover too, planned nothing after it.
	if st := srv.Router().PlanCacheStats(); st.Misses != 0 || st.Hits == 0 {
		t.Errorf("the new layout's plan cache after the cutover: %+v, want hits and no miss", st)
	}

	// A proxy given the old rules refuses to start; a process that routes by them is
	// refused its writes, and one that says nothing (psql) is not.
	if _, _, err := serve(t, from); !errors.Is(err, reshard.ErrStaleLayout) {
		t.Errorf("a proxy given the old rules: %v, want ErrStaleLayout", err)
	}
	stale, err := pgconn.Connect(ctx, dsns[0]+"&options=-c%20"+reshard.LayoutSetting+"%3D"+from.Digest())
	if err != nil {
		t.Fatal(err)
	}
	var pe *pgconn.PgError
	if _, err := stale.Exec(ctx, "UPDATE accounts SET bal = bal WHERE id = 1").ReadAll(); !errors.As(err, &pe) || pe.Code != "55000" {
		t.Errorf("a write of a process on the old layout: %v, want the fence's 55000", err)
	}
	stale.Close(ctx)
	exec(t, dsns[0], "UPDATE accounts SET bal = bal WHERE id = 1")
	if res, err := c.admin("SHOW LAYOUT"); err != nil {
		t.Error(err)
	} else if !strings.Contains(fmt.Sprint(rowsText(res)), "ds_0.accounts -> accounts__shardlab_owned") {
		t.Errorf("SHOW LAYOUT: %v", rowsText(res))
	}

	if _, err := c.admin("RESHARD FINISH"); err != nil {
		t.Errorf("RESHARD FINISH: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	c.halt()
	t.Logf("%d transfers, %d counts", c.txs.Load(), c.reads.Load())

	// Every account on the data source the new layout places it on, and on no other.
	total := int64(0)
	for k, d := range dsns {
		var all, owned int64
		cn, err := pgx.Connect(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		if err := cn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), count(*) FILTER (WHERE satisfies_hash_partition('hash_oracle'::regclass, 4, %d, id)) FROM accounts`, k)).Scan(&all, &owned); err != nil {
			t.Fatal(err)
		}
		var leftovers int64
		if err := cn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_subscription) +
			(SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_views WHERE viewname LIKE '%shardlab%') +
			(SELECT count(*) FROM pg_event_trigger)`).Scan(&leftovers); err != nil {
			t.Fatal(err)
		}
		cn.Close(ctx)
		if all != owned {
			t.Errorf("ds_%d holds %d accounts, %d of them its own by the new layout", k, all, owned)
		}
		if leftovers != 0 {
			t.Errorf("ds_%d: %d publications, subscriptions, slots, views or event triggers of the move are left", k, leftovers)
		}
		total += all
	}
	if total != rows {
		t.Errorf("the data sources hold %d accounts in all, want %d", total, rows)
	}
	cn, err := pgx.Connect(ctx, c.url("app"))
	if err != nil {
		t.Fatal(err)
	}
	defer cn.Close(ctx)
	var n, sum int64
	if err := cn.QueryRow(ctx, "SELECT count(*), sum(bal) FROM accounts").Scan(&n, &sum); err != nil {
		t.Fatal(err)
	}
	if n != rows || sum != rows*100 {
		t.Errorf("through the proxy after the finish: %d accounts holding %d, want %d holding %d", n, sum, rows, rows*100)
	}
	// A proxy started now with the new rules serves them.
	if _, _, err := serve(t, to); err != nil {
		t.Errorf("a proxy given the new rules after the finish: %v", err)
	}
}

// TestCutoverGivesUp: a transaction that stays open outlasts the cutover's bound on
// the transactions in flight; the cutover gives up, and the old layout serves on with
// the streams running again, the transaction's writes intact, and no layout recorded
// but the old one.
func TestCutoverGivesUp(t *testing.T) {
	dsns := fourDatabases(t)
	fill(t, dsns, 2, 500)
	from, to := layout(t, dsns[:2]), layout(t, dsns)
	ctx := context.Background()
	addr, srv, err := serve(t, from)
	if err != nil {
		t.Fatal(err)
	}
	startMove(t, from, to, reshard.CopyOptions{})
	cn, err := pgx.Connect(ctx, "postgres://postgres@"+addr+"/app?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer cn.Close(ctx)
	// DDL on a table the move carries is refused (logical replication does not carry
	// it), through the proxy and on a data source itself; DDL elsewhere is not.
	var pe *pgconn.PgError
	if _, err := cn.Exec(ctx, "ALTER TABLE people ADD COLUMN age int"); !errors.As(err, &pe) || pe.Code != "55006" {
		t.Errorf("ALTER TABLE on a moving table through the proxy: %v, want 55006", err)
	}
	for _, sql := range []string{"CREATE INDEX ON people (name)", "DROP TABLE countries", "ALTER TABLE people RENAME TO persons"} {
		c, err := pgconn.Connect(ctx, dsns[2])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, sql).ReadAll(); !errors.As(err, &pe) || pe.Code != "55006" {
			t.Errorf("%s on a destination during the move: %v, want 55006", sql, err)
		}
		c.Close(ctx)
	}
	// A table the move does not touch (on the default data source): the transaction
	// holds no lock that the cutover's fence would wait for.
	exec(t, dsns[0], "CREATE TABLE notes (id int PRIMARY KEY, body text)")
	tx, err := cn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// It reads first: a transaction that has written holds back the slots the
	// cutover makes before its hold (below).
	if _, err := tx.Exec(ctx, "SELECT count(*) FROM notes"); err != nil {
		t.Fatal(err)
	}
	_, err = reshard.Cutover(ctx, from, to, srv.ReshardProxy(), reshard.CutoverOptions{Drain: 300 * time.Millisecond})
	if !errors.Is(err, reshard.ErrCutover) {
		t.Fatalf("a cutover that a transaction outlasts: %v, want ErrCutover", err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO notes VALUES (7, 'held')"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// A transaction that writes and stays open on the server holds back the slots
	// of the streams back: the cutover gives up after its bound, naming it.
	reshard.SetSlotWait(t, time.Second)
	w, err := pgx.Connect(ctx, dsns[0])
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	wtx, err := w.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wtx.Exec(ctx, "INSERT INTO notes VALUES (8, 'open')"); err != nil {
		t.Fatal(err)
	}
	if _, err := reshard.Cutover(ctx, from, to, srv.ReshardProxy(), reshard.CutoverOptions{}); err == nil || !strings.Contains(err.Error(), "stay open on the server (pid") {
		t.Errorf("a cutover while a writing transaction stays open: %v, want the slot's wait named", err)
	}
	if err := wtx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := cn.QueryRow(ctx, "SELECT count(*) FROM notes WHERE body = 'held'").Scan(&n); err != nil || n != 1 {
		t.Errorf("after the cutover gave up: %d rows of the transaction's write (%v), want 1", n, err)
	}
	if got := srv.Router().Rules().Digest(); got != from.Digest() {
		t.Errorf("the proxy routes by %s after the cutover gave up, want the old layout %s", got, from.Digest())
	}
	rec, err := reshard.ReadLayout(ctx, to)
	if err != nil || rec == nil || rec.Digest != from.Digest() {
		t.Errorf("the layout recorded after the cutover gave up: %+v (%v), want the old one", rec, err)
	}
	// A row that differs on a destination (written there by hand) makes a cutover that
	// verifies in its hold give up; the old layout serves on.
	waitReady(t, from, to)
	exec(t, dsns[2], "UPDATE people SET name = 'not the source''s' WHERE id = (SELECT min(id) FROM people)")
	// A verify cut short after its first chunk (countries, ds_0 -> ds_2) keeps its
	// record through the cutover's comparison in the hold, which records nothing.
	cut := reshard.VerifyOptions{}
	reshard.StopVerifyAfter(&cut, 1)
	if _, err := reshard.Verify(ctx, from, to, cut); !errors.Is(err, reshard.ErrCrashed) {
		t.Fatalf("a verify cut short: %v", err)
	}
	_, err = reshard.Cutover(ctx, from, to, srv.ReshardProxy(), reshard.CutoverOptions{Verify: 30 * time.Second})
	if !errors.Is(err, reshard.ErrCutover) || !strings.Contains(err.Error(), "1 different") {
		t.Errorf("a cutover verifying in its hold, a row different on a destination: %v, want ErrCutover naming it", err)
	}
	if st, err := reshard.GetStatus(ctx, from, to); err != nil || st.Verify == nil || st.Verify.Chunks != 1 || !st.Verify.Finished.IsZero() {
		t.Errorf("the verify cut short, after a comparison in the hold: %v, %+v; want its record as it was (1 chunk, not finished)", err, st.Verify)
	}
	if d, err := reshard.Verify(ctx, from, to, reshard.VerifyOptions{Resume: true}); err != nil || d.ResumedChunks != 1 || len(d.Tables) != 4 {
		t.Errorf("resuming the verify cut short after the cutover gave up: %v, %+v", err, d)
	} else {
		var differ []string
		for _, rd := range d.Tables {
			differ = append(differ, rd.Different...)
		}
		if len(differ) != 1 {
			t.Errorf("the resumed verify found %v different, want the row changed on ds_2", differ)
		}
	}
	if got := srv.Router().Rules().Digest(); got != from.Digest() {
		t.Errorf("the proxy routes by %s after the verifying cutover gave up, want the old layout", got)
	}
	waitReady(t, from, to)
	if err := reshard.Cancel(ctx, from, to, reshard.Options{}); err != nil {
		t.Fatal(err)
	}
	// The guard went with the move.
	exec(t, dsns[0], "ALTER TABLE people ADD COLUMN age int")
	for k, d := range dsns {
		if n := queryString(t, d, "SELECT count(*) FROM pg_event_trigger"); n != "0" {
			t.Errorf("ds_%d: %s event triggers left after cancel", k, n)
		}
	}
}

// fourDatabases makes four databases on a throwaway cluster that can carry a move.
func fourDatabases(t *testing.T, settings ...string) []string {
	t.Helper()
	c := logicalCluster(t, settings...)
	var dsns []string
	for range 4 {
		dsns = append(dsns, c.NewDatabase("reshard"))
	}
	return dsns
}

// startMove starts the move from layout from to layout to and waits until every
// stream is ready.
func startMove(t *testing.T, from, to *rules.Compiled, opts reshard.CopyOptions) {
	t.Helper()
	if _, err := reshard.Start(context.Background(), from, to, opts); err != nil {
		t.Fatal(err)
	}
	waitReady(t, from, to)
}

func waitReady(t *testing.T, from, to *rules.Compiled) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := reshard.GetStatus(context.Background(), from, to)
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready() {
			return
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			st.WriteText(&b)
			t.Fatalf("the copy is not ready after 60 s:\n%s", b.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func rowsText(res []*pgconn.Result) []string {
	var out []string
	for _, r := range res {
		for _, row := range r.Rows {
			var cells []string
			for _, v := range row {
				cells = append(cells, string(v))
			}
			out = append(out, strings.Join(cells, " "))
		}
	}
	return out
}

// TestCutoverKeepsWritesOfTheOldLayout: with no proxy to hold them, writers that
// route by the old layout go on writing rows that move, up to the moment the cutover
// records the new layout; then the fence refuses them (55000). Every update they were
// told committed is on the row's new data source afterwards: the record is written
// before the destinations catch up, and waits for the writes that passed the fence.
func TestCutoverKeepsWritesOfTheOldLayout(t *testing.T) {
	dsns := fourDatabases(t)
	fill(t, dsns, 2, 2000)
	// visits has five rows per key and no primary key (as pgbench_history): the
	// finish's delete, in batches of 7, ends batches inside a key's rows.
	withVisits := func(r *rules.Rules) {
		r.Tables = append(r.Tables, rules.Table{Name: "visits", Strategy: rules.Strategy{Column: "id"}})
	}
	for i, d := range dsns {
		exec(t, d, "CREATE TABLE visits (id bigint NOT NULL, n int)")
		if i < 2 {
			exec(t, d, fmt.Sprintf(`INSERT INTO visits SELECT g, k FROM generate_series(1, 200) g, generate_series(1, 5) k
				WHERE satisfies_hash_partition('hash_oracle'::regclass, 2, %d, g::bigint)`, i))
		}
	}
	from, to := layout(t, dsns[:2], withVisits), layout(t, dsns, withVisits)
	ctx := context.Background()
	startMove(t, from, to, reshard.CopyOptions{ReplicaIdentityFull: true})
	type target struct {
		old, new int
		ids      []int64
	}
	targets := []target{{old: 0, new: 2}, {old: 1, new: 3}}
	for i := range targets {
		tg := &targets[i]
		ids := queryString(t, dsns[tg.old], fmt.Sprintf(`SELECT string_agg(id::text, ' ' ORDER BY id) FROM (SELECT id FROM people
			WHERE satisfies_hash_partition('hash_oracle'::regclass, 4, %d, id) ORDER BY id LIMIT 20) s`, tg.new))
		for f := range strings.FieldsSeq(ids) {
			var id int64
			fmt.Sscan(f, &id)
			tg.ids = append(tg.ids, id)
		}
	}
	var wg sync.WaitGroup
	acked := make([]map[int64]string, len(targets))
	fenced := make([]bool, len(targets))
	for i, tg := range targets {
		acked[i] = map[int64]string{}
		wg.Go(func() {
			cn, err := pgconn.Connect(ctx, dsns[tg.old]+"&options=-c%20"+reshard.LayoutSetting+"%3D"+from.Digest())
			if err != nil {
				t.Error(err)
				return
			}
			defer cn.Close(ctx)
			for n := 0; ; n++ {
				id := tg.ids[n%len(tg.ids)]
				v := fmt.Sprintf("w%d", n)
				_, err := cn.Exec(ctx, fmt.Sprintf("UPDATE people SET name = '%s' WHERE id = %d", v, id)).ReadAll()
				var pe *pgconn.PgError
				if errors.As(err, &pe) && pe.Code == "55000" {
					fenced[i] = true
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				acked[i][id] = v
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	// Verified in the hold: the writers write up to it, and nothing writes in it, so
	// the comparison is exact (outside a hold a write between its two reads differs).
	if _, err := reshard.Cutover(ctx, from, to, nil, reshard.CutoverOptions{Verify: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, tg := range targets {
		if !fenced[i] {
			t.Errorf("the writer on ds_%d was not fenced", tg.old)
		}
		if len(acked[i]) == 0 {
			t.Fatalf("the writer on ds_%d wrote nothing", tg.old)
		}
		for id, v := range acked[i] {
			if got := queryString(t, dsns[tg.new], fmt.Sprintf("SELECT coalesce((SELECT name FROM people WHERE id = %d), 'missing')", id)); got != v {
				t.Errorf("id %d on ds_%d is %q, want the last update acknowledged on ds_%d, %q", id, tg.new, got, tg.old, v)
			}
		}
	}
	// A finish run twice: the second finds the move finished and drops nothing more.
	// The first deletes at most 600 rows a second (one table after the other): it
	// takes at least the rows it deleted over 600 seconds (about 2 s here; unbounded,
	// the whole finish takes well under that).
	for i := range 2 {
		began := time.Now()
		rep, err := reshard.Finish(ctx, from, to, nil, reshard.FinishOptions{Batch: 7, Rate: 600})
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			continue
		}
		var all int64
		for _, n := range rep.Deleted {
			all += n
		}
		if took, least := time.Since(began), time.Duration(all)*time.Second/600; all == 0 || took < least {
			t.Errorf("the finish deleted %d rows in %v, faster than its bound of 600 a second allows (%v)", all, took, least)
		}
	}
	visits := 0
	for k, d := range dsns {
		for _, table := range []string{"people", "visits"} {
			if n := queryString(t, d, fmt.Sprintf(`SELECT count(*) FILTER (WHERE NOT satisfies_hash_partition('hash_oracle'::regclass, 4, %d, id)) FROM %s`, k, table)); n != "0" {
				t.Errorf("ds_%d keeps %s rows of %s that the new layout places elsewhere", k, n, table)
			}
		}
		var n int
		fmt.Sscan(queryString(t, d, "SELECT count(*) FROM visits"), &n)
		visits += n
	}
	if visits != 1000 {
		t.Errorf("%d visits on the four data sources, want 1000", visits)
	}
}

// TestCutoverCompletesAfterACrash: a cutover killed once it recorded the new layout
// (its streams still running) leaves a state no proxy may serve: one given the new
// rules refuses to start (ErrCutoverIncomplete), until the cutover is run again, which
// completes it (the destinations caught up, the streams stopped). Then it refuses a
// third run, and the proxy starts.
func TestCutoverCompletesAfterACrash(t *testing.T) {
	dsns := fourDatabases(t)
	fill(t, dsns, 2, 500)
	from, to := layout(t, dsns[:2]), layout(t, dsns)
	ctx := context.Background()
	startMove(t, from, to, reshard.CopyOptions{})
	opts := reshard.CutoverOptions{}
	reshard.CrashAfterRecord(&opts)
	if _, err := reshard.Cutover(ctx, from, to, nil, opts); !errors.Is(err, reshard.ErrCrashed) {
		t.Fatalf("the crashed cutover: %v", err)
	}
	if _, _, err := serve(t, to); !errors.Is(err, reshard.ErrCutoverIncomplete) {
		t.Errorf("a proxy given the new rules after the crash: %v, want ErrCutoverIncomplete", err)
	}
	if _, _, err := serve(t, from); !errors.Is(err, reshard.ErrStaleLayout) {
		t.Errorf("a proxy given the old rules after the crash: %v, want ErrStaleLayout", err)
	}
	// A finish would drop streams that still run: it sends the user to the cutover.
	if _, err := reshard.Finish(ctx, from, to, nil, reshard.FinishOptions{}); !errors.Is(err, reshard.ErrCutoverIncomplete) {
		t.Errorf("a finish after the crash: %v, want ErrCutoverIncomplete", err)
	}
	if _, err := reshard.Cutover(ctx, from, to, nil, reshard.CutoverOptions{}); err != nil {
		t.Fatalf("the cutover run again: %v", err)
	}
	for k, d := range dsns[2:] {
		if n := queryString(t, d, "SELECT count(*) FROM pg_subscription WHERE subenabled AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())"); n != "0" {
			t.Errorf("ds_%d: %s subscriptions still enabled after the cutover completed", k+2, n)
		}
	}
	if _, err := reshard.Cutover(ctx, from, to, nil, reshard.CutoverOptions{}); err == nil || !strings.Contains(err.Error(), "cut over already") {
		t.Errorf("a third cutover: %v, want 'cut over already'", err)
	}
	if _, _, err := serve(t, to); err != nil {
		t.Errorf("a proxy given the new rules after the cutover completed: %v", err)
	}
	if _, err := reshard.Finish(ctx, from, to, nil, reshard.FinishOptions{}); err != nil {
		t.Fatal(err)
	}
}
