package e2e_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/resultscsv"
)

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
	for _, name := range []string{"run_scenario.sh", "run_all_scenarios.sh", "sweep.sh", "http_ceiling.sh", "scenarios.conf"} {
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
		{"bad line in the scenario file", "run_all_scenarios.sh", []string{"--scenarios", badConf, "--report", "none"}, "bad.conf:3: ops, concurrency and keys must be integers"},
		{"missing scenario file", "run_all_scenarios.sh", []string{"--scenarios", badConf + ".missing"}, "cannot read"},
		{"unknown option to run_all", "run_all_scenarios.sh", []string{"--frobnicate"}, "unknown option --frobnicate"},
		{"non-numeric read-conns", "run_scenario.sh", []string{"--read-conns", "abc", "--no-build"}, "--read-conns must be a positive integer"},
		{"write ratio above 1", "run_scenario.sh", []string{"--writeRatio", "1.5", "--no-build"}, "--writeRatio must be a number between 0 and 1"},
		{"bad duration", "run_scenario.sh", []string{"--warmup", "soon", "--no-build"}, "--warmup must be a duration"},
		{"postgres flags on sqlite", "run_scenario.sh", []string{"--dsn", "x", "--no-build"}, "are for --backend postgres"},
		{"sweep without scenario", "sweep.sh", []string{"--no-build"}, "--scenario is required"},
		{"sweep unknown scenario", "sweep.sh", []string{"--scenario", "nope", "--no-build"}, "no scenario 'nope'"},
		{"ceiling bad trials", "http_ceiling.sh", []string{"--trials", "x", "--no-build"}, "positive integers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, output := script(t, root, tt.script, tt.args...)
			if code != 2 || !strings.Contains(output, tt.want) {
				t.Errorf("%s %v: exit %d, want 2 with %q\n%s", tt.script, tt.args, code, tt.want, output)
			}
		})
	}
	for _, name := range []string{"run_scenario.sh", "run_all_scenarios.sh", "sweep.sh", "http_ceiling.sh"} {
		code, output := script(t, root, name, "--help")
		if code != 0 || !strings.Contains(output, "Usage: scripts/"+name) {
			t.Errorf("%s --help: exit %d\n%s", name, code, output)
		}
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

// TestRunAllScenariosSmoke runs the README's main job on a tiny scenario file: every
// configuration runs once per trial, in alternating order, and the report is generated.
func TestRunAllScenariosSmoke(t *testing.T) {
	root := scriptRoot(t)
	tmp := t.TempDir()
	out := filepath.Join(tmp, "results.csv")
	report := filepath.Join(tmp, "report.md")
	code, output := script(t, root, "run_all_scenarios.sh", "--scenarios", tinyScenarios(t), "--trials", "2",
		"--warmup", "100ms", "--out", out, "--report", report, "--no-build")
	if code != 0 {
		t.Fatalf("run_all_scenarios.sh: exit %d\n%s", code, output)
	}
	rows, err := resultscsv.ReadFile(out)
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
		if r.RunID != rows[0].RunID || r.Errors != 0 || r.WarmupS != 0.1 || !strings.HasPrefix(r.Command, "scripts/run_all_scenarios.sh ") {
			t.Errorf("row %+v", r)
		}
	}
	if got := strings.Join(order, " "); got != "t1:1 t1:2 t2:2 t2:1" {
		t.Errorf("tiny_read configuration order %q, want t1:1 t1:2 t2:2 t2:1", got)
	}
	md, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("no report: %v", err)
	}
	for _, want := range []string{"## Findings", "tiny_read", "tiny_write", rows[0].RunID} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// TestSweepSmoke runs a short sweep over six shard counts and checks the USL fit line, and
// that fewer than six counts are refused before anything runs.
func TestSweepSmoke(t *testing.T) {
	root := scriptRoot(t)
	tmp := t.TempDir()
	conf := tinyScenarios(t)
	code, output := script(t, root, "sweep.sh", "--scenario", "tiny_read", "--scenarios", conf, "--shards", "1,2,3",
		"--out", filepath.Join(tmp, "r.csv"), "--no-build")
	if code != 2 || !strings.Contains(output, "at least 6") {
		t.Errorf("sweep over 3 shard counts: exit %d, want 2 naming the 6-point minimum\n%s", code, output)
	}
	report := filepath.Join(tmp, "sweep.md")
	code, output = script(t, root, "sweep.sh", "--scenario", "tiny_read", "--scenarios", conf, "--shards", "1,2,3,4,5,6",
		"--trials", "1", "--ops", "800", "--warmup", "0s", "--out", filepath.Join(tmp, "r.csv"), "--report", report, "--no-build")
	if code != 0 {
		t.Fatalf("sweep.sh: exit %d\n%s", code, output)
	}
	for _, want := range []string{"sigma=", "kappa=", "lambda=", "nstar="} {
		if !strings.Contains(output, want) {
			t.Errorf("sweep output lacks %q:\n%s", want, output)
		}
	}
	if _, err := os.Stat(report); err != nil {
		t.Errorf("no sweep report: %v", err)
	}
	rows, err := resultscsv.ReadFile(filepath.Join(tmp, "r.csv"))
	if err != nil || len(rows) != 6 {
		t.Fatalf("%d rows (%v), want 6", len(rows), err)
	}
}

// TestHTTPCeilingSmoke runs the ceiling comparison once and checks that both servers are
// gone afterwards.
func TestHTTPCeilingSmoke(t *testing.T) {
	root := scriptRoot(t)
	code, output := script(t, root, "http_ceiling.sh", "--trials", "1", "--ops", "500", "--concurrency", "4", "--no-build")
	if code != 0 || !strings.Contains(output, "median ratio") {
		t.Fatalf("http_ceiling.sh: exit %d\n%s", code, output)
	}
	if out, err := exec.Command("pgrep", "-f", filepath.Join(root, "bin")).Output(); err == nil {
		t.Errorf("processes left running after the script ended:\n%s", out)
	}
}
