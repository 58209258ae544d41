package reshard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	resharding "github.com/shardlab/shardlab/reshard"
)

// proxyProcess is a shard-proxy running as a process of its own during a test.
type proxyProcess struct {
	cmd    *exec.Cmd
	addr   string
	out    *bytes.Buffer
	exited chan struct{}
	err    error // once exited is closed
}

// startProxy runs the shard-proxy binary over the rules file, with the crash point
// (reshard.CrashEnv) given, and waits until it accepts clients; it returns the process
// and nil, or nil and the reason it did not come up (its output when it exited).
func startProxy(t *testing.T, bin, rulesPath, crash string) (*proxyProcess, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := &proxyProcess{addr: addr, out: &bytes.Buffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, "--config", rulesPath, "--listen", addr, "--database", "app", "--admin-database", "shardlab_admin",
		"--stats-interval", "0", "--deadlock-interval", "0")
	p.cmd.Env = append(os.Environ(), resharding.CrashEnv+"="+crash)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() { p.cmd.Process.Kill(); <-p.exited })
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-p.exited:
			return nil, fmt.Errorf("shard-proxy exited: %v\n%s", p.err, p.out)
		default:
		}
		c, err := pgconn.Connect(context.Background(), p.url("app"))
		if err == nil {
			c.Close(context.Background())
			return p, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("shard-proxy does not answer after 20 s: %v\n%s", err, p.out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *proxyProcess) url(db string) string {
	return "postgres://postgres@" + p.addr + "/" + db + "?sslmode=disable"
}

// killedBy runs an admin console statement that must kill the proxy at its crash
// point (SIGKILL).
func (p *proxyProcess) killedBy(t *testing.T, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, err := pgconn.Connect(ctx, p.url("shardlab_admin"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Exec(ctx, sql).ReadAll()
	if err == nil {
		t.Fatalf("%s ended without the proxy being killed", sql)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: %v, and the proxy is still running\n%s", sql, err, p.out)
	}
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) {
		t.Fatalf("%s: the proxy ended with %v, want it killed\n%s", sql, p.err, p.out)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s: the proxy ended with %v, want it killed\n%s", sql, p.err, p.out)
	}
}

// proxyWriters insert rows through a proxy, one client each, until stopped or until
// the proxy goes away; they keep the keys acknowledged, and those whose insert was in
// flight when the connection broke (committed or not: the client cannot know).
type proxyWriters struct {
	mu             sync.Mutex
	next           int64
	acked, inDoubt []int64
	stop           chan struct{}
	wg             sync.WaitGroup
	failures       []string
}

func (w *proxyWriters) key() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next++
	return w.next
}

// run starts n clients of proxy p.
func (w *proxyWriters) run(p *proxyProcess, n int) {
	w.stop = make(chan struct{})
	for range n {
		w.wg.Go(func() {
			ctx := context.Background()
			c, err := pgx.Connect(ctx, p.url("app"))
			if err != nil {
				w.mu.Lock()
				w.failures = append(w.failures, err.Error())
				w.mu.Unlock()
				return
			}
			defer c.Close(ctx)
			for {
				select {
				case <-w.stop:
					return
				default:
				}
				k := w.key()
				_, err := c.Exec(ctx, fmt.Sprintf("INSERT INTO items VALUES (%d)", k))
				w.mu.Lock()
				if err != nil {
					w.inDoubt = append(w.inDoubt, k)
				} else {
					w.acked = append(w.acked, k)
				}
				w.mu.Unlock()
				if err != nil {
					var pe *pgconn.PgError
					if errors.As(err, &pe) {
						// An error the proxy answered: no client may see one.
						w.mu.Lock()
						w.failures = append(w.failures, fmt.Sprintf("INSERT %d: %v", k, err))
						w.mu.Unlock()
					}
					return // the proxy went away
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
}

func (w *proxyWriters) halt() {
	close(w.stop)
	w.wg.Wait()
}

// TestProxyKilledAtEachStep kills shard-proxy (SIGKILL, at the points reshard.CrashEnv
// names) while its admin console runs RESHARD CUTOVER, RESHARD REVERT and RESHARD
// FINISH of a move from one data source to two, with clients inserting through it.
// After each kill: a proxy given the old rules refuses to start while the cutover's
// record says it is switching; reshard run with both rules files completes the step;
// a proxy restarted with the rules in force serves, and its clients' writes go on. At
// the end every acknowledged row is there, on the data source the layout in force
// places it on, no row is there that no client wrote, and nothing of the move is left.
func TestProxyKilledAtEachStep(t *testing.T) {
	bins := buildCommands(t, "reshard", "shard-proxy")
	bin, proxyBin := bins[0], bins[1]
	a, b := twoDatabases(t, "proxykill")
	ctx := context.Background()
	query := func(dsn, q string) int64 { t.Helper(); return queryInt(t, dsn, q) }
	from, to := writeRules(t, a), writeRules(t, a, b)

	run := func(args ...string) (string, error) {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(rctx, bin, append(args, "--from", from, "--to", to)...).CombinedOutput()
		return string(out), err
	}
	ok := func(args ...string) {
		t.Helper()
		if out, err := run(args...); err != nil {
			t.Fatalf("reshard %v: %v\n%s", args, err, out)
		}
	}
	ready := func() {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			out, err := run("status")
			if err == nil && strings.Contains(out, "ready for the cutover") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the copy is not ready after a minute: %v\n%s", err, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	serve := func(rulesPath, crash string) *proxyProcess {
		t.Helper()
		p, err := startProxy(t, proxyBin, rulesPath, crash)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	w := &proxyWriters{next: 1000}
	// writing inserts through p during step (which kills p), then checks no client met
	// an error the proxy answered.
	writing := func(p *proxyProcess, step func()) {
		t.Helper()
		w.run(p, 3)
		time.Sleep(200 * time.Millisecond)
		step()
		w.halt()
		if len(w.failures) > 0 {
			t.Fatalf("clients of the proxy: %v", w.failures)
		}
	}

	for i, points := range [][2]string{{"cutover-switching", "revert-switching"}, {"cutover-stopped", "revert-stopped"},
		{"cutover-final", "revert-final"}, {"cutover-done", "revert-removing"}} {
		ok("start")
		ready()
		p := serve(from, points[0])
		writing(p, func() { p.killedBy(t, "RESHARD CUTOVER '"+to+"'") })
		if i == 0 {
			// Switching: no process may serve either layout until the cutover is run again.
			for _, r := range []string{from, to} {
				if q, err := startProxy(t, proxyBin, r, ""); err == nil {
					q.cmd.Process.Kill()
					t.Fatalf("a proxy started over %s while the cutover's record says it is switching", filepath.Base(filepath.Dir(r)))
				}
			}
		}
		if i < 2 {
			ok("cutover") // completes it
		} else if out, err := run("cutover"); err == nil || !strings.Contains(out, "cut over already") {
			t.Fatalf("cutover after %s: %v, want 'cut over already'\n%s", points[0], err, out)
		}
		if _, err := startProxy(t, proxyBin, from, ""); err == nil || !strings.Contains(err.Error(), "layout") {
			t.Fatalf("a proxy over the old rules after the cutover: %v, want it refused", err)
		}
		p = serve(to, points[1])
		writing(p, func() { p.killedBy(t, "RESHARD REVERT") })
		ok("revert") // completes it
		p = serve(from, "")
		writing(p, func() { time.Sleep(200 * time.Millisecond) })
		p.cmd.Process.Kill()
	}
	ok("start")
	ready()
	p := serve(from, "")
	writing(p, func() {
		a, err := pgconn.Connect(ctx, p.url("shardlab_admin"))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close(ctx)
		if _, err := a.Exec(ctx, "RESHARD CUTOVER '"+to+"'").ReadAll(); err != nil {
			t.Fatalf("RESHARD CUTOVER: %v", err)
		}
	})
	p.cmd.Process.Kill()
	p = serve(to, "finish-finishing")
	writing(p, func() { p.killedBy(t, "RESHARD FINISH") })
	p = serve(to, "finish-deleted")
	writing(p, func() { p.killedBy(t, "RESHARD FINISH") })
	ok("finish")
	p = serve(to, "")
	writing(p, func() { time.Sleep(200 * time.Millisecond) })

	// Every acknowledged row is there, on its data source; every other is one whose
	// insert was in flight when its proxy was killed.
	var got []int64
	for k, d := range []string{a, b} {
		if n := query(d, fmt.Sprintf("SELECT count(*) FROM items WHERE NOT satisfies_hash_partition('hash_oracle'::regclass, 2, %d, id)", k)); n != 0 {
			t.Errorf("ds_%d holds %d items the layout in force places elsewhere", k, n)
		}
		conn, err := pgx.Connect(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := conn.Query(ctx, "SELECT id FROM items WHERE id > 1000")
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			got = append(got, int64(id))
		}
	}
	if n := query(a, "SELECT count(*) FROM items WHERE id <= 1000") + query(b, "SELECT count(*) FROM items WHERE id <= 1000"); n != 1000 {
		t.Errorf("%d of the 1000 first items, want all", n)
	}
	slices.Sort(got)
	for _, k := range w.acked {
		if _, found := slices.BinarySearch(got, k); !found {
			t.Errorf("item %d was acknowledged and is not there", k)
		}
	}
	written := map[int64]bool{}
	for _, k := range append(w.acked, w.inDoubt...) {
		written[k] = true
	}
	for _, k := range got {
		if !written[k] {
			t.Errorf("item %d is there and no client wrote it", k)
		}
	}
	t.Logf("%d inserts acknowledged, %d in flight when a proxy was killed (%d of them committed)", len(w.acked), len(w.inDoubt), len(got)-len(w.acked))
	if n := query(a, `SELECT (SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_subscription)
		+ (SELECT count(*) FROM pg_prepared_xacts)`) + query(a, "SELECT count(*) FROM pg_publication") + query(b, "SELECT count(*) FROM pg_publication"); n != 0 {
		t.Errorf("%d slots, subscriptions, prepared transactions or publications left", n)
	}
}
