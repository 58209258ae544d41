package netlab_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestNetlabTail runs the tail experiment small: two shard counts, two trials, and
// checks what it wrote: a row per shard count and query, the model beside the
// cross-shard rows only, every sample kept, and nothing left once it brought the
// network down again.
func TestNetlabTail(t *testing.T) {
	l := newLab(t)
	out := l.must("run", "tail", "--shard-counts", "2,1", "--trials", "2", "--count", "60", "--rows", "1000", "--preset", "cross-zone")
	dir := l.onlyRunDir("netlab-tail-")
	rows := readCSV(t, filepath.Join(dir, "results.csv"))
	if len(rows) != 4 {
		t.Fatalf("results.csv: %d rows, want 4 (2 shard counts x 2 queries):\n%s", len(rows), out)
	}
	num := func(r map[string]string, col string) float64 {
		t.Helper()
		v, err := strconv.ParseFloat(r[col], 64)
		if err != nil || v <= 0 {
			t.Errorf("%s shards %s: %s = %q, want a positive number", r["shards"], r["query"], col, r[col])
		}
		return v
	}
	for i, r := range rows {
		wantShards, wantQuery := []string{"2", "2", "1", "1"}[i], []string{"point", "cross", "point", "cross"}[i]
		if r["shards"] != wantShards || r["query"] != wantQuery || r["n"] != "120" || r["preset"] != "cross-zone" || r["jitter_host"] != "shard0" {
			t.Errorf("row %d: %v, want %s shards, %s, n=120", i, r, wantShards, wantQuery)
		}
		p50, p99, p999 := num(r, "p50_ms"), num(r, "p99_ms"), num(r, "p999_ms")
		if p50 > p99 || p99 > p999 {
			t.Errorf("row %d: p50 %v, p99 %v, p99.9 %v out of order", i, p50, p99, p999)
		}
		if lo, hi := num(r, "p99_trial_min_ms"), num(r, "p99_trial_max_ms"); lo > hi || p99 < lo || p99 > hi {
			t.Errorf("row %d: p99 %v outside its trials' range %v-%v", i, p99, lo, hi)
		}
		if r["query"] == "cross" {
			m50, m99 := num(r, "model_p50_ms"), num(r, "model_p99_ms")
			if m50 > m99 {
				t.Errorf("row %d: model p50 %v above its p99 %v", i, m50, m99)
			}
		} else if r["model_p50_ms"] != "" {
			t.Errorf("row %d: a point select has a model: %v", i, r)
		}
	}
	// Every sample is kept: per trial, through the proxy and straight to each shard.
	for _, name := range []string{"k2-point-t1", "k2-cross-t2", "k1-cross-t1", "k2-shard0-t1", "k2-shard1-t2", "k1-shard0-t2"} {
		data, err := os.ReadFile(filepath.Join(dir, "samples", name))
		if err != nil || len(strings.Fields(string(data))) != 60 {
			t.Errorf("samples/%s: %v, %d samples, want 60", name, err, len(strings.Fields(string(data))))
		}
	}
	checkRunTxt(t, dir, "command: scripts/netlab.sh run tail", "extra jitter: shard0", "delay lines' CPU:", "rtt_check: ok")
	l.checkNothingLeft()
}

func TestNetlabTailRefusesBadInput(t *testing.T) {
	state := t.TempDir()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--qps", "0"}, "--qps takes a positive whole number"},
		{[]string{"--trials", "0"}, "--trials takes a positive integer"},
		{[]string{"--rows", "many"}, "--rows takes a positive integer"},
		{[]string{"--shard-counts", "1,,2"}, "--shard-counts takes shard counts separated by commas"},
		{[]string{"--shard-counts", "1,17"}, "at most 16 shard hosts"},
		{[]string{"--jitter-host", "mw"}, "--jitter-host takes a shard host"},
		{[]string{"--shard-counts", "1,2", "--jitter-host", "shard2"}, "not among the 2 shard hosts"},
		{[]string{"--extra-jitter", "soon"}, "--extra-jitter takes a duration"},
		{[]string{"--clients", "2"}, "--clients is for run pgbench"},
		{[]string{"--routerbench-arg=--trials=1"}, "--routerbench-arg is for run routerbench"},
	} {
		args := append([]string{"run", "tail"}, tt.args...)
		cmd := exec.Command(filepath.Join("..", "..", "scripts", "netlab.sh"), append(args, "--state-dir", state)...)
		out, _ := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(out), tt.want) {
			t.Errorf("netlab.sh %v: exit %d, want 2 with %q\n%s", args, code, tt.want, out)
		}
	}
	cmd := exec.Command(filepath.Join("..", "..", "scripts", "netlab.sh"), "run", "pgbench", "--trials", "2", "--state-dir", state)
	if out, _ := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "--trials is for run tail") {
		t.Errorf("run pgbench --trials: %s", out)
	}
}

// TestNetlabRouterbench runs seed 004's experiment across two shard hosts, briefly, and
// checks that routerbench's report came out of it with the limit experiment's rows.
func TestNetlabRouterbench(t *testing.T) {
	l := newLab(t)
	l.must("run", "routerbench", "--preset", "cross-zone", "--routerbench-arg=--trials=1", "--routerbench-arg=--duration=1s",
		"--routerbench-arg=--orders=300", "--routerbench-arg=--warmup=0s", "--routerbench-arg=--concurrency=4")
	dir := l.onlyRunDir("netlab-routerbench-")
	rows := readCSV(t, filepath.Join(dir, "routerbench", "trials.csv"))
	configs := map[string]bool{}
	for _, r := range rows {
		configs[r["config"]] = true
		if r["errors"] != "0" {
			t.Errorf("routerbench errors: %v", r)
		}
	}
	for _, c := range []string{"direct-1db-1t", "router-2db-1t", "router-2db-2t"} {
		if !configs[c] {
			t.Errorf("trials.csv lacks %s: %v", c, configs)
		}
	}
	checkRunTxt(t, dir, "command: scripts/netlab.sh run routerbench", "rtt_check: ok", "mw->shard1 n=", "result: ok")
	l.checkNothingLeft()
}

// TestNetlabFaults runs the fault experiment short, with the proxy's dead-peer bounds
// turned down to seconds, and asserts what issue 24 asks of each fault: statements for
// the other shards keep succeeding; those for the faulty shard fail within a bound
// with an error naming it, or wait no longer than the bound; none hangs; after healing
// the shard answers again and nothing fails; every acknowledged write is read back, no
// two-shard transaction is torn, none is left in doubt; a client host that vanishes in
// a transaction loses its lock within the bound.
func TestNetlabFaults(t *testing.T) {
	l := newLab(t)
	const userTimeout = 4.0 // seconds; keepalive 1 s + 1 s x 3 = 4 s
	// --no-verify: what a fault does does not hang on the links' round trips, and a busy
	// machine cannot always hold the zone preset's 0.5 ms within its tolerance (a CI run
	// failed on 0.66 ms); they are still measured and recorded.
	out := l.must("run", "faults", "--preset", "zone", "--shards", "3", "--faults", "partition,oneway", "--hold", "7", "--settle", "6",
		"--two-phase", "--workers", "6", "--vanish-bound", "60", "--no-verify",
		"--proxy-arg=--tcp-user-timeout=4s", "--proxy-arg=--client-tcp-user-timeout=4s", "--proxy-arg=--tcp-keepalive-idle=1s", "--proxy-arg=--tcp-keepalive-interval=1s", "--proxy-arg=--tcp-keepalive-count=3")
	dir := l.onlyRunDir("netlab-faults-")
	rows := readCSV(t, filepath.Join(dir, "results.csv"))
	if len(rows) != 2 || rows[0]["fault"] != "partition" || rows[1]["fault"] != "oneway" {
		t.Fatalf("results.csv: %v\n%s", rows, out)
	}
	num := func(r map[string]string, col string) float64 {
		t.Helper()
		v, err := strconv.ParseFloat(r[col], 64)
		if err != nil {
			t.Fatalf("%s: %s = %q", r["fault"], col, r[col])
		}
		return v
	}
	for _, r := range rows {
		if r["shard"] != "ds_1" {
			t.Errorf("%s hit %s, want ds_1", r["fault"], r["shard"])
		}
		if num(r, "others_n") < 100 || num(r, "others_errors") != 0 {
			t.Errorf("%s: the other shards' statements during it: %s, %s errors; want them going on without error", r["fault"], r["others_n"], r["others_errors"])
		}
		if num(r, "faulty_errors") == 0 {
			t.Errorf("%s: no statement on the faulty shard failed in %s s (the bound is %v s)", r["fault"], r["duration_s"], userTimeout)
		}
		if num(r, "errors_naming_shard") != num(r, "faulty_errors") {
			t.Errorf("%s: %s of %s errors name ds_1: %s", r["fault"], r["errors_naming_shard"], r["faulty_errors"], r["errors"])
		}
		// A failing statement waits about the user timeout (one dead connection), or a
		// connect timeout when it needed a new one: bounded either way, well under the
		// hold when the bound is honoured.
		if fm := num(r, "fail_max_ms") / 1000; fm > 3*userTimeout+1 {
			t.Errorf("%s: a failing statement took %.1f s, bound %v s", r["fault"], fm, userTimeout)
		}
		if num(r, "hangs") != 0 {
			t.Errorf("%s: %s statements hung", r["fault"], r["hangs"])
		}
		if num(r, "recover_ms") <= 0 || num(r, "recover_ms") > 15000 {
			t.Errorf("%s: recovery took %s ms", r["fault"], r["recover_ms"])
		}
		if num(r, "after_recovery_n") == 0 || num(r, "after_recovery_errors") != 0 {
			t.Errorf("%s: after recovery %s statements, %s errors: want some, none failing (a pool left poisoned)", r["fault"], r["after_recovery_n"], r["after_recovery_errors"])
		}
	}
	checkRunTxt(t, dir, "lost=0 torn_pairs=0", "in doubt after healing (pg_prepared_xacts, every shard): 0", "rtt_check: ") // recorded, ok or not (--no-verify)
	raw, _ := os.ReadFile(filepath.Join(dir, "run.txt"))
	var s float64
	_, after, _ := strings.Cut(string(raw), "client vanished in a transaction holding a row lock: released after ")
	if _, err := fmt.Sscanf(after, "%f s", &s); err != nil || s > 3*userTimeout {
		t.Errorf("the vanished client's lock: %.1f s, %v (want released within %v s):\n%s", s, err, 3*userTimeout, raw)
	}
	l.checkNothingLeft()
}

// TestNetlabScenarios runs one of the lab's scenarios, quick, with its shards on the
// shard hosts: the rows come out for one shard and three, without errors, and each
// shard's database sits on a host of its own.
func TestNetlabScenarios(t *testing.T) {
	l := newLab(t)
	l.must("up", "--shards", "3", "--preset", "cross-zone")
	l.must("run", "scenarios", "--scenario-arg=--quick", "--scenario-arg=--only=read_heavy_cachelike", "--scenario-arg=--no-report")
	dir := l.onlyRunDir("netlab-scenarios-")
	csvs, _ := filepath.Glob(filepath.Join(dir, "scenarios", "*", "results.csv"))
	if len(csvs) != 1 {
		t.Fatalf("scenario results: %v", csvs)
	}
	rows := readCSV(t, csvs[0])
	modes := map[string]bool{}
	for _, r := range rows {
		modes[r["mode"]+r["shards"]] = true
		if r["errors"] != "0" || r["backend"] != "postgres" {
			t.Errorf("row %v", r)
		}
	}
	if !modes["single1"] || !modes["sharded3"] {
		t.Errorf("modes %v, want single 1 and sharded 3", modes)
	}
	// The three shards' databases, one a host.
	for i := range 3 {
		out := l.must("exec", fmt.Sprintf("shard%d", i), "--", "psql", shardDSN(i, 5433), "-X", "-At", "-c",
			"SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database WHERE datname LIKE 'shardlab_lab_s3_%'")
		if got, want := strings.TrimSpace(out), fmt.Sprintf("shardlab_lab_s3_%d", i); got != want {
			t.Errorf("shard%d holds %q, want %s only", i, got, want)
		}
	}
	checkRunTxt(t, dir, "command: scripts/netlab.sh run scenarios", "rtt_check: ok", "result: ok")
	l.must("down")
	l.checkNothingLeft()
}

// TestNetlabSweep runs seed 001's proxy sweep tiny across three hosts: every target
// answers; the direct runs cross one shaped link and the middleware's two, so their
// latency is at least one and two round trips of the preset; the sweep drops the
// databases it made on shard0, and refuses a server that has one of them already.
func TestNetlabSweep(t *testing.T) {
	l := newLab(t)
	l.must("up", "--shards", "1", "--preset", "zone")
	tiny := []string{"--sweep-arg=--trials=1", "--sweep-arg=--time=2s", "--sweep-arg=--warmup=1s", "--sweep-arg=--threads=4",
		"--sweep-arg=--tables=1", "--sweep-arg=--table-size=500", "--sweep-arg=--workloads=oltp_point_select",
		"--sweep-arg=--pgbench-clients=2", "--sweep-arg=--pool-size=3"}
	l.must(append([]string{"run", "sweep"}, tiny...)...)
	dir := l.onlyRunDir("netlab-sweep-")
	rows := readCSV(t, filepath.Join(dir, "sweep", "results.csv"))
	if len(rows) != 8 {
		t.Fatalf("results.csv has %d rows, want 4 sysbench and 4 pgbench targets: %v", len(rows), rows)
	}
	const rttMS = 0.4 // the zone preset's 0.5 ms, less its jitter and the measuring's slack
	for _, r := range rows {
		tps, _ := strconv.ParseFloat(r["tps"], 64)
		p95, _ := strconv.ParseFloat(r["p95_ms"], 64)
		if r["status"] != "ok" || tps <= 0 {
			t.Errorf("%s %s: status %q, %s tps", r["suite"], r["target"], r["status"], r["tps"])
			continue
		}
		links := 2.0
		if r["target"] == "direct" {
			links = 1
		}
		if p95 < links*rttMS {
			t.Errorf("%s %s: p95 %.3f ms, below %v shaped round trips: the traffic did not cross the hosts", r["suite"], r["target"], p95, links)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "sweep", "logs", "t1_oltp_point_select_4_direct.txt"))
	if err != nil || !strings.Contains(string(b), "ip netns exec "+l.nsPrefix()+"client sysbench") {
		t.Errorf("the direct run's sysbench did not run on the client host (%v):\n%.300s", err, b)
	}
	if _, err := os.Stat(filepath.Join(dir, "sweep", "report.md")); err != nil {
		t.Error(err)
	}
	checkRunTxt(t, dir, "command: scripts/netlab.sh run sweep", "rtt_check: ok", "mw->shard0 n=", "delay lines' CPU:", "result: ok")
	dbs := func() string {
		return l.must("exec", "shard0", "--", "psql", "-X", "-At", "-h", "198.18.0.10", "-p", "5433", "-U", "postgres",
			"-c", "SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database WHERE datname IN ('direct', 'sharded')")
	}
	if got := strings.TrimSpace(dbs()); got != "" {
		t.Errorf("the sweep left databases %q on shard0", got)
	}
	l.must("exec", "shard0", "--", "psql", "-X", "-q", "-h", "198.18.0.10", "-p", "5433", "-U", "postgres", "-c", "CREATE DATABASE direct")
	code, out := l.script(append([]string{"run", "sweep"}, tiny...)...)
	if code != 1 || !strings.Contains(out, `already has a database "direct"`) {
		t.Errorf("a sweep on a server with a database direct: exit %d, want 1 naming it\n%s", code, out)
	}
	if got := strings.TrimSpace(dbs()); got != "direct" {
		t.Errorf("after the refused sweep shard0 has %q, want the database it had (direct) and nothing more", got)
	}
	code, out = l.script("run", "sweep", "--sweep-arg=--threads=eight")
	if code != 2 || !strings.Contains(out, "positive integers") {
		t.Errorf("--sweep-arg=--threads=eight: exit %d, want 2 saying why\n%s", code, out)
	}
	if dirs, _ := filepath.Glob(filepath.Join(l.runsDir, "netlab-sweep-*")); len(dirs) != 2 {
		t.Errorf("run directories %v: want the first sweep's and the refused server's, none for the refused flag", dirs)
	}
}
