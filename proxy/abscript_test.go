package proxy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// TestABScript runs scripts/proxy_ab.sh in a tiny mode (HEAD against the work tree, one
// round of one second over two schema shards): both builds serve, results.csv has a
// row for each, the summary has the ratios, and the scratch database is gone. It checks
// the machinery, not the speed.
func TestABScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the proxy twice and runs sysbench")
	}
	needTool(t, "sysbench")
	needTool(t, "psql")
	cfg, err := pgconn.ParseConfig(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	server := fmt.Sprintf("postgres://%s@%s:%d", cfg.User, cfg.Host, cfg.Port)
	runs := t.TempDir()
	out, err := run(t, 5*time.Minute, "../scripts/proxy_ab.sh", "HEAD", "--rounds", "1", "--time", "1", "--tables", "1",
		"--table-size", "200", "--threads", "2", "--shards", "2", "--pool-size", "2", "--server", server, "--runs-dir", runs)
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
	if len(lines) != 3 {
		t.Fatalf("results.csv has %d lines, want a header and one row per side:\n%s", len(lines), csv)
	}
	for _, side := range []string{"old", "new"} {
		found := false
		for _, l := range lines[1:] {
			f := strings.Split(l, ",")
			if len(f) == 9 && f[3] == side {
				found = true
				if f[8] != "ok" || f[5] == "0" || f[6] == "nan" {
					t.Errorf("%s side: %s", side, l)
				}
			}
		}
		if !found {
			t.Errorf("no row for the %s side:\n%s", side, csv)
		}
	}
	summary, err := os.ReadFile(filepath.Join(dirs[0], "summary.txt"))
	if err != nil || !strings.Contains(string(summary), "oltp_write_only throughput: ") {
		t.Errorf("summary.txt (%v):\n%s", err, summary)
	}
	direct := pgtest.DSN(t)
	c, err := pgconn.Connect(t.Context(), direct)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(t.Context())
	res, err := c.Exec(t.Context(), "SELECT count(*) FROM pg_database WHERE datname LIKE 'shardlab\\_ab\\_%'").ReadAll()
	if err != nil || string(res[0].Rows[0][0]) != "0" {
		t.Errorf("scratch databases left behind: %v %v", res, err)
	}
}
