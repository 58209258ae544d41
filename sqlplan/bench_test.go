package sqlplan_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/shardlab/shardlab/sqlplan"
)

// The plan cache's costs, per statement: what a driver or proxy pays before it can
// send a statement to its shard. docs/sql-sharding.md quotes them.
//
//	go test -run XXX -bench . -benchmem ./sqlplan

const (
	sysbenchPoint = "SELECT c FROM sbtest1 WHERE id=$1"
	pgbenchSimple = "SELECT abalance FROM sbtest1 WHERE id = %d;"
)

// BenchmarkExtendedHit: an extended-protocol statement whose plan is cached (Parse of
// a statement seen before), then bound to its parameter and routed.
func BenchmarkExtendedHit(b *testing.B) {
	p := sqlplan.New(testRules(b), nil, sqlplan.Options{})
	ctx := context.Background()
	if _, err := p.Prepare(ctx, sysbenchPoint); err != nil {
		b.Fatal(err)
	}
	args := sqlplan.Args{Values: [][]byte{[]byte("4242")}}
	for b.Loop() {
		pl, err := p.Prepare(ctx, sysbenchPoint)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pl.Bind(args); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSimpleHit: a simple-protocol statement with its value inline (pgbench -M
// simple), normalised, found in the cache and bound to its literal; 64 different
// values, so the statement text differs from call to call.
func BenchmarkSimpleHit(b *testing.B) {
	p := sqlplan.New(testRules(b), nil, sqlplan.Options{})
	ctx := context.Background()
	stmts := make([]string, 64)
	for i := range stmts {
		stmts[i] = fmt.Sprintf(pgbenchSimple, 1000+i*7919)
	}
	if _, err := p.Simple(ctx, stmts[0]); err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		if _, err := p.Simple(ctx, stmts[i%len(stmts)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	if s := p.CacheStats(); s.Misses != 1 {
		b.Fatalf("%d misses: the statements did not share a plan", s.Misses)
	}
}

// BenchmarkMiss: planning from scratch (parse with PostgreSQL's grammar, analyse,
// route), what every statement would cost without the cache.
func BenchmarkMiss(b *testing.B) {
	p := sqlplan.New(testRules(b), nil, sqlplan.Options{CacheSize: -1})
	ctx := context.Background()
	args := sqlplan.Args{Values: [][]byte{[]byte("4242")}}
	for b.Loop() {
		pl, err := p.Prepare(ctx, sysbenchPoint)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pl.Bind(args); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMissRenamed: planning from scratch a statement whose tables are renamed on
// the shards, so that its tree is printed back as SQL (and parsed again, to check the
// text reads as the tree).
func BenchmarkMissRenamed(b *testing.B) {
	p := sqlplan.New(testRules(b), nil, sqlplan.Options{CacheSize: -1})
	ctx := context.Background()
	args := sqlplan.Args{Values: [][]byte{[]byte("4242"), []byte("paid")}}
	for b.Loop() {
		pl, err := p.Prepare(ctx, "SELECT order_id, amount FROM t_order WHERE order_id = $1 AND status = $2")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pl.Bind(args); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMergePlanHit: a cached cross-shard ORDER BY ... LIMIT, bound (targets
// rendered with the pushed-down LIMIT).
func BenchmarkMergePlanHit(b *testing.B) {
	p := sqlplan.New(testRules(b), nil, sqlplan.Options{})
	ctx := context.Background()
	const q = "SELECT id, k FROM sbtest1 WHERE k > $1 ORDER BY k DESC, id LIMIT $2"
	args := sqlplan.Args{Values: [][]byte{[]byte("5"), []byte("10")}}
	for b.Loop() {
		pl, err := p.Prepare(ctx, q)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pl.Bind(args); err != nil {
			b.Fatal(err)
		}
	}
}
