package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/proxy"
	"github.com/shardlab/shardlab/proxy/auth"
	"github.com/shardlab/shardlab/proxy/router"
)

// The tests of this file hold the proxy to one rule: whenever a server connection passes
// from one client to another, it carries nothing the first client changed (settings,
// role, session authorization, temporary objects, advisory locks, prepared
// statements), in both pool modes; and within a session, every statement that changes
// session state behaves as on one PostgreSQL server. Each starts a proxy with a pool of
// one server connection, so that two clients must share it.

var poolModes = []router.PoolMode{router.PoolTransaction, router.PoolSession}

func withPoolMode(m router.PoolMode) option {
	return func(c *proxy.Config) { c.PoolMode = m }
}

// sharing runs check in each pool mode over a proxy with one shard and one server
// connection: client a runs setup; then, in transaction pooling, client b connects
// beside a (a stays connected, its state alive), and in session pooling once a has
// left, which is when its connection passes on. checkA checks that a kept its own
// state (in transaction pooling, across transactions). Every step uses the simple
// protocol and the extended one alike through pgx.
func sharing(t *testing.T, setup []string, checkB func(t *testing.T, b *pgx.Conn), checkA func(t *testing.T, a *pgx.Conn)) {
	for _, mode := range poolModes {
		t.Run(mode.String(), func(t *testing.T) {
			e := startProxy(t, 1, nil, nil, withPool(1, 10*time.Second), withPoolMode(mode))
			ctx := context.Background()
			a, err := pgx.Connect(ctx, e.url(""))
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close(ctx)
			for _, sql := range setup {
				exec1(t, a, sql)
			}
			if checkA != nil {
				checkA(t, a)
			}
			if mode == router.PoolSession {
				a.Close(ctx)
			}
			b := e.connect(t)
			checkB(t, b)
			if mode == router.PoolTransaction && checkA != nil {
				checkA(t, a)
			}
		})
	}
}

func queryText(t testing.TB, c *pgx.Conn, sql string, args ...any) string {
	t.Helper()
	var v *string
	if err := c.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if v == nil {
		return "<null>"
	}
	return *v
}

// TestRoleDoesNotCross: one client's role and session authorization, however set,
// never reach the next client of its server connection.
func TestRoleDoesNotCross(t *testing.T) {
	role := pgtest.NewRole(t, "r_low", "")
	setters := []string{
		"SET ROLE " + role,
		"SET SESSION AUTHORIZATION " + role,
		"SELECT set_config('role', '" + role + "', false)",
	}
	for _, set := range setters {
		t.Run(strings.Fields(set)[1], func(t *testing.T) {
			sharing(t, []string{set},
				func(t *testing.T, b *pgx.Conn) {
					for range 2 {
						if got := queryText(t, b, "SELECT current_user"); got != "postgres" {
							t.Errorf("after the other client's %q, current_user is %s", set, got)
						}
						if got := queryText(t, b, "SELECT session_user"); got != "postgres" {
							t.Errorf("after the other client's %q, session_user is %s", set, got)
						}
					}
				},
				func(t *testing.T, a *pgx.Conn) {
					if got := queryText(t, a, "SELECT current_user"); got != role {
						t.Errorf("after %q, the client's own current_user is %s", set, got)
					}
				})
		})
	}
}

// TestSettingsDoNotCross: settings made with SET or set_config (built-in and custom,
// through both protocols) stay with their client.
func TestSettingsDoNotCross(t *testing.T) {
	sharing(t, []string{
		"SET statement_timeout = '123s'",
		"SELECT set_config('work_mem', '9MB', false)",
		"SELECT set_config('app.tenant', '42', false)",
	},
		func(t *testing.T, b *pgx.Conn) {
			for range 2 {
				if got := queryText(t, b, "SHOW statement_timeout"); got != "0" {
					t.Errorf("statement_timeout %s", got)
				}
				if got := queryText(t, b, "SHOW work_mem"); got != "4MB" {
					t.Errorf("work_mem %s", got)
				}
				if got := queryText(t, b, "SELECT coalesce(current_setting('app.tenant', true), '')"); got != "" {
					t.Errorf("app.tenant %q", got)
				}
			}
		},
		func(t *testing.T, a *pgx.Conn) {
			if got := queryText(t, a, "SHOW work_mem"); got != "9MB" {
				t.Errorf("the client's own work_mem is %s after set_config", got)
			}
			if got := queryText(t, a, "SELECT current_setting('app.tenant')"); got != "42" {
				t.Errorf("the client's own app.tenant is %s after set_config", got)
			}
			// set_config with parameters (the extended protocol).
			if got := queryText(t, a, "SELECT set_config($1, $2, false)", "app.user", "ann"); got != "ann" {
				t.Errorf("set_config answered %s", got)
			}
			if got := queryText(t, a, "SELECT current_setting('app.user')"); got != "ann" {
				t.Errorf("the client's own app.user is %s after set_config with parameters", got)
			}
		})
}

// TestTempTableDoesNotCross: in transaction pooling with two server connections, two
// clients that take turns never meet each other's temporary table or advisory lock,
// and each keeps its own across transactions. (Session pooling: TestSessionPooling.)
func TestTempTableDoesNotCross(t *testing.T) {
	e := startProxy(t, 1, nil, nil, withPool(2, 10*time.Second))
	ctx := context.Background()
	a, b := e.connect(t), e.connect(t)
	exec1(t, a, "CREATE TEMP TABLE scratch (x int)")
	exec1(t, a, "INSERT INTO scratch VALUES (1)")
	exec1(t, a, "SELECT pg_advisory_lock(99)")
	for range 3 {
		if _, err := b.Exec(ctx, "SELECT * FROM scratch"); sqlState(err) != "42P01" {
			t.Fatalf("the other client reads the temporary table: %v", err)
		}
		var unlocked bool
		if err := b.QueryRow(ctx, "SELECT pg_advisory_unlock(99)").Scan(&unlocked); err != nil || unlocked {
			t.Fatalf("the other client released the advisory lock: %v %v", unlocked, err)
		}
		if n := queryInt(t, a, "SELECT count(*) FROM scratch"); n != 1 {
			t.Fatalf("the client's own temporary table has %d rows", n)
		}
	}
	if pinned := e.srv.Stats().Pools[0].Pinned; pinned != 1 {
		t.Errorf("pinned clients %d, want 1", pinned)
	}
}

// TestPinnedUntilStateIsGone: in transaction pooling, a client that holds a temporary
// table or a session advisory lock keeps its server connection; another client waits
// for it, and gets it once the state is gone, with none of it.
func TestPinnedUntilStateIsGone(t *testing.T) {
	cases := []struct {
		name, make, drop string
		// check runs on the next client once it has the connection.
		check func(t *testing.T, b *pgx.Conn)
	}{
		{"temp table", "CREATE TEMP TABLE scratch (x int)", "DROP TABLE scratch",
			func(t *testing.T, b *pgx.Conn) {
				if _, err := b.Exec(context.Background(), "SELECT * FROM scratch"); sqlState(err) != "42P01" {
					t.Errorf("the next client reads the temporary table: %v", err)
				}
			}},
		{"temp table, DISCARD TEMP", "CREATE TEMP TABLE scratch (x int)", "DISCARD TEMP",
			func(t *testing.T, b *pgx.Conn) {
				if _, err := b.Exec(context.Background(), "SELECT * FROM scratch"); sqlState(err) != "42P01" {
					t.Errorf("the next client reads the temporary table: %v", err)
				}
			}},
		{"listen", "LISTEN jobs", "UNLISTEN jobs",
			func(t *testing.T, b *pgx.Conn) {
				if n := queryInt(t, b, "SELECT count(*) FROM pg_listening_channels()"); n != 0 {
					t.Errorf("the next client listens on %d channels", n)
				}
			}},
		{"advisory lock", "SELECT pg_advisory_lock(4242)", "SELECT pg_advisory_unlock(4242)",
			func(t *testing.T, b *pgx.Conn) {
				var unlocked bool
				if err := b.QueryRow(context.Background(), "SELECT pg_advisory_unlock(4242)").Scan(&unlocked); err != nil {
					t.Fatal(err)
				}
				if unlocked {
					t.Error("the next client could release the other client's advisory lock")
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := startProxy(t, 1, nil, nil, withPool(1, 20*time.Second))
			ctx := context.Background()
			a, b := e.connect(t), e.connect(t)
			exec1(t, a, tc.make)
			if pinned := e.srv.Stats().Pools[0].Pinned; pinned != 1 {
				t.Errorf("pinned clients %d, want 1", pinned)
			}
			// The client keeps its state across transactions.
			exec1(t, a, "BEGIN")
			exec1(t, a, "SELECT 1")
			exec1(t, a, "COMMIT")
			done := make(chan error, 1)
			go func() {
				_, err := b.Exec(ctx, "SELECT 1")
				done <- err
			}()
			waitFor(t, "the next client waits for the pinned connection", func() bool { return e.srv.Stats().Pools[0].Waiting == 1 })
			select {
			case err := <-done:
				t.Fatalf("the next client ran on the pinned connection: %v", err)
			default:
			}
			exec1(t, a, tc.drop)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if pinned := e.srv.Stats().Pools[0].Pinned; pinned != 0 {
				t.Errorf("pinned clients %d after the state is gone, want 0", pinned)
			}
			tc.check(t, b)
		})
	}
}

// TestPinnedClientLeaves: a client that leaves while pinned gives its connection back
// reset (DISCARD ALL): its temporary table and advisory lock are gone.
func TestPinnedClientLeaves(t *testing.T) {
	e := startProxy(t, 1, nil, nil, withPool(1, 20*time.Second))
	ctx := context.Background()
	a, err := pgx.Connect(ctx, e.url(""))
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, a, "CREATE TEMP TABLE scratch (x int)")
	exec1(t, a, "SELECT pg_advisory_lock(77)")
	a.Close(ctx)
	b := e.connect(t)
	if _, err := b.Exec(ctx, "SELECT * FROM scratch"); sqlState(err) != "42P01" {
		t.Errorf("the next client reads the temporary table: %v", err)
	}
	// This database's: other tests of the same server may hold advisory locks in theirs
	// (a coordinator database's owner holds one).
	if n := queryInt(t, b, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 77 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"); n != 0 {
		t.Errorf("%d advisory locks left", n)
	}
	if pinned := e.srv.Stats().Pools[0].Pinned; pinned != 0 {
		t.Errorf("pinned clients %d, want 0", pinned)
	}
}

// TestPreparedStatementsDoNotCross: a client's protocol-level prepared statement is
// its own: another client cannot run it by name.
func TestPreparedStatementsDoNotCross(t *testing.T) {
	for _, mode := range poolModes {
		t.Run(mode.String(), func(t *testing.T) {
			e := startProxy(t, 1, nil, nil, withPool(1, 10*time.Second), withPoolMode(mode))
			ctx := context.Background()
			a := e.pgconnect(t)
			if _, err := a.Prepare(ctx, "mine", "SELECT 1", nil); err != nil {
				t.Fatal(err)
			}
			if err := a.ExecPrepared(ctx, "mine", nil, nil, nil).Read().Err; err != nil {
				t.Fatal(err)
			}
			if mode == router.PoolSession {
				a.Close(ctx)
			}
			b := e.pgconnect(t)
			if err := b.ExecPrepared(ctx, "mine", nil, nil, nil).Read().Err; sqlState(err) != "26000" {
				t.Errorf("the next client runs the other client's statement: %v", err)
			}
		})
	}
}

// TestDiscardRunsForReal: DISCARD TEMP, SEQUENCES and ALL do what they do on one
// server, in both pool modes.
func TestDiscardRunsForReal(t *testing.T) {
	role := pgtest.NewRole(t, "r_low", "")
	for _, mode := range poolModes {
		t.Run(mode.String(), func(t *testing.T) {
			e := startProxy(t, 1, nil, nil, withPool(1, 10*time.Second), withPoolMode(mode))
			ctx := context.Background()
			a := e.connect(t)
			exec1(t, a, "CREATE SEQUENCE seq")
			exec1(t, a, "CREATE TEMP TABLE scratch (x int)")
			exec1(t, a, "DISCARD TEMP")
			if _, err := a.Exec(ctx, "SELECT * FROM scratch"); sqlState(err) != "42P01" {
				t.Errorf("after DISCARD TEMP the temporary table is still there: %v", err)
			}
			// nextval and currval meet on the one server connection.
			exec1(t, a, "SELECT nextval('seq')")
			exec1(t, a, "DISCARD SEQUENCES")
			if _, err := a.Exec(ctx, "SELECT currval('seq')"); sqlState(err) != "55000" {
				t.Errorf("after DISCARD SEQUENCES currval answers: %v", err)
			}
			exec1(t, a, "DISCARD PLANS")
			exec1(t, a, "CREATE TEMP TABLE scratch (x int)")
			exec1(t, a, "SET ROLE "+role)
			exec1(t, a, "SET work_mem = '9MB'")
			exec1(t, a, "DISCARD ALL")
			if _, err := a.Exec(ctx, "SELECT * FROM scratch"); sqlState(err) != "42P01" {
				t.Errorf("after DISCARD ALL the temporary table is still there: %v", err)
			}
			if got := queryText(t, a, "SELECT current_user"); got != "postgres" {
				t.Errorf("after DISCARD ALL current_user is %s", got)
			}
			if got := queryText(t, a, "SHOW work_mem"); got != "4MB" {
				t.Errorf("after DISCARD ALL work_mem is %s", got)
			}
			if _, err := a.Exec(ctx, "BEGIN; DISCARD ALL"); sqlState(err) != "25001" {
				t.Errorf("DISCARD ALL in a transaction block: %v", err)
			}
			if pinned := e.srv.Stats().Pools[0].Pinned; pinned != 0 {
				t.Errorf("pinned clients %d, want 0", pinned)
			}
		})
	}
}

// sessionStep is one statement of a differential session script, with its parameters
// (none: the simple protocol).
type sessionStep struct {
	sql  string
	args []any
}

// TestSessionStatementsAsOnOneServer runs scripts of statements that change session
// state, directly on PostgreSQL and through the proxy in both pool modes, and compares
// what the session sees after each statement: the current and session users and a
// built-in and a custom setting. PostgreSQL is the judge.
func TestSessionStatementsAsOnOneServer(t *testing.T) {
	role := pgtest.NewRole(t, "r_low", "")
	other := pgtest.NewRole(t, "r_other", "")
	steps := func(sqls ...string) []sessionStep {
		var out []sessionStep
		for _, s := range sqls {
			out = append(out, sessionStep{sql: s})
		}
		return out
	}
	scripts := map[string][]sessionStep{
		"reset session authorization after set role": steps("SET ROLE "+role, "RESET SESSION AUTHORIZATION"),
		"reset all keeps the role":                   steps("SET ROLE "+role, "SET work_mem = '8MB'", "RESET ALL", "RESET ROLE"),
		"session authorization resets the role":      steps("SET ROLE "+other, "SET SESSION AUTHORIZATION "+role, "SET SESSION AUTHORIZATION DEFAULT"),
		"set role none":                              steps("SET ROLE "+role, "SET ROLE NONE"),
		"set_config":                                 steps("SELECT set_config('work_mem', '9MB', false)", "SELECT set_config('app.x', '42', false)", "SELECT set_config('role', '"+role+"', false)", "SELECT set_config('session_authorization', 'postgres', false)"),
		"set_config rolled back":                     steps("BEGIN", "SELECT set_config('app.x', '1', false)", "SELECT set_config('work_mem', '7MB', false)", "ROLLBACK"),
		"set_config local":                           steps("BEGIN", "SELECT set_config('work_mem', '5MB', true)", "SELECT 1", "COMMIT"),
		"set_config committed":                       steps("BEGIN", "SELECT set_config('work_mem', '6MB', false)", "COMMIT"),
		"set local outside a transaction":            steps("SET LOCAL work_mem = '5MB'"),
		"savepoint rolled back":                      steps("BEGIN", "SET work_mem = '8MB'", "SAVEPOINT a", "SET work_mem = '7MB'", "SET ROLE "+role, "ROLLBACK TO a", "COMMIT"),
		"savepoint released":                         steps("BEGIN", "SAVEPOINT a", "SET work_mem = '7MB'", "RELEASE a", "COMMIT"),
		"same savepoint name twice":                  steps("BEGIN", "SAVEPOINT a", "SET work_mem = '7MB'", "SAVEPOINT a", "SET work_mem = '6MB'", "ROLLBACK TO a", "RELEASE a", "ROLLBACK TO a", "COMMIT"),
		"set to default":                             steps("SET work_mem = '8MB'", "SET work_mem TO DEFAULT"),
		"discard all":                                steps("SET ROLE "+role, "SELECT set_config('app.x', '3', false)", "DISCARD ALL"),
		"set_config with parameters": {
			{sql: "SELECT set_config($1, $2, false)", args: []any{"app.x", "p"}},
			{sql: "SELECT set_config($1, $2, $3)", args: []any{"work_mem", "3MB", false}},
		},
	}
	const probe = "SELECT current_user, session_user, current_setting('work_mem'), coalesce(current_setting('app.x', true), '')"
	run := func(t *testing.T, c *pgx.Conn, script []sessionStep) []string {
		ctx := context.Background()
		var out []string
		for _, st := range script {
			_, err := c.Exec(ctx, st.sql, st.args...)
			var u, su, wm, x string
			perr := c.QueryRow(ctx, probe).Scan(&u, &su, &wm, &x)
			out = append(out, fmt.Sprintf("%s -> error %q; %s %s %s %q (%v)", st.sql, sqlState(err), u, su, wm, x, sqlState(perr)))
		}
		return out
	}
	for _, mode := range poolModes {
		t.Run(mode.String(), func(t *testing.T) {
			e := startProxy(t, 1, nil, nil, withPool(1, 10*time.Second), withPoolMode(mode))
			for name, script := range scripts {
				t.Run(name, func(t *testing.T) {
					ctx := context.Background()
					direct, err := pgx.Connect(ctx, e.dsns[0])
					if err != nil {
						t.Fatal(err)
					}
					want := run(t, direct, script)
					direct.Close(ctx)
					through, err := pgx.Connect(ctx, e.url(""))
					if err != nil {
						t.Fatal(err)
					}
					got := run(t, through, script)
					through.Close(ctx)
					for i := range want {
						if got[i] != want[i] {
							t.Errorf("step %d:\n proxy  %s\n direct %s", i+1, got[i], want[i])
						}
					}
				})
			}
		})
	}
}

// TestCleanClientsPayNothing: clients that change no session state cost no reset and
// no state check, however they share connections; one that changes a setting costs a
// reset when its connection passes to another client, and one that may make state
// that lives on a connection costs a check when it gives the connection back.
func TestCleanClientsPayNothing(t *testing.T) {
	e := startProxy(t, 2, []string{"t=id"}, nil, withPool(1, 10*time.Second))
	ctx := context.Background()
	a, b := e.connect(t), e.connect(t)
	exec1(t, a, "CREATE TABLE t (id int PRIMARY KEY, v int)")
	exec1(t, a, "INSERT INTO t VALUES (1, 0), (2, 0)")
	cost := func() (resets, checks int64) {
		for _, st := range e.srv.Stats().Pools {
			resets += st.Resets
			checks += st.StateChecks
		}
		return resets, checks
	}
	r0, c0 := cost()
	for i := range 20 {
		c := a
		if i%2 == 1 {
			c = b
		}
		queryInt(t, c, "SELECT v FROM t WHERE id = $1", i%2+1)
		exec1(t, c, "UPDATE t SET v = v + 1 WHERE id = 1")
		exec1(t, c, "BEGIN")
		exec1(t, c, "SELECT count(*) FROM t")
		exec1(t, c, "COMMIT")
		if _, err := c.Exec(ctx, "SELECT v FROM t WHERE id = 2", pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatal(err)
		}
	}
	if r, c := cost(); r != r0 || c != c0 {
		t.Errorf("clean clients cost %d resets and %d state checks, want none", r-r0, c-c0)
	}
	exec1(t, a, "SET work_mem = '9MB'")
	queryInt(t, b, "SELECT v FROM t WHERE id = 1")
	if r, _ := cost(); r == r0 {
		t.Error("a connection passed from a client with a setting of its own to one without was not reset")
	}
	exec1(t, a, "SELECT pg_advisory_xact_lock(1)")
	if _, c := cost(); c != c0 {
		t.Error("a transaction-level advisory lock cost a state check")
	}
	exec1(t, a, "SELECT pg_advisory_lock(1)")
	exec1(t, a, "SELECT pg_advisory_unlock(1)")
	if _, c := cost(); c != c0+2 {
		t.Errorf("a session advisory lock and its release cost %d state checks, want 2", c-c0)
	}
}

// waitFor polls cond until it holds, failing the test after 10 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSessionStateEdges: the cases a review found, each of which once let one client's
// state reach another, lost a client's state without a word, or failed a statement
// PostgreSQL runs.
func TestSessionStateEdges(t *testing.T) {
	ctx := context.Background()
	t.Run("pinned connection whose settings no longer replay", func(t *testing.T) {
		role := pgtest.NewRole(t, "r_gone", "")
		e := startProxy(t, 1, nil, nil, withPool(1, 3*time.Second))
		a := e.connect(t)
		exec1(t, a, "SELECT pg_advisory_lock(4711)")
		exec1(t, a, "SET ROLE "+role)
		exec1(t, a, "RESET work_mem") // the next use replays the settings
		exec1(t, e.shard(t, 0), "DROP ROLE "+role)
		if _, err := a.Exec(ctx, "SELECT 1"); err == nil {
			t.Error("a statement ran with a role that is gone")
		}
		exec1(t, a, "RESET ROLE") // the client can mend its settings
		// The connection with a's lock stayed a's: b waits for it, in vain.
		b := e.connect(t)
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		var unlocked bool
		if err := b.QueryRow(tctx, "SELECT pg_advisory_unlock(4711)").Scan(&unlocked); err == nil {
			t.Errorf("client b got client a's pinned connection (unlock answered %v)", unlocked)
		}
		if n := queryInt(t, a, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"); n != 1 {
			t.Errorf("client a holds %d advisory locks, want 1", n)
		}
	})
	t.Run("set_config that does not run", func(t *testing.T) {
		e := startProxy(t, 1, nil, nil, withPool(1, 3*time.Second))
		a := e.connect(t)
		const q = "SELECT CASE WHEN false THEN set_config('app.never', 'x', false) END"
		if _, err := a.Exec(ctx, q); err != nil {
			t.Errorf("outside a transaction: %v", err)
		}
		exec1(t, a, "BEGIN")
		if _, err := a.Exec(ctx, q); err != nil {
			t.Errorf("in a transaction: %v", err)
		}
		if _, err := a.Exec(ctx, "SELECT 1"); err != nil {
			t.Errorf("the transaction was aborted: %v", err)
		}
		exec1(t, a, "COMMIT")
	})
	t.Run("set_config with a NULL is_local", func(t *testing.T) {
		e := startProxy(t, 1, nil, nil, withPool(1, 3*time.Second))
		a, b := e.connect(t), e.connect(t)
		exec1(t, a, "SELECT set_config('search_path', 'tenant_a', NULL)")
		exec1(t, a, "SELECT set_config($1, $2, $3)", "statement_timeout", "4s", nil)
		if sp, st := queryText(t, b, "SHOW search_path"), queryText(t, b, "SHOW statement_timeout"); sp == "tenant_a" || st == "4s" {
			t.Errorf("client b sees client a's settings: search_path %s, statement_timeout %s", sp, st)
		}
		if sp := queryText(t, a, "SHOW search_path"); sp != "tenant_a" {
			t.Errorf("client a lost its search_path: %s", sp)
		}
	})
	t.Run("set_config with a binary text is_local", func(t *testing.T) {
		e := startProxy(t, 1, nil, nil, withPool(1, 3*time.Second))
		a := e.pgconnect(t)
		if err := a.Exec(ctx, "BEGIN").Close(); err != nil {
			t.Fatal(err)
		}
		rr := a.ExecParams(ctx, "SELECT set_config($1, $2, $3::text::boolean)", [][]byte{[]byte("work_mem"), []byte("7MB"), []byte("true")},
			[]uint32{25, 25, 25}, []int16{1, 1, 1}, nil).Read()
		if rr.Err != nil {
			t.Fatal(rr.Err)
		}
		if err := a.Exec(ctx, "COMMIT").Close(); err != nil {
			t.Fatal(err)
		}
		res, err := a.Exec(ctx, "SHOW work_mem").ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		if got := string(res[0].Rows[0][0]); got != "4MB" {
			t.Errorf("a local set_config outlived its transaction: work_mem %s", got)
		}
	})
	t.Run("temporary table through the search path", func(t *testing.T) {
		e := startProxy(t, 1, nil, nil, withPool(2, 3*time.Second))
		a, b := e.connect(t), e.connect(t)
		exec1(t, a, "CREATE TABLE accounts (owner text)")
		exec1(t, a, "INSERT INTO accounts VALUES ('real')")
		exec1(t, a, "SET search_path = pg_temp, public")
		exec1(t, a, "CREATE TABLE accounts (owner text)") // temporary: pg_temp comes first
		exec1(t, a, "INSERT INTO accounts VALUES ('planted by a')")
		for range 3 {
			if owner := queryText(t, b, "SELECT owner FROM accounts"); owner != "real" {
				t.Fatalf("client b read client a's temporary table: %q", owner)
			}
		}
		if owner := queryText(t, a, "SELECT owner FROM accounts"); owner != "planted by a" {
			t.Errorf("client a lost its temporary table: %q", owner)
		}
	})
	t.Run("rollback to a savepoint on a shard that joined after it", func(t *testing.T) {
		role := pgtest.NewRole(t, "r_sp", "")
		e := startProxy(t, 2, []string{"t=id"}, nil, withPool(2, 3*time.Second))
		a := e.connect(t)
		exec1(t, a, "CREATE TABLE t (id int PRIMARY KEY)")
		exec1(t, a, "INSERT INTO t VALUES (1), (2), (3), (4), (5), (6), (7), (8)")
		exec1(t, a, "GRANT SELECT ON t TO "+role)
		exec1(t, a, "BEGIN")
		exec1(t, a, "SAVEPOINT s")
		exec1(t, a, "SET work_mem = '7MB'")
		exec1(t, a, "SET LOCAL statement_timeout = '9s'")
		exec1(t, a, "SET ROLE "+role)
		probe := "SELECT current_user::text || ' ' || current_setting('work_mem') || ' ' || current_setting('statement_timeout') FROM t WHERE id = $1"
		for i := 1; i <= 8; i++ { // every shard joins, after the savepoint
			queryText(t, a, probe, i)
		}
		exec1(t, a, "ROLLBACK TO s")
		for i := 1; i <= 8; i++ {
			if got := queryText(t, a, probe, i); got != "postgres 4MB 0" {
				t.Errorf("id %d after ROLLBACK TO: %s, want postgres 4MB 0", i, got)
			}
		}
		exec1(t, a, "COMMIT")
	})
	t.Run("lastval of another client", func(t *testing.T) {
		e := startProxy(t, 1, nil, nil, withPool(1, 3*time.Second))
		a, b := e.connect(t), e.connect(t)
		exec1(t, a, "CREATE SEQUENCE s")
		exec1(t, a, "SELECT nextval('s')")
		var v int64
		if err := b.QueryRow(ctx, "SELECT lastval()").Scan(&v); sqlState(err) != "55000" {
			t.Errorf("client b's lastval: %d, %v; want 55000", v, err)
		}
		if _, err := b.Exec(ctx, "SELECT currval('s')", pgx.QueryExecModeSimpleProtocol); sqlState(err) != "55000" {
			t.Errorf("client b's currval: %v; want 55000", err)
		}
		// A client's own nextval and currval in one transaction meet.
		exec1(t, a, "BEGIN")
		exec1(t, a, "SELECT nextval('s')")
		if n := queryInt(t, a, "SELECT currval('s')"); n != 2 {
			t.Errorf("client a's currval in its transaction: %d, want 2", n)
		}
		exec1(t, a, "COMMIT")
		// A serial column's default sets sequence state no statement shows: on a
		// connection another client used before, currval cannot tell whose it reads,
		// and is refused, never answered with the other's value.
		c := e.connect(t)
		exec1(t, c, "CREATE TABLE items (id serial PRIMARY KEY, name text)")
		exec1(t, b, "SELECT nextval('s')") // b uses the connection last
		exec1(t, c, "BEGIN")
		exec1(t, c, "INSERT INTO items (name) VALUES ('x')")
		if _, err := c.Exec(ctx, "SELECT currval('items_id_seq')"); sqlState(err) != "0A000" {
			t.Errorf("currval after an implicit nextval on another client's connection: %v, want 0A000", err)
		}
		exec1(t, c, "ROLLBACK")
		exec1(t, b, "SELECT nextval('s')")
		// The client uses sequence functions now: its next transaction starts clean.
		exec1(t, c, "BEGIN")
		exec1(t, c, "INSERT INTO items (name) VALUES ('y')")
		if n := queryInt(t, c, "SELECT currval('items_id_seq')"); n != 2 {
			t.Errorf("currval after an insert, in a later transaction: %d, want 2", n)
		}
		exec1(t, c, "COMMIT")
	})
	t.Run("state check under the client's lock_timeout", func(t *testing.T) {
		e := startProxy(t, 1, nil, nil, withPool(2, 3*time.Second))
		a, b := e.connect(t), e.connect(t)
		exec1(t, a, "SET lock_timeout = '200ms'")
		exec1(t, a, "SELECT pg_advisory_lock(7)")
		admin := e.shard(t, 0)
		exec1(t, admin, "BEGIN")
		exec1(t, admin, "LOCK TABLE pg_catalog.pg_class IN ACCESS EXCLUSIVE MODE")
		done := make(chan error, 1)
		go func() {
			_, err := a.Exec(ctx, "SELECT pg_advisory_lock(8)")
			done <- err
		}()
		time.Sleep(500 * time.Millisecond) // past a's lock_timeout
		exec1(t, admin, "COMMIT")
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		var got bool
		if err := b.QueryRow(ctx, "SELECT pg_try_advisory_lock(7)").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got {
			t.Error("client a's advisory lock 7 was lost without a word to a")
		}
	})
}

// TestListenNotify: LISTEN through the proxy keeps the client's server connection
// (pinned in transaction pooling), and notifications reach the client both during its
// statements and while it waits, from its own NOTIFY and another client's, in both pool
// modes; a client that leaves takes its LISTEN with it.
func TestListenNotify(t *testing.T) {
	for _, mode := range poolModes {
		t.Run(mode.String(), func(t *testing.T) {
			e := startProxy(t, 1, nil, nil, withPool(3, 5*time.Second), withPoolMode(mode))
			ctx := context.Background()
			got := make(chan string, 10)
			cfg, err := pgconn.ParseConfig(e.url(""))
			if err != nil {
				t.Fatal(err)
			}
			cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { got <- n.Channel + ":" + n.Payload }
			a, err := pgconn.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close(ctx)
			if _, err := a.Exec(ctx, "LISTEN jobs").ReadAll(); err != nil {
				t.Fatal(err)
			}
			if mode == router.PoolTransaction {
				if pinned := e.srv.Stats().Pools[0].Pinned; pinned != 1 {
					t.Errorf("pinned clients %d, want 1", pinned)
				}
			}
			// Its own NOTIFY: the notification comes with the statement's answer.
			if _, err := a.Exec(ctx, "NOTIFY jobs, 'own'").ReadAll(); err != nil {
				t.Fatal(err)
			}
			select {
			case n := <-got:
				if n != "jobs:own" {
					t.Errorf("notification %s", n)
				}
			default:
				t.Error("the client's own notification did not come with its statement's answer")
			}
			// Another client's, while the listener waits.
			b := e.connect(t)
			exec1(t, b, "SELECT pg_notify('jobs', 'from b')")
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := a.WaitForNotification(wctx); err != nil {
				t.Fatalf("waiting for another client's notification: %v", err)
			}
			if n := <-got; n != "jobs:from b" {
				t.Errorf("notification %s", n)
			}
			// psql prints a notification that comes with its statement's answer.
			out, err := run(t, time.Minute, "psql", "-X", e.url(""), "-c", "LISTEN psqlch", "-c", "NOTIFY psqlch, 'hi'")
			if err != nil || !strings.Contains(out, `Asynchronous notification "psqlch" with payload "hi" received`) {
				t.Errorf("psql: %v\n%s", err, out)
			}
			// The listener goes on running statements.
			if _, err := a.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
				t.Fatal(err)
			}
			if n := queryInt(t, b, "SELECT count(*) FROM pg_listening_channels()"); n != 0 {
				t.Errorf("client b listens on %d channels", n)
			}
			a.Close(ctx)
			c := e.connect(t)
			for range 2 {
				if n := queryInt(t, c, "SELECT count(*) FROM pg_listening_channels()"); n != 0 {
					t.Errorf("a client after the listener left listens on %d channels", n)
				}
			}
		})
	}
}

// simpleQuery runs sql with the simple protocol and returns the first column of the
// first row ("" when there is none).
func simpleQuery(ctx context.Context, c *pgconn.PgConn, sql string) (string, error) {
	res, err := c.Exec(ctx, sql).ReadAll()
	if err != nil {
		return "", err
	}
	for _, r := range res {
		if len(r.Rows) > 0 {
			return string(r.Rows[0][0]), nil
		}
	}
	return "", nil
}

// TestSequenceStateEdges: the cases a second review found in the sequence guard: a
// DISCARD SEQUENCES that never ran (the server refused the whole string) must not count
// as run; the proxy's own statements (a login's check, SET) set no sequence state; and
// a connection reset with DISCARD ALL carries none.
func TestSequenceStateEdges(t *testing.T) {
	ctx := context.Background()
	for name, trigger := range map[string]string{
		"invalid UTF-8":         "SELECT currval('sq'), 'x\xff'",
		"PG 16 syntax on PG 15": "SELECT currval('sq') WHERE '1' IS JSON",
	} {
		t.Run("a prefix that did not run: "+name, func(t *testing.T) {
			e := startProxy(t, 1, nil, nil, withPool(1, 10*time.Second))
			b, a := e.pgconnect(t), e.pgconnect(t)
			for _, q := range []string{"CREATE SEQUENCE sq", "SELECT setval('sq', 4242)"} {
				if _, err := simpleQuery(ctx, a, q); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := simpleQuery(ctx, b, trigger); err == nil {
				t.Fatal("the server took the statement")
			}
			if got, err := simpleQuery(ctx, b, "SELECT currval('sq')"); err == nil {
				t.Errorf("client b read client a's currval %s", got)
			}
		})
	}
	t.Run("nextval and currval after a login on another client's connection", func(t *testing.T) {
		e := startProxy(t, 1, nil, nil, withPool(1, 10*time.Second))
		a := e.pgconnect(t)
		if _, err := simpleQuery(ctx, a, "CREATE SEQUENCE sq2"); err != nil {
			t.Fatal(err)
		}
		b := e.pgconnect(t)
		if _, err := simpleQuery(ctx, b, "SET application_name = 'b'"); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if _, err := simpleQuery(ctx, b, "SELECT nextval('sq2')"); err != nil {
				t.Fatal(err)
			}
			if got, err := simpleQuery(ctx, b, "SELECT currval('sq2')"); err != nil || got != strconv.Itoa(i+1) {
				t.Errorf("round %d: currval after the client's own nextval: %q, %v", i, got, err)
			}
		}
	})
	t.Run("lastval after an insert in session pooling", func(t *testing.T) {
		e := startProxy(t, 1, nil, nil, withPool(1, 10*time.Second), withSessionPooling())
		a := e.pgconnect(t)
		if _, err := simpleQuery(ctx, a, "CREATE TABLE items (id serial PRIMARY KEY, v int)"); err != nil {
			t.Fatal(err)
		}
		a.Close(ctx)
		b := e.pgconnect(t)
		for i := range 2 {
			if _, err := simpleQuery(ctx, b, "INSERT INTO items (v) VALUES (1)"); err != nil {
				t.Fatal(err)
			}
			if got, err := simpleQuery(ctx, b, "SELECT lastval()"); err != nil || got != strconv.Itoa(i+1) {
				t.Errorf("insert %d: lastval %q, %v", i+1, got, err)
			}
		}
	})
}

// TestLostServerSession: a client whose server connection broke with its state on it
// (a temporary table, a LISTEN) gets 08006 from then on, in both pool modes, as its
// session would have ended on PostgreSQL itself.
func TestLostServerSession(t *testing.T) {
	ctx := context.Background()
	for _, mode := range poolModes {
		t.Run(mode.String(), func(t *testing.T) {
			e := startProxy(t, 1, nil, nil, withPool(2, 10*time.Second), withPoolMode(mode))
			a := e.pgconnect(t)
			for _, q := range []string{"CREATE TEMP TABLE tt (x int)", "LISTEN ch"} {
				if _, err := simpleQuery(ctx, a, q); err != nil {
					t.Fatal(err)
				}
			}
			pid, err := simpleQuery(ctx, a, "SELECT pg_backend_pid()")
			if err != nil {
				t.Fatal(err)
			}
			exec1(t, e.shard(t, 0), "SELECT pg_terminate_backend("+pid+")")
			time.Sleep(300 * time.Millisecond)
			simpleQuery(ctx, a, "SELECT 1") // meets the broken connection
			for range 2 {
				if _, err := simpleQuery(ctx, a, "SELECT count(*) FROM tt"); sqlState(err) != "08006" {
					t.Errorf("after its server session was lost: %v; want 08006", err)
				}
			}
		})
	}
}

// TestPoolsPerServerUser: clients of one server user share its pools, whatever
// password their users-file lines give, and where a data source's DSN names that user
// its own pool serves them: /metrics and SHOW POOLS show each pool once.
func TestPoolsPerServerUser(t *testing.T) {
	e := startProxy(t, 1, nil, nil)
	users, err := auth.ParseUsers(strings.NewReader(`"postgres" "pg pw"` + "\n" + `"admin" "x" "postgres" "other pw"` + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := startProxyOn(t, shardedRules(e.dsns, nil, nil), func(c *proxy.Config) { c.Users = users })
	ctx := context.Background()
	for _, login := range []string{"postgres:pg%20pw", "admin:x"} {
		c, err := pgconn.Connect(ctx, "postgres://"+login+"@"+p.addr+"/"+testDatabase+"?sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := simpleQuery(ctx, c, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(p.srv.Stats().Pools); n != 1 {
		t.Errorf("%d pools, want the data source's own one", n)
	}
	rec := httptest.NewRecorder()
	p.srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if body, _ := io.ReadAll(rec.Body); rec.Code != 200 {
		t.Errorf("/metrics: HTTP %d: %.300s", rec.Code, body)
	}
}

// TestNotifyWhileBusy: a listener that keeps running statements while another client
// notifies gets every notification once (the watch starts and stops around each of its
// statements).
func TestNotifyWhileBusy(t *testing.T) {
	for _, mode := range poolModes {
		t.Run(mode.String(), func(t *testing.T) {
			e := startProxy(t, 1, nil, nil, withPool(3, 5*time.Second), withPoolMode(mode))
			ctx := context.Background()
			got := map[string]int{}
			cfg, err := pgconn.ParseConfig(e.url(""))
			if err != nil {
				t.Fatal(err)
			}
			cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { got[n.Payload]++ }
			a, err := pgconn.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close(ctx)
			if _, err := a.Exec(ctx, "LISTEN busy").ReadAll(); err != nil {
				t.Fatal(err)
			}
			const n = 300
			done := make(chan error, 1)
			go func() {
				b, err := pgconn.Connect(ctx, e.url(""))
				if err != nil {
					done <- err
					return
				}
				defer b.Close(ctx)
				for i := range n {
					if _, err := b.Exec(ctx, "SELECT pg_notify('busy', '"+strconv.Itoa(i)+"')").ReadAll(); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			for range n {
				if _, err := a.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for len(got) < n && time.Now().Before(deadline) {
				wctx, cancel := context.WithTimeout(ctx, time.Second)
				a.WaitForNotification(wctx)
				cancel()
			}
			dups := 0
			for _, c := range got {
				if c > 1 {
					dups++
				}
			}
			if len(got) != n || dups > 0 {
				t.Errorf("%d distinct notifications of %d, %d duplicated", len(got), n, dups)
			}
		})
	}
}

// TestSavepointErrorsAsPostgreSQL: a missing savepoint is reported in PostgreSQL's own
// words, the name quoted once, through the proxy as directly.
func TestSavepointErrorsAsPostgreSQL(t *testing.T) {
	e := startProxy(t, 2, []string{"t=id"}, nil)
	ctx := context.Background()
	missing := func(c *pgconn.PgConn) string {
		_, err := c.Exec(ctx, `BEGIN; SAVEPOINT "a b"; ROLLBACK TO SAVEPOINT "no such"`).ReadAll()
		c.Exec(ctx, "ROLLBACK").ReadAll()
		return fmt.Sprintf("%s %v", sqlState(err), err)
	}
	direct, err := pgconn.Connect(ctx, e.dsns[0])
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	if got, want := missing(e.pgconnect(t)), missing(direct); got != want {
		t.Errorf("through the proxy: %s\nPostgreSQL: %s", got, want)
	}
}

// TestMigrationInOneString: DDL and the statements after it in one transaction, as a
// migration tool sends them (one query string, or statements of one transaction): each
// statement is planned on the transaction's view of the schema, which no other
// session sees until it commits, and a rolled-back table leaves no plan behind.
func TestMigrationInOneString(t *testing.T) {
	e := startProxy(t, 2, []string{"people=id", "pets=id"}, nil) // the keys' types come from the catalog
	ctx := context.Background()
	c := e.connect(t)
	if _, err := c.Exec(ctx, "CREATE TABLE people (id int PRIMARY KEY, name text); INSERT INTO people VALUES (1, 'a'), (2, 'b'), (3, 'c')",
		pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("a migration as one string: %v", err)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM people"); n != 3 {
		t.Errorf("%d people, want 3", n)
	}
	var perShard []int64
	for i := range e.dsns {
		perShard = append(perShard, queryInt(t, e.shard(t, i), "SELECT count(*) FROM people"))
	}
	if perShard[0]+perShard[1] != 3 || perShard[0] == 0 || perShard[1] == 0 {
		t.Errorf("rows per shard %v: not spread by the key", perShard)
	}
	// Statements of one explicit transaction, through the extended protocol; rolled
	// back, then made again with a key of another type.
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"CREATE TABLE pets (id int PRIMARY KEY, owner int)", "INSERT INTO pets VALUES (10, 1)"} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if n := queryInt(t, c, "SELECT count(*) FROM pets WHERE id = $1", 10); n != 1 {
		t.Errorf("the transaction's own row: %d", n)
	}
	tx.Rollback(ctx)
	if _, err := c.Exec(ctx, "SELECT * FROM pets"); sqlState(err) != "42P01" {
		t.Errorf("after the rollback: %v, want 42P01", err)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE pets (id text PRIMARY KEY); INSERT INTO pets VALUES ('rex'), ('tom')",
		pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("the table again, with a text key: %v", err)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM pets WHERE id = $1", "rex"); n != 1 {
		t.Errorf("rex: %d rows", n)
	}
}

// TestSyntaxErrorsAsPostgreSQL: a syntax error is reported as PostgreSQL reports it,
// the place named as it names it and the position counted in the client's string.
func TestSyntaxErrorsAsPostgreSQL(t *testing.T) {
	e := startProxy(t, 2, []string{"t=id"}, nil)
	ctx := context.Background()
	direct, err := pgconn.Connect(ctx, e.dsns[0])
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	through := e.pgconnect(t)
	for _, q := range []string{"SELECT 1 +;", "SELECT 1; SELEC 2; SELECT 3", "SELECT (1;"} {
		describe := func(c *pgconn.PgConn) string {
			_, err := c.Exec(ctx, q).ReadAll()
			var pe *pgconn.PgError
			if !errors.As(err, &pe) {
				return fmt.Sprint(err)
			}
			return fmt.Sprintf("%s %s at %d", pe.Code, pe.Message, pe.Position)
		}
		if got, want := describe(through), describe(direct); got != want {
			t.Errorf("%q:\n through the proxy %s\n PostgreSQL        %s", q, got, want)
		}
	}
}

// TestCopyRelaysNotices: the notices a trigger raises during COPY FROM STDIN reach the
// client, one per row, as from PostgreSQL itself.
func TestCopyRelaysNotices(t *testing.T) {
	e := startProxy(t, 2, []string{"t=id"}, nil)
	ctx := context.Background()
	setup := e.connect(t)
	exec1(t, setup, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	for i := range e.dsns {
		s := e.shard(t, i)
		exec1(t, s, `CREATE FUNCTION noisy() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'row %', NEW.id; RETURN NEW; END $$`)
		exec1(t, s, "CREATE TRIGGER noisy BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION noisy()")
	}
	cfg, err := pgconn.ParseConfig(e.url(""))
	if err != nil {
		t.Fatal(err)
	}
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Message) }
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	tag, err := c.CopyFrom(ctx, strings.NewReader("1\ta\n2\tb\n3\tc\n4\td\n"), "COPY t FROM STDIN")
	if err != nil || tag.RowsAffected() != 4 {
		t.Fatalf("COPY: %v %v", tag, err)
	}
	slices.Sort(notices)
	if want := []string{"row 1", "row 2", "row 3", "row 4"}; !slices.Equal(notices, want) {
		t.Errorf("notices %q, want %q", notices, want)
	}
}

// TestOneShardPassesThrough: with one shard (rules.Compiled.OneShard) every statement its
// server runs passes through as written, the kinds the sharding layer refuses across
// shards included: DO, CALL, SQL-level PREPARE and EXECUTE (the client pinned while its
// statement exists), cursors, EXPLAIN of a write, MERGE, materialized views, domains.
// With two shards the same DO block is refused.
func TestOneShardPassesThrough(t *testing.T) {
	e := startProxy(t, 1, nil, nil, withPool(2, 10*time.Second))
	ctx := context.Background()
	c := e.connect(t)
	simple := func(q string) error {
		_, err := c.Exec(ctx, q, pgx.QueryExecModeSimpleProtocol)
		return err
	}
	for _, q := range []string{
		"CREATE TABLE acct (id int PRIMARY KEY, balance int)",
		"INSERT INTO acct VALUES (1, 10), (2, 20)",
		"DO $$ BEGIN UPDATE acct SET balance = balance + 1; END $$",
		"CREATE PROCEDURE bump(n int) LANGUAGE sql AS $$ UPDATE acct SET balance = balance + n $$",
		"CALL bump(100)",
		"MERGE INTO acct a USING (VALUES (3, 30)) v(id, b) ON a.id = v.id WHEN NOT MATCHED THEN INSERT VALUES (v.id, v.b)",
		"CREATE MATERIALIZED VIEW rich AS SELECT id FROM acct WHERE balance > 100",
		"CREATE DOMAIN positive AS int CHECK (VALUE > 0)",
		"EXPLAIN (COSTS OFF) UPDATE acct SET balance = 0 WHERE id = 1",
		"REINDEX TABLE acct",
		"PREPARE total AS SELECT sum(balance) FROM acct",
	} {
		if err := simple(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if pinned := e.srv.Stats().Pools[0].Pinned; pinned != 1 {
		t.Errorf("after PREPARE: %d pinned clients, want 1", pinned)
	}
	if n := queryInt(t, c, "EXECUTE total"); n != 10+20+2+200+30 {
		t.Errorf("EXECUTE total: %d", n)
	}
	if err := simple("DEALLOCATE total"); err != nil {
		t.Fatal(err)
	}
	if pinned := e.srv.Stats().Pools[0].Pinned; pinned != 0 {
		t.Errorf("after DEALLOCATE: %d pinned clients, want 0", pinned)
	}
	// psql's FETCH_COUNT reads through a cursor, in a transaction.
	out, err := run(t, time.Minute, "psql", "-X", "-A", "-t", "-v", "FETCH_COUNT=2", e.url(""), "-c", "SELECT id FROM acct ORDER BY id")
	if err != nil || strings.Join(strings.Fields(out), ",") != "1,2,3" {
		t.Errorf("psql with FETCH_COUNT: %v\n%s", err, out)
	}
	// A statement the proxy's parser refuses gets the server's own error, every field.
	var pe *pgconn.PgError
	if err := simple(`SELECT U&'\wxyz'`); !errors.As(err, &pe) || pe.Hint == "" {
		t.Errorf("syntax error: %v, want the server's error with its HINT", err)
	}
	// In the extended protocol too, and at Parse, where psql's \gdesc expects it (it
	// then shows the statement's line).
	if out, _ := runStdin(t, time.Minute, "SELECT 1 + \\gdesc\n", "psql", "-X", e.url(""), "-f", "-"); !strings.Contains(out, "LINE 1: SELECT 1 +") {
		t.Errorf("psql \\gdesc of a syntax error:\n%s", out)
	}
	// An empty statement is answered in a failed transaction, as by PostgreSQL
	// (psql's \gdesc of it describes it in the extended protocol).
	if out, _ := runStdin(t, time.Minute, "BEGIN;\nbogus;\n;\n\\gdesc\nROLLBACK;\n", "psql", "-X", e.url(""), "-f", "-"); !strings.Contains(out, "The command has no result") {
		t.Errorf("psql \\gdesc of an empty statement in a failed transaction:\n%s", out)
	}
	// A cursor's text is the client's alone (pg_cursors shows it), not joined to the
	// transaction's BEGIN.
	for _, q := range []string{"BEGIN", "DECLARE cur CURSOR FOR SELECT id FROM acct"} {
		if err := simple(q); err != nil {
			t.Fatal(err)
		}
	}
	var text string
	if err := c.QueryRow(ctx, "SELECT statement FROM pg_cursors WHERE name = 'cur'", pgx.QueryExecModeSimpleProtocol).Scan(&text); err != nil || text != "DECLARE cur CURSOR FOR SELECT id FROM acct" {
		t.Errorf("pg_cursors: %q, %v", text, err)
	}
	// PREPARE TRANSACTION ends the transaction on the server, whether it succeeds or
	// fails (here: prepared transactions are off, or the test server lacks them).
	if err := simple("PREPARE TRANSACTION 'shardlab_test_px'"); err == nil {
		if err := simple("ROLLBACK PREPARED 'shardlab_test_px'"); err != nil {
			t.Fatal(err)
		}
	}
	if err := simple("SELECT 1"); err != nil {
		t.Errorf("after PREPARE TRANSACTION: %v, want no transaction open", err)
	}
	if err := simple("ROLLBACK TO SAVEPOINT s"); err == nil || !strings.Contains(err.Error(), "ROLLBACK TO SAVEPOINT can only be used in transaction blocks") {
		t.Errorf("ROLLBACK TO SAVEPOINT outside a transaction: %v", err)
	}
	// SETs of DateStyle compose: replayed on a connection another client used, and
	// restored at a savepoint, they keep the style and the order each one named.
	shared := startProxy(t, 1, nil, nil, withPool(1, 10*time.Second))
	sa, sb := shared.connect(t), shared.connect(t)
	show := func(c *pgx.Conn) string {
		var v string
		if err := c.QueryRow(ctx, "SHOW datestyle", pgx.QueryExecModeSimpleProtocol).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, q := range []string{"SET datestyle = 'German, YMD'", "SET datestyle = 'DMY'"} {
		if _, err := sa.Exec(ctx, q, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatal(err)
		}
	}
	show(sb) // the connection is reset for the other client
	if v := show(sa); v != "German, DMY" {
		t.Errorf("DateStyle replayed: %q, want German, DMY", v)
	}
	for _, q := range []string{"BEGIN", "SET datestyle = 'YMD'", "SAVEPOINT a", "SET datestyle = 'SQL, DMY'", "ROLLBACK TO a"} {
		if _, err := sa.Exec(ctx, q, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatal(err)
		}
	}
	if v := show(sa); v != "German, YMD" {
		t.Errorf("DateStyle after ROLLBACK TO: %q, want German, YMD", v)
	}
	if _, err := sa.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	// A setting a DO block changes stays off the next client's statements on the
	// connection: one connection, two clients.
	one := startProxy(t, 1, nil, nil, withPool(1, 10*time.Second))
	a, b := one.connect(t), one.connect(t)
	if _, err := a.Exec(ctx, "DO $$ BEGIN PERFORM set_config('work_mem', '7777kB', false); END $$", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	var workMem string
	if err := b.QueryRow(ctx, "SELECT current_setting('work_mem')").Scan(&workMem); err != nil || workMem == "7777kB" {
		t.Errorf("another client's work_mem after a DO that set it: %q, %v", workMem, err)
	}
	two := startProxy(t, 2, []string{"acct=id"}, nil)
	if _, err := two.connect(t).Exec(ctx, "DO $$ BEGIN PERFORM 1; END $$"); sqlState(err) != "0A000" {
		t.Errorf("DO over two shards: %v, want 0A000", err)
	}
}

// TestResetsReportParameters: after RESET, RESET ALL and DISCARD ALL the client hears,
// in ParameterStatus messages, of every reported parameter they changed, as from
// PostgreSQL; values its startup packet gave come back. A client that went on
// believing client_encoding was still SJIS would misread every string.
func TestResetsReportParameters(t *testing.T) {
	steps := []string{
		"SET client_encoding = 'SJIS'", "RESET ALL",
		"SET application_name = 'changed'", "RESET application_name",
		"SET DateStyle = 'German'", "SET client_encoding = 'LATIN1'", "DISCARD ALL",
		"SET IntervalStyle = 'iso_8601'", "SET IntervalStyle TO DEFAULT",
		// Inside a transaction, a reset goes back to the startup packet's value too.
		"BEGIN", "SET TimeZone = 'Asia/Tokyo'", "RESET TimeZone", "SELECT '2024-01-01 10:00'::timestamptz::text", "COMMIT",
		"SET TimeZone = 'Asia/Tokyo'; RESET TimeZone; SELECT '2024-01-01 10:00'::timestamptz::text",
		"BEGIN", "SET application_name = 'in_tx'", "RESET ALL", "SELECT current_setting('application_name')", "ROLLBACK",
		"BEGIN", "SET client_encoding = 'LATIN1'", "ROLLBACK",
	}
	const watched = "client_encoding application_name DateStyle IntervalStyle TimeZone"
	run := func(t *testing.T, dsn string) []string {
		ctx := context.Background()
		cfg, err := pgconn.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = "from_startup"
		cfg.RuntimeParams["TimeZone"] = "Europe/Paris"
		c, err := pgconn.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		var out []string
		for _, q := range steps {
			res, err := c.Exec(ctx, q).ReadAll()
			line := q + " ->"
			if n := len(res); n > 0 && len(res[n-1].Rows) > 0 {
				line += fmt.Sprintf(" %q", res[n-1].Rows[0][0])
			}
			for _, name := range strings.Fields(watched) {
				line += " " + name + "=" + c.ParameterStatus(name)
			}
			out = append(out, fmt.Sprintf("%s (%v)", line, err))
		}
		return out
	}
	for _, mode := range poolModes {
		t.Run(mode.String(), func(t *testing.T) {
			e := startProxy(t, 2, []string{"t=id"}, nil, withPool(1, 10*time.Second), withPoolMode(mode))
			want := run(t, e.dsns[0])
			got := run(t, e.url(""))
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("step %d:\n proxy  %s\n direct %s", i+1, got[i], want[i])
				}
			}
		})
	}
}
