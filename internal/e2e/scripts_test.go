package e2e_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"shardlab/resultscsv"
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
	for _, name := range []string{"run_scenario.sh", "run_all_scenarios.sh"} {
		if err := os.Symlink(filepath.Join(repo, "scripts", name), filepath.Join(root, "scripts", name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"demo-server", "loadgen"} {
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, output := script(t, root, tt.script, tt.args...)
			if code != 2 || !strings.Contains(output, tt.want) {
				t.Errorf("%s %v: exit %d, want 2 with %q\n%s", tt.script, tt.args, code, tt.want, output)
			}
		})
	}
	for _, name := range []string{"run_scenario.sh", "run_all_scenarios.sh"} {
		code, output := script(t, root, name, "--help")
		if code != 0 || !strings.Contains(output, "Usage: scripts/"+name) {
			t.Errorf("%s --help: exit %d\n%s", name, code, output)
		}
	}
}
