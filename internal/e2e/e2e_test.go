package e2e_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardlab/shardlab/lab/loadgen"
	"github.com/shardlab/shardlab/lab/shardset/sqlite"
	"github.com/shardlab/shardlab/routing"
)

var binDir string

// builtCommands are the binaries TestMain builds for the tests.
var builtCommands = []string{"demo-server", "loadgen", "report", "usl", "http-ceiling", "blockbench"}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shardlab-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	for _, cmd := range builtCommands {
		build := exec.Command("go", "build", "-o", filepath.Join(dir, cmd), "github.com/shardlab/shardlab/cmd/"+cmd)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build", cmd, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// server is a demo-server process.
type server struct {
	t    *testing.T
	cmd  *exec.Cmd
	url  string
	logs *bytes.Buffer
	done chan error
}

func startServer(t *testing.T, dataDir string, args ...string) *server {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	args = append(args, "--data", dataDir, "--addr", "127.0.0.1:0", "--addr-file", addrFile)
	cmd := exec.Command(filepath.Join(binDir, "demo-server"), args...)
	logs := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, cmd: cmd, logs: logs, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-s.done
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		raw, err := os.ReadFile(addrFile)
		if err == nil && len(raw) > 0 {
			s.url = "http://" + strings.TrimSpace(string(raw))
			break
		}
		select {
		case err := <-s.done:
			t.Fatalf("demo-server exited early: %v\n%s", err, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("demo-server did not start:\n%s", logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s
}

// stop sends sig and waits for the process to end.
func (s *server) stop(sig syscall.Signal) error {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatal(err)
	}
	select {
	case err := <-s.done:
		return err
	case <-time.After(30 * time.Second):
		s.t.Fatalf("demo-server did not stop after %v:\n%s", sig, s.logs)
		return nil
	}
}

// ackLog records what the server acknowledged.
type ackLog struct {
	mu     sync.Mutex
	values map[string]map[string]bool // key -> values acknowledged for it
	shard  map[string]int             // key -> shard named in the acknowledgement
	maxSeq map[string]int             // loadgen worker -> its last acknowledged write's sequence number
	bad    []string
}

func newAckLog() *ackLog {
	return &ackLog{values: map[string]map[string]bool{}, shard: map[string]int{}, maxSeq: map[string]int{}}
}

// writer returns the loadgen worker and sequence number of a written value
// ("key:worker:seq:filler").
func writer(value string) (worker string, seq int, ok bool) {
	parts := strings.SplitN(value, ":", 4)
	if len(parts) < 4 {
		return "", 0, false
	}
	if _, err := fmt.Sscan(parts[2], &seq); err != nil {
		return "", 0, false
	}
	return parts[1], seq, true
}

func (a *ackLog) record(o loadgen.Outcome) {
	if !o.Write || o.Status != http.StatusOK {
		return
	}
	var resp struct {
		UserID string `json:"user_id"`
		Shard  *int   `json:"shard"`
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := json.Unmarshal(o.Body, &resp); err != nil || resp.Shard == nil || resp.UserID != o.Key {
		a.bad = append(a.bad, fmt.Sprintf("bad acknowledgement for %s: %s", o.Key, o.Body))
		return
	}
	if prev, ok := a.shard[o.Key]; ok && prev != *resp.Shard {
		a.bad = append(a.bad, fmt.Sprintf("%s acknowledged on shard %d and %d", o.Key, prev, *resp.Shard))
	}
	a.shard[o.Key] = *resp.Shard
	if a.values[o.Key] == nil {
		a.values[o.Key] = map[string]bool{}
	}
	a.values[o.Key][o.Data] = true
	if w, seq, ok := writer(o.Data); ok {
		a.maxSeq[w] = max(a.maxSeq[w], seq)
	}
}

func runLoad(t *testing.T, ctx context.Context, target string, acks *ackLog, ops int64) *loadgen.Result {
	t.Helper()
	res, err := loadgen.Run(ctx, loadgen.Config{
		Target: target, Ops: ops, Concurrency: 16, WriteRatio: 0.7, Keys: 3000,
		Dist: loadgen.DistZipfian, Seed: 42, DataSize: 64, OnResult: acks.record,
	})
	if err != nil && ctx.Err() == nil {
		t.Fatal(err)
	}
	return res
}

func getRecord(t *testing.T, base, key string) (int, string, int) {
	t.Helper()
	resp, err := http.Get(base + "/get?user_id=" + url.QueryEscape(key))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var rec struct {
		Data  string `json:"data"`
		Shard int    `json:"shard"`
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, &rec); err != nil {
			t.Fatalf("GET %s: %v: %s", key, err, body)
		}
	}
	return resp.StatusCode, rec.Data, rec.Shard
}

// lastIfOneWriter returns the last of a key's acknowledged values when a single loadgen
// worker wrote them all (a worker's writes are sequential, so its last acknowledged write
// must be the one stored). Values start with "key:worker:seq:".
func lastIfOneWriter(values map[string]bool) (string, bool) {
	worker, last, lastSeq := "", "", -1
	for v := range values {
		parts := strings.SplitN(v, ":", 4)
		if len(parts) < 4 {
			return "", false
		}
		if worker != "" && parts[1] != worker {
			return "", false
		}
		worker = parts[1]
		var seq int
		if _, err := fmt.Sscan(parts[2], &seq); err != nil {
			return "", false
		}
		if seq > lastSeq {
			last, lastSeq = v, seq
		}
	}
	return last, worker != ""
}

// checkThroughAPI proves every acknowledged write is readable through /get, on the shard
// the router names, with one of the values acknowledged for it.
//
// With exactLast, a key written by one worker only must hold that worker's last write.
// Not after a crash: a write in flight at the kill may have committed unacknowledged.
func checkThroughAPI(t *testing.T, base string, router routing.Router, acks *ackLog, exactLast bool) {
	t.Helper()
	for key, values := range acks.values {
		status, data, shard := getRecord(t, base, key)
		if status != http.StatusOK {
			t.Errorf("acknowledged key %s: GET answered %d", key, status)
			continue
		}
		if !values[data] && (exactLast || !inFlightAtCrash(acks, key, data)) {
			t.Errorf("key %s: stored value %q was never acknowledged", key, data)
		}
		if last, ok := lastIfOneWriter(values); exactLast && ok && data != last {
			t.Errorf("key %s: one worker wrote it in sequence, stored %q is not its last acknowledged write %q", key, data, last)
		}
		if want := router.ShardFor(key); shard != want || acks.shard[key] != want {
			t.Errorf("key %s: read from shard %d, acknowledged on %d, router says %d", key, shard, acks.shard[key], want)
		}
	}
}

// inFlightAtCrash tells whether an unacknowledged stored value can be a write that was
// committed but not yet answered when the server was killed: a worker sends its writes
// one after another, so that write must come after every write of the worker that was
// acknowledged.
func inFlightAtCrash(acks *ackLog, key, value string) bool {
	w, seq, ok := writer(value)
	return ok && strings.HasPrefix(value, key+":") && seq > acks.maxSeq[w]
}

// checkShardFiles opens the SQLite files directly: every acknowledged key sits in the file
// of the shard the router names, and in no other.
func checkShardFiles(t *testing.T, dataDir string, router routing.Router, acks *ackLog) {
	t.Helper()
	dbs := make([]*sql.DB, router.Shards())
	for i := range dbs {
		db, err := sql.Open(sqlite.DriverName, "file:"+sqlite.ShardFile(dataDir, i)+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		dbs[i] = db
	}
	total := 0
	for i, db := range dbs {
		var n int
		if err := db.QueryRow("SELECT count(*) FROM records").Scan(&n); err != nil {
			t.Fatalf("shard %d: %v", i, err)
		}
		total += n
	}
	for key, values := range acks.values {
		want := router.ShardFor(key)
		for i, db := range dbs {
			var data []byte
			err := db.QueryRow("SELECT data FROM records WHERE user_id = ?", key).Scan(&data)
			switch {
			case i == want && err != nil:
				t.Errorf("key %s missing from its shard file %d: %v", key, i, err)
			case i == want && !values[string(data)]:
				t.Errorf("key %s: file holds %q, never acknowledged", key, data)
			case i != want && err == nil:
				t.Errorf("key %s also found in shard file %d (router says %d)", key, i, want)
			case i != want && err != sql.ErrNoRows:
				t.Errorf("shard %d: %v", i, err)
			}
		}
	}
	if total != len(acks.values) {
		t.Errorf("shard files hold %d records, but %d keys were acknowledged", total, len(acks.values))
	}
}

// TestNothingLostNothingMisplaced runs a load against a 3-shard server, then proves every
// acknowledged write is readable and sits in exactly the shard file the router names, and
// still is after a clean restart on the same data directory.
func TestNothingLostNothingMisplaced(t *testing.T) {
	dataDir := t.TempDir()
	router, _ := routing.NewCRC32(3)
	srv := startServer(t, dataDir, "--mode", "sharded", "--shards", "3")
	acks := newAckLog()
	res := runLoad(t, context.Background(), srv.url, acks, 6000)
	if res.Errors != 0 {
		t.Fatalf("%d requests failed: %v", res.Errors, res.ErrorsByKind)
	}
	if len(acks.bad) > 0 {
		t.Fatal(strings.Join(acks.bad, "\n"))
	}
	if len(acks.values) < 500 {
		t.Fatalf("only %d keys written; the test would prove little", len(acks.values))
	}
	checkThroughAPI(t, srv.url, router, acks, true)
	if err := srv.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("clean shutdown failed: %v\n%s", err, srv.logs)
	}
	if !strings.Contains(srv.logs.String(), "stopped cleanly") {
		t.Errorf("no clean stop in the logs:\n%s", srv.logs)
	}
	checkShardFiles(t, dataDir, router, acks)

	// Restart on the same data directory: everything is still there.
	again := startServer(t, dataDir, "--mode", "sharded", "--shards", "3")
	checkThroughAPI(t, again.url, router, acks, true)
	if err := again.stop(syscall.SIGINT); err != nil {
		t.Fatalf("clean shutdown after SIGINT failed: %v", err)
	}
}

// TestCrashKeepsAcknowledgedWrites kills the server with SIGKILL in the middle of a load,
// restarts it, and checks that every write acknowledged before the kill is readable: with
// one commit per write, and with group commit, which acknowledges a write only after the
// commit holding it.
func TestCrashKeepsAcknowledgedWrites(t *testing.T) {
	for _, tt := range []struct {
		name  string
		extra []string
	}{
		{"commit per write", nil},
		{"group commit", []string{"--group-commit"}},
		{"group commit, sync full", []string{"--group-commit", "--sync", "full"}},
	} {
		t.Run(tt.name, func(t *testing.T) { crashKeepsAcknowledgedWrites(t, tt.extra) })
	}
}

func crashKeepsAcknowledgedWrites(t *testing.T, extra []string) {
	dataDir := t.TempDir()
	router, _ := routing.NewJump(3)
	args := append([]string{"--mode", "sharded", "--shards", "3", "--router", "jump"}, extra...)
	srv := startServer(t, dataDir, args...)
	acks := newAckLog()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		loadgen.Run(ctx, loadgen.Config{
			Target: srv.url, Duration: time.Minute, Concurrency: 16, WriteRatio: 1, Keys: 100000,
			Seed: 7, DataSize: 64, OnResult: acks.record, Timeout: 5 * time.Second,
		})
	}()
	// Kill once a fair number of writes were acknowledged.
	deadline := time.Now().Add(30 * time.Second)
	for {
		acks.mu.Lock()
		n := len(acks.values)
		acks.mu.Unlock()
		if n >= 1500 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d writes acknowledged in 30s", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	srv.stop(syscall.SIGKILL)
	cancel()
	<-loadDone
	if len(acks.bad) > 0 {
		t.Fatal(strings.Join(acks.bad, "\n"))
	}
	again := startServer(t, dataDir, args...)
	checkThroughAPI(t, again.url, router, acks, false)
	again.stop(syscall.SIGTERM)
	// Unacknowledged writes in flight at the kill may or may not be stored, so the files
	// may hold a few more records than were acknowledged; check placement key by key.
	checkShardFilesPlacement(t, dataDir, router, acks)
}

// checkShardFilesPlacement is checkShardFiles without the exact total.
func checkShardFilesPlacement(t *testing.T, dataDir string, router routing.Router, acks *ackLog) {
	t.Helper()
	for i := range router.Shards() {
		db, err := sql.Open(sqlite.DriverName, "file:"+sqlite.ShardFile(dataDir, i)+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		rows, err := db.Query("SELECT user_id FROM records")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var key string
			rows.Scan(&key)
			if want := router.ShardFor(key); want != i {
				t.Errorf("key %s found in shard file %d, router says %d", key, i, want)
			}
		}
		rows.Close()
		db.Close()
	}
}

// TestRestartWithOtherLayoutRefused: reopening a data directory with another shard count
// would strand records, so the server must refuse with a clear message.
func TestRestartWithOtherLayoutRefused(t *testing.T) {
	dataDir := t.TempDir()
	srv := startServer(t, dataDir, "--mode", "sharded", "--shards", "3")
	srv.stop(syscall.SIGTERM)
	cmd := exec.Command(filepath.Join(binDir, "demo-server"), "--mode", "sharded", "--shards", "4", "--data", dataDir, "--addr", "127.0.0.1:0")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("server started on a 3-shard directory with --shards 4:\n%s", out)
	}
	if !strings.Contains(string(out), "3 shards") || !strings.Contains(string(out), "asked for 4") {
		t.Errorf("unclear refusal:\n%s", out)
	}
}

func TestCommandsHelpAndBadFlags(t *testing.T) {
	for _, cmd := range builtCommands {
		out, err := exec.Command(filepath.Join(binDir, cmd), "--help").CombinedOutput()
		if err != nil || !strings.Contains(strings.ToLower(string(out)), "usage:") {
			t.Errorf("%s --help: err=%v\n%s", cmd, err, out)
		}
		c := exec.Command(filepath.Join(binDir, cmd), "--no-such-flag")
		out, err = c.CombinedOutput()
		if c.ProcessState == nil || c.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "no-such-flag") {
			t.Errorf("%s --no-such-flag: want exit 2 naming the flag, got %v\n%s", cmd, err, out)
		}
	}
	for _, args := range [][]string{
		{"--mode", "weird"}, {"--mode", "sharded", "--shards", "0"}, {"--router", "md5"},
		{"--sync", "sometimes"}, {"--mode", "single", "--shards", "3"},
		{"--backend", "postgres"}, {"--backend", "postgres", "--dsn", "postgres://x/y", "--shards", "2", "--mode", "sharded"},
		{"--backend", "postgres", "--dsn", "a", "--dsn", "b", "--create"}, {"--dsn", "postgres://x/y"},
		{"--backend", "postgres", "--dsn", "postgres://x/y", "--create", "--db-prefix", "Bad-Name"},
		{"--backend", "postgres", "--dsn", "postgres://x/y", "--reset"}, {"--counter", "tree"},
		{"--counter", "bucket", "--buckets", "0"}, {"--bucket-by", "moon"},
	} {
		// A free port and a deadline: should a bad flag be accepted, the server must not
		// hold the default port or hang the test.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		c := exec.CommandContext(ctx, filepath.Join(binDir, "demo-server"), append(args, "--data", t.TempDir(), "--addr", "127.0.0.1:0")...)
		out, _ := c.CombinedOutput()
		cancel()
		if c.ProcessState.ExitCode() != 2 {
			t.Errorf("demo-server %v: want exit 2, got %d\n%s", args, c.ProcessState.ExitCode(), out)
		}
	}
	for _, args := range [][]string{
		{"--writeRatio", "1.5"}, {"--concurrency", "0"}, {"--dist", "pareto"}, {"--target", "ftp://x"},
		{"--ops", "0"}, {"--keys", "0"}, {"--rate", "-1"},
	} {
		c := exec.Command(filepath.Join(binDir, "loadgen"), args...)
		out, _ := c.CombinedOutput()
		if c.ProcessState.ExitCode() != 2 {
			t.Errorf("loadgen %v: want exit 2, got %d\n%s", args, c.ProcessState.ExitCode(), out)
		}
	}
}
