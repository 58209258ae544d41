package shardproxy_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/internal/cmd/shardproxy"
	"github.com/shardlab/shardlab/internal/pgtest"
)

func TestHelp(t *testing.T) {
	var out bytes.Buffer
	err := shardproxy.Run(context.Background(), []string{"--help"}, &out, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"--sharded", "-pool-mode", "-checkout-timeout", "-max-clients", "-users", "-tls-cert", "-lock-wait-timeout", "-admin-database", "-metrics-listen", "-settle-interval", "-tcp-user-timeout", "-client-tcp-user-timeout", "-ban-time"} {
		if !strings.Contains(out.String(), strings.TrimLeft(want, "-")) {
			t.Errorf("--help does not mention %s", want)
		}
	}
}

func TestBadFlags(t *testing.T) {
	dir := t.TempDir()
	badRules := filepath.Join(dir, "rules.toml")
	os.WriteFile(badRules, []byte("[[data_source]]\nname = 1\n"), 0o644)
	badUsers := filepath.Join(dir, "users.txt")
	os.WriteFile(badUsers, []byte("alice secret\n"), 0o644)
	shard := "--shard=postgres://postgres@127.0.0.1:1/x"
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{shard}, "--database is required"},
		{[]string{"--database", "app"}, "at least one --shard"},
		{[]string{"--database", "app", shard, "--pool-mode", "statement"}, "--pool-mode must be transaction or session"},
		{[]string{"--database", "app", shard, "--pool-size", "0"}, "--pool-size must be"},
		{[]string{"--database", "app", shard, "--max-clients", "0"}, "--max-clients must be"},
		{[]string{"--database", "app", shard, "--procs", "-1"}, "--procs must be"},
		{[]string{"--database", "app", shard, "--coordinator", "--coordinator-pool-size", "0"}, "--coordinator-pool-size must be"},
		{[]string{"--database", "app", shard, "--coordinator=false", "--coordinator-database", "x"}, "--coordinator, which is off"},
		{[]string{"--database", "app", shard, "--coordinator-max-moved", "-1"}, "--coordinator-max-moved must be"},
		{[]string{"--database", "app", shard, "--cross-pool-wait", "0s"}, "--cross-pool-wait must be"},
		{[]string{"--database", "app", shard, "--two-phase", "--settle-interval", "0s"}, "--settle-interval must be positive"},
		{[]string{"--database", "app", shard, "--max-transactions", "-2"}, "--max-transactions must be"},
		{[]string{"--database", "app", shard, "--pool-size", "4", "--max-transactions", "4"}, "below --pool-size"},
		{[]string{"--database", "app", shard, "--sharded", "t"}, "--sharded wants TABLE=COLUMN"},
		{[]string{"--database", "app", shard, "--tls-cert", "x.pem"}, "--tls-cert and --tls-key go together"},
		{[]string{"--database", "app", shard, "--config", badRules}, "do not combine it"},
		{[]string{"--database", "app", "--config", badRules}, "--config"},
		{[]string{"--database", "app", shard, "--users", badUsers}, "--users"},
		{[]string{"--database", "app", shard, "--log-level", "loud"}, "--log-level"},
		{[]string{"--database", "app", shard, "extra"}, "unexpected argument"},
		{[]string{"--database", "app", shard, "--admin-database", "app"}, "--admin-database must differ"},
		{[]string{"--database", "app", shard, "--no-such-flag"}, "no-such-flag"},
		{[]string{"--database", "app", shard, "--sharded", "t=id", "--broadcast", "t"}, "rules"},
	} {
		var out bytes.Buffer
		err := shardproxy.Run(context.Background(), tt.args, &out, &out)
		if !errors.Is(err, shardproxy.ErrUsage) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: err %v, want a usage error mentioning %q", tt.args, err, tt.want)
		}
	}
}

// TestRunServesAndStops runs the command in-process: it serves clients and stops
// gracefully when its context ends (SIGINT or SIGTERM in the real command).
func TestRunServesAndStops(t *testing.T) {
	s0, s1 := pgtest.NewDatabase(t, "cli_s0"), pgtest.NewDatabase(t, "cli_s1")
	addrFile := filepath.Join(t.TempDir(), "addr")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, log bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- shardproxy.Run(ctx, []string{"--listen", "127.0.0.1:0", "--addr-file", addrFile, "--database", "app",
			"--shard", s0, "--shard", s1, "--sharded", "t=id", "--pool-size", "2"}, &out, &log)
	}()
	var addr string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(addrFile); err == nil && len(b) > 0 {
			addr = strings.TrimSpace(string(b))
			break
		}
	}
	if addr == "" {
		cancel()
		t.Fatalf("the proxy did not start: %v\n%s", <-done, log.String())
	}
	c, err := pgx.Connect(ctx, "postgres://postgres@"+addr+"/app?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1), (2), (3), (4)"} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 4 {
		t.Fatalf("count %d %v", n, err)
	}
	c.Close(ctx)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not stop")
	}
	if !strings.Contains(out.String(), "listening on "+addr) {
		t.Errorf("stdout: %q", out.String())
	}
	if strings.Contains(log.String(), "password") {
		t.Errorf("the log mentions a password:\n%s", log.String())
	}
}

// TestDefaultProcs: the proxy runs on one thread on a small machine, Go's choice on a
// larger one.
func TestDefaultProcs(t *testing.T) {
	for cpus, want := range map[int]int{1: 1, 2: 1, 3: 0, 8: 0, 64: 0} {
		if got := shardproxy.DefaultProcs(cpus); got != want {
			t.Errorf("DefaultProcs(%d) = %d, want %d", cpus, got, want)
		}
	}
}

// TestClientTCPUserTimeoutIsItsOwn: --tcp-user-timeout bounds server connections only;
// a client that stops reading a large answer for longer (its receive window closed)
// is not cut off, unless --client-tcp-user-timeout asks for it (Linux 5.11 and later
// count a closed window against the user timeout).
func TestClientTCPUserTimeoutIsItsOwn(t *testing.T) {
	shard := pgtest.NewDatabase(t, "cli_tcp")
	for _, tc := range []struct {
		name   string
		flags  []string
		cutOff bool
	}{
		{"server user timeout only", []string{"--tcp-user-timeout", "500ms"}, false},
		{"client user timeout", []string{"--client-tcp-user-timeout", "500ms"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := startCommand(t, append([]string{"--database", "app", "--shard", shard}, tc.flags...)...)
			rows, err := slowReader(t, addr, "SELECT repeat('x', 1000) FROM generate_series(1, 20000)", 3*time.Second)
			switch {
			case tc.cutOff && err != nil:
				t.Logf("cut off after %d rows: %v", rows, err)
			case tc.cutOff:
				t.Errorf("a client that read nothing for 3s with a 500ms client user timeout got all %d rows", rows)
			case !tc.cutOff && (err != nil || rows != 20000):
				t.Errorf("a client that read nothing for 3s: %d rows, %v; want all 20000", rows, err)
			}
		})
	}
}

// startCommand runs the command with args and the address it listens on, until the
// test ends.
func startCommand(t *testing.T, args ...string) string {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	ctx, cancel := context.WithCancel(context.Background())
	var out, log bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- shardproxy.Run(ctx, append([]string{"--listen", "127.0.0.1:0", "--addr-file", addrFile}, args...), &out, &log)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(addrFile); err == nil && len(b) > 0 {
			return strings.TrimSpace(string(b))
		}
	}
	cancel()
	t.Fatalf("the proxy did not start: %v\n%s", <-done, log.String())
	return ""
}

// slowReader connects to the proxy at addr with a small receive buffer, sends query,
// reads nothing for pause, then reads the answer: the rows it got, and the error that
// ended the answer early.
func slowReader(t *testing.T, addr, query string, pause time.Duration) (rows int, err error) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.(*net.TCPConn).SetReadBuffer(64 << 10)
	fe := pgproto3.NewFrontend(nc, nc)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": "postgres", "database": "app"}})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatalf("startup: %v", err)
		}
		if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			t.Fatalf("startup: %s", e.Message)
		}
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	fe.Send(&pgproto3.Query{String: query})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(pause)
	nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		msg, err := fe.Receive()
		if err != nil {
			return rows, err
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			rows++
		case *pgproto3.ErrorResponse:
			return rows, fmt.Errorf("%s %s", m.Code, m.Message)
		case *pgproto3.ReadyForQuery:
			return rows, nil
		}
	}
}

// TestCoordinatesByDefault: with the default flags, a statement the merge cannot answer
// (a count of distinct values across shards) is answered by the coordinator database;
// --coordinator=false refuses it with 0A000.
func TestCoordinatesByDefault(t *testing.T) {
	s0, s1 := pgtest.NewDatabase(t, "cli_co0"), pgtest.NewDatabase(t, "cli_co1")
	cfg, err := pgx.ParseConfig(s0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin, err := pgx.Connect(context.Background(), pgtest.DSN(t))
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close(context.Background())
		if _, err := admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{cfg.Database + "_coordinator"}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	ctx := context.Background()
	query := "SELECT count(DISTINCT v) FROM t"
	for _, tc := range []struct {
		flags []string
		want  string // "" for an answer, else the SQLSTATE
	}{
		{nil, ""},
		{[]string{"--coordinator=false"}, "0A000"},
	} {
		addr := startCommand(t, append([]string{"--database", "app", "--shard", s0, "--shard", s1, "--sharded", "t=id", "--pool-size", "3"}, tc.flags...)...)
		c, err := pgx.Connect(ctx, "postgres://postgres@"+addr+"/app?sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		var rows []string
		for i := 1; i <= 100; i++ {
			rows = append(rows, fmt.Sprintf("(%d, %d)", i, i%7))
		}
		for _, q := range []string{"CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY, v int)", "INSERT INTO t VALUES " + strings.Join(rows, ", ") + " ON CONFLICT DO NOTHING"} {
			if _, err := c.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		var n int
		err = c.QueryRow(ctx, query).Scan(&n)
		var pe *pgconn.PgError
		switch {
		case tc.want == "" && (err != nil || n != 7):
			t.Errorf("%v: %s = %d, %v; want 7", tc.flags, query, n, err)
		case tc.want != "" && (!errors.As(err, &pe) || pe.Code != tc.want):
			t.Errorf("%v: %s: %v, want %s", tc.flags, query, err, tc.want)
		}
	}
}
