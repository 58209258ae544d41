package sqlplan_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/sqlplan"
)

// TestFeedPlan: INSERT ... SELECT into a sharded table is planned as a query and batches
// of rows (sqlplan.Feed), never as a statement some shard runs whole. On the old code it
// was refused.
func TestFeedPlan(t *testing.T) {
	ctx := context.Background()
	r := testRules(t)
	p := sqlplan.New(r, keyCatalog{}, sqlplan.Options{})

	// Simple protocol: the query keeps its literals (the plan is made from the text as
	// written, not from its normalised form).
	sql := "INSERT INTO t_order (order_id, status) SELECT user_id, 'new' FROM t_user WHERE name = 'x' RETURNING order_id"
	pl, lits, err := p.PlanSimple(ctx, sql)
	if err != nil {
		t.Fatal(err)
	}
	f := pl.Feed
	if f == nil || f.Table != "t_order" || f.Params != 0 || len(lits) != 0 {
		t.Fatalf("feed %+v, %d literals", f, len(lits))
	}
	if want := "SELECT user_id, 'new' FROM t_user WHERE name = 'x'"; f.Query != want {
		t.Errorf("query %q, want %q", f.Query, want)
	}
	b, err := pl.BindSimple(sql, lits)
	if err != nil || len(b.Targets) != 0 {
		t.Fatalf("bind: %v, %d targets", err, len(b.Targets))
	}
	batch, err := f.Batch(3, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := "INSERT INTO t_order (order_id, status) VALUES ($1, $2), ($3, $4), ($5, $6) RETURNING order_id"; batch != want {
		t.Errorf("batch %q, want %q", batch, want)
	}
	// The batch is an ordinary multi-row INSERT: each row goes where its key says.
	bp, err := p.Prepare(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	bb, err := bp.Bind(sqlplan.Args{Values: [][]byte{[]byte("1"), []byte("a"), []byte("2"), []byte("b"), []byte("3"), []byte("c")}})
	if err != nil {
		t.Fatal(err)
	}
	placed := map[int]bool{}
	for _, tg := range bb.Targets {
		placed[tg.Shard] = true
	}
	if want := map[int]bool{orderShard(1): true, orderShard(2): true, orderShard(3): true}; len(placed) != len(want) {
		t.Errorf("batch rows on shards %v, want %v", placed, want)
	}
	// Described on shard 0's data source, with the tables named as there.
	ds, desc := pl.DescribeSQL()
	if ds != r.Lookup("t_order").Nodes[0].DataSource || !strings.Contains(desc, "t_order_0") || !strings.Contains(desc, "FROM t_user") {
		t.Errorf("describe on %d: %s", ds, desc)
	}

	// Extended protocol: the client's parameters come first, the rows' after them; the
	// INSERT's WITH clause goes with the query.
	pl, err = p.Prepare(ctx, "WITH u AS (SELECT user_id FROM t_user WHERE name = $1) INSERT INTO t_order (order_id) SELECT user_id FROM u ON CONFLICT (order_id) DO UPDATE SET status = $2")
	if err != nil {
		t.Fatal(err)
	}
	f = pl.Feed
	if f == nil || f.Params != 2 || !f.Upsert || !strings.HasPrefix(f.Query, "WITH u AS (SELECT user_id FROM t_user WHERE name = $1) SELECT") {
		t.Fatalf("feed %+v", f)
	}
	if batch, _ = f.Batch(2, 1); !strings.Contains(batch, "VALUES ($3), ($4) ON CONFLICT") {
		t.Errorf("batch %q", batch)
	}
	if got := f.RowsPerBatch(1); got != sqlplan.BatchRows {
		t.Errorf("%d rows per batch", got)
	}
	if got := f.RowsPerBatch(1000); got != (sqlplan.MaxParams-2)/1000 {
		t.Errorf("%d rows per batch of 1000 columns", got)
	}

	// Column types: a key of another type than the key's, a type the database
	// defines, and an upsert of more than one batch are refused with 0A000.
	const int8OID, int4OID, numericOID, textOID = 20, 23, 1700, 25
	for _, c := range []struct {
		oids []uint32
		rows int64
		ok   bool
	}{
		{[]uint32{int4OID}, 10, true},
		{[]uint32{int8OID}, 10, true},
		{[]uint32{numericOID}, 10, false},
		{[]uint32{textOID}, 10, false},
		{[]uint32{16500}, 10, false},
		{[]uint32{int8OID}, sqlplan.BatchRows + 1, false},
	} {
		err := f.CheckColumns(c.oids, c.rows)
		if c.ok != (err == nil) || err != nil && !errors.Is(err, sqlplan.ErrUnsupported) {
			t.Errorf("columns %v, %d rows: %v", c.oids, c.rows, err)
		}
	}

	// Not a Feed: VALUES, and a target that is not sharded.
	for _, q := range []string{"INSERT INTO t_order (order_id) VALUES (1), (2)", "INSERT INTO t_config SELECT * FROM t_config"} {
		pl, err := p.Prepare(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if pl.Feed != nil {
			t.Errorf("%s: planned as a feed", q)
		}
	}
}
