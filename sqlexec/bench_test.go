package sqlexec_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/routing"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// BenchmarkMergeOrderByLimit is the cost of a cross-shard ORDER BY ... LIMIT 10 over 4
// shards, against the same query on one database holding every row (run side by side:
// the two sub-benchmarks share one server and one data set). docs/sql-sharding.md
// quotes it:
//
//	SHARDLAB_PG_DSN=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable \
//	  go test -run XXX -bench MergeOrderByLimit -benchtime 3s -count 5 ./sqlexec
func BenchmarkMergeOrderByLimit(b *testing.B) {
	const rows, shards = 100_000, 4
	ctx := context.Background()
	one := pgtest.NewDatabase(b, "merge_one")
	var dsns []string
	for i := range shards {
		dsns = append(dsns, pgtest.NewDatabase(b, fmt.Sprintf("merge_s%d", i)))
	}
	ddl := "CREATE TABLE t (id bigint PRIMARY KEY, k int NOT NULL, c text NOT NULL); CREATE INDEX t_k ON t (k)"
	load := func(dsn string, keep func(id int64) bool) {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, ddl); err != nil {
			b.Fatal(err)
		}
		var data [][]any
		for id := int64(1); id <= rows; id++ {
			if keep(id) {
				data = append(data, []any{id, int32((id * 7919) % 1_000_003), fmt.Sprintf("row %d", id)})
			}
		}
		if _, err := conn.CopyFrom(ctx, pgx.Identifier{"t"}, []string{"id", "k", "c"}, pgx.CopyFromRows(data)); err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "VACUUM ANALYZE t"); err != nil {
			b.Fatal(err)
		}
	}
	load(one, func(int64) bool { return true })
	for s, dsn := range dsns {
		load(dsn, func(id int64) bool { return routing.PGPartition(routing.PGHashInt8(id), shards) == s })
	}
	const query = "SELECT id, k, c FROM t WHERE k > $1 ORDER BY k DESC, id LIMIT 10"
	args := [][]byte{[]byte("1000")}

	direct := func(b *testing.B, dsn string, want int) {
		conn, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close(ctx)
		for b.Loop() {
			rr := conn.ExecParams(ctx, query, args, nil, nil, nil)
			n := 0
			for rr.NextRow() {
				n++
			}
			if _, err := rr.Close(); err != nil || n != want {
				b.Fatalf("%d rows, %v", n, err)
			}
		}
	}
	b.Run("one-database", func(b *testing.B) { direct(b, one, 10) })
	// The same query on one shard alone: what each of the four runs in the merge.
	b.Run("one-shard-of-4", func(b *testing.B) { direct(b, dsns[0], 10) })
	b.Run("4-shards", func(b *testing.B) {
		r := rules.Rules{Tables: []rules.Table{{Name: "t", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt8}}}}
		for i, d := range dsns {
			r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d})
		}
		c, err := rules.Compile(r)
		if err != nil {
			b.Fatal(err)
		}
		db, err := sqlexec.Open(ctx, c, sqlexec.Config{})
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		for b.Loop() {
			res, err := db.Exec(ctx, query, sqlplan.Args{Values: args}, nil)
			if err != nil || len(res.Rows) != 10 {
				b.Fatalf("%v, %v", res, err)
			}
		}
	})
}
