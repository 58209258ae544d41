package reshard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	resharding "github.com/shardlab/shardlab/reshard"
	"github.com/shardlab/shardlab/rules"
)

// TestKilledAtEachStep runs the reshard command as a process of its own and kills it
// (SIGKILL, at the points reshard.CrashEnv names) at each step of a move from one data
// source to two, in turn: start, the cutover's hold and what follows it, the revert's,
// the finish. After each kill the command run again with the same rules files
// completes what was cut short (or, for a start, cancel and start again), and the move
// goes on; rows are written on the layout in force between the steps. At the end
// every row is on the data source the layout in force places it on, none is lost, and
// nothing of the move is left: no slot, subscription, publication or prepared
// transaction.
func TestKilledAtEachStep(t *testing.T) {
	bin := buildCommands(t, "reshard")[0]
	a, b := twoDatabases(t, "reshardkill")
	ctx := context.Background()
	sql := func(dsn, q string) int64 { t.Helper(); return queryInt(t, dsn, q) }
	from, to := writeRules(t, a), writeRules(t, a, b)
	toRules, err := rules.Load(to)
	if err != nil {
		t.Fatal(err)
	}

	run := func(crash string, args ...string) (string, error) {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(rctx, bin, append(args, "--from", from, "--to", to)...)
		cmd.Env = append(os.Environ(), resharding.CrashEnv+"="+crash)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	killed := func(point string, args ...string) {
		t.Helper()
		out, err := run(point, args...)
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("%v with %s: %v, want it killed\n%s", args, point, err, out)
		}
		if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("%v with %s: %v, want it killed\n%s", args, point, err, out)
		}
	}
	ok := func(args ...string) {
		t.Helper()
		if out, err := run("", args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	ready := func() {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			out, err := run("", "status")
			if err == nil && strings.Contains(out, "ready for the cutover") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the copy is not ready after a minute: %v\n%s", err, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	fromRules, err := rules.Load(from)
	if err != nil {
		t.Fatal(err)
	}
	as := func(dsn string, l *rules.Compiled) string {
		return dsn + "&options=-c%20" + resharding.LayoutSetting + "%3D" + l.Digest()
	}
	next, acked := int64(1001), int64(0)
	// insert inserts the next row through layout l, as a process that routes by it:
	// the old layout writes every row on a; the new one on b the rows it places there,
	// the others on a (through its view). It reports whether the fence refused it.
	insert := func(l *rules.Compiled) (fenced bool, err error) {
		at := as(a, l)
		if l == toRules {
			var onB bool
			conn, err := pgx.Connect(ctx, a)
			if err != nil {
				return false, err
			}
			err = conn.QueryRow(ctx, "SELECT satisfies_hash_partition('hash_oracle'::regclass, 2, 1, $1::int)", next).Scan(&onB)
			conn.Close(ctx)
			if err != nil {
				return false, err
			}
			if onB {
				at = as(b, l)
			}
		}
		conn, err := pgx.Connect(ctx, at)
		if err != nil {
			return false, err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, fmt.Sprintf("INSERT INTO items VALUES (%d)", next))
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55000" {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		next++
		acked++
		return false, nil
	}
	write := func(l *rules.Compiled) {
		t.Helper()
		for range 20 {
			if fenced, err := insert(l); err != nil || fenced {
				t.Fatalf("a write through the layout in force: fenced %v, %v", fenced, err)
			}
		}
	}
	// during runs step while rows are inserted through layout l, until the fence
	// refuses one or the step ends: the step must carry every row acknowledged.
	during := func(l *rules.Compiled, step func()) {
		t.Helper()
		stop := make(chan struct{})
		errc := make(chan error, 1)
		go func() {
			for {
				select {
				case <-stop:
					errc <- nil
					return
				default:
				}
				if fenced, err := insert(l); err != nil || fenced {
					errc <- err
					return
				}
			}
		}()
		step()
		close(stop)
		if err := <-errc; err != nil {
			t.Fatalf("a write during the step: %v", err)
		}
	}

	killed("start-stream", "start")
	ok("cancel")
	for i, points := range [][2]string{{"cutover-switching", "revert-switching"}, {"cutover-stopped", "revert-stopped"},
		{"cutover-final", "revert-final"}, {"cutover-done", "revert-removing"}} {
		ok("start")
		ready()
		during(fromRules, func() { killed(points[0], "cutover") })
		if i < 2 {
			ok("cutover") // completes it
		} else if out, err := run("", "cutover"); err == nil || !strings.Contains(out, "cut over already") {
			t.Fatalf("cutover after %s: %v, want 'cut over already'\n%s", points[0], err, out)
		}
		write(toRules)
		during(toRules, func() { killed(points[1], "revert") })
		ok("revert") // completes it
		write(fromRules)
	}
	ok("start")
	ready()
	ok("cutover")
	write(toRules)
	killed("finish-finishing", "finish")
	if out, err := run("", "revert"); err == nil || !strings.Contains(out, "a finish of the move") {
		t.Errorf("revert after a finish began: %v, want it refused\n%s", err, out)
	}
	killed("finish-deleted", "finish")
	ok("finish")

	total := sql(a, "SELECT count(*) FROM items") + sql(b, "SELECT count(*) FROM items")
	if want := 1000 + acked; total != want {
		t.Errorf("%d items on the two data sources, want %d", total, want)
	}
	for i, d := range []string{a, b} {
		if n := sql(d, fmt.Sprintf("SELECT count(*) FROM items WHERE NOT satisfies_hash_partition('hash_oracle'::regclass, 2, %d, id)", i)); n != 0 {
			t.Errorf("ds_%d holds %d items the layout in force places elsewhere", i, n)
		}
	}
	if n := sql(a, `SELECT (SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_subscription)
		+ (SELECT count(*) FROM pg_prepared_xacts)`) + sql(a, "SELECT count(*) FROM pg_publication") + sql(b, "SELECT count(*) FROM pg_publication"); n != 0 {
		t.Errorf("%d slots, subscriptions, prepared transactions or publications left", n)
	}
}
