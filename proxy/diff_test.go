package proxy_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/sqldiff"
)

// runDifferential runs the SQL core's differential suite through the proxy: the same
// statements on one unsharded database and, over the wire, on the sharded layout,
// compared value by value in the simple protocol and in the extended protocol with
// text and binary results (sqldiff.PgConnRunner speaks to the proxy exactly as to a
// server).
func runDifferential(t *testing.T, layout sqldiff.Layout, options string) {
	env := sqldiff.NewEnv(t, layout, options)
	env.InSteps = true
	e := startProxyOn(t, env.Rules.Rules())
	ctx := context.Background()
	conn, err := pgconn.Connect(ctx, e.url(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	r := sqldiff.PgConnRunner{Conn: conn}
	env.Load(t, r)
	env.CheckPlacement(t)
	queries := append(sqldiff.Queries(), sqldiff.Random(uint64(len(layout.Name)), 60)...)
	reads := env.RunReads(t, r, queries)
	writes := env.RunWrites(t, r)
	if reads.Equal == 0 || writes.Equal == 0 {
		t.Errorf("nothing was answered equal: reads %+v, writes %+v", reads, writes)
	}
	t.Logf("%s through the proxy: %d reads (%d answered equal, %d refused), %d writes (%d equal, %d refused)",
		layout.Name, reads.Total, reads.Equal, reads.Refused, writes.Total, writes.Equal, writes.Refused)
}

// TestDifferentialThroughTheWire: seed 004's 2 databases x 2 tables, 3 shards, and 3
// shards whose collation is ICU's en-US.
func TestDifferentialThroughTheWire(t *testing.T) {
	for _, layout := range sqldiff.Layouts() {
		t.Run(layout.Name, func(t *testing.T) { runDifferential(t, layout, "") })
	}
	t.Run("3shards-icu", func(t *testing.T) { runDifferential(t, sqldiff.ICULayout(), sqldiff.ICUOptions) })
}
