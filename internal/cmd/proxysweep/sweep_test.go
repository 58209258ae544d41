package proxysweep_test

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/internal/cmd/proxysweep"
	"github.com/shardlab/shardlab/internal/pgtest"
)

// TestSweepScript runs scripts/proxy_sweep.sh in a tiny --quick mode (one table, one
// thread count, one-second runs) on a cluster of its own: every target answers, the
// CSV parses, the report names the targets, and the aggregated proxy stays within its
// pool. It checks the machinery, not the speed.
func TestSweepScript(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and runs sysbench, pgbench and pgbouncer")
	}
	for _, prog := range []string{"sysbench", "pgbench", "pgbouncer"} {
		if _, err := exec.LookPath(prog); err != nil {
			if os.Getenv(pgtest.EnvRequire) == "1" {
				t.Fatalf("%s is not installed (%s=1 forbids skipping)", prog, pgtest.EnvRequire)
			}
			t.Skipf("%s is not installed", prog)
		}
	}
	if _, err := os.Stat(filepath.Join(proxysweep.DefaultBinDir, "initdb")); err != nil {
		if os.Getenv(pgtest.EnvRequire) == "1" {
			t.Fatalf("no initdb: %v", err)
		}
		t.Skipf("no initdb: %v", err)
	}
	runs := t.TempDir()
	if os.Geteuid() == 0 {
		os.Chmod(filepath.Dir(runs), 0o755) // the servers run as postgres and read nothing here, but pass through
	}
	cmd := exec.Command("../../../scripts/proxy_sweep.sh", "--quick", "--threads", "4", "--time", "1", "--warmup", "0",
		"--tables", "1", "--table-size", "500", "--pool-size", "3", "--workloads", "oltp_point_select",
		"--pgbench-clients", "2", "--pgbench-modes", "simple", "--runs-dir", runs)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("proxy_sweep.sh: %v\n%s", err, out)
	}
	dirs, err := filepath.Glob(filepath.Join(runs, "proxysweep-*"))
	if err != nil || len(dirs) != 1 {
		t.Fatalf("run directories %v (%v)\n%s", dirs, err, out)
	}
	f, err := os.Open(filepath.Join(dirs[0], "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := proxysweep.ReadRows(f)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range rows {
		seen[r.Target] = true
		if r.TPS <= 0 || r.PeakBackends < 1 {
			t.Errorf("%+v: no throughput or no backend seen", r)
		}
		if direct := r.Target == proxysweep.TargetDirect; direct != math.IsNaN(r.MiddlewareCPU) || (!direct && r.MiddlewareCPU <= 0) {
			t.Errorf("%s: middleware CPU %v µs per transaction", r.Target, r.MiddlewareCPU)
		}
		if _, err := os.Stat("/proc/self/schedstat"); err == nil {
			if direct := r.Target == proxysweep.TargetDirect; direct != math.IsNaN(r.MiddlewareRunQueue) || r.MiddlewareRunQueue < 0 {
				t.Errorf("%s: middleware waited %v µs per transaction for a CPU", r.Target, r.MiddlewareRunQueue)
			}
		}
		if !(r.MachineIdle >= 0 && r.MachineIdle <= 100) {
			t.Errorf("%s: machine idle %v%%", r.Target, r.MachineIdle)
		}
		if r.Target == proxysweep.TargetProxyAgg && r.PeakBackends > 3 {
			t.Errorf("aggregated proxy: %d backends at the peak, pool size 3", r.PeakBackends)
		}
	}
	for _, tg := range append(append([]string{}, proxysweep.SysbenchTargets...), proxysweep.PgbenchTargets...) {
		if !seen[tg] {
			t.Errorf("no run of target %s", tg)
		}
	}
	rep, err := os.ReadFile(filepath.Join(dirs[0], "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## oltp_point_select (QPS)", "## Targets", "backend connections <= --pool-size 3",
		"Middleware CPU per transaction", "`--procs 1`", "waiting for a CPU"} {
		if !strings.Contains(string(rep), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
}
