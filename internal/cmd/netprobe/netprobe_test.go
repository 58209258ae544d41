package netprobe_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net"
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
