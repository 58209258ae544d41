package report_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/lab/report"
)

func TestRunInfoBusy(t *testing.T) {
	const head = "run_id: r\ncommand: scripts/run_all_scenarios.sh\ncpus: 2\n"
	for _, tc := range []struct {
		name  string
		text  string
		other float64 // want OtherCPUs, -1 for not recorded
		busy  []string
	}{
		{"quiet", head + "loadavg_start: 0.10 0.20 0.30\nloadavg_end: 2.50 1.00 0.50\nwall_s: 100\nmachine_cpu_s: 201\nlab_cpu_s: 195\n",
			0.06, nil},
		{"loaded at the start", head + "loadavg_start: 2.50 1.00 0.50\nwall_s: 100\nmachine_cpu_s: 200\nlab_cpu_s: 199\n",
			0.01, []string{"load average was 2.50 when the run started"}},
		{"other work during the run", head + "loadavg_start: 0.10 0.20 0.30\nwall_s: 100\nmachine_cpu_s: 200\nlab_cpu_s: 170\n",
			0.30, []string{"other processes used 0.30 CPUs on average during the run, 15% of the machine"}},
		// The end load counts the lab's own work: never a reason on its own.
		{"high load at the end only", head + "loadavg_start: 0.10 0.20 0.30\nloadavg_end: 4.00 3.00 2.00\n", -1, nil},
		{"nothing about CPU time", head, -1, nil},
		{"lab more than the machine (clock skew)", head + "wall_s: 10\nmachine_cpu_s: 19\nlab_cpu_s: 20\n", 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ri, err := report.ParseRunInfo(strings.NewReader(tc.text))
			if err != nil {
				t.Fatal(err)
			}
			if ri.RunID != "r" || ri.Command != "scripts/run_all_scenarios.sh" || ri.CPUs != 2 {
				t.Errorf("parsed %+v", ri)
			}
			other, ok := ri.OtherCPUs()
			if tc.other < 0 && ok || tc.other >= 0 && (!ok || other < tc.other-1e-9 || other > tc.other+1e-9) {
				t.Errorf("OtherCPUs = %v, %v; want %v", other, ok, tc.other)
			}
			why := ri.BusyReasons()
			if len(why) != len(tc.busy) {
				t.Fatalf("BusyReasons = %q, want %d reasons", why, len(tc.busy))
			}
			for i, w := range tc.busy {
				if !strings.Contains(why[i], w) {
					t.Errorf("reason %q lacks %q", why[i], w)
				}
			}
		})
	}
}

func TestRunInfoErrors(t *testing.T) {
	for _, text := range []string{"cpus: two\n", "loadavg_start: 1 2\n", "loadavg_end: 1 x 3\n", "wall_s: soon\n"} {
		if _, err := report.ParseRunInfo(strings.NewReader(text)); !errors.Is(err, report.ErrBadRunInfo) {
			t.Errorf("%q: err %v, want ErrBadRunInfo", text, err)
		}
	}
	// Lines the report does not know are left alone: newer scripts may record more.
	if _, err := report.ParseRunInfo(strings.NewReader("kernel: 6.1\nno colon here\n")); err != nil {
		t.Errorf("unknown lines: %v", err)
	}
	var none *report.RunInfo
	if why := none.BusyReasons(); why != nil {
		t.Errorf("nil RunInfo busy: %q", why)
	}
}
