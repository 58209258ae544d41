package shardproxy_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/cmd/shardproxy"
	"github.com/shardlab/shardlab/internal/pgtest"
)

func TestHelp(t *testing.T) {
	var out bytes.Buffer
	err := shardproxy.Run(context.Background(), []string{"--help"}, &out, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"--sharded", "-pool-mode", "-checkout-timeout", "-max-clients", "-users", "-tls-cert", "-lock-wait-timeout", "-admin-database", "-metrics-listen", "-settle-interval"} {
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
