package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/coordinator"
	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/proxy"
	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/proxy/router"
	"github.com/shardlab/shardlab/rules"
)

// testDatabase is the name clients give to reach the proxy in tests.
const testDatabase = "app"

// env is a running proxy over fresh databases.
type env struct {
	t     testing.TB
	srv   *proxy.Server
	addr  string
	dsns  []string // the data sources, straight to PostgreSQL
	rules *rules.Compiled
	// stop shuts the proxy down (once; the test's cleanup calls it too).
	stop func()
}

// close shuts the proxy down before the test ends.
func (e *env) close() { e.stop() }

// option changes a proxy's configuration before it starts.
type option func(*proxy.Config)

func withPool(size int, checkout time.Duration) option {
	return func(c *proxy.Config) { c.Pool = backend.Options{Size: size, CheckoutTimeout: checkout} }
}

func withCoordinator() option { return func(c *proxy.Config) { c.Coordinate = true } }

func withSessionPooling() option { return func(c *proxy.Config) { c.PoolMode = router.PoolSession } }

// shardedRules makes rules over dsns: every table in sharded is sharded by the column
// after its '=', every table in broadcast is copied.
func shardedRules(dsns []string, sharded []string, broadcast []string) rules.Rules {
	r := rules.Rules{Broadcast: broadcast}
	for i, d := range dsns {
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d})
	}
	for _, s := range sharded {
		table, col, _ := strings.Cut(s, "=")
		r.Tables = append(r.Tables, rules.Table{Name: table, Strategy: rules.Strategy{Column: col}})
	}
	return r
}

// startProxy creates n databases and serves a proxy over them with the given sharded
// (TABLE=COLUMN) and broadcast tables.
func startProxy(t testing.TB, n int, sharded, broadcast []string, opts ...option) *env {
	t.Helper()
	var dsns []string
	for i := range n {
		dsns = append(dsns, pgtest.NewDatabase(t, fmt.Sprintf("proxy_s%d", i)))
	}
	return startProxyOn(t, shardedRules(dsns, sharded, broadcast), opts...)
}

// startProxyOn serves a proxy over the data sources of r.
func startProxyOn(t testing.TB, r rules.Rules, opts ...option) *env {
	t.Helper()
	c, err := rules.Compile(r)
	if err != nil {
		t.Fatal(err)
	}
	cfg := proxy.Config{Rules: c, Database: testDatabase, DeadlockInterval: 200 * time.Millisecond,
		Pool: backend.Options{Size: 8, CheckoutTimeout: 5 * time.Second}}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.Coordinate {
		coord, err := coordinator.New(c, cfg.CoordinatorDatabase)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := coord.Drop(context.Background()); err != nil {
				t.Errorf("dropping the coordinator database: %v", err)
			}
		})
	}
	srv, err := proxy.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	stop := sync.OnceFunc(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("proxy shutdown: %v", err)
		}
		if err := <-done; !errors.Is(err, proxy.ErrServerClosed) {
			t.Errorf("Serve returned %v", err)
		}
		for _, st := range srv.Stats().Pools {
			if st.InUse != 0 {
				t.Errorf("data source %s: %d connections still lent out after shutdown", st.DataSource, st.InUse)
			}
		}
	})
	t.Cleanup(stop)
	var dsns []string
	for _, ds := range c.DataSources() {
		dsns = append(dsns, ds.DSN)
	}
	return &env{t: t, srv: srv, addr: ln.Addr().String(), dsns: dsns, rules: c, stop: stop}
}

// url is the proxy's URL for database db (testDatabase when "").
func (e *env) url(db string) string {
	if db == "" {
		db = testDatabase
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", e.addr, db)
}

func (e *env) host() string { h, _, _ := net.SplitHostPort(e.addr); return h }
func (e *env) port() string { _, p, _ := net.SplitHostPort(e.addr); return p }

// connect opens a pgx connection to the proxy (closed when the test ends).
func (e *env) connect(t testing.TB) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, e.url(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// pgconnect opens a pgconn connection to the proxy.
func (e *env) pgconnect(t testing.TB) *pgconn.PgConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, e.url(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// shard opens a connection straight to data source i.
func (e *env) shard(t testing.TB, i int) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), e.dsns[i])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// exec runs statements through the proxy, failing the test on error.
func exec1(t testing.TB, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// queryInt runs a query returning one integer.
func queryInt(t testing.TB, c *pgx.Conn, sql string, args ...any) int64 {
	t.Helper()
	var n *int64
	if err := c.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if n == nil {
		return 0
	}
	return *n
}

// sqlState returns the SQLSTATE of err ("" when it has none).
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// needTool finds a client program; without it the test skips, unless PostgreSQL
// tests are required (CI installs the clients).
func needTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv(pgtest.EnvRequire) == "1" {
			t.Fatalf("%s is not installed (.ci/run installs it; %s=1 forbids skipping)", name, pgtest.EnvRequire)
		}
		t.Skipf("%s is not installed", name)
	}
	return p
}

// run runs a client program with a deadline and returns its combined output.
func run(t testing.TB, timeout time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, needTool(t, name), args...)
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10", "PGOPTIONS=", "PGAPPNAME=")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("%s timed out after %v", name, timeout)
	}
	return string(out), err
}

// runStdin is run with input on the program's standard input.
func runStdin(t testing.TB, timeout time.Duration, input, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, needTool(t, name), args...)
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10", "PGOPTIONS=", "PGAPPNAME=")
	cmd.Stdin = strings.NewReader(input)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("%s timed out after %v", name, timeout)
	}
	return string(out), err
}
