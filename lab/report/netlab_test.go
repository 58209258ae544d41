package report_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/lab/report"
)

const tailHeader = "preset,rtt_target_ms,delay_us,jitter_us,jitter_host,extra_jitter_us,shards,query,n,p50_ms,p99_ms,p999_ms,max_ms,p99_trial_min_ms,p99_trial_max_ms,model_p50_ms,model_p99_ms,model_p999_ms\n"

func writeRun(t *testing.T, dir, run, body string) string {
	t.Helper()
	p := filepath.Join(dir, run, "results.csv")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNetlab(t *testing.T) {
	dir := t.TempDir()
	zone := writeRun(t, dir, "netlab-tail-a", tailHeader+
		"zone,0.500,200,25,shard0,200,1,point,3000,0.90,1.50,2.10,3.0,1.40,1.60,,,\n"+
		"zone,0.500,200,25,shard0,200,1,cross,3000,1.00,1.70,2.30,3.1,1.60,1.80,0.98,1.65,2.20\n"+
		"zone,0.500,200,25,shard0,200,8,point,3000,0.95,1.55,2.20,3.2,1.50,1.70,,,\n"+
		"zone,0.500,200,25,shard0,200,8,cross,3000,1.40,2.60,3.90,5.0,2.40,2.90,1.35,2.45,3.70\n")
	crossZone := writeRun(t, dir, "netlab-tail-b", strings.ReplaceAll(tailHeader+
		"cross-zone,2.000,900,100,shard0,900,1,point,3000,2.40,3.50,4.10,5.0,3.40,3.60,,,\n"+
		"cross-zone,2.000,900,100,shard0,900,1,cross,3000,2.50,3.70,4.30,5.1,3.60,3.80,2.48,3.65,4.20\n"+
		"cross-zone,2.000,900,100,shard0,900,8,point,3000,2.45,3.55,4.20,5.2,3.50,3.70,,,\n"+
		"cross-zone,2.000,900,100,shard0,900,8,cross,3000,3.40,5.60,6.90,8.0,5.40,5.90,3.35,5.45,6.70\n", "\r", ""))
	bench := writeRun(t, dir, "netlab-pgbench-c", "preset,shards,rtt_target_ms,delay_us,jitter_us,loss_pct,rate,clients,mode,time_s,transactions,tps,latency_avg_ms,failed,proxy_cpu_us_per_tx,delayline_cpu_us_per_tx,status\n"+
		"zone,2,0.500,200,25,0,10gbit,8,prepared,10,30000,3000.5,2.660,0,80.1,40.2,ok\n"+
		"cross-zone,2,2.000,900,100,0,5gbit,8,prepared,10,12000,1200.1,6.660,0,82.1,41.2,ok\n")
	out := filepath.Join(dir, "doc", "netlab-results.md")
	files, err := report.Netlab(report.NetlabConfig{CSVPaths: []string{crossZone, zone, bench}, OutPath: out})
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"### zone (netlab-tail-a, round trip 0.5 ms; shard0 jittered ± 0.2 ms)",
		"| 8 | cross | 3000 | 1.40 | 2.60 (2.40-2.90) | 3.90 | 1.35 | 2.45 | 3.70 |",
		"| 8 | point | 3000 | 0.95 | 1.55 (1.50-1.70) | 2.20 |  |  |  |",
		"## Latency against the round trip",
		"| netlab-pgbench-c | cross-zone | 2 | 2 | 8 | prepared | 1200 | 6.660 | 82.1 | ok |",
		"charts/latency-vs-rtt.png",
		"charts/pgbench-tps-vs-rtt.png",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("the report lacks %q:\n%s", want, md)
		}
	}
	// The zone run (the shorter round trip) comes first, whatever the order given.
	if strings.Index(string(md), "### zone") > strings.Index(string(md), "### cross-zone") {
		t.Errorf("runs not in order of round trip")
	}
	for _, f := range files {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	if len(files) != 5*2+1 { // two tail charts, latency against RTT, two pgbench charts (png and svg each), the markdown
		t.Errorf("wrote %d files, want 11: %v", len(files), files)
	}
}

func TestNetlabRefusesOtherCSVs(t *testing.T) {
	dir := t.TempDir()
	other := writeRun(t, dir, "sweep", "run_id,scenario\nx,y\n")
	out := filepath.Join(dir, "r.md")
	if _, err := report.Netlab(report.NetlabConfig{CSVPaths: []string{other}, OutPath: out}); !errors.Is(err, report.ErrNotNetlab) {
		t.Errorf("a scenario CSV: %v, want ErrNotNetlab", err)
	}
	bad := writeRun(t, dir, "netlab-tail-x", tailHeader+"zone,0.5,200,25,shard0,200,1,cross,lots,1,2,3,4,1,2,1,2,3\n")
	if _, err := report.Netlab(report.NetlabConfig{CSVPaths: []string{bad}, OutPath: out}); err == nil || !strings.Contains(err.Error(), "lots") {
		t.Errorf("a bad number: %v", err)
	}
	if _, err := report.Netlab(report.NetlabConfig{OutPath: out}); err == nil {
		t.Errorf("no CSVs: no error")
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused report was written: %v", err)
	}
}
