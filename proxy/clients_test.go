package proxy_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPsqlSession runs a psql script through the proxy: DDL, inserts, cross-shard
// reads, a transaction, \copy in and out, and a refusal.
func TestPsqlSession(t *testing.T) {
	e := startProxy(t, 2, []string{"users=id"}, []string{"countries"})
	script := `
\set ON_ERROR_STOP 1
CREATE TABLE countries (code text PRIMARY KEY, name text);
CREATE TABLE users (id bigint PRIMARY KEY, name text NOT NULL, country text, score int);
INSERT INTO countries VALUES ('fr', 'France'), ('jp', 'Japan');
INSERT INTO users VALUES (1, 'ann', 'fr', 10), (2, 'bob', 'jp', 20), (3, 'cat', 'fr', 30), (4, 'dan', 'jp', 40);
\copy users from stdin with (format csv)
5,eve,fr,50
6,"fay, the second",jp,60
\.
BEGIN;
UPDATE users SET score = score + 1 WHERE id = 1;
UPDATE users SET score = score + 1 WHERE id = 2;
COMMIT;
SELECT id, name, score FROM users ORDER BY id;
SELECT country, count(*), sum(score) FROM users GROUP BY country ORDER BY country;
SELECT u.name, c.name FROM users u JOIN countries c ON c.code = u.country WHERE u.id = 6;
\copy (SELECT id, name FROM users WHERE id > 4 ORDER BY id) to stdout with (format csv)
\copy (SELECT id FROM users ORDER BY id) to stdout with (format binary)
`
	out, err := run(t, time.Minute, "psql", "-X", "-q", "-A", "-t", "-h", e.host(), "-p", e.port(), "-U", "postgres", "-d", testDatabase, "-c", "SELECT 1")
	if err != nil || strings.TrimSpace(out) != "1" {
		t.Fatalf("psql -c: %v\n%s", err, out)
	}
	// The last line is a refusal (binary COPY of a query merged across shards), which
	// stops the script with an error after everything else ran.
	out, err = runStdin(t, time.Minute, script, "psql", "-X", "-A", "-t", "-h", e.host(), "-p", e.port(), "-U", "postgres", "-d", testDatabase)
	if err == nil {
		t.Errorf("psql: the script's last statement should have been refused\n%s", out)
	}
	for _, want := range []string{
		"1|ann|11", "2|bob|21", "6|fay, the second|60",
		"fr|3|91", "jp|3|121",
		"fay, the second|Japan",
		"5,eve\n6,\"fay, the second\"", // COPY (query) merged across shards, in CSV
		"0A000",                        // \set VERBOSITY is default: the refusal's message names the construct
	} {
		if want == "0A000" {
			if !strings.Contains(out, "COPY (query) TO STDOUT over several shards") || !strings.Contains(out, "binary") {
				t.Errorf("psql output lacks the refusal of COPY (query):\n%s", out)
			}
			continue
		}
		if !strings.Contains(out, want) {
			t.Errorf("psql output lacks %q:\n%s", want, out)
		}
	}
	// The rows are spread over both shards and the broadcast table is on both.
	for i := range e.dsns {
		s := e.shard(t, i)
		if n := queryInt(t, s, "SELECT count(*) FROM users"); n == 0 || n == 6 {
			t.Errorf("shard %d holds %d of 6 users", i, n)
		}
		if n := queryInt(t, s, "SELECT count(*) FROM countries"); n != 2 {
			t.Errorf("shard %d holds %d countries, want 2", i, n)
		}
	}
	// \copy ... to stdout of a sharded table gets every shard's rows.
	out, err = run(t, time.Minute, "psql", "-X", "-h", e.host(), "-p", e.port(), "-U", "postgres", "-d", testDatabase,
		"-c", `\copy users to stdout with (format csv, header)`)
	if err != nil {
		t.Fatalf("copy to stdout: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 7 || lines[0] != "id,name,country,score" {
		t.Errorf("COPY TO of 6 rows with a header gave %d lines:\n%s", len(lines), out)
	}
}

// TestPgbench: pgbench -i loads the tables (TRUNCATE and COPY ... FREEZE in one
// transaction on each shard), pgbench -S runs in the simple, extended and prepared
// protocols, and the TPC-B script runs with no failed transaction; afterwards the
// balances add up across shards, as they must after TPC-B.
func TestPgbench(t *testing.T) {
	e := startProxy(t, 2, []string{"pgbench_accounts=aid", "pgbench_history=aid"},
		[]string{"pgbench_branches", "pgbench_tellers"}, withPool(8, 10*time.Second))
	conn := []string{"-h", e.host(), "-p", e.port(), "-U", "postgres"}
	// pgbench -i loads with COPY ... WITH (FREEZE), which PostgreSQL refuses unless
	// the table was truncated in the same transaction: its success shows that TRUNCATE
	// and COPY shared one server transaction on every shard.
	out, err := run(t, 3*time.Minute, "pgbench", append(append([]string{"-i", "-s", "1", "-q"}, conn...), testDatabase)...)
	if err != nil || !strings.Contains(out, "done in") {
		t.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	var accounts int64
	for i := range e.dsns {
		n := queryInt(t, e.shard(t, i), "SELECT count(*) FROM pgbench_accounts")
		if n == 0 {
			t.Errorf("shard %d holds no accounts", i)
		}
		accounts += n
		if b := queryInt(t, e.shard(t, i), "SELECT count(*) FROM pgbench_branches"); b != 1 {
			t.Errorf("shard %d holds %d branches, want the broadcast 1", i, b)
		}
	}
	if accounts != 100000 {
		t.Errorf("shards hold %d accounts in all, want 100000", accounts)
	}
	for _, mode := range []string{"simple", "extended", "prepared"} {
		out, err := run(t, time.Minute, "pgbench", append(append([]string{"-S", "-M", mode, "-c", "4", "-j", "2", "-T", "2"}, conn...), testDatabase)...)
		checkPgbench(t, "-S -M "+mode, out, err)
	}
	out, err = run(t, 2*time.Minute, "pgbench", append(append([]string{"-M", "prepared", "-c", "4", "-j", "2", "-T", "3"}, conn...), testDatabase)...)
	checkPgbench(t, "TPC-B", out, err)
	c := e.connect(t)
	abalance := queryInt(t, c, "SELECT sum(abalance) FROM pgbench_accounts")
	delta := queryInt(t, c, "SELECT sum(delta) FROM pgbench_history")
	bbalance := queryInt(t, c, "SELECT sum(bbalance) FROM pgbench_branches")
	tbalance := queryInt(t, c, "SELECT sum(tbalance) FROM pgbench_tellers")
	history := queryInt(t, c, "SELECT count(*) FROM pgbench_history")
	if history == 0 || abalance != delta || bbalance != delta || tbalance != delta {
		t.Errorf("after TPC-B: sum(abalance) %d, sum(delta) %d, sum(bbalance) %d, sum(tbalance) %d over %d history rows; all sums must be equal",
			abalance, delta, bbalance, tbalance, history)
	}
	// The shards' own rows add up to what the proxy answers.
	var perShard int64
	for i := range e.dsns {
		perShard += queryInt(t, e.shard(t, i), "SELECT sum(abalance) FROM pgbench_accounts")
	}
	if perShard != abalance {
		t.Errorf("shards' sum(abalance) %d, proxy's %d", perShard, abalance)
	}
}

var (
	pgbenchProcessed = regexp.MustCompile(`number of transactions actually processed: (\d+)`)
	pgbenchFailed    = regexp.MustCompile(`number of failed transactions: (\d+)`)
)

func checkPgbench(t *testing.T, what, out string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("pgbench %s: %v\n%s", what, err, out)
	}
	m := pgbenchProcessed.FindStringSubmatch(out)
	f := pgbenchFailed.FindStringSubmatch(out)
	if m == nil || f == nil {
		t.Fatalf("pgbench %s: no summary in\n%s", what, out)
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Errorf("pgbench %s processed no transaction\n%s", what, out)
	}
	if f[1] != "0" {
		t.Errorf("pgbench %s: %s failed transactions\n%s", what, f[1], out)
	}
	t.Logf("pgbench %s: %s transactions", what, m[1])
}

// TestSysbench: sysbench's OLTP workloads prepare, run and clean up through the
// proxy with named prepared statements and binary results; the only errors allowed
// are the deadlock retries sysbench ignores.
func TestSysbench(t *testing.T) {
	e := startProxy(t, 2, []string{"sbtest*=id"}, nil, withPool(8, 10*time.Second))
	base := []string{"--db-driver=pgsql", "--pgsql-host=" + e.host(), "--pgsql-port=" + e.port(), "--pgsql-user=postgres",
		"--pgsql-db=" + testDatabase, "--tables=2", "--table-size=2000", "--auto_inc=off"}
	sb := func(args ...string) string {
		t.Helper()
		out, err := run(t, 2*time.Minute, "sysbench", append(args[:1:1], append(base, args[1:]...)...)...)
		if err != nil || strings.Contains(out, "FATAL") {
			t.Fatalf("sysbench %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	sb("oltp_read_write", "prepare")
	var rows int64
	for i := range e.dsns {
		n := queryInt(t, e.shard(t, i), "SELECT count(*) FROM sbtest1")
		if n == 0 {
			t.Errorf("shard %d holds no sbtest1 rows", i)
		}
		rows += n
	}
	if rows != 2000 {
		t.Errorf("sbtest1 has %d rows over the shards, want 2000", rows)
	}
	for _, w := range [][]string{
		{"oltp_point_select"},
		{"oltp_write_only"},
		{"oltp_read_write"},
		{"oltp_read_write", "--range_selects=off"},
	} {
		out := sb(append(w, "--threads=4", "--time=3", "run")...)
		tx := regexp.MustCompile(`transactions:\s+(\d+)`).FindStringSubmatch(out)
		ignored := regexp.MustCompile(`ignored errors:\s+(\d+)`).FindStringSubmatch(out)
		if tx == nil || tx[1] == "0" || ignored == nil {
			t.Errorf("sysbench %s: no transactions\n%s", strings.Join(w, " "), out)
			continue
		}
		n, _ := strconv.Atoi(tx[1])
		ig, _ := strconv.Atoi(ignored[1])
		t.Logf("sysbench %s: %d transactions, %d ignored errors (deadlock retries)", strings.Join(w, " "), n, ig)
		if ig > n/5+5 {
			t.Errorf("sysbench %s: %d ignored errors for %d transactions", strings.Join(w, " "), ig, n)
		}
	}
	sb("oltp_read_write", "cleanup")
	for i := range e.dsns {
		if n := queryInt(t, e.shard(t, i), "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'sbtest%'"); n != 0 {
			t.Errorf("shard %d still has %d sbtest tables after cleanup", i, n)
		}
	}
}

// TestLargeObjectsThroughPsql: psql's \lo_import and \lo_export, which use libpq's
// large-object functions over the protocol's function call message, work through the
// proxy: the objects live on the first data source.
func TestLargeObjectsThroughPsql(t *testing.T) {
	e := startProxy(t, 2, []string{"t=id"}, nil)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.bin"), filepath.Join(dir, "out.bin")
	data := bytes.Repeat([]byte("shardlab large object\x00\x01\x02"), 5000)
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := run(t, time.Minute, "psql", "-X", "-v", "ON_ERROR_STOP=1", e.url(""), "-c", `\lo_import `+in)
	if err != nil {
		t.Fatalf("\\lo_import: %v\n%s", err, res)
	}
	var oid uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(res), "lo_import %d", &oid); err != nil {
		t.Fatalf("\\lo_import answered %q", res)
	}
	if res, err := run(t, time.Minute, "psql", "-X", "-v", "ON_ERROR_STOP=1", e.url(""), "-c", fmt.Sprintf(`\lo_export %d %s`, oid, out)); err != nil {
		t.Fatalf("\\lo_export: %v\n%s", err, res)
	}
	got, err := os.ReadFile(out)
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("the object read back differs (%d bytes, want %d): %v", len(got), len(data), err)
	}
	if n := queryInt(t, e.shard(t, 0), "SELECT count(*) FROM pg_largeobject_metadata WHERE oid = $1", oid); n != 1 {
		t.Errorf("the object is not on the first data source")
	}
}
