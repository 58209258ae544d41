package netprobe_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/internal/cmd/netprobe"
	"github.com/shardlab/shardlab/internal/pgtest"
)

func run(args ...string) (string, string, error) {
	var stdout, stderr bytes.Buffer
	err := netprobe.Run(context.Background(), args, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

func TestRunRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"ping", "x"},
		{"sql"},
		{"sql", "a", "b"},
		{"sql", "--count", "0", "postgres://x"},
		{"dial", "--timeout", "0s", "127.0.0.1:1"},
		{"dial", "--frob", "127.0.0.1:1"},
		{"latency", "--rate", "-1", "postgres://x"},
		{"latency", "--count", "0", "postgres://x"},
		{"slowest"},
		{"quantiles"},
	} {
		if _, _, err := run(args...); !errors.Is(err, netprobe.ErrUsage) {
			t.Errorf("netprobe %v: %v, want a usage error", args, err)
		}
	}
	if _, stderr, err := run("--help"); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr, "netprobe sql") {
		t.Errorf("--help: %v\n%s", err, stderr)
	}
}

func TestRunDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if out, _, err := run("dial", "--timeout", "2s", ln.Addr().String()); err != nil || out != "answered\n" {
		t.Errorf("dial: %q, %v", out, err)
	}
}

func TestRunSQL(t *testing.T) {
	dsn := pgtest.DSN(t)
	out, _, err := run("sql", "--count", "10", dsn)
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`^n=10 min_ms=[0-9.]+ median_ms=[0-9.]+ p99_ms=[0-9.]+ max_ms=[0-9.]+ mean_ms=[0-9.]+ stddev_ms=[0-9.]+\n$`)
	if !line.MatchString(out) {
		t.Errorf("sql printed %q", out)
	}
}

func TestRunLatencyAndModel(t *testing.T) {
	dsn := pgtest.DSN(t)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	out, _, err := run("latency", "--query", "SELECT $1::int", "--key-max", "100", "--count", "20", "--rate", "500", "--out", a, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^n=20 p50_ms=[0-9.]+ p99_ms=[0-9.]+ p999_ms=[0-9.]+ max_ms=[0-9.]+\n$`).MatchString(out) {
		t.Errorf("latency printed %q", out)
	}
	data, err := os.ReadFile(a)
	if err != nil || len(strings.Fields(string(data))) != 20 {
		t.Fatalf("--out wrote %q, %v; want 20 samples", data, err)
	}

	// Samples by hand: the model of two servers, and the pooled quantiles.
	os.WriteFile(a, []byte("1000\n2000\n3000\n4000\n"), 0o644)
	os.WriteFile(b, []byte("1000\n2000\n3000\n4000\n"), 0o644)
	if out, _, err := run("slowest", "--offset", "1ms", a, b); err != nil || out != "servers=2 p50_ms=4.000 p99_ms=5.000 p999_ms=5.000\n" {
		t.Errorf("slowest: %q, %v", out, err)
	}
	if out, _, err := run("quantiles", a, b); err != nil || out != "n=8 p50_ms=2.000 p99_ms=4.000 p999_ms=4.000 max_ms=4.000\n" {
		t.Errorf("quantiles: %q, %v", out, err)
	}
	os.WriteFile(b, []byte("1000\nlots\n"), 0o644)
	if _, _, err := run("slowest", a, b); err == nil || !strings.Contains(err.Error(), "lots") {
		t.Errorf("slowest over a bad file: %v", err)
	}
}
