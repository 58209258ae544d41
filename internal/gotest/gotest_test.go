package gotest_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/internal/gotest"
)

// TestRunRealModule runs real go test on a throwaway module whose tests pass, fail, skip
// for want of PostgreSQL (in both ways the lab's tests do) and skip for another reason.
func TestRunRealModule(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/m\n\ngo 1.26\n",
		"a/a_test.go": `package a
import "testing"
func TestPass(t *testing.T) { t.Log("quiet when passing") }
func TestFail(t *testing.T) {
	t.Run("sub", func(t *testing.T) { t.Error("boom in sub") })
	t.Log("parent says")
}
func TestNeedsDSN(t *testing.T) { t.Skip("SHARDLAB_PG_DSN is not set: set it to run this test") }
func TestNeedsServer(t *testing.T) { t.Skip("pgtest: PostgreSQL server programs not found") }
func TestOtherSkip(t *testing.T) { t.Skip("git is not installed") }
`,
		"b/b_test.go": `package b
import "testing"
func TestTable(t *testing.T) {
	for _, n := range []string{"x", "y"} {
		t.Run(n, func(t *testing.T) { t.Skip("SHARDLAB_PG_DSN is unset") })
	}
}
`,
		"c/c.go": "package c\n",
	}
	for name, body := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(dir)
	var stdout, stderr bytes.Buffer
	code, err := gotest.Run(context.Background(), []string{"-count=1", "./..."}, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	out := stdout.String()
	if code != 1 {
		t.Errorf("exit %d, want 1 (a test failed)\n%s", code, out)
	}
	for _, want := range []string{
		"boom in sub", "parent says", "--- FAIL: TestFail ", "FAIL\texample.com/m/a\t", "ok  \texample.com/m/b\t",
		"?   \texample.com/m/c\t[no test files]",
		"tests: 2 passed, 2 failed, 5 skipped; 1 package(s) failed\n",
		"4 of the skipped tests need PostgreSQL and did not run: example.com/m/a (2), example.com/m/b (2).",
		"SHARDLAB_PG_DSN='" + gotest.ExampleDSN + "' make test",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, unwanted := range []string{"quiet when passing", "=== RUN", "git is not installed"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("output shows %q, which plain go test does not:\n%s", unwanted, out)
		}
	}
}

// TestSummarizeCrashAndBuildFailure: the output of a test that was running when its
// package crashed is shown, and so are build errors and lines that are not events.
func TestSummarizeCrashAndBuildFailure(t *testing.T) {
	events := `{"ImportPath":"m/bad [m/bad.test]","Action":"build-output","Output":"bad.go:1: undefined: y\n"}
{"ImportPath":"m/bad [m/bad.test]","Action":"build-fail"}
{"Action":"output","Package":"m/bad","Output":"FAIL\tm/bad [build failed]\n"}
{"Action":"fail","Package":"m/bad"}
go: downloading example.com/x v1.0.0
{"Action":"run","Package":"m/p","Test":"TestHang"}
{"Action":"output","Package":"m/p","Test":"TestHang","Output":"=== RUN   TestHang\n"}
{"Action":"output","Package":"m/p","Test":"TestHang","Output":"panic: test timed out after 1s\n"}
{"Action":"output","Package":"m/p","Output":"FAIL\tm/p\t1.0s\n"}
{"Action":"fail","Package":"m/p"}
{"Action":"output","Package":"m/q","Output":"PASS\n"}
{"Action":"output","Package":"m/q","Output":"ok  \tm/q\t0.1s\n"}
{"Action":"pass","Package":"m/q"}
`
	var out bytes.Buffer
	s, err := gotest.Summarize(strings.NewReader(events), &out)
	if err != nil {
		t.Fatal(err)
	}
	want := "bad.go:1: undefined: y\nFAIL\tm/bad [build failed]\ngo: downloading example.com/x v1.0.0\nFAIL\tm/p\t1.0s\npanic: test timed out after 1s\nok  \tm/q\t0.1s\n"
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
	if s.FailedPackages != 2 || s.Failed != 0 || s.Passed != 0 || len(s.PostgresSkipped) != 0 {
		t.Errorf("summary %+v", s)
	}
	var sum bytes.Buffer
	s.WriteSummary(&sum)
	if got := sum.String(); got != "\ntests: 0 passed, 0 failed, 0 skipped; 2 package(s) failed\n" {
		t.Errorf("summary text %q", got)
	}
}
