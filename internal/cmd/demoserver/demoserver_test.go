package demoserver_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/cmd/demoserver"
	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/lab/shardset/postgres"
)

// TestRunServesAndShutsDownInProcess runs the command in-process on a free port, checks it
// serves, then cancels its context and expects a clean shutdown with the databases closed.
func TestRunServesAndShutsDownInProcess(t *testing.T) {
	dir := t.TempDir()
	addrFile := filepath.Join(dir, "addr")
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- demoserver.Run(ctx, []string{"--mode", "sharded", "--shards", "2", "--data", filepath.Join(dir, "data"),
			"--addr", "127.0.0.1:0", "--addr-file", addrFile}, &stdout, &stderr)
	}()
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == ""; {
		if raw, err := os.ReadFile(addrFile); err == nil {
			addr = strings.TrimSpace(string(raw))
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not start: %s %s", stdout.String(), stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Post("http://"+addr+"/insert", "application/json", strings.NewReader(`{"user_id":"a","data":"b"}`))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("insert: %v %v", resp, err)
	}
	resp.Body.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel = %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	if !strings.Contains(stdout.String(), "stopped cleanly") {
		t.Errorf("no clean stop reported:\n%s", stdout.String())
	}
}

func TestRunRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{"--mode", "both"}, {"--shards", "-2"}, {"--router", "rendezvous"}, {"--backend", "mysql"},
		{"extra-argument"}, {"--shutdown-timeout", "0s"}, {"--counter", "bucket", "--bucket-by", "moon"},
		{"--journal", "memory"}, {"--one-conn", "--read-conns", "2"},
		{"--backend", "postgres", "--dsn", "postgres://h/db", "--group-commit"},
		{"--backend", "postgres", "--dsn", "postgres://h/db", "--journal", "delete"},
	} {
		var out bytes.Buffer
		err := demoserver.Run(context.Background(), append(args, "--data", t.TempDir(), "--addr", "127.0.0.1:0"), &out, &out)
		if !errors.Is(err, demoserver.ErrUsage) {
			t.Errorf("Run(%v) = %v, want ErrUsage", args, err)
		}
	}
	var out bytes.Buffer
	if err := demoserver.Run(context.Background(), []string{"--help"}, &out, &out); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "Usage:") {
		t.Errorf("--help: %v\n%s", err, out.String())
	}
}

// startRun runs the command in-process until the returned function stops it, which
// reports how Run ended.
func startRun(t *testing.T, args ...string) func() error {
	_, stop := startRunAt(t, args...)
	return stop
}

// startRunAt is startRun that also returns the address the API listens on.
func startRunAt(t *testing.T, args ...string) (string, func() error) {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- demoserver.Run(ctx, append(args, "--addr", "127.0.0.1:0", "--addr-file", addrFile), io.Discard, &out)
	}()
	var addr string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if raw, err := os.ReadFile(addrFile); err == nil && strings.HasSuffix(string(raw), "\n") {
			addr = strings.TrimSpace(string(raw))
			break
		}
		select {
		case err := <-done:
			cancel()
			t.Fatalf("demo-server %v did not start: %v", args, err)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("demo-server %v did not start in 30s", args)
		}
	}
	return addr, func() error {
		cancel()
		return <-done
	}
}

func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	return exists
}

// TestCreateRefusedStartLeavesNoDatabase: a --create start refused because the databases
// hold another layout drops the database it had just made, says which flags lead out,
// and the way out it names works.
func TestCreateRefusedStartLeavesNoDatabase(t *testing.T) {
	base := pgtest.DSN(t)
	prefix := pgtest.UniqueName("demo_refused") + "_s"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := postgres.DropShardDatabasesWithPrefix(ctx, base, prefix, 3); err != nil {
			t.Error(err)
		}
	})
	args := func(shards string, more ...string) []string {
		return append([]string{"--mode", "sharded", "--shards", shards, "--backend", "postgres", "--dsn", base,
			"--create", "--db-prefix", prefix}, more...)
	}
	if err := startRun(t, args("2")...)(); err != nil {
		t.Fatalf("first start: %v", err)
	}

	var out bytes.Buffer
	err := demoserver.Run(t.Context(), append(args("3"), "--addr", "127.0.0.1:0"), &out, &out)
	if !errors.Is(err, shardset.ErrLayoutMismatch) {
		t.Fatalf("3 shards over a 2-shard layout: %v, want a layout mismatch", err)
	}
	for _, want := range []string{"--reset", "--db-prefix"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not name %s as a way out:\n%v", want, err)
		}
	}
	if databaseExists(t, prefix+"2") {
		t.Errorf("the refused start left database %s2 behind", prefix)
	}
	if !databaseExists(t, prefix+"0") || !databaseExists(t, prefix+"1") {
		t.Error("the refused start dropped the databases it found")
	}

	// The ways out: another prefix, or --reset.
	if err := startRun(t, "--mode", "sharded", "--shards", "3", "--backend", "postgres", "--dsn", base,
		"--create", "--db-prefix", prefix+"x")(); err != nil {
		t.Errorf("start with another --db-prefix: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		postgres.DropShardDatabasesWithPrefix(ctx, base, prefix+"x", 3)
	})
	if err := startRun(t, args("3", "--reset")...)(); err != nil {
		t.Errorf("start with --reset: %v", err)
	}
}

// TestProfilesAndVariantsServe starts the server with the naive access variants, group
// commit and --pprof: the API stores and serves a record, the profiles answer on their own
// address, and the API's address does not expose them.
func TestProfilesAndVariantsServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pprofAddr := ln.Addr().String()
	ln.Close()
	addr, stop := startRunAt(t, "--mode", "sharded", "--shards", "2", "--data", t.TempDir(), "--journal", "delete",
		"--one-conn", "--group-commit", "--sync", "full", "--pprof", pprofAddr)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for i := range 20 {
		resp, err := http.Post("http://"+addr+"/insert", "application/json", strings.NewReader(fmt.Sprintf(`{"user_id":"u%d","data":"d%d"}`, i, i)))
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("insert: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	for i := range 20 {
		if code, body := get(fmt.Sprintf("http://%s/get?user_id=u%d", addr, i)); code != http.StatusOK || !strings.Contains(body, fmt.Sprintf(`"d%d"`, i)) {
			t.Errorf("get u%d: %d %s", i, code, body)
		}
	}
	// The goroutine profile shows the shards' group committers: --group-commit arrived.
	if code, body := get("http://" + pprofAddr + "/debug/pprof/goroutine?debug=1"); code != http.StatusOK || !strings.Contains(body, "groupCommitter") {
		t.Errorf("pprof goroutine profile: %d, no group committer in:\n%s", code, body)
	}
	if code, _ := get("http://" + addr + "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("the API address serves /debug/pprof/: %d", code)
	}
}
