package proxy_test

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/proxy"
)

// TestAdminDatabase: the admin console answers SHOW POOLS with pgbouncer's columns,
// shows where a statement would run, and /metrics reports the same pools.
func TestAdminDatabase(t *testing.T) {
	e := startProxy(t, 2, []string{"t=id"}, nil, func(c *proxy.Config) { c.AdminDatabase = "shardlab" })
	c := e.connect(t)
	exec1(t, c, "CREATE TABLE t (id int PRIMARY KEY, v int)")
	exec1(t, c, "INSERT INTO t VALUES (1, 1), (2, 2), (3, 3)")
	ctx := context.Background()
	adm, err := pgconn.Connect(ctx, strings.Replace(e.url(""), "/"+testDatabase+"?", "/shardlab?", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close(ctx)
	res, err := adm.Exec(ctx, "SHOW POOLS").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, f := range res[0].FieldDescriptions {
		cols = append(cols, f.Name)
	}
	if strings.Join(cols[:4], ",") != "database,user,cl_active,cl_waiting" || len(res[0].Rows) != 2 || string(res[0].Rows[0][0]) != "ds_0" {
		t.Errorf("SHOW POOLS: columns %v, rows %q", cols, res[0].Rows)
	}
	idle := string(res[0].Rows[0][9])
	if idle == "0" {
		t.Errorf("SHOW POOLS: no idle connection on ds_0 after statements ran (sv_idle %s)", idle)
	}
	// A client whose session holds a temporary table keeps its connection: pinned.
	exec1(t, c, "CREATE TEMP TABLE scratch (x int)")
	res, err = adm.Exec(ctx, "SHOW POOLS").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if cols := res[0].FieldDescriptions; cols[16].Name != "cl_pinned" || string(res[0].Rows[0][16]) != "1" || string(res[0].Rows[1][16]) != "0" {
		t.Errorf("SHOW POOLS: %s of ds_0 and ds_1: %s, %s; want 1, 0", cols[16].Name, res[0].Rows[0][16], res[0].Rows[1][16])
	}
	route := func(sql string) string {
		t.Helper()
		res, err := adm.Exec(ctx, "SHOW ROUTE "+sql).ReadAll()
		if err != nil {
			return "error: " + err.Error()
		}
		var lines []string
		for _, r := range res[0].Rows {
			lines = append(lines, string(r[0]))
		}
		return strings.Join(lines, "\n")
	}
	if r := route("SELECT v FROM t WHERE id = 2"); !strings.Contains(r, "(1 target)") || !strings.Contains(r, "SELECT v FROM t WHERE id = 2") {
		t.Errorf("route of a point select:\n%s", r)
	}
	if r := route("SELECT count(*) FROM t"); !strings.Contains(r, "(2 targets)") || !strings.Contains(r, "merge:") {
		t.Errorf("route of a cross-shard count:\n%s", r)
	}
	if r := route("SELECT id, rank() OVER (ORDER BY v) FROM t"); !strings.Contains(r, "0A000") {
		t.Errorf("route of a refused statement:\n%s", r)
	}
	for _, q := range []string{"SHOW DATABASES", "SHOW CLIENTS", "SHOW HELP"} {
		if _, err := adm.Exec(ctx, q).ReadAll(); err != nil {
			t.Errorf("%s: %v", q, err)
		}
	}
	if _, err := adm.Exec(ctx, "SELECT 1").ReadAll(); sqlState(err) != "42601" {
		t.Errorf("a statement the console does not know: %v", err)
	}

	rec := httptest.NewRecorder()
	e.srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{`shardlab_proxy_server_connections_idle{data_source="ds_1",user="postgres"}`, `shardlab_proxy_pool_size{data_source="ds_0",user="postgres"} 8`, "shardlab_proxy_clients 2",
		`shardlab_proxy_clients_pinned{data_source="ds_0",user="postgres"} 1`, `shardlab_proxy_session_state_checks_total{data_source="ds_0",user="postgres"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
