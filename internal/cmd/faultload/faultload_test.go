package faultload_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/internal/cmd/faultload"
)

func run(args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	err := faultload.Run(context.Background(), args, &stdout, &stderr)
	return stdout.String() + stderr.String(), err
}

func TestRunRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"dance", "--events", "x"},
		{"run", "postgres://x"},
		{"run", "--events", "e", "--workers", "0", "postgres://x"},
		{"run", "--events", "e"},
		{"analyze", "--events", "e"},
		{"analyze", "--events", "e", "--windows", "w", "--shard-map", "m"},
	} {
		if _, err := run(args...); !errors.Is(err, faultload.ErrUsage) {
			t.Errorf("faultload %v: %v, want a usage error", args, err)
		}
	}
	if out, err := run("schema"); err != nil || !strings.Contains(out, "CREATE TABLE fault_acks") {
		t.Errorf("schema: %v\n%s", err, out)
	}
	if out, err := run("--help"); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out, "faultload analyze") {
		t.Errorf("--help: %v\n%s", err, out)
	}
}

// TestAnalyze reads a log written by hand: one fault on shard 1, one lost write.
func TestAnalyze(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	events := write("events.csv", "start_unix_us,end_unix_us,worker,op,key,key2,seq,code,error\n"+
		"1000,3000,0,read,1,0,0,,\n"+
		"2000,4000,1,write,2,0,1,,\n"+
		"100000,600000,0,read,2,0,0,08006,shardlab: data source ds_1 is unavailable: i/o timeout\n"+
		"100000,102000,1,write,1,0,2,,\n"+
		"1200000,1203000,0,read,2,0,0,,\n")
	windows := write("windows.csv", "partition,1,100000,1100000\n")
	shards := write("map.csv", "1,0\n2,1\n")
	found := write("found.csv", "2,1,1\n1,1,2\n")
	out := filepath.Join(dir, "results.csv")
	stdout, err := run("analyze", "--events", events, "--windows", windows, "--shard-map", shards, "--found", found, "--out", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	if !strings.Contains(stdout, "acknowledged=2 read_back=2 lost=0 torn_pairs=0") {
		t.Errorf("stdout %q", stdout)
	}
	data, _ := os.ReadFile(out)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], "partition,ds_1,1.0,") ||
		!strings.Contains(lines[1], ",500.0,500.0,103.0,") || !strings.Contains(lines[1], "1x 08006 shardlab: data source ds_1") {
		t.Errorf("results:\n%s", data)
	}
	// A write acknowledged but not read back: exit status 3's error.
	write("found.csv", "2,1,1\n")
	if _, err := run("analyze", "--events", events, "--windows", windows, "--shard-map", shards, "--found", found); !errors.Is(err, faultload.ErrFailedCheck) {
		t.Errorf("a lost write: %v, want ErrFailedCheck", err)
	}
	// A key with no shard in the map is an error, not a guess.
	write("map.csv", "1,0\n")
	if _, err := run("analyze", "--events", events, "--windows", windows, "--shard-map", shards, "--found", found); err == nil || !strings.Contains(err.Error(), "no shard") {
		t.Errorf("a key missing from the map: %v", err)
	}
}
