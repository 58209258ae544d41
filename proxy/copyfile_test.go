package proxy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
)

// TestCopyServerFileAsOnOneServer runs COPY FROM and TO server files and programs on
// one PostgreSQL database and through the proxy over 2 data sources x 2 tables, and
// compares what the client sees (the command tag or the error) and then the tables'
// rows. Over several shards the server of the first one reads the file, and every row
// lands on the physical table its key names: text with escapes, NULLs, CSV with a
// header, a WHERE clause, a generated column, a program, a bad row that loads nothing.
func TestCopyServerFileAsOnOneServer(t *testing.T) {
	dir, err := os.MkdirTemp("", "shardlab-copyfile-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil { // the server reads the files as its own user
		t.Fatal(err)
	}
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var text strings.Builder
	for i := 1; i <= 25000; i++ { // more than one batch of rows
		switch i % 4 {
		case 0:
			fmt.Fprintf(&text, "%d\tk%d\t\\N\n", i, i%3)
		case 1:
			fmt.Fprintf(&text, "%d\tk%d\ta tab\\there, a backslash \\\\ and\\na newline\n", i, i%3)
		default:
			fmt.Fprintf(&text, "%d\tk%d\tplain %d\n", i, i%3, i)
		}
	}
	textFile := write("events.txt", text.String())
	csvFile := write("events.csv", "id,kind,body\n100001,csv,\"quoted, with comma\"\n100002,csv,\"two\nlines\"\n100003,csv,\n")
	badFile := write("bad.txt", "200001\tok\tfine\n200002\tok\tfine\nnot-a-number\tbad\tbad\n")
	tagsFile := write("tags.txt", "red\nblue\ngreen\n")
	out := filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(out, 0o777); err != nil {
		t.Fatal(err)
	}
	steps := []string{
		"COPY events FROM '" + textFile + "'",
		"COPY events (id, kind, body) FROM '" + csvFile + "' WITH (FORMAT csv, HEADER true)",
		"COPY events FROM '" + textFile + "' WHERE id > 100000",
		"COPY events FROM '" + badFile + "'",
		"BEGIN; COPY events FROM '" + badFile + "'; COMMIT",
		"ROLLBACK",
		"COPY tags FROM PROGRAM 'cat " + tagsFile + "'",
		"COPY plain FROM '" + tagsFile + "'",
		"COPY plain TO '" + filepath.Join(out, "plain") + "'",
		"COPY events FROM '" + filepath.Join(dir, "missing") + "'",
	}
	schema := []string{
		"CREATE TABLE events (id bigint PRIMARY KEY, kind text, body text, twice bigint GENERATED ALWAYS AS (id * 2) STORED)",
		"CREATE TABLE tags (name text PRIMARY KEY)",
		"CREATE TABLE plain (name text)",
	}
	see := func(c *pgx.Conn) []string {
		ctx := context.Background()
		var seen []string
		// COPY FROM STDIN with a WHERE clause keeps its literal too.
		tag, err := c.PgConn().CopyFrom(ctx, strings.NewReader("300001\tw\tx\n5\tw\tx\n"), "COPY events FROM STDIN WHERE id > 300000")
		seen = append(seen, fmt.Sprintf("COPY FROM STDIN WHERE -> %v %s", tag, sqlState(err)))
		for _, q := range steps {
			tag, err := c.PgConn().Exec(ctx, q).ReadAll()
			var tags []string
			for _, r := range tag {
				tags = append(tags, r.CommandTag.String())
			}
			line := fmt.Sprintf("%s -> %v", strings.ReplaceAll(q, dir, "DIR"), tags)
			if err != nil {
				line += " error " + sqlState(err)
			}
			seen = append(seen, line)
		}
		for _, q := range []string{
			"SELECT id, kind, body, twice FROM events ORDER BY id",
			"SELECT name FROM tags ORDER BY name",
			"SELECT name FROM plain ORDER BY name",
		} {
			rows, err := c.Query(ctx, q, pgx.QueryExecModeSimpleProtocol)
			if err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			n := 0
			var all strings.Builder
			for rows.Next() {
				n++
				fmt.Fprintln(&all, rows.RawValues())
			}
			if rows.Err() != nil {
				t.Fatalf("%s: %v", q, rows.Err())
			}
			seen = append(seen, fmt.Sprintf("%s: %d rows, %x", q, n, all.String()))
		}
		return seen
	}
	ctx := context.Background()
	directDSN := pgtest.NewDatabase(t, "copyfile_direct")
	direct, err := pgx.Connect(ctx, directDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	for _, q := range schema {
		exec1(t, direct, q)
	}
	want := see(direct)

	dsns := []string{pgtest.NewDatabase(t, "copyfile_s0"), pgtest.NewDatabase(t, "copyfile_s1")}
	r := shardedRules(dsns, nil, []string{"tags"})
	r.Tables = []rules.Table{{Name: "events", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2},
		{Name: "gen_first", Strategy: rules.Strategy{Column: "id"}}, {Name: "exact", Strategy: rules.Strategy{Column: "id"}}}
	e := startProxyOn(t, r)
	c := e.connect(t)
	for _, q := range schema {
		exec1(t, c, q)
	}
	got := see(c)
	for i := range want {
		if got[i] != want[i] {
			g, w := got[i], want[i]
			if len(g) > 300 {
				g, w = g[:300]+"...", w[:min(len(w), 300)]+"..."
			}
			t.Errorf("step %d:\n proxy  %s\n direct %s", i+1, g, w)
		}
	}
	// Every physical table got rows, each where the rules put its key, and the
	// broadcast table is whole on both data sources.
	rule := e.rules.Lookup("events")
	for shard, node := range rule.Nodes {
		var n int64
		q := fmt.Sprintf("SELECT count(*) FROM %s", pgx.Identifier{node.Table}.Sanitize())
		if err := e.shard(t, node.DataSource).QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Errorf("physical table %d (%s on data source %d) got no rows", shard, node.Table, node.DataSource)
		}
		rows, err := e.shard(t, node.DataSource).Query(ctx, "SELECT id::text FROM "+pgx.Identifier{node.Table}.Sanitize())
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			rows.Scan(&id)
			shards, err := rule.ShardsFor(map[string]rules.Key{"id": rules.TextKey(id)}, map[string]rules.KeyType{"id": rules.TypeInt8})
			if err != nil || len(shards) != 1 || shards[0] != shard {
				t.Fatalf("row %s is on physical table %d, the rules say %v (%v)", id, shard, shards, err)
			}
		}
	}
	for i := range dsns {
		if n := queryInt(t, e.shard(t, i), "SELECT count(*) FROM tags"); n != 3 {
			t.Errorf("data source %d has %d tags, want 3", i, n)
		}
	}
	// COPY without a column list skips generated columns, so a generated column before
	// the sharding key does not shift it: each row is found by its key.
	exec1(t, c, "CREATE TABLE gen_first (twice bigint GENERATED ALWAYS AS (id * 2) STORED, id bigint PRIMARY KEY, v bigint)")
	var gen strings.Builder
	for i := 1; i <= 50; i++ {
		fmt.Fprintf(&gen, "%d\t%d\n", i, i*7+3)
	}
	if _, err := c.PgConn().CopyFrom(ctx, strings.NewReader(gen.String()), "COPY gen_first FROM STDIN"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 50; i++ {
		if n := queryInt(t, c, "SELECT count(*) FROM gen_first WHERE id = $1", i); n != 1 {
			t.Fatalf("row %d of gen_first is not where its key routes (%d found)", i, n)
		}
	}
	// Values arrive exact whatever the session's encoding and float settings: a
	// Shift JIS character whose second byte is a backslash, a double with 17 digits,
	// a type's name.
	// A regtype names a type of each shard's own (another OID on each).
	exactFile := write("exact.txt", "1\t1.2345678901234567\t\x83\x5ct\tmood\n2\t0.1\t\x83\x5c\tmood\n")
	exact := func(c *pgx.Conn) string {
		t.Helper()
		for _, q := range []string{"CREATE TYPE mood AS ENUM ('ok')", "CREATE TABLE exact (id bigint PRIMARY KEY, x float8, s text, rt regtype)",
			"SET client_encoding = 'SJIS'", "SET extra_float_digits = 0", "COPY exact FROM '" + exactFile + "'", "RESET ALL"} {
			if _, err := c.PgConn().Exec(ctx, q).ReadAll(); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		rows, err := c.Query(ctx, "SELECT id, float8send(x), convert_to(s, 'UTF8'), rt::text FROM exact ORDER BY id", pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		for rows.Next() {
			fmt.Fprintln(&out, rows.RawValues())
		}
		return out.String()
	}
	if got, want := exact(c), exact(direct); got != want {
		t.Errorf("values under SJIS and extra_float_digits = 0:\n proxy  %s\n direct %s", got, want)
	}
	// Without its sharding key a row has no shard: refused, nothing loaded.
	if _, err := c.Exec(ctx, "COPY events (kind) FROM '"+tagsFile+"'"); sqlState(err) != "0A000" {
		t.Errorf("COPY without the sharding column: %v, want 0A000", err)
	}
	// No staging table is left on any server connection.
	for i := range dsns {
		if n := queryInt(t, e.shard(t, i), "SELECT count(*) FROM pg_class WHERE relname = 'shardlab_copy_source'"); n != 0 {
			t.Errorf("data source %d still has a staging table", i)
		}
	}
}
