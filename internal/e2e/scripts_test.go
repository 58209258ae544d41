package e2e_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/lab/resultscsv"
)

// labScripts are the scripts (and what they read) that scriptRoot links.
var labScripts = []string{"lib.sh", "run_scenario.sh", "run_all_scenarios.sh", "sweep.sh", "http_ceiling.sh",
	"promote.sh", "blockbench_sweep.sh", "scenarios.conf"}

// scriptRoot lays out a throwaway lab root for the scenario scripts: scripts/ links to
// the real scripts and bin/ holds the binaries TestMain built, so the runs below use
// --no-build and never touch the working tree's bin/ or results/.
func scriptRoot(t *testing.T) string {
	t.Helper()
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, dir := range []string{"scripts", "bin"} {
		if err := os.Mkdir(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range labScripts {
		if err := os.Symlink(filepath.Join(repo, "scripts", name), filepath.Join(root, "scripts", name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range builtCommands {
		if err := os.Symlink(filepath.Join(binDir, name), filepath.Join(root, "bin", name)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// script runs a scenario script with its stdin closed and returns its exit code and output.
func script(t *testing.T, root, name string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(root, "scripts", name), args...)
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil && cmd.ProcessState == nil {
		t.Fatalf("%s: %v", name, err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

func TestRunScenarioSmoke(t *testing.T) {
	root := scriptRoot(t)
	tmp := t.TempDir()
	out := filepath.Join(tmp, "r.csv")
	tsDir := filepath.Join(tmp, "ts")
	common := []string{"--ops", "3000", "--concurrency", "8", "--writeRatio", "0.5", "--out", out,
		"--timeseries-dir", tsDir, "--run-id", "smoke", "--no-build"}

	code, output := script(t, root, "run_scenario.sh", append(common, "--shards", "2")...)
	if code != 0 {
		t.Fatalf("run_scenario.sh --shards 2: exit %d\n%s", code, output)
	}
	rows, err := resultscsv.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("%d rows after one run, want 1", len(rows))
	}
	if r := rows[0]; r.Mode != "sharded" || r.Shards != 2 || r.Ops != 3000 || r.Errors != 0 || r.Concurrency != 8 || r.WriteRatio != 0.5 || r.RunID != "smoke" || r.Trial != 1 {
		t.Errorf("row after --shards 2: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(tsDir, "smoke", "adhoc_sharded_2_t1.csv")); err != nil {
		t.Errorf("no per-second samples file: %v", err)
	}

	code, output = script(t, root, "run_scenario.sh", append(common, "--shards", "1")...)
	if code != 0 {
		t.Fatalf("run_scenario.sh --shards 1: exit %d\n%s", code, output)
	}
	rows, err = resultscsv.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("%d rows after two runs, want 2", len(rows))
	}
	if r := rows[1]; r.Mode != "single" || r.Shards != 1 || r.Ops != 3000 || r.Errors != 0 {
		t.Errorf("row after --shards 1: %+v", r)
	}
}

// badServerConf writes a scenario file whose second scenario names an unknown server option.
func badServerConf(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bad-server.conf")
	conf := "fine 100 4 0.5 100 uniform no 1,2 sync=full,group-commit\nbroken 100 4 0.5 100 uniform no 1 fast=yes\n"
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestScenarioScriptsRefuseBadArguments(t *testing.T) {
	root := scriptRoot(t)
	badConf := filepath.Join(t.TempDir(), "bad.conf")
	conf := "# a comment\nfine 100 4 0.5 100 uniform no 1,2\nbroken 100 four 0.5 100 uniform no 1\n"
	if err := os.WriteFile(badConf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		script string
		args   []string
		want   string
	}{
		{"shards not a number", "run_scenario.sh", []string{"--shards", "abc", "--no-build"}, "--shards must be a positive integer"},
		{"zero shards", "run_scenario.sh", []string{"--shards", "0", "--no-build"}, "--shards must be a positive integer"},
		{"unknown option", "run_scenario.sh", []string{"--frobnicate", "--no-build"}, "unknown option --frobnicate"},
		{"option without its value", "run_scenario.sh", []string{"--ops"}, "--ops needs a value"},
		{"bad scenario name", "run_scenario.sh", []string{"--scenario", "a b", "--no-build"}, "--scenario may hold"},
		{"bad line in the scenario file", "run_all_scenarios.sh", []string{"--scenarios", badConf, "--no-report"}, "bad.conf:3: ops, concurrency and keys must be integers"},
		{"bad sync to run_all", "run_all_scenarios.sh", []string{"--sync", "fast", "--no-build"}, "--sync must be normal or full"},
		{"missing scenario file", "run_all_scenarios.sh", []string{"--scenarios", badConf + ".missing"}, "cannot read"},
		{"unknown option to run_all", "run_all_scenarios.sh", []string{"--frobnicate"}, "unknown option --frobnicate"},
		{"non-numeric read-conns", "run_scenario.sh", []string{"--read-conns", "abc", "--no-build"}, "--read-conns must be a positive integer"},
		{"write ratio above 1", "run_scenario.sh", []string{"--writeRatio", "1.5", "--no-build"}, "--writeRatio must be a number between 0 and 1"},
		{"bad duration", "run_scenario.sh", []string{"--warmup", "soon", "--no-build"}, "--warmup must be a duration"},
		{"postgres flags on sqlite", "run_scenario.sh", []string{"--dsn", "x", "--no-build"}, "are for --backend postgres"},
		{"sweep without scenario", "sweep.sh", []string{"--no-build"}, "--scenario is required"},
		{"sweep unknown scenario", "sweep.sh", []string{"--scenario", "nope", "--no-build"}, "no scenario 'nope'"},
		{"ceiling bad trials", "http_ceiling.sh", []string{"--trials", "x", "--no-build"}, "positive integers"},
		{"ceiling unknown client", "http_ceiling.sh", []string{"--client", "curl", "--no-build"}, "--client must be loadgen, wrk or both"},
		{"bad journal", "run_scenario.sh", []string{"--journal", "memory", "--no-build"}, "--journal must be wal or delete"},
		{"one conn with read conns", "run_scenario.sh", []string{"--one-conn", "--read-conns", "2", "--no-build"}, "exclude each other"},
		{"bad server options in the scenario file", "run_all_scenarios.sh", []string{"--scenarios", badServerConf(t), "--no-report"}, "bad-server.conf:2: server options are"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, output := script(t, root, tt.script, tt.args...)
			if code != 2 || !strings.Contains(output, tt.want) {
				t.Errorf("%s %v: exit %d, want 2 with %q\n%s", tt.script, tt.args, code, tt.want, output)
			}
		})
	}
	for _, name := range []string{"run_scenario.sh", "run_all_scenarios.sh", "sweep.sh", "http_ceiling.sh", "promote.sh"} {
		code, output := script(t, root, name, "--help")
		if code != 0 || !strings.Contains(output, "Usage: scripts/"+name) {
			t.Errorf("%s --help: exit %d\n%s", name, code, output)
		}
	}
	// Neither a refused command line nor --help leaves a file behind.
	if _, err := os.Stat(filepath.Join(root, "results")); !os.IsNotExist(err) {
		t.Errorf("refused runs or --help wrote %s (%v)", filepath.Join(root, "results"), err)
	}
}

// tinyScenarios writes a scenario file small enough for a test run.
func tinyScenarios(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.conf")
	conf := "# two small scenarios\ntiny_read 1500 8 0.1 300 zipfian yes 1,2\ntiny_write 1500 8 0.9 3000 uniform no 1,2\n"
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runDirs lists the run directories under runs, oldest first (their names start with the
// UTC time).
func runDirs(t *testing.T, runs string) []string {
	t.Helper()
	entries, err := os.ReadDir(runs)
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(runs, e.Name()))
		}
	}
	slices.Sort(dirs)
	return dirs
}

// checkRunDir checks what every run directory holds: the files named, a finished
// run.txt with the command, and "latest" beside runs pointing at it.
func checkRunDir(t *testing.T, runs, dir string, files ...string) {
	t.Helper()
	for _, f := range append(files, "run.txt") {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("run directory lacks %s: %v", f, err)
		}
	}
	info, err := os.ReadFile(filepath.Join(dir, "run.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"run_id: " + filepath.Base(dir) + "\n", "command: scripts/", "git_commit: ",
		"loadavg_start: ", "finished: ", "loadavg_end: ", "machine_cpu_s: ", "lab_cpu_s: "} {
		if !strings.Contains(string(info), want) {
			t.Errorf("run.txt lacks %q:\n%s", want, info)
		}
	}
	latest, err := filepath.EvalSymlinks(filepath.Join(filepath.Dir(runs), "latest"))
	if err != nil {
		t.Fatalf("no latest link: %v", err)
	}
	if want, _ := filepath.EvalSymlinks(dir); latest != want {
		t.Errorf("latest points at %s, want %s", latest, want)
	}
}

// TestRunAllScenariosSmoke runs the README's main job on a tiny scenario file: every
// configuration runs once per trial, in alternating order, and everything lands in the
// run's own directory, report included.
func TestRunAllScenariosSmoke(t *testing.T) {
	root := scriptRoot(t)
	runs := filepath.Join(t.TempDir(), "results", "runs")
	code, output := script(t, root, "run_all_scenarios.sh", "--scenarios", tinyScenarios(t), "--trials", "2",
		"--warmup", "100ms", "--runs-dir", runs, "--no-build")
	if code != 0 {
		t.Fatalf("run_all_scenarios.sh: exit %d\n%s", code, output)
	}
	dirs := runDirs(t, runs)
	if len(dirs) != 1 {
		t.Fatalf("run directories %v, want one", dirs)
	}
	dir := dirs[0]
	checkRunDir(t, runs, dir, "results.csv", "report.md", "charts/latency.png")
	if !strings.Contains(output, "writing to "+dir) {
		t.Errorf("the script did not say where it writes (%s):\n%s", dir, output)
	}
	rows, err := resultscsv.ReadFile(filepath.Join(dir, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 8 {
		t.Fatalf("%d rows, want 2 scenarios x 2 configurations x 2 trials", len(rows))
	}
	// Trial 1 runs single then sharded, trial 2 sharded then single.
	var order []string
	for _, r := range rows {
		if r.Scenario == "tiny_read" {
			order = append(order, fmt.Sprintf("t%d:%d", r.Trial, r.Shards))
		}
		if r.RunID != filepath.Base(dir) || r.Errors != 0 || r.WarmupS != 0.1 || !strings.HasPrefix(r.Command, "scripts/run_all_scenarios.sh ") {
			t.Errorf("row %+v", r)
		}
		if _, err := os.Stat(filepath.Join(dir, "timeseries", r.RunID, fmt.Sprintf("%s_%s_%d_t%d.csv", r.Scenario, r.Mode, r.Shards, r.Trial))); err != nil {
			t.Errorf("per-second samples: %v", err)
		}
	}
	if got := strings.Join(order, " "); got != "t1:1 t1:2 t2:2 t2:1" {
		t.Errorf("tiny_read configuration order %q, want t1:1 t1:2 t2:2 t2:1", got)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatalf("no report: %v", err)
	}
	for _, want := range []string{"## Findings", "tiny_read", "tiny_write", rows[0].RunID, "| Load average at start (1, 5, 15 min) | ",
		"| CPU used by other work during the run | "} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// TestRecordedCommandReruns runs the command a run recorded in its rows, as the report
// tells a reader to, and checks that it makes a new run of the same shape. The command
// of a run without arguments is the script's bare name.
func TestRecordedCommandReruns(t *testing.T) {
	root := scriptRoot(t)
	// No arguments at all: the quoting must add nothing (printf ' %q' alone adds '').
	out, err := exec.Command("bash", "-c", `. "$1"; printf '[scripts/run_all_scenarios.sh%s]' "$(quote_args)"`, "bash",
		filepath.Join(root, "scripts", "lib.sh")).CombinedOutput()
	if err != nil || string(out) != "[scripts/run_all_scenarios.sh]" {
		t.Errorf("command recorded for no arguments: %q (%v), want [scripts/run_all_scenarios.sh]", out, err)
	}

	runs := filepath.Join(t.TempDir(), "runs")
	args := []string{"--scenarios", tinyScenarios(t), "--only", "tiny_write", "--trials", "1", "--warmup", "0s",
		"--runs-dir", runs, "--no-build", "--no-report"}
	if code, output := script(t, root, "run_all_scenarios.sh", args...); code != 0 {
		t.Fatalf("run_all_scenarios.sh: exit %d\n%s", code, output)
	}
	first := runDirs(t, runs)[0]
	rows, err := resultscsv.ReadFile(filepath.Join(first, "results.csv"))
	if err != nil || len(rows) != 2 {
		t.Fatalf("%d rows (%v), want 2", len(rows), err)
	}
	command := rows[0].Command
	cmd := exec.Command("bash", "-c", command)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the recorded command %q failed: %v\n%s", command, err, out)
	}
	dirs := runDirs(t, runs)
	if len(dirs) != 2 {
		t.Fatalf("run directories after the rerun: %v, want two", dirs)
	}
	again, err := resultscsv.ReadFile(filepath.Join(dirs[1], "results.csv"))
	if err != nil || len(again) != len(rows) || again[0].Command != command || again[0].Scenario != "tiny_write" {
		t.Errorf("rerun rows %+v (%v), want %d rows of tiny_write recording %q", again, err, len(rows), command)
	}
}

// TestRunScenarioOwnRunDir: without --out, run_scenario.sh makes a run directory of its own.
func TestRunScenarioOwnRunDir(t *testing.T) {
	root := scriptRoot(t)
	runs := filepath.Join(t.TempDir(), "runs")
	code, output := script(t, root, "run_scenario.sh", "--ops", "500", "--concurrency", "4", "--run-id", "solo",
		"--runs-dir", runs, "--no-build")
	if code != 0 {
		t.Fatalf("run_scenario.sh: exit %d\n%s", code, output)
	}
	dir := filepath.Join(runs, "solo")
	checkRunDir(t, runs, dir, "results.csv", "timeseries/solo/adhoc_single_1_t1.csv")
	// The same run id again gets a directory of its own rather than appending.
	if code, output := script(t, root, "run_scenario.sh", "--ops", "500", "--concurrency", "4", "--run-id", "solo",
		"--runs-dir", runs, "--no-build"); code != 0 {
		t.Fatalf("second run: exit %d\n%s", code, output)
	}
	checkRunDir(t, runs, filepath.Join(runs, "solo-2"), "results.csv")
}

// TestGitCommitIgnoresResults: the commit a run records is "-dirty" for changed code, not
// for the results the lab writes.
func TestGitCommitIgnoresResults(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	repo := t.TempDir()
	sh := func(script string) string {
		t.Helper()
		cmd := exec.Command("bash", "-c", script)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com", "LIB="+filepath.Join(scriptRoot(t), "scripts", "lib.sh"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	sh(`git init -q . && mkdir -p results code && echo a > results/results.csv && echo a > code/x.go && git add . && git commit -qm init`)
	head := sh(`git rev-parse --short=12 HEAD`)
	sh(`echo b >> results/results.csv && mkdir -p results/runs/r1 && echo c > results/runs/r1/results.csv`)
	if got := sh(`. "$LIB"; git_commit .`); got != head {
		t.Errorf("with changed results: %q, want %q", got, head)
	}
	sh(`echo b >> code/x.go`)
	if got := sh(`. "$LIB"; git_commit .`); got != head+"-dirty" {
		t.Errorf("with changed code: %q, want %q", got, head+"-dirty")
	}
}

// TestPromote publishes a run directory and refuses what is not a finished run.
func TestPromote(t *testing.T) {
	root := scriptRoot(t)
	runs := filepath.Join(root, "results", "runs")
	run := filepath.Join(runs, "20261122T010203Z")
	if err := os.MkdirAll(filepath.Join(run, "charts"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"results.csv":        "timestamp,scenario\n",
		"charts/latency.png": "png",
		"run.txt":            "run_id: 20261122T010203Z\ncommand: scripts/run_all_scenarios.sh\ngit_commit: abc\nfinished: 2026-11-22T01:05:00Z\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(run, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("runs/20261122T010203Z", filepath.Join(root, "results", "latest")); err != nil {
		t.Fatal(err)
	}
	code, output := script(t, root, "promote.sh", filepath.Join(root, "results", "latest"))
	if code != 0 || !strings.Contains(output, "results/published/20261122T010203Z") || !strings.Contains(output, "command: scripts/run_all_scenarios.sh") {
		t.Fatalf("promote.sh: exit %d\n%s", code, output)
	}
	for name, body := range files {
		got, err := os.ReadFile(filepath.Join(root, "results", "published", "20261122T010203Z", name))
		if err != nil || string(got) != body {
			t.Errorf("published %s: %q (%v), want %q", name, got, err, body)
		}
	}

	unfinished := filepath.Join(runs, "unfinished")
	noCommand := filepath.Join(runs, "nocommand")
	for dir, info := range map[string]string{unfinished: "command: x\n", noCommand: "finished: now\n"} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "run.txt"), []byte(info), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"again", []string{run}, "exists"},
		{"unfinished", []string{unfinished}, "did not finish"},
		{"no command", []string{noCommand}, "records no command"},
		{"bad name", []string{"--as", "../x", run}, "--as may hold"},
		{"not a directory", []string{filepath.Join(run, "run.txt")}, "not a directory"},
	} {
		if code, output := script(t, root, "promote.sh", tc.args...); code != 2 || !strings.Contains(output, tc.want) {
			t.Errorf("%s: promote.sh %v: exit %d, want 2 with %q\n%s", tc.name, tc.args, code, tc.want, output)
		}
	}
	if code, output := script(t, root, "promote.sh", "--as", "renamed", run); code != 0 {
		t.Errorf("promote.sh --as renamed: exit %d\n%s", code, output)
	}
	if code, output := script(t, root, "promote.sh", "--force", run); code != 0 {
		t.Errorf("promote.sh --force: exit %d\n%s", code, output)
	}
}

// TestSweepSmoke runs a short sweep over six shard counts and checks the USL fit line and
// the run directory, and that fewer than six counts are refused before anything runs.
func TestSweepSmoke(t *testing.T) {
	root := scriptRoot(t)
	runs := filepath.Join(t.TempDir(), "runs")
	conf := tinyScenarios(t)
	code, output := script(t, root, "sweep.sh", "--scenario", "tiny_read", "--scenarios", conf, "--shards", "1,2,3",
		"--runs-dir", runs, "--no-build")
	if code != 2 || !strings.Contains(output, "at least 6") {
		t.Errorf("sweep over 3 shard counts: exit %d, want 2 naming the 6-point minimum\n%s", code, output)
	}
	if _, err := os.Stat(runs); !os.IsNotExist(err) {
		t.Errorf("a refused sweep made %s (%v)", runs, err)
	}
	code, output = script(t, root, "sweep.sh", "--scenario", "tiny_read", "--scenarios", conf, "--shards", "1,2,3,4,5,6",
		"--trials", "1", "--ops", "800", "--warmup", "0s", "--runs-dir", runs, "--no-build")
	if code != 0 {
		t.Fatalf("sweep.sh: exit %d\n%s", code, output)
	}
	for _, want := range []string{"sigma=", "kappa=", "lambda=", "nstar="} {
		if !strings.Contains(output, want) {
			t.Errorf("sweep output lacks %q:\n%s", want, output)
		}
	}
	dirs := runDirs(t, runs)
	if len(dirs) != 1 || !strings.HasPrefix(filepath.Base(dirs[0]), "sweep-") {
		t.Fatalf("run directories %v, want one sweep-*", dirs)
	}
	checkRunDir(t, runs, dirs[0], "report.md", "usl_points.csv", "usl.txt", "charts/usl.png", "charts/scaling_tiny_read.png")
	if b, err := os.ReadFile(filepath.Join(dirs[0], "usl.txt")); err != nil || !strings.Contains(string(b), "sigma=") {
		t.Errorf("usl.txt: %q (%v)", b, err)
	}
	rows, err := resultscsv.ReadFile(filepath.Join(dirs[0], "results.csv"))
	if err != nil || len(rows) != 6 {
		t.Fatalf("%d rows (%v), want 6", len(rows), err)
	}
}

// TestHTTPCeilingSmoke runs the ceiling comparison once, checks that its output is kept
// in its run directory and that both servers are gone afterwards.
func TestHTTPCeilingSmoke(t *testing.T) {
	root := scriptRoot(t)
	runs := filepath.Join(t.TempDir(), "runs")
	code, output := script(t, root, "http_ceiling.sh", "--trials", "1", "--ops", "500", "--concurrency", "4",
		"--duration", "1", "--runs-dir", runs, "--no-build")
	if code != 0 || !strings.Contains(output, "client loadgen: demo-server / http ceiling: median ratio") ||
		!strings.Contains(output, "client wrk: demo-server / http ceiling: median ratio") {
		t.Fatalf("http_ceiling.sh: exit %d, want a median ratio for each client\n%s", code, output)
	}
	if out, err := exec.Command("pgrep", "-f", filepath.Join(root, "bin")).Output(); err == nil {
		t.Errorf("processes left running after the script ended:\n%s", out)
	}
	dirs := runDirs(t, runs)
	if len(dirs) != 1 {
		t.Fatalf("run directories %v, want one", dirs)
	}
	checkRunDir(t, runs, dirs[0], "http_ceiling.txt")
	if b, err := os.ReadFile(filepath.Join(dirs[0], "http_ceiling.txt")); err != nil || !strings.Contains(string(b), "median ratio") {
		t.Errorf("http_ceiling.txt: %q (%v)", b, err)
	}
}

// TestBlockbenchSweepSmoke: --help writes nothing, and a tiny sweep records in
// machine.txt the target it really ran with, flags passed through to blockbench included.
func TestBlockbenchSweepSmoke(t *testing.T) {
	root := scriptRoot(t)
	code, output := script(t, root, "blockbench_sweep.sh", "--help")
	if code != 0 || !strings.Contains(output, "Usage: scripts/blockbench_sweep.sh") {
		t.Fatalf("--help: exit %d\n%s", code, output)
	}
	if _, err := os.Stat(filepath.Join(root, "results")); !os.IsNotExist(err) {
		t.Errorf("--help wrote %s (%v)", filepath.Join(root, "results"), err)
	}
	runs := filepath.Join(t.TempDir(), "runs")
	// A flag blockbench refuses leaves no run directory behind.
	if code, output := script(t, root, "blockbench_sweep.sh", "--thresholds", "never,lots", "--runs-dir", runs, "--no-build"); code != 2 {
		t.Errorf("bad threshold: exit %d, want 2\n%s", code, output)
	}
	if dirs, _ := filepath.Glob(filepath.Join(runs, "*")); len(dirs) != 0 {
		t.Errorf("a refused sweep left %v", dirs)
	}
	code, output = script(t, root, "blockbench_sweep.sh", "--thresholds", "never,300", "--target-blocks", "600",
		"--rounds", "1", "--max-duration", "30s", "--runs-dir", runs, "--no-build",
		"--files-per-batch", "2", "--blocks-per-file", "100", "--lookups", "5")
	if code != 0 {
		t.Fatalf("blockbench_sweep.sh: exit %d\n%s", code, output)
	}
	dirs := runDirs(t, runs)
	if len(dirs) != 1 {
		t.Fatalf("run directories %v, want one", dirs)
	}
	checkRunDir(t, runs, dirs[0], "machine.txt", "summary.csv", "ingest-T300-r1.csv", "time_to_target.png")
	machine, err := os.ReadFile(filepath.Join(dirs[0], "machine.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`command: scripts/blockbench_sweep.sh --thresholds never\,300 --target-blocks 600 `,
		`blockbench: sweep --thresholds never\,300 --target-blocks 600 --max-duration 30s --rounds 1 --files-per-batch 2 --blocks-per-file 100 --lookups 5 --results `,
		"target blocks: 600\n", "loadavg at end: ", "finished: ",
	} {
		if !strings.Contains(string(machine), want) {
			t.Errorf("machine.txt lacks %q:\n%s", want, machine)
		}
	}
}
