package demoserver_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/demoserver"
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
