package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The test binary runs main() itself when this variable is set, so the tests
// check real exit codes.
const envRunMain = "BLOCKBENCH_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envRunMain) == "1" {
		os.Args = append([]string{"blockbench"}, strings.Fields(os.Getenv("BLOCKBENCH_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestExitCodes(t *testing.T) {
	tests := []struct {
		args     string
		wantCode int
		wantOut  string
	}{
		{"--help", 0, "Usage:"},
		{"--bogus", 2, "blockbench: usage error: flag provided but not defined: -bogus"},
		{"--threshold -1", 2, "--threshold -1 is negative"},
		{"--target-blocks 0", 2, "blockbench: usage error: target blocks 0 must be positive"},
		{"--max-level 99 --threshold 10", 2, "max level 99"},
		{"--threshold 100 --target-blocks 200 --files-per-batch 1 --blocks-per-file 100 --lookups 5", 0, "time_s,files,blocks,files_per_s,blocks_per_s,shards,level"},
	}
	for _, tt := range tests {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envRunMain+"=1", "BLOCKBENCH_ARGS="+tt.args)
		out, err := cmd.CombinedOutput()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tt.wantCode || !strings.Contains(string(out), tt.wantOut) {
			t.Errorf("blockbench %s: exit %d, want %d; output:\n%s", tt.args, code, tt.wantCode, out)
		}
	}
}
