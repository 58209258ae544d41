package backend_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/proxy/backend"
)

// collect is a Sink that keeps what it is sent.
type collect struct{ msgs []pgproto3.BackendMessage }

func (c *collect) Send(m pgproto3.BackendMessage) {
	// Messages are only valid until the next receive: keep copies.
	switch m := m.(type) {
	case *pgproto3.DataRow:
		var vals [][]byte
		for _, v := range m.Values {
			vals = append(vals, append([]byte(nil), v...))
		}
		c.msgs = append(c.msgs, &pgproto3.DataRow{Values: vals})
	case *pgproto3.CommandComplete:
		c.msgs = append(c.msgs, &pgproto3.CommandComplete{CommandTag: append([]byte(nil), m.CommandTag...)})
	default:
		c.msgs = append(c.msgs, m)
	}
}

func (c *collect) rows() []string {
	var out []string
	for _, m := range c.msgs {
		if d, ok := m.(*pgproto3.DataRow); ok {
			out = append(out, string(d.Values[0]))
		}
	}
	return out
}

func newPool(t *testing.T, o backend.Options) *backend.Pool {
	t.Helper()
	p, err := backend.NewPool("ds_0", pgtest.NewDatabase(t, "pool"), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestPoolBoundAndCheckoutTimeout: a pool never opens more than its size, a caller
// waits at most the checkout timeout (then 53300 naming the data source), and a
// released connection serves the next caller.
func TestPoolBoundAndCheckoutTimeout(t *testing.T) {
	p := newPool(t, backend.Options{Size: 2, CheckoutTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	a, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = p.Acquire(ctx)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "53300" || !strings.Contains(pe.Message, "ds_0") {
		t.Fatalf("third Acquire of a pool of 2: %v, want 53300 naming ds_0", err)
	}
	if waited := time.Since(start); waited < 150*time.Millisecond || waited > 2*time.Second {
		t.Errorf("waited %v for a checkout timeout of 200ms", waited)
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		p.Release(a, true)
	}()
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire after a release: %v", err)
	}
	if c != a {
		t.Error("the released connection was not reused")
	}
	st := p.Stats()
	if st.Opened != 2 || st.InUse != 2 || st.Timeouts != 1 {
		t.Errorf("stats %+v: want 2 opened, 2 in use, 1 timeout", st)
	}
	p.Release(b, true)
	p.Release(c, true)
	if st := p.Stats(); st.InUse != 0 || st.Idle != 2 {
		t.Errorf("after releasing all: %+v", st)
	}
	p.Close()
	p.Close() // idempotent
	if _, err := p.Acquire(ctx); !errors.Is(err, backend.ErrPoolClosed) {
		t.Errorf("Acquire after Close: %v", err)
	}
}

// TestReleaseInTransactionCloses: a connection given back in the middle of a
// transaction (a client that left) is closed, not handed to the next caller.
func TestReleaseInTransactionCloses(t *testing.T) {
	p := newPool(t, backend.Options{Size: 1})
	ctx := context.Background()
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid := c.PgConn().PID()
	if err := c.Query(ctx, "BEGIN", &collect{}); err != nil {
		t.Fatal(err)
	}
	p.Release(c, true)
	c2, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(c2, true)
	if c2.PgConn().PID() == pid {
		t.Fatal("a connection left in a transaction went back to the pool")
	}
	if st := p.Stats(); st.Closed != 1 {
		t.Errorf("closed %d connections, want 1", st.Closed)
	}
}

// TestExecPreparesOnce: a statement run with Prepare is parsed on the server once per
// connection, and a server error leaves the connection usable.
func TestExecPreparesOnce(t *testing.T) {
	ctx := context.Background()
	c := oneConn(t)
	for i, v := range []string{"1", "2", "3"} {
		var out collect
		st := backend.Statement{SQL: "SELECT $1::int + 1", Values: [][]byte{[]byte(v)}, Prepare: true}
		if err := c.Exec(ctx, &st, &out); err != nil {
			t.Fatal(err)
		}
		if got := out.rows(); len(got) != 1 || got[0] != string(rune('2'+i)) {
			t.Errorf("row %q", got)
		}
	}
	if got := serverStatements(t, c); got != "1" {
		t.Errorf("prepared statements on the server: %v, want 1", got)
	}
	err := c.Exec(ctx, &backend.Statement{SQL: "SELECT 1/0", Prepare: true}, &collect{})
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "22012" {
		t.Fatalf("division by zero: %v", err)
	}
	var out collect
	if err := c.Query(ctx, "SELECT 42", &out); err != nil || out.rows()[0] != "42" {
		t.Fatalf("after a server error: %v %v", out.rows(), err)
	}
}

// oneConn is the only connection of a new pool, given back when the test ends.
func oneConn(t *testing.T) *backend.Conn {
	t.Helper()
	p := newPool(t, backend.Options{Size: 1})
	c, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Release(c, true) })
	return c
}

// serverStatements counts the statements the proxy has prepared on c's server.
func serverStatements(t *testing.T, c *backend.Conn) string {
	t.Helper()
	var out collect
	if err := c.Query(context.Background(), "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'shardlab_proxy_%'", &out); err != nil {
		t.Fatal(err)
	}
	return out.rows()[0]
}

// TestFailedBindKeepsTheStatement: a prepared statement whose Parse succeeded and
// whose Bind failed (a parameter the type rejects) stays known, so its next use
// reuses it instead of preparing a second copy that the server would keep for the
// connection's life; one whose Parse failed is forgotten and prepared again.
func TestFailedBindKeepsTheStatement(t *testing.T) {
	ctx := context.Background()
	c := oneConn(t)
	count := func() string { return serverStatements(t, c) }
	run := func(sql, v string) error {
		return c.Exec(ctx, &backend.Statement{SQL: sql, Values: [][]byte{[]byte(v)}, ParamOIDs: []uint32{23}, Prepare: true}, &collect{})
	}
	var pe *pgconn.PgError
	if err := run("SELECT $1 + 1", "not a number"); !errors.As(err, &pe) || pe.Code != "22P02" {
		t.Fatalf("a bad integer: %v, want 22P02", err)
	}
	for _, v := range []string{"x", "1", "y", "2"} {
		_ = run("SELECT $1 + 1", v)
	}
	if got := count(); got != "1" {
		t.Errorf("after failed binds: %s statements on the server, want 1", got)
	}
	// A Parse that fails must be forgotten: run with a prefix, where a name the server
	// does not know is not retried, the same text fails with 26000 if it was kept.
	const sql = "SELECT $1 + no_such_column FROM t"
	if err := run(sql, "1"); !errors.As(err, &pe) || pe.Code != "42P01" {
		t.Fatalf("a failed parse: %v, want 42P01", err)
	}
	if err := c.Query(ctx, "CREATE TEMP TABLE t (no_such_column int)", &collect{}); err != nil {
		t.Fatal(err)
	}
	st := backend.Statement{SQL: sql, Values: [][]byte{[]byte("1")}, ParamOIDs: []uint32{23}, Prepare: true}
	if _, err := c.ExecAfter(ctx, []string{"BEGIN"}, &st, &collect{}); err != nil {
		t.Fatalf("the same statement once it parses: %v", err)
	}
	if err := c.Query(ctx, "COMMIT", &collect{}); err != nil {
		t.Fatal(err)
	}
	if got := count(); got != "2" {
		t.Errorf("%s statements on the server, want 2", got)
	}
}

// TestOutdatedPlanIsClosed: a prepared statement whose result type DDL changed
// (0A000, "cached plan must not change result type") is prepared again, and the
// outdated one is closed on the server rather than left there for the connection's life.
func TestOutdatedPlanIsClosed(t *testing.T) {
	ctx := context.Background()
	c := oneConn(t)
	for _, q := range []string{"CREATE TEMP TABLE w (a int)", "INSERT INTO w VALUES (1)"} {
		if err := c.Query(ctx, q, &collect{}); err != nil {
			t.Fatal(err)
		}
	}
	sel := func() {
		t.Helper()
		if err := c.Exec(ctx, &backend.Statement{SQL: "SELECT * FROM w", Prepare: true}, &collect{}); err != nil {
			t.Fatal(err)
		}
	}
	sel()
	if err := c.Query(ctx, "ALTER TABLE w ADD COLUMN b int", &collect{}); err != nil {
		t.Fatal(err)
	}
	sel() // 0A000, then prepared again
	sel() // closes the outdated one
	if got := serverStatements(t, c); got != "1" {
		t.Errorf("%s statements on the server after an outdated plan, want 1", got)
	}
}

// TestSettingsFollowTheKey: ApplySettings resets a connection that carries other
// settings, and does nothing when it carries the same ones.
func TestSettingsFollowTheKey(t *testing.T) {
	p := newPool(t, backend.Options{Size: 1})
	ctx := context.Background()
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(c, true)
	show := func() string {
		var out collect
		if err := c.Query(ctx, "SHOW application_name", &out); err != nil {
			t.Fatal(err)
		}
		return out.rows()[0]
	}
	if err := c.ApplySettings(ctx, "a", []string{"SET application_name = 'alice'"}); err != nil {
		t.Fatal(err)
	}
	if got := show(); got != "alice" {
		t.Errorf("application_name %q, want alice", got)
	}
	if err := c.ApplySettings(ctx, "", nil); err != nil {
		t.Fatal(err)
	}
	if got := show(); got != "" {
		t.Errorf("after reset: application_name %q, want empty", got)
	}
	if err := c.ApplySettings(ctx, "bad", []string{"SET no_such_setting = 1"}); err == nil {
		t.Error("an invalid setting was accepted")
	}
}
