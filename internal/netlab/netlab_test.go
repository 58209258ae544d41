package netlab_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// EnvRequire, when 1, turns the skip for a machine without network namespaces into a
// failure. CI sets it: there the lab must be tested.
const EnvRequire = "SHARDLAB_REQUIRE_NETNS"

// requireNetns skips (or fails under EnvRequire) unless this process can build the lab:
// root, the tools, PostgreSQL's server programs and a namespace it can actually create.
func requireNetns(t *testing.T) {
	t.Helper()
	skip := func(format string, args ...any) {
		t.Helper()
		msg := "netlab: " + fmt.Sprintf(format, args...)
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("%s (%s=1 forbids skipping)", msg, EnvRequire)
		}
		t.Skip(msg)
	}
	if os.Geteuid() != 0 {
		skip("needs root to create network namespaces, veth pairs, qdiscs and nftables tables; run the tests as root (CI does)")
	}
	for _, prog := range []string{"ip", "nft", "tc", "curl", "ping", "runuser", "setsid", "flock", "psql", "pgbench", "go"} {
		if _, err := exec.LookPath(prog); err != nil {
			skip("%s is not installed (.ci/run installs what the lab needs)", prog)
		}
	}
	bin := pgBinDir()
	for _, prog := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(bin, prog)); err != nil {
			skip("PostgreSQL server programs not found (%v); install postgresql-15 or set SHARDLAB_PG_BINDIR", err)
		}
	}
	if _, err := user.Lookup("postgres"); err != nil {
		skip("no \"postgres\" OS user to run the shard hosts' clusters as: %v", err)
	}
	probe := "nl-probe-" + randomHex(4)
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		skip("cannot create a network namespace here (a container without CAP_SYS_ADMIN?): %v: %s", err, out)
	}
	exec.Command("ip", "netns", "delete", probe).Run()
}

func pgBinDir() string {
	if dir := os.Getenv("SHARDLAB_PG_BINDIR"); dir != "" {
		return dir
	}
	return "/usr/lib/postgresql/15/bin"
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds the programs the lab runs once per test binary, into a directory
// removed by TestMain.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "shardlab-netlab-bin")
		if buildErr != nil {
			return
		}
		// The shard hosts run these as root from inside their namespaces; postgres never
		// needs them.
		cmd := exec.Command("go", "build", "-o", binDir+"/", "../../cmd/netprobe", "../../cmd/delayline", "../../cmd/shard-proxy", "../../cmd/routerbench", "../../cmd/faultload", "../../cmd/proxysweep")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// lab is one network of the lab, named uniquely, with its state and runs in
// directories of the test's own.
type lab struct {
	t        *testing.T
	name     string
	stateDir string // --state-dir
	runsDir  string
	bin      string
}

func newLab(t *testing.T) *lab {
	t.Helper()
	return newLabNamed(t, "t"+randomHex(4))
}

// newLabNamed is newLab with the lab's name given: two labs of one name have their state
// in two directories.
func newLabNamed(t *testing.T, name string) *lab {
	t.Helper()
	requireNetns(t)
	// The clusters run as postgres, which must pass through the state directory's parent:
	// not t.TempDir(), whose parent only the test's user may enter. A space and a quote
	// in its name check that the script quotes the path wherever it uses it (traps
	// included).
	state, err := os.MkdirTemp("", "shardlab netlab's state")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(state, 0o711); err != nil {
		t.Fatal(err)
	}
	if state, err = filepath.EvalSymlinks(state); err != nil {
		t.Fatal(err)
	}
	l := &lab{t: t, name: name, stateDir: state, runsDir: t.TempDir(), bin: binaries(t)}
	t.Cleanup(func() {
		// Whatever the test did, nothing may be left: down, then check.
		if code, out := l.script("down"); code != 0 {
			t.Errorf("down at the end of the test: exit %d\n%s", code, out)
		}
		l.checkNothingLeft()
		os.RemoveAll(state)
	})
	return l
}

// command returns scripts/netlab.sh with args and the lab's own options.
func (l *lab) command(ctx context.Context, args ...string) *exec.Cmd {
	opts := []string{"--lab", l.name, "--state-dir", l.stateDir, "--bin-dir", l.bin, "--runs-dir", l.runsDir}
	// exec's command goes last, after "--".
	if i := slices.Index(args, "--"); i >= 0 {
		args = slices.Concat(args[:i], opts, args[i:])
	} else {
		args = append(args, opts...)
	}
	cmd := exec.CommandContext(ctx, filepath.Join("..", "..", "scripts", "netlab.sh"), args...)
	// A proxy in the environment, which nothing of the lab may use: the delay lines' API
	// is inside the hosts, where this address cannot be reached.
	cmd.Env = append(os.Environ(), "TMPDIR="+l.t.TempDir(), "http_proxy="+deadProxy, "https_proxy="+deadProxy,
		"ALL_PROXY="+deadProxy, "all_proxy="+deadProxy, "no_proxy=", "NO_PROXY=")
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// script runs scripts/netlab.sh to the end and returns its exit status and output.
func (l *lab) script(args ...string) (int, string) {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := l.command(ctx, args...)
	out, err := cmd.CombinedOutput()
	if err != nil && cmd.ProcessState == nil {
		l.t.Fatalf("netlab.sh %v: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// must runs scripts/netlab.sh and fails the test unless it succeeds; it returns stdout
// and stderr together.
func (l *lab) must(args ...string) string {
	l.t.Helper()
	code, out := l.script(args...)
	if code != 0 {
		l.t.Fatalf("netlab.sh %v: exit %d\n%s", args, code, out)
	}
	return out
}

// probe runs netprobe inside host and returns its output line.
func (l *lab) probe(host string, args ...string) string {
	l.t.Helper()
	out := l.must(append([]string{"exec", host, "--", filepath.Join(l.bin, "netprobe")}, args...)...)
	return strings.TrimSpace(out)
}

// medianMS reads median_ms from netprobe's sql line.
func medianMS(t *testing.T, line string) float64 {
	t.Helper()
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "median_ms="); ok {
			ms, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("median_ms in %q: %v", line, err)
			}
			return ms
		}
	}
	t.Fatalf("no median_ms in %q", line)
	return 0
}

func shardDSN(i, port int) string {
	return fmt.Sprintf("postgres://postgres@198.18.0.%d:%d/postgres?sslmode=disable&connect_timeout=5", 10+i, port)
}

// deadProxy is an HTTP proxy that is not there (TEST-NET-1, RFC 5737).
const deadProxy = "http://192.0.2.1:9"

// nsPrefix is how the lab's namespaces are named: nl-NAME-ID-, ID the first eight hex
// digits of the SHA-256 of its state directory's path (docs/netlab.md).
func (l *lab) nsPrefix() string {
	sum := sha256.Sum256([]byte(l.stateDir + "/" + l.name))
	return "nl-" + l.name + "-" + hex.EncodeToString(sum[:])[:8] + "-"
}

// namespaces lists the lab's namespaces; those of another lab of the same name (in
// another state directory) are not among them.
func (l *lab) namespaces() []string {
	l.t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		l.t.Fatalf("ip netns list: %v", err)
	}
	var ours []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], l.nsPrefix()) {
			ours = append(ours, f[0])
		}
	}
	return ours
}

// ourProcesses lists the processes whose command line names the lab's state directory:
// its clusters, delay lines and proxies.
func (l *lab) ourProcesses() []string {
	l.t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		l.t.Fatal(err)
	}
	var found []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		cmdline := string(bytes.ReplaceAll(raw, []byte{0}, []byte{' '}))
		if strings.Contains(cmdline, l.stateDir+"/") {
			found = append(found, e.Name()+": "+cmdline)
		}
	}
	return found
}

// checkNothingLeft checks that no namespace, process or state of the lab remains, and
// that the machine's own namespace got no nftables table of the lab's.
func (l *lab) checkNothingLeft() {
	l.t.Helper()
	if ns := l.namespaces(); len(ns) > 0 {
		l.t.Errorf("namespaces left: %v", ns)
	}
	// Processes end a moment after their namespace is deleted.
	var procs []string
	for range 50 {
		if procs = l.ourProcesses(); len(procs) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(procs) > 0 {
		l.t.Errorf("processes left:\n%s", strings.Join(procs, "\n"))
	}
	if entries, err := os.ReadDir(l.stateDir); err != nil || len(entries) > 0 {
		l.t.Errorf("state left in %s: %v (%v)", l.stateDir, entries, err)
	}
	if out, err := exec.Command("nft", "list", "tables").CombinedOutput(); err != nil {
		l.t.Errorf("nft list tables: %v: %s", err, out)
	} else if strings.Contains(string(out), "netlab") {
		l.t.Errorf("an nftables table of the lab in the machine's own namespace:\n%s", out)
	}
}

// readCSV reads a run's CSV file into maps keyed by its header.
func readCSV(t *testing.T, path string) []map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	records, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var rows []map[string]string
	for _, rec := range records[1:] {
		row := map[string]string{}
		for i, h := range records[0] {
			row[h] = rec[i]
		}
		rows = append(rows, row)
	}
	return rows
}

// onlyRunDir returns the one run directory under the lab's runs directory whose name
// starts with prefix.
func (l *lab) onlyRunDir(prefix string) string {
	l.t.Helper()
	matches, _ := filepath.Glob(filepath.Join(l.runsDir, prefix+"*"))
	if len(matches) != 1 {
		l.t.Fatalf("run directories %s*: %v, want one", prefix, matches)
	}
	return matches[0]
}

// TestNetlab brings a network of two shard hosts up at the cross-zone preset (2 ms round
// trips: far enough above the machine's own noise to be told apart), checks that a shard
// answers mw only through the shaped path and with the preset's round trip, partitions a
// shard host and heals it, runs both experiments, and takes it all down.
func TestNetlab(t *testing.T) {
	l := newLab(t)
	out := l.must("up", "--shards", "2", "--preset", "cross-zone")
	if !strings.Contains(out, "lab "+l.name+" is up") {
		t.Errorf("up did not say the lab is up:\n%s", out)
	}
	for _, host := range []string{"sw", "client", "mw", "shard0", "shard1"} {
		if want := l.nsPrefix() + host; !slices.Contains(l.namespaces(), want) {
			t.Errorf("no namespace %s after up (have %v)", want, l.namespaces())
		}
	}
	if st := l.must("status"); !strings.Contains(st, "shard1   198.18.0.11") || !strings.Contains(st, "preset=cross-zone") {
		t.Errorf("status:\n%s", st)
	}

	// The shaped path: mw reaches shard0 through its delay line with about the preset's
	// round trip (as the script's own check, 25% either way, taking the best of three
	// measurements since the machine is shared), while on shard0 itself the same
	// statement takes a fraction of it: the delay is in the network, not the server.
	var shaped float64
	for range 3 {
		shaped = medianMS(t, l.probe("mw", "sql", "--count", "100", shardDSN(0, 5432)))
		if shaped >= 1.5 && shaped <= 2.5 {
			break
		}
	}
	if shaped < 1.5 || shaped > 2.5 {
		t.Errorf("SELECT 1 from mw to shard0 through the shaped path: median %.3f ms, want 2 ms ± 25%%", shaped)
	}
	if local := medianMS(t, l.probe("shard0", "sql", "--count", "100", shardDSN(0, 5433))); local > shaped/2 {
		t.Errorf("SELECT 1 on shard0 itself: median %.3f ms, not well below the shaped %.3f ms", local, shaped)
	}
	// Only through the shaped path: PostgreSQL's own port answers its host alone.
	if got := l.probe("mw", "dial", "--timeout", "2s", "198.18.0.10:5433"); got != "refused" {
		t.Errorf("mw dialing shard0's PostgreSQL port directly: %s, want refused", got)
	}
	if got := l.probe("shard0", "dial", "--timeout", "2s", "198.18.0.10:5433"); got != "answered" {
		t.Errorf("shard0 dialing its own PostgreSQL port: %s, want answered", got)
	}
	// Nothing outside the lab's addresses: no route, and no packet leaves.
	if got := l.probe("mw", "dial", "--timeout", "2s", "198.18.1.1:5432"); got != "unreachable" {
		t.Errorf("mw dialing an address outside the lab: %s, want unreachable", got)
	}

	// A partition drops packets without a reset: a connection times out, and the other
	// shard still answers.
	l.must("fault", "partition", "shard1")
	if got := l.probe("mw", "dial", "--timeout", "2s", "198.18.0.11:5432"); got != "timeout" {
		t.Errorf("mw dialing shard1 across a partition: %s, want timeout", got)
	}
	if got := l.probe("shard1", "dial", "--timeout", "1s", "198.18.0.3:6432"); got != "timeout" {
		t.Errorf("shard1 dialing mw across a partition: %s, want timeout", got)
	}
	// shard0 still answers, through its shaped path: the preset's round trip, not a
	// fraction of it (a path around the delay line) nor a wait for retransmissions.
	if line := l.probe("mw", "sql", "--count", "20", shardDSN(0, 5432)); medianMS(t, line) < 1.5 || medianMS(t, line) > 5 {
		t.Errorf("shard0 during shard1's partition: %s, want a median of about 2 ms", line)
	}
	if st := l.must("status"); !strings.Contains(st, "FAULTS: partition") {
		t.Errorf("status does not show the partition:\n%s", st)
	}
	l.must("fault", "heal", "shard1")
	if got := l.probe("mw", "dial", "--timeout", "2s", "198.18.0.11:5432"); got != "answered" {
		t.Errorf("mw dialing shard1 after heal: %s, want answered", got)
	}
	if m := medianMS(t, l.probe("mw", "sql", "--count", "20", shardDSN(1, 5432))); m < 1.5 {
		t.Errorf("shard1 after heal: median %.3f ms, want the preset's 2 ms again", m)
	}

	// The ping experiment: every link measured, and the run recorded.
	l.must("run", "ping", "--count", "20")
	dir := l.onlyRunDir("netlab-ping-")
	rows := readCSV(t, filepath.Join(dir, "rtt.csv"))
	links := map[string]bool{}
	for _, r := range rows {
		links[r["link"]+" "+r["probe"]] = true
		if r["n"] != "20" {
			t.Errorf("rtt.csv row %v: n = %s, want 20", r, r["n"])
		}
	}
	for _, want := range []string{"client-mw icmp", "mw-shard0 icmp", "mw-shard1 sql-shaped", "shard1-local sql-local"} {
		if !links[want] {
			t.Errorf("rtt.csv has no row for %s: %v", want, rows)
		}
	}
	checkRunTxt(t, dir, "command: scripts/netlab.sh run ping", "preset=cross-zone", "mw-shard0 sql-shaped: median")

	// The pgbench experiment through shard-proxy on mw, with the CPU it costs. While it
	// runs, a second run and a down are refused (they would take its proxy's port, or
	// the network, from under it); when it ends, its proxy has ended too.
	var runOut bytes.Buffer
	run := l.command(context.Background(), "run", "pgbench", "--clients", "2", "--time", "3")
	run.Stdout, run.Stderr = &runOut, &runOut
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	proxyPid := filepath.Join(l.stateDir, l.name, "mw", "shard-proxy.pid")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(proxyPid); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run pgbench never started its proxy:\n%s", runOut.String())
		}
	}
	for _, args := range [][]string{{"run", "pgbench", "--clients", "1", "--time", "1"}, {"down"}} {
		if code, out := l.script(args...); code != 1 || !strings.Contains(out, "wait for it") {
			t.Errorf("netlab.sh %v during a run: exit %d, want 1 and a refusal\n%s", args, code, out)
		}
	}
	if err := run.Wait(); err != nil {
		t.Fatalf("run pgbench: %v\n%s", err, runOut.String())
	}
	out = runOut.String()
	for _, p := range l.ourProcesses() {
		if strings.Contains(p, "shard-proxy") {
			t.Errorf("run pgbench ended and left its proxy running: %s", p)
		}
	}
	if _, err := os.Stat(proxyPid); err == nil {
		t.Errorf("run pgbench ended and left %s", proxyPid)
	}
	dir = l.onlyRunDir("netlab-pgbench-")
	rows = readCSV(t, filepath.Join(dir, "results.csv"))
	if len(rows) != 1 {
		t.Fatalf("results.csv: %d rows, want 1:\n%s", len(rows), out)
	}
	r := rows[0]
	if r["status"] != "ok" || r["failed"] != "0" || r["preset"] != "cross-zone" || r["shards"] != "2" {
		t.Errorf("results.csv row: %v", r)
	}
	for _, col := range []string{"tps", "proxy_cpu_us_per_tx", "delayline_cpu_us_per_tx"} {
		if v, err := strconv.ParseFloat(r[col], 64); err != nil || v <= 0 {
			t.Errorf("results.csv %s = %q, want a positive number", col, r[col])
		}
	}
	checkRunTxt(t, dir, "command: scripts/netlab.sh run pgbench", "rtt_check: ok", "mw->shard1 n=", "client->mw->shard(proxy) n=")

	out = l.must("down")
	if !strings.Contains(out, "lab "+l.name+" is down") {
		t.Errorf("down:\n%s", out)
	}
	l.checkNothingLeft()
	if out := l.must("down"); !strings.Contains(out, "nothing to tear down") {
		t.Errorf("a second down:\n%s", out)
	}
}

func checkRunTxt(t *testing.T, dir string, wants ...string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "run.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range append(wants, "finished: ", "machine_cpu_s: ") {
		if !strings.Contains(string(raw), want) {
			t.Errorf("%s/run.txt lacks %q:\n%s", filepath.Base(dir), want, raw)
		}
	}
}

// startUp starts "up" in the background and waits until cond holds (polled), failing
// the test if up ends first.
func (l *lab) startUp(cond func() bool, what string) *exec.Cmd {
	l.t.Helper()
	cmd := l.command(context.Background(), "up", "--shards", "2", "--preset", "rack", "--no-verify")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			l.t.Fatalf("up never got to %s:\n%s", what, out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cmd
}

// TestNetlabCleansUpAfterInterruptAndCrash: an up interrupted with Ctrl-C tears down
// what it built before it exits, even when Ctrl-C is pressed again and again while it
// does; after an up killed outright, the next up cleans the leftovers before it starts,
// and down leaves nothing.
func TestNetlabCleansUpAfterInterruptAndCrash(t *testing.T) {
	l := newLab(t)

	// Interrupted once the clusters run, so that the teardown has clusters to stop and
	// takes a while: SIGINT every 20 ms until the script ends.
	pgPid := filepath.Join(l.stateDir, l.name, "shard1", "data", "postmaster.pid")
	cmd := l.startUp(func() bool { _, err := os.Stat(pgPid); return err == nil }, "its clusters")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	interrupts := 0
interrupting:
	for {
		if err := cmd.Process.Signal(syscall.SIGINT); err == nil {
			interrupts++
		}
		select {
		case err = <-done:
			break interrupting
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err == nil {
		t.Fatalf("up went on after SIGINT:\n%s", cmd.Stdout)
	}
	if interrupts < 3 {
		t.Errorf("up ended after %d interrupts: the test did not interrupt its teardown", interrupts)
	}
	l.checkNothingLeft()

	// A crash once the shard hosts' clusters run (the delay lines start after them):
	// SIGKILL gives the script no chance to clean up.
	pidFile := filepath.Join(l.stateDir, l.name, "mw", "delayline.pid")
	cmd = l.startUp(func() bool { _, err := os.Stat(pidFile); return err == nil }, "its delay lines")
	cmd.Process.Kill()
	cmd.Wait()
	if len(l.namespaces()) == 0 || len(l.ourProcesses()) == 0 {
		t.Fatalf("nothing left after the crash to clean up (namespaces %v): the test tests nothing", l.namespaces())
	}
	out := l.must("up", "--shards", "1", "--preset", "rack", "--no-verify")
	if !strings.Contains(out, "cleaning up what an earlier run left behind") {
		t.Errorf("up after a crash did not say it cleaned up:\n%s", out)
	}
	if ns := l.namespaces(); len(ns) != 4 {
		t.Errorf("namespaces after up --shards 1: %v, want sw, client, mw, shard0", ns)
	}
	l.must("down")
	l.checkNothingLeft()
}

// TestNetlabLabsAreApart: two labs of one name with their state in two directories
// are two networks: each comes up beside the other, and down of one leaves the other
// up.
func TestNetlabLabsAreApart(t *testing.T) {
	name := "t" + randomHex(4)
	a, b := newLabNamed(t, name), newLabNamed(t, name)
	a.must("up", "--shards", "1", "--preset", "rack", "--no-verify")
	b.must("up", "--shards", "1", "--preset", "rack", "--no-verify")
	if len(a.namespaces()) != 4 || len(b.namespaces()) != 4 {
		t.Fatalf("namespaces: %v and %v, want four each", a.namespaces(), b.namespaces())
	}
	b.must("down")
	b.checkNothingLeft()
	if ns := a.namespaces(); len(ns) != 4 {
		t.Errorf("the other lab's down took namespaces of this one: %v left", ns)
	}
	if st := a.must("status"); !strings.Contains(st, "postgres :5433 (running)") {
		t.Errorf("status after the other lab's down:\n%s", st)
	}
	if got := a.probe("mw", "dial", "--timeout", "2s", "198.18.0.10:5432"); got != "answered" {
		t.Errorf("mw dialing shard0 after the other lab's down: %s", got)
	}
}

// TestNetlabLeavesOtherDirectoriesAlone: a --state-dir and --lab that name a directory
// up did not make (--state-dir / --lab usr would name /usr) have it left as it is by
// up and down alike, and the state directory's own mode is kept (it may be /tmp).
func TestNetlabLeavesOtherDirectoriesAlone(t *testing.T) {
	requireNetns(t)
	root := t.TempDir()
	if err := os.Chmod(root, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(root, "usr", "keep")
	if err := os.MkdirAll(keep, 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join("..", "..", "scripts", "netlab.sh")
	// Should up build a lab there after all, it must not outlive the test. (The
	// directory stays: it is the test's own, the check above is what the test is about.)
	t.Cleanup(func() {
		if err := os.WriteFile(filepath.Join(root, "usr", "lab.env"), []byte("lab=usr\n"), 0o644); err == nil {
			exec.Command(script, "down", "--lab", "usr", "--state-dir", root).Run()
		}
	})
	for _, args := range [][]string{
		{"down", "--lab", "usr", "--state-dir", root},
		{"up", "--lab", "usr", "--state-dir", root, "--bin-dir", binaries(t), "--shards", "1", "--no-verify"},
		{"down", "--lab", "usr", "--state-dir", root},
	} {
		out, _ := exec.Command(script, args...).CombinedOutput()
		if _, err := os.Stat(keep); err != nil {
			t.Fatalf("netlab.sh %v removed a directory it did not make: %v\n%s", args, err, out)
		}
	}
	if fi, err := os.Stat(root); err != nil || fi.Mode()&(os.ModePerm|os.ModeSticky) != 0o777|os.ModeSticky {
		t.Errorf("the state directory's mode after up and down: %v (%v), want drwxrwxrwt", fi.Mode(), err)
	}
	cmd := exec.Command(script, "down", "--state-dir", "/")
	out, _ := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(out), "--state-dir /") {
		t.Errorf("down --state-dir /: exit %d, want 2 and a refusal\n%s", code, out)
	}
}

// TestNetlabRefusesBadInput: mistakes get a clear message and exit status 2 before
// anything is built. It needs no root.
func TestNetlabRefusesBadInput(t *testing.T) {
	state := t.TempDir()
	tests := []struct {
		args []string
		want string
	}{
		{nil, "Usage: scripts/netlab.sh"},
		{[]string{"launch"}, "unknown command 'launch'"},
		{[]string{"up", "--shards", "0"}, "--shards takes 1 to 16"},
		{[]string{"up", "--shards", "17"}, "--shards takes 1 to 16"},
		{[]string{"up", "--shards"}, "--shards needs a value"},
		{[]string{"up", "--preset", "moon"}, "unknown preset 'moon'"},
		{[]string{"up", "--rtt", "2ms", "--delay", "1ms"}, "--rtt and --delay exclude each other"},
		{[]string{"up", "--delay", "soon"}, "--delay takes a duration"},
		{[]string{"up", "--jitter", "-1ms"}, "--jitter takes a duration"},
		{[]string{"up", "--loss", "101"}, "--loss takes a percentage from 0 to 100"},
		{[]string{"up", "--rate", "fast"}, "--rate takes a rate"},
		{[]string{"up", "--lab", "Not_OK"}, "--lab takes 1 to 12 characters"},
		{[]string{"up", "--clients", "4"}, "--clients is for run"},
		{[]string{"up", "extra"}, "up takes no arguments"},
		{[]string{"down", "--preset", "zone"}, "--preset is for up"},
		{[]string{"run"}, "run takes one experiment"},
		{[]string{"run", "dance"}, "unknown experiment 'dance'"},
		{[]string{"run", "ping", "--clients", "4"}, "--clients is for run pgbench"},
		{[]string{"run", "pgbench", "--count", "4"}, "--count is for run ping"},
		{[]string{"run", "pgbench", "--mode", "turbo"}, "--mode takes simple, extended or prepared"},
		{[]string{"run", "pgbench", "--time", "0"}, "--time takes a positive integer"},
		{[]string{"fault", "partition"}, "fault takes a kind and a host"},
		{[]string{"exec", "mw"}, "give the command after --"},
		{[]string{"up", "--frobnicate"}, "unknown option --frobnicate"},
	}
	for _, tt := range tests {
		cmd := exec.Command(filepath.Join("..", "..", "scripts", "netlab.sh"), append(tt.args, "--state-dir", state)...)
		if tt.args == nil {
			cmd = exec.Command(filepath.Join("..", "..", "scripts", "netlab.sh"))
		}
		out, _ := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(out), tt.want) {
			t.Errorf("netlab.sh %v: exit %d, want 2 with %q\n%s", tt.args, code, tt.want, out)
		}
	}
	cmd := exec.Command(filepath.Join("..", "..", "scripts", "netlab.sh"), "--help")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Usage: scripts/netlab.sh") || !strings.Contains(string(out), "cross-region") {
		t.Errorf("--help: %v\n%s", err, out)
	}
	// Nothing refused, nor --help, left a file behind.
	if entries, _ := os.ReadDir(state); len(entries) > 0 {
		t.Errorf("refused commands wrote into the state directory: %v", entries)
	}
}
