package sqlplan_test

import (
	"context"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/sqlplan"
)

// TestCopyServerFile: COPY to or from a server file or program runs as written where a
// table has one copy of its rows; COPY FROM one into a table over several data sources
// reads the file into a staging table with the client's options and loads each
// physical table from STDIN; COPY of a sharded table TO one is refused.
func TestCopyServerFile(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	ctx := context.Background()
	plan := func(sql string) *sqlplan.Plan {
		t.Helper()
		pl, err := p.Prepare(ctx, sql)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return pl
	}
	for _, sql := range []string{"COPY t_plain FROM '/tmp/x.csv' WITH (FORMAT csv)", "COPY t_plain TO PROGRAM 'cat'", "COPY t_config TO '/tmp/c'"} {
		c := plan(sql).Copy
		if !c.Server || c.Stage != "" || len(c.SQL) == 0 || !strings.Contains(c.SQL[0], "'") {
			t.Errorf("%s: server %v, stage %q, SQL %q: want it run as written", sql, c.Server, c.Stage, c.SQL)
		}
	}
	c := plan("COPY t_order (order_id, note) FROM '/tmp/o.csv' WITH (FORMAT csv, HEADER) WHERE order_id > 5").Copy
	if c.Server || !c.From {
		t.Fatalf("staged copy: server %v, from %v", c.Server, c.From)
	}
	for _, want := range []string{"pg_temp." + sqlplan.CopyStageTable, "'/tmp/o.csv'", "csv", "header", "order_id > 5"} {
		if !strings.Contains(strings.ToLower(c.Stage), strings.ToLower(want)) {
			t.Errorf("stage statement %q lacks %q", c.Stage, want)
		}
	}
	if len(c.SQL) != 4 {
		t.Fatalf("%d load statements, want one per physical table (4): %q", len(c.SQL), c.SQL)
	}
	for _, sql := range c.SQL {
		l := strings.ToLower(sql)
		if !strings.Contains(l, "from stdin") || strings.Contains(l, "csv") || strings.Contains(l, "binary") || !strings.Contains(l, "(order_id, note)") {
			t.Errorf("load statement %q: want the columns, FROM STDIN, text format", sql)
		}
	}
	c = plan("COPY t_config FROM PROGRAM 'cat /tmp/c'").Copy
	if c.Stage == "" || !strings.Contains(c.Stage, "PROGRAM") || len(c.SQL) != 2 {
		t.Errorf("broadcast table from a program: stage %q, %d loads", c.Stage, len(c.SQL))
	}
	for sql, want := range map[string]string{
		"COPY t_order TO '/tmp/o'":                                       "TO STDOUT",
		"COPY t_order FROM '/tmp/o' WITH (FREEZE)":                       "FREEZE",
		"COPY t_order (order_id) FROM '/tmp/o' WHERE note <> ''":         "note",
		"COPY t_order (order_id) FROM '/tmp/o' WHERE t_order.note <> ''": "note",
	} {
		if _, err := p.Prepare(ctx, sql); sqlplan.Code(err) != "0A000" || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want 0A000 naming %s", sql, err, want)
		}
	}
	if _, err := p.Prepare(ctx, "COPY t_order (order_id) FROM '/tmp/o' WHERE order_id > 1"); err != nil {
		t.Errorf("WHERE on a listed column: %v", err)
	}
	cq := plan("COPY (SELECT order_id FROM t_order WHERE order_id > 5 ORDER BY 1) TO STDOUT WITH (FORMAT csv, HEADER)").Copy
	if cq.Query == "" || !strings.Contains(cq.Query, "order_id > 5") || !strings.Contains(cq.Wrap, sqlplan.CopyQueryMarker) || !strings.Contains(strings.ToLower(cq.Wrap), "csv") {
		t.Errorf("COPY (query): query %q, wrap %q", cq.Query, cq.Wrap)
	}
	if _, err := p.Prepare(ctx, "COPY (DELETE FROM t_order RETURNING *) TO STDOUT"); sqlplan.Code(err) != "0A000" {
		t.Errorf("COPY (DELETE ... RETURNING): %v, want 0A000", err)
	}
}
