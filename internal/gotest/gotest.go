// Package gotest runs `go test -json` and prints what a plain `go test` prints (a line
// per package, and the output of failing tests), followed by a summary: how many tests
// passed, failed and were skipped, and how many of the skipped ones need PostgreSQL,
// with the command that runs them. `make test` uses it through internal/cmd/gotest, so
// that a machine without SHARDLAB_PG_DSN is told what it did not test.
package gotest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
)

// PostgresMarkers are the texts by which a skip message says that the test needs
// PostgreSQL: the environment variable the tests read (internal/pgtest and the tests
// that read it themselves name it), and the prefix of internal/pgtest's other skips.
var PostgresMarkers = []string{"SHARDLAB_PG_DSN", "pgtest:"}

// ExampleDSN is the server URL the summary suggests, that of the README and .ci/run.
const ExampleDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// event is one line of `go test -json` (cmd/test2json), with the build events of
// `go test -json` since Go 1.24.
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail events
	Test       string
	Output     string
}

// Summary counts the tests of a run.
type Summary struct {
	Passed, Failed, Skipped int
	// FailedPackages counts packages that failed, including those that did not build.
	FailedPackages int
	// PostgresSkipped names the skipped tests whose skip message says they need
	// PostgreSQL, as "package TestName", in the order they were skipped (packages run
	// in parallel, so that order varies; WriteSummary sorts).
	PostgresSkipped []string
}

// line is one line of output of a test.
type line struct{ test, text string }

// Summarize reads `go test -json` events from r until EOF and writes to w what a plain
// `go test` would print: every package's result line, build errors, and the output of
// each failed top-level test (its subtests included, "=== RUN"-style lines left out).
// Lines that are not JSON, such as the go command's own messages, are passed through.
func Summarize(r io.Reader, w io.Writer) (Summary, error) {
	var s Summary
	pending := map[string][]line{} // package -> output of its tests so far
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(w, sc.Text())
			continue
		}
		switch {
		case e.Action == "build-output":
			io.WriteString(w, e.Output)
		case e.Test == "" && e.Action == "output":
			// The package's own lines: "ok ...", "FAIL ...", "? ... [no test files]", and
			// what a crashing test binary printed. A plain go test does not print PASS.
			if e.Output != "PASS\n" {
				io.WriteString(w, e.Output)
			}
		case e.Test == "" && e.Action == "fail":
			s.FailedPackages++
			// A test still running when the package failed (a panic, a timeout) never
			// got its own fail event: show what it printed.
			writeLines(w, pending[e.Package], func(string) bool { return true })
			delete(pending, e.Package)
		case e.Test == "" && (e.Action == "pass" || e.Action == "skip"):
			delete(pending, e.Package)
		case e.Action == "output":
			pending[e.Package] = append(pending[e.Package], line{e.Test, e.Output})
		case e.Action == "pass" || e.Action == "skip" || e.Action == "fail":
			switch e.Action {
			case "pass":
				s.Passed++
			case "skip":
				s.Skipped++
				if needsPostgres(pending[e.Package], e.Test) {
					s.PostgresSkipped = append(s.PostgresSkipped, e.Package+" "+e.Test)
				}
			case "fail":
				s.Failed++
				if strings.Contains(e.Test, "/") {
					continue // a failed subtest is shown with its top-level test
				}
			}
			// A finished test's output is shown if it failed, and forgotten either way.
			mine := func(t string) bool { return t == e.Test || strings.HasPrefix(t, e.Test+"/") }
			if e.Action == "fail" {
				writeLines(w, pending[e.Package], mine)
			}
			pending[e.Package] = slices.DeleteFunc(pending[e.Package], func(l line) bool { return mine(l.test) })
		}
	}
	if err := sc.Err(); err != nil {
		return s, fmt.Errorf("read go test output: %w", err)
	}
	return s, nil
}

// writeLines writes the lines of the tests keep selects, without the progress lines
// ("=== RUN", "=== PAUSE", ...) that only verbose output shows.
func writeLines(w io.Writer, lines []line, keep func(test string) bool) {
	for _, l := range lines {
		if keep(l.test) && !strings.HasPrefix(l.text, "=== ") {
			io.WriteString(w, l.text)
		}
	}
}

// needsPostgres reports whether test's output names one of PostgresMarkers.
func needsPostgres(lines []line, test string) bool {
	for _, l := range lines {
		if l.test != test {
			continue
		}
		for _, m := range PostgresMarkers {
			if strings.Contains(l.text, m) {
				return true
			}
		}
	}
	return false
}

// WriteSummary writes the closing lines: the counts, and when tests were skipped for
// want of PostgreSQL, how many in which packages and how to run them.
func (s Summary) WriteSummary(w io.Writer) {
	fmt.Fprintf(w, "\ntests: %d passed, %d failed, %d skipped", s.Passed, s.Failed, s.Skipped)
	if s.FailedPackages > 0 {
		fmt.Fprintf(w, "; %d package(s) failed", s.FailedPackages)
	}
	fmt.Fprintln(w)
	if len(s.PostgresSkipped) == 0 {
		return
	}
	var pkgs []string
	count := map[string]int{}
	for _, t := range s.PostgresSkipped {
		pkg, _, _ := strings.Cut(t, " ")
		if count[pkg] == 0 {
			pkgs = append(pkgs, pkg)
		}
		count[pkg]++
	}
	slices.Sort(pkgs) // packages finish in any order
	parts := make([]string, len(pkgs))
	for i, p := range pkgs {
		parts[i] = fmt.Sprintf("%s (%d)", p, count[p])
	}
	fmt.Fprintf(w, "%d of the skipped tests need PostgreSQL and did not run: %s.\n", len(s.PostgresSkipped), strings.Join(parts, ", "))
	fmt.Fprintf(w, "To run them, start PostgreSQL 15 (its user must be allowed to create databases) and run:\n")
	fmt.Fprintf(w, "    SHARDLAB_PG_DSN='%s' make test\n", ExampleDSN)
	fmt.Fprintf(w, "(.ci/run installs and starts PostgreSQL on a fresh Debian machine and runs make test with it.)\n")
}

// Run runs `go test -json` with args (flags and packages, as for go test), prints its
// output as Summarize does, then the summary, on stdout; the go command's own messages
// go to stderr. It returns go test's exit status, and an error only when go test could
// not be run or its output not read. Cancelling ctx kills go test.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	cmd := exec.CommandContext(ctx, "go", append([]string{"test", "-json"}, args...)...)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 1, err
	}
	if err := cmd.Start(); err != nil {
		return 1, fmt.Errorf("start go test: %w", err)
	}
	s, readErr := Summarize(out, stdout)
	waitErr := cmd.Wait()
	s.WriteSummary(stdout)
	var exit *exec.ExitError
	switch {
	case errors.As(waitErr, &exit):
		return max(exit.ExitCode(), 1), readErr
	case waitErr != nil:
		return 1, fmt.Errorf("go test: %w", waitErr)
	case readErr != nil:
		return 1, readErr
	case s.Failed > 0 || s.FailedPackages > 0:
		return 1, nil // go test said it passed, but a test failed: trust the failure
	}
	return 0, nil
}
