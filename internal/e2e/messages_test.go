package e2e_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestErrorsNameTheCommandOnce runs the real binaries on bad input and checks that each
// says which command speaks exactly once: "usl: standard input: usl: ..." told the
// reader nothing the first "usl:" had not.
func TestErrorsNameTheCommandOnce(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.csv")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cmd   string
		stdin string
		args  []string
		want  string
	}{
		{"usl", "", []string{"-"}, "usl: standard input: CSV header must be n,throughput"},
		{"usl", "n,throughput\n1,x\n", []string{"-"}, "usl: standard input: bad number on line 2"},
		{"usl", "n,throughput\n1,10\n2,19\n", []string{"-"}, "usl: standard input: too few points"},
		{"report", "", []string{"--csv", empty, "--out", filepath.Join(dir, "r.md")}, "the results CSV has no rows"},
		{"report", "", []string{"--csv", filepath.Join(dir, "missing.csv"), "--out", filepath.Join(dir, "r.md")}, "no such file"},
		{"loadgen", "", []string{"--ops", "-1", "--target", "http://127.0.0.1:1"}, "loadgen: usage: invalid configuration"},
		{"blockbench", "", []string{"--threshold", "-1"}, "is negative"},
	} {
		cmd := exec.Command(filepath.Join(binDir, tc.cmd), tc.args...)
		cmd.Stdin = strings.NewReader(tc.stdin)
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("%s %v succeeded:\n%s", tc.cmd, tc.args, out)
			continue
		}
		last := strings.TrimSpace(string(out))
		if i := strings.LastIndex(last, "\n"); i >= 0 {
			last = last[i+1:] // after any usage text
		}
		if !strings.HasPrefix(last, tc.cmd+": ") || strings.Count(last, tc.cmd+": ") != 1 || !strings.Contains(last, tc.want) {
			t.Errorf("%s %v: %q, want one %q prefix and %q", tc.cmd, tc.args, last, tc.cmd+": ", tc.want)
		}
	}
}
