package proxy_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/proxy"
)

// TestPauseResume: the admin console's PAUSE waits for the transaction in progress
// (whose statements go on meanwhile) and holds a new client's statement until RESUME;
// a PAUSE that a transaction outlasts gives up and leaves the proxy serving; a held
// client's cancel request ends its wait with 57014.
func TestPauseResume(t *testing.T) {
	e := startProxy(t, 2, []string{"t=id"}, nil, func(c *proxy.Config) { c.AdminDatabase = "shardlab" })
	a, b := e.connect(t), e.connect(t)
	exec1(t, a, "CREATE TABLE t (id int PRIMARY KEY, v int)")
	ctx := context.Background()
	adm, err := pgconn.Connect(ctx, strings.Replace(e.url(""), "/"+testDatabase+"?", "/shardlab?", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close(ctx)
	admin := func(sql string) error {
		_, err := adm.Exec(ctx, sql).ReadAll()
		return err
	}
	showPause := func() string {
		res, err := adm.Exec(ctx, "SHOW PAUSE").ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		return string(res[0].Rows[0][0]) + " " + string(res[0].Rows[0][1])
	}

	exec1(t, a, "BEGIN")
	exec1(t, a, "INSERT INTO t VALUES (1, 1)")
	paused := make(chan error, 1)
	go func() {
		// Its own connection: the admin connection above answers SHOW PAUSE meanwhile.
		c, err := pgconn.Connect(ctx, strings.Replace(e.url(""), "/"+testDatabase+"?", "/shardlab?", 1))
		if err != nil {
			paused <- err
			return
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, "PAUSE 20").ReadAll()
		paused <- err
	}()
	waitFor(t, "the pause begins, a client in a transaction", func() bool { return showPause() == "yes 1" })
	held := make(chan error, 1)
	go func() {
		_, err := b.Exec(ctx, "INSERT INTO t VALUES (2, 2)")
		held <- err
	}()
	select {
	case err := <-paused:
		t.Fatalf("PAUSE returned while a transaction was open: %v", err)
	case err := <-held:
		t.Fatalf("a new client's statement ran during the pause: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	// The open transaction goes on, and ends.
	exec1(t, a, "UPDATE t SET v = 10 WHERE id = 1")
	exec1(t, a, "COMMIT")
	if err := <-paused; err != nil {
		t.Fatalf("PAUSE: %v", err)
	}
	select {
	case err := <-held:
		t.Fatalf("the held statement ran before RESUME: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := admin("PAUSE"); err == nil || !strings.Contains(err.Error(), "paused already") {
		t.Errorf("a second PAUSE: %v", err)
	}
	if err := admin("RESUME"); err != nil {
		t.Fatal(err)
	}
	if err := <-held; err != nil {
		t.Fatalf("the held statement after RESUME: %v", err)
	}
	if err := admin("RESUME"); err == nil || !strings.Contains(err.Error(), "not paused") {
		t.Errorf("RESUME when not paused: %v", err)
	}

	// A transaction that outlasts the PAUSE: it gives up, and the proxy serves.
	exec1(t, a, "BEGIN")
	exec1(t, a, "SELECT v FROM t WHERE id = 1")
	start := time.Now()
	if err := admin("PAUSE 0.5"); err == nil || !strings.Contains(err.Error(), "PAUSE gave up") {
		t.Errorf("PAUSE with a transaction open for longer: %v", err)
	}
	if d := time.Since(start); d < 400*time.Millisecond || d > 5*time.Second {
		t.Errorf("PAUSE 0.5 gave up after %v", d)
	}
	if got := showPause(); got != "no 1" {
		t.Errorf("SHOW PAUSE after PAUSE gave up: %q, want not paused, one client in a transaction", got)
	}
	exec1(t, b, "SELECT count(*) FROM t")
	exec1(t, a, "COMMIT")

	// A held client cancels its wait.
	if err := admin("PAUSE"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.Exec(ctx, "SELECT 1")
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := b.PgConn().CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	var pe *pgconn.PgError
	if err := <-done; !errors.As(err, &pe) || pe.Code != "57014" {
		t.Errorf("a held client's cancel: %v, want 57014", err)
	}
	if err := admin("RESUME"); err != nil {
		t.Fatal(err)
	}
	exec1(t, b, "SELECT 1")
}
