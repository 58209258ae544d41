package proxy_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// TestCopyQueryAsOnOneServer: COPY (query) TO STDOUT over two shards writes, byte for
// byte, what one PostgreSQL database writes for the same rows: text and CSV, headers,
// NULL strings, delimiters, values with quotes, commas, tabs, backslashes and line
// breaks; a query merged across shards (ORDER BY, an aggregate), and one that a
// single shard answers inside the client's COPY.
func TestCopyQueryAsOnOneServer(t *testing.T) {
	setup := []string{
		"CREATE TABLE cq (id int PRIMARY KEY, t text, n numeric)",
		`INSERT INTO cq VALUES (1, 'plain', 1.5), (2, NULL, NULL), (3, '', 0), (4, 'a,b', 2), (5, 'say "hi"', 3),
			(6, E'tab\there', 4), (7, E'back\\slash', 5), (8, E'two\nlines', 6), (9, 'x', 7), (10, '\.', 8), (11, 'pipe|d', 9)`,
	}
	queries := []string{
		"COPY (SELECT id, t, n FROM cq ORDER BY id) TO STDOUT",
		"COPY (SELECT id, t, n FROM cq ORDER BY id) TO STDOUT WITH (FORMAT csv, HEADER)",
		"COPY (SELECT id, t AS \"the text\", n FROM cq ORDER BY id DESC) TO STDOUT WITH (FORMAT csv, NULL 'x', DELIMITER '|')",
		"COPY (SELECT t FROM cq ORDER BY id) TO STDOUT WITH (FORMAT csv, QUOTE '''', ESCAPE '\\')",
		"COPY (SELECT t FROM cq ORDER BY id) TO STDOUT WITH (DELIMITER '|', NULL 'NULL', HEADER)",
		"COPY (SELECT count(*), sum(n) FROM cq) TO STDOUT WITH (FORMAT csv)",
		"COPY (SELECT id, t FROM cq WHERE id = 8) TO STDOUT WITH (FORMAT csv, FORCE_QUOTE *)",
		// Options PostgreSQL refuses, refused alike on the merged path.
		"COPY (SELECT id FROM cq ORDER BY id) TO STDOUT WITH (DELIMITER 'n')",
		"COPY (SELECT id FROM cq ORDER BY id) TO STDOUT WITH (QUOTE '\"')",
		"COPY (SELECT id FROM cq ORDER BY id) TO STDOUT WITH (FORMAT csv, HEADER match)",
		"COPY (SELECT id FROM cq ORDER BY id) TO STDOUT WITH (FORMAT csv, FORMAT text)",
		"COPY (SELECT id FROM cq ORDER BY id) TO STDOUT WITH (FORMAT csv, DELIMITER '\"')",
	}
	run := func(t *testing.T, dsn string) []string {
		ctx := context.Background()
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		for _, q := range setup {
			if _, err := c.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		var out []string
		for _, q := range queries {
			var buf bytes.Buffer
			tag, err := c.PgConn().CopyTo(ctx, &buf, q)
			out = append(out, q+" -> "+tag.String()+" "+sqlState(err)+"\n"+buf.String())
		}
		return out
	}
	direct := run(t, pgtest.NewDatabase(t, "copyq_direct"))
	e := startProxy(t, 2, []string{"cq=id"}, nil)
	proxied := run(t, e.url(""))
	for i := range direct {
		if proxied[i] != direct[i] {
			t.Errorf("proxy:\n%s\ndirect:\n%s", proxied[i], direct[i])
		}
	}
	if !strings.Contains(strings.Join(direct, ""), `'\\.'`) {
		t.Errorf("no lone \\. in the answers: the test lost a case:\n%s", direct[3])
	}
}
