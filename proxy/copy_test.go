package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
)

// TestCopy: COPY FROM STDIN puts every row on the shard its key names, over a layout
// of 2 data sources x 2 tables, in text and CSV; a broadcast table gets every row on
// every data source; a bad row or CopyFail loads nothing; COPY TO STDOUT gives every
// shard's rows.
func TestCopy(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t, "copy_s0"), pgtest.NewDatabase(t, "copy_s1")}
	r := shardedRules(dsns, nil, []string{"tags"})
	r.Tables = []rules.Table{{Name: "events", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2}}
	e := startProxyOn(t, r)
	c := e.connect(t)
	exec1(t, c, "CREATE TABLE events (id bigint PRIMARY KEY, kind text, body text)")
	exec1(t, c, "CREATE TABLE tags (name text PRIMARY KEY)")
	pc := e.pgconnect(t)
	ctx := context.Background()

	var text bytes.Buffer
	for i := 1; i <= 200; i++ {
		fmt.Fprintf(&text, "%d\tk%d\tline\\twith a tab\n", i, i%3)
	}
	tag, err := pc.CopyFrom(ctx, &text, "COPY events FROM STDIN")
	if err != nil || tag.RowsAffected() != 200 {
		t.Fatalf("COPY text: %v %v", tag, err)
	}
	csv := "id,kind,body\n1001,csv,\"quoted, with comma\"\n1002,csv,\"two\nlines\"\n1003,csv,\n"
	tag, err = pc.CopyFrom(ctx, strings.NewReader(csv), "COPY events (id, kind, body) FROM STDIN WITH (FORMAT csv, HEADER true)")
	if err != nil || tag.RowsAffected() != 3 {
		t.Fatalf("COPY csv: %v %v", tag, err)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM events"); n != 203 {
		t.Errorf("%d events, want 203", n)
	}
	var body string
	if err := c.QueryRow(ctx, "SELECT body FROM events WHERE id = 1002").Scan(&body); err != nil || body != "two\nlines" {
		t.Errorf("CSV field with a newline: %q %v", body, err)
	}
	if err := c.QueryRow(ctx, "SELECT body FROM events WHERE id = 7").Scan(&body); err != nil || body != "line\twith a tab" {
		t.Errorf("text field with an escaped tab: %q %v", body, err)
	}
	// Every physical table holds rows, each where the rules put its key.
	rule := e.rules.Lookup("events")
	total := 0
	for shard, node := range rule.Nodes {
		rows, err := e.shard(t, node.DataSource).Query(ctx, "SELECT id::text FROM "+pgx.Identifier{node.Table}.Sanitize())
		if err != nil {
			t.Fatal(err)
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			t.Errorf("physical table %s on ds_%d is empty", node.Table, node.DataSource)
		}
		for _, k := range keys {
			got, err := rule.ShardsFor(map[string]rules.Key{"id": rules.TextKey(k)}, map[string]rules.KeyType{"id": rules.TypeInt8})
			if err != nil || len(got) != 1 || got[0] != shard {
				t.Errorf("key %s is in shard %d, the rules say %v", k, shard, got)
			}
		}
		total += len(keys)
	}
	if total != 203 {
		t.Errorf("physical tables hold %d rows, want 203", total)
	}

	// A broadcast table: every row on every data source; the count is the table's.
	tag, err = pc.CopyFrom(ctx, strings.NewReader("red\ngreen\nblue\n"), "COPY tags FROM STDIN")
	if err != nil || tag.RowsAffected() != 3 {
		t.Fatalf("COPY broadcast: %v %v", tag, err)
	}
	for i := range dsns {
		if n := queryInt(t, e.shard(t, i), "SELECT count(*) FROM tags"); n != 3 {
			t.Errorf("ds_%d holds %d tags, want 3", i, n)
		}
	}

	// A key that is not a number: nothing of the COPY stays, on any shard.
	_, err = pc.CopyFrom(ctx, strings.NewReader("2001\tok\tx\nnot-a-number\tbad\tx\n"), "COPY events FROM STDIN")
	if err == nil {
		t.Error("COPY with a bad key succeeded")
	}
	// A duplicate key, which one shard refuses: the other shards' rows go too.
	_, err = pc.CopyFrom(ctx, strings.NewReader("3001\tok\tx\n3002\tok\tx\n3003\tok\tx\n5\tdup\tx\n"), "COPY events FROM STDIN")
	if sqlState(err) != "23505" {
		t.Errorf("COPY with a duplicate key: %v, want 23505", err)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM events WHERE id > 2000"); n != 0 {
		t.Errorf("%d rows of failed COPYs stayed", n)
	}
	// Inside a transaction that rolls back.
	exec1(t, c, "BEGIN")
	if _, err := c.PgConn().CopyFrom(ctx, strings.NewReader("4001\tin tx\tx\n4002\tin tx\tx\n"), "COPY events FROM STDIN"); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM events WHERE id > 4000"); n != 2 {
		t.Errorf("inside the transaction: %d rows, want 2", n)
	}
	exec1(t, c, "ROLLBACK")
	if n := queryInt(t, c, "SELECT count(*) FROM events WHERE id > 4000"); n != 0 {
		t.Errorf("after ROLLBACK: %d rows", n)
	}
	// Binary COPY cannot be split by shard.
	if _, err := pc.CopyFrom(ctx, strings.NewReader(""), "COPY events FROM STDIN WITH (FORMAT binary)"); sqlState(err) != "0A000" {
		t.Errorf("binary COPY into a sharded table: %v, want 0A000", err)
	}
	// COPY TO STDOUT from every shard.
	var out bytes.Buffer
	tag, err = pc.CopyTo(ctx, &out, "COPY events (id) TO STDOUT")
	if err != nil || tag.RowsAffected() != 203 || strings.Count(out.String(), "\n") != 203 {
		t.Errorf("COPY TO: %v %v, %d lines", tag, err, strings.Count(out.String(), "\n"))
	}
	// The connection is fine after all that.
	if n := queryInt(t, c, "SELECT count(*) FROM tags"); n != 3 {
		t.Errorf("tags %d", n)
	}
}
