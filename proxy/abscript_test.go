package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// TestABScript runs scripts/proxy_ab.sh in a tiny mode (HEAD against the work tree, one
// round of one second over two schema shards, a sysbench and a pgbench workload): both
// builds serve, results.csv has a row for each side and workload, the summary has the
// ratios, and the scratch database is gone. It checks the machinery, not the speed.
func TestABScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the proxy twice and runs sysbench")
	}
	needTool(t, "sysbench")
	needTool(t, "pgbench")
	needTool(t, "psql")
	runs := t.TempDir()
	args := append(abArgs(t, runs, 1), "--workloads", "oltp_write_only,pgbench_select_extended")
	out, err := run(t, 5*time.Minute, "../scripts/proxy_ab.sh", args...)
	if err != nil {
		t.Fatalf("proxy_ab.sh: %v\n%s", err, out)
	}
	dirs, err := filepath.Glob(filepath.Join(runs, "proxyab-*"))
	if err != nil || len(dirs) != 1 {
		t.Fatalf("run directories %v (%v)\n%s", dirs, err, out)
	}
	csv, err := os.ReadFile(filepath.Join(dirs[0], "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(csv)), "\n")
	if len(lines) != 5 {
		t.Fatalf("results.csv has %d lines, want a header and one row per side and workload:\n%s", len(lines), csv)
	}
	for _, side := range []string{"old", "new"} {
		for _, w := range []string{"oltp_write_only", "pgbench_select_extended"} {
			found := false
			for _, l := range lines[1:] {
				f := strings.Split(l, ",")
				if len(f) == 9 && f[1] == w && f[3] == side {
					found = true
					if f[8] != "ok" || f[5] == "0" || f[6] == "nan" {
						t.Errorf("%s side, %s: %s", side, w, l)
					}
				}
			}
			if !found {
				t.Errorf("no row for the %s side of %s:\n%s", side, w, csv)
			}
		}
	}
	summary, err := os.ReadFile(filepath.Join(dirs[0], "summary.txt"))
	if err != nil || !strings.Contains(string(summary), "oltp_write_only throughput: ") ||
		!strings.Contains(string(summary), "pgbench_select_extended proxy CPU per transaction: ") {
		t.Errorf("summary.txt (%v):\n%s", err, summary)
	}
	checkNoScratchDatabase(t)
}

// abArgs are proxy_ab.sh's arguments for a tiny run of the given rounds (HEAD against
// the work tree, one second each, two schema shards) writing to runs.
func abArgs(t *testing.T, runs string, rounds int) []string {
	cfg, err := pgconn.ParseConfig(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	server := fmt.Sprintf("postgres://%s@%s:%d", cfg.User, cfg.Host, cfg.Port)
	return []string{"HEAD", "--rounds", fmt.Sprint(rounds), "--time", "1", "--tables", "1", "--table-size", "200",
		"--threads", "2", "--shards", "2", "--pool-size", "2", "--server", server, "--runs-dir", runs}
}

func checkNoScratchDatabase(t *testing.T) {
	t.Helper()
	c, err := pgconn.Connect(t.Context(), pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(t.Context())
	res, err := c.Exec(t.Context(), "SELECT count(*) FROM pg_database WHERE datname LIKE 'shardlab\\_ab\\_%'").ReadAll()
	if err != nil || string(res[0].Rows[0][0]) != "0" {
		t.Errorf("scratch databases left behind: %v %v", res, err)
	}
}

// TestABScriptInterrupted stops proxy_ab.sh with SIGTERM after its first round: it
// exits with 143, marks its run directory incomplete (which promote.sh refuses) with
// the round it measured kept, drops its scratch database and leaves no proxy running.
func TestABScriptInterrupted(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the proxy twice and runs sysbench")
	}
	needTool(t, "sysbench")
	needTool(t, "psql")
	runs, tmp := t.TempDir(), t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "../scripts/proxy_ab.sh", abArgs(t, runs, 20)...)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp, "PGCONNECT_TIMEOUT=10", "PGOPTIONS=", "PGAPPNAME=")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		log.WriteString(lines.Text() + "\n")
		if strings.HasPrefix(lines.Text(), "round 1/20 oltp_write_only new") {
			// Signalled while it waits for the next round's sysbench, as a user's
			// Ctrl-C mostly finds it: bash 5.2 runs a trap that arrives while it
			// parses a command substitution ($(...), between rounds) in the
			// substitution's parser state, and fails on it ("trap: line 2:
			// unexpected EOF while looking for matching `)'", status 2).
			time.Sleep(500 * time.Millisecond)
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
		}
	}
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 143 {
		t.Fatalf("proxy_ab.sh after SIGTERM: %v, want exit status 143\n%s", err, log.String())
	}
	dirs, _ := filepath.Glob(filepath.Join(runs, "proxyab-*"))
	if len(dirs) != 1 {
		t.Fatalf("run directories %v\n%s", dirs, log.String())
	}
	info, err := os.ReadFile(filepath.Join(dirs[0], "run.txt"))
	if err != nil || !strings.Contains(string(info), "incomplete: the script stopped with status 143") ||
		strings.Contains(string(info), "finished: ") {
		t.Errorf("run.txt (%v):\n%s", err, info)
	}
	csv, err := os.ReadFile(filepath.Join(dirs[0], "results.csv"))
	if n := strings.Count(string(csv), "\n"); err != nil || n < 3 {
		t.Errorf("results.csv keeps %d lines, want the header and round 1 (%v):\n%s", n, err, csv)
	}
	out, err := run(t, time.Minute, "../scripts/promote.sh", "--as", "abscript-test-incomplete", dirs[0])
	if err == nil {
		os.RemoveAll("../results/published/abscript-test-incomplete")
	}
	if err == nil || !strings.Contains(out, "did not finish") {
		t.Errorf("promote.sh took an incomplete run: %v\n%s", err, out)
	}
	// The proxies ran from the script's work directory under tmp: none may be left.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), tmp) {
			t.Errorf("a process of the run is still running: %s", strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	checkNoScratchDatabase(t)
}
