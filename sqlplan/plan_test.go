package sqlplan_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/shardlab/shardlab/routing"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// testRules: t_order and t_order_item bound over 2 data sources x 2 tables by a bigint
// order_id; sbtest* over 2 shards by an int id; t_event by range; t_config broadcast.
func testRules(t testing.TB) *rules.Compiled {
	t.Helper()
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: "postgres://a/x"}, {Name: "ds_1", DSN: "postgres://b/x"}},
		Tables: []rules.Table{
			{Name: "t_order", Strategy: rules.Strategy{Column: "order_id", Type: rules.TypeInt8}, TablesPerDataSource: 2},
			{Name: "t_order_item", Strategy: rules.Strategy{Column: "order_id", Type: rules.TypeInt8}, TablesPerDataSource: 2},
			{Name: "t_user", Strategy: rules.Strategy{Column: "user_id", Type: rules.TypeInt4, Algorithm: rules.AlgorithmMod}},
			{Name: "sbtest*", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt4}},
			{Name: "t_event", Strategy: rules.Strategy{Column: "event_id", Type: rules.TypeInt8, Algorithm: rules.AlgorithmRange, Bounds: []int64{100, 200, 300}}, TablesPerDataSource: 2},
		},
		Bindings:  [][]string{{"t_order", "t_order_item"}},
		Broadcast: []string{"t_config"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// orderShard is where t_order puts a key: pghash over 4 physical tables.
func orderShard(k int64) int { return routing.PGPartition(routing.PGHashInt8(k), 4) }

func sbShard(k int32) int { return routing.PGPartition(routing.PGHashInt4(k), 2) }

func shards(b *sqlplan.Bound) []int {
	var out []int
	for _, t := range b.Targets {
		if t.Shard >= 0 {
			out = append(out, t.Shard)
		} else {
			out = append(out, -1-t.DataSource) // a whole data source: -1 is ds 0, -2 ds 1
		}
	}
	return out
}

// TestRouting checks, statement shape by statement shape, which shards a statement goes
// to (by shard number; -1-d for a whole data source d) or that it is refused.
func TestRouting(t *testing.T) {
	all4 := []int{0, 1, 2, 3}
	tests := []struct {
		sql    string
		want   []int
		refuse bool // 0A000
	}{
		{"SELECT * FROM t_order WHERE order_id = 17", []int{orderShard(17)}, false},
		{"SELECT * FROM t_order WHERE 17 = order_id", []int{orderShard(17)}, false},
		{"SELECT * FROM t_order o WHERE o.order_id = -5", []int{orderShard(-5)}, false},
		{"SELECT * FROM t_order WHERE order_id = '17'", []int{orderShard(17)}, false},
		{"SELECT * FROM t_order WHERE order_id = 17::bigint", []int{orderShard(17)}, false},
		{"SELECT * FROM t_order WHERE order_id IN (1, 2, 3)", uniqSorted(orderShard(1), orderShard(2), orderShard(3)), false},
		{"SELECT * FROM t_order WHERE order_id = 1 OR order_id = 2", uniqSorted(orderShard(1), orderShard(2)), false},
		{"SELECT * FROM t_order WHERE order_id = 1 OR status = 'x'", all4, false},
		{"SELECT * FROM t_order WHERE order_id IN (1, 2) AND order_id = 2", []int{orderShard(2)}, false},
		{"SELECT * FROM t_order WHERE NOT (order_id = 1)", all4, false},
		{"SELECT * FROM t_order WHERE order_id > 5", all4, false},
		// Printed back by pg_query's deparser without the parentheses, these would read
		// as other conditions on the shards: refused.
		{"SELECT * FROM t_order WHERE (NOT amount > 1) IS NULL", nil, true},
		{"UPDATE t_order SET status = 'x' WHERE order_id = 5 AND (status = 'a' OR amount > 1) IS NOT NULL", nil, true},
		{"SELECT * FROM t_order WHERE order_id BETWEEN 1 AND 2", all4, false},
		{"SELECT * FROM t_order", all4, false},
		{"SELECT * FROM t_event WHERE event_id BETWEEN 150 AND 250", []int{1, 2}, false},
		{"SELECT * FROM t_event WHERE event_id < 100", []int{0}, false},
		{"SELECT * FROM t_event WHERE event_id >= 300", []int{3}, false},
		{"SELECT * FROM t_event WHERE event_id = 150", []int{1}, false},
		{"SELECT * FROM t_order o JOIN t_order_item i ON o.order_id = i.order_id WHERE i.order_id = 9", []int{orderShard(9)}, false},
		{"SELECT * FROM t_order o JOIN t_order_item i USING (order_id) WHERE order_id = 9", []int{orderShard(9)}, false},
		{"SELECT * FROM t_order o JOIN t_order_item i ON o.order_id = i.order_id", all4, false},
		{"SELECT * FROM t_order o JOIN t_order_item i ON o.status = i.sku", nil, true},
		{"SELECT * FROM t_order o JOIN t_user u ON o.user_id = u.user_id", nil, true},
		{"SELECT * FROM t_order o, t_config c WHERE o.order_id = 3", []int{orderShard(3)}, false},
		{"SELECT * FROM t_config", []int{-1}, false},
		{"SELECT * FROM t_region", []int{-1}, false},
		{"SELECT 1", []int{-1}, false},
		{"SELECT * FROM sbtest7 WHERE id = 42", []int{sbShard(42)}, false},
		{"SELECT * FROM sbtest1 s1 JOIN sbtest2 s2 ON s1.id = s2.id", []int{0, 1}, false},
		{"SELECT count(*) OVER () FROM t_order WHERE order_id = 4", []int{orderShard(4)}, false},
		{"SELECT count(*) OVER () FROM t_order", nil, true},
		{"SELECT x.order_id FROM (SELECT order_id FROM t_order WHERE order_id = 6) x", []int{orderShard(6)}, false},
		{"SELECT * FROM t_order WHERE user_id IN (SELECT user_id FROM t_user)", nil, true},
		{"SELECT * FROM t_order o WHERE EXISTS (SELECT 1 FROM t_order_item i WHERE i.order_id = o.order_id)", all4, false},
		// An inner alias shadows the outer one: this subquery is not correlated on the key.
		{"SELECT * FROM t_order o WHERE EXISTS (SELECT 1 FROM t_order_item i, t_config o WHERE i.order_id = o.order_id)", nil, true},
		{"SELECT * FROM t_order o WHERE EXISTS (SELECT 1 FROM t_order_item i JOIN (SELECT 1 AS order_id) o ON true WHERE i.order_id = o.order_id)", nil, true},
		{"INSERT INTO t_order (order_id, status) VALUES (10, 'a')", []int{orderShard(10)}, false},
		{"INSERT INTO t_order (order_id, status) VALUES (10, 'a'), (11, 'b'), (12, 'c')", uniqSorted(orderShard(10), orderShard(11), orderShard(12)), false},
		{"INSERT INTO t_order (status) VALUES ('a')", nil, true},
		{"INSERT INTO t_order (order_id) VALUES (DEFAULT)", nil, true},
		{"INSERT INTO t_config VALUES ('k', 'v')", []int{-1, -2}, false},
		{"INSERT INTO t_region VALUES (1)", []int{-1}, false},
		{"UPDATE t_order SET status = 'x' WHERE order_id = 5", []int{orderShard(5)}, false},
		{"UPDATE t_order SET status = 'x'", all4, false},
		{"UPDATE t_order SET order_id = 5 WHERE order_id = 5", []int{orderShard(5)}, false},
		{"UPDATE t_order SET order_id = order_id + 1 WHERE order_id = 5", nil, true},
		{"UPDATE t_config SET v = 'x'", []int{-1, -2}, false},
		{"UPDATE t_config SET v = (SELECT max(status) FROM t_order)", nil, true},
		{"DELETE FROM t_order WHERE order_id IN (7, 8)", uniqSorted(orderShard(7), orderShard(8)), false},
		{"DELETE FROM t_order_item i USING t_order o WHERE i.order_id = o.order_id AND o.order_id = 7", []int{orderShard(7)}, false},
		{"CREATE TABLE t_order (order_id bigint PRIMARY KEY, status text)", all4, false},
		{"CREATE TABLE t_order (order_id bigint, status text UNIQUE)", nil, true},
		{"CREATE TABLE t_order (order_id bigint, status text, PRIMARY KEY (status))", nil, true},
		{"CREATE UNIQUE INDEX ON t_order (status)", nil, true},
		{"CREATE INDEX ON t_order (status)", all4, false},
		{"CREATE TABLE t_config (k text PRIMARY KEY)", []int{-1, -2}, false},
		{"CREATE TABLE t_region (id int)", []int{-1}, false},
		{"DROP TABLE t_order, t_region", []int{-1, -2}, false},
		{"TRUNCATE t_config", []int{-1, -2}, false},
		{"ALTER TABLE t_order ADD COLUMN note text", all4, false},
		{"ALTER TABLE t_order ALTER COLUMN order_id TYPE int", nil, true},
		{"CREATE FUNCTION f() RETURNS int AS 'SELECT 1' LANGUAGE sql", []int{-1, -2}, false},
		{"DO $$ BEGIN END $$", nil, true},
		{"LISTEN x", []int{-1}, false},
		{"NOTIFY x, 'y'", []int{-1}, false},
		{"DECLARE c CURSOR FOR SELECT 1", nil, true},
		{"PREPARE TRANSACTION 'x'", nil, true},
	}
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	for _, tt := range tests {
		t.Run(tt.sql, func(t *testing.T) {
			for _, mode := range []string{"simple", "extended"} {
				var b *sqlplan.Bound
				var err error
				if mode == "simple" {
					b, err = p.Simple(context.Background(), tt.sql)
				} else {
					var pl *sqlplan.Plan
					pl, err = p.Prepare(context.Background(), tt.sql)
					if err == nil {
						b, err = pl.Bind(sqlplan.Args{})
					}
				}
				if tt.refuse {
					if sqlplan.Code(err) != sqlplan.CodeFeatureNotSupported || !errors.Is(err, sqlplan.ErrUnsupported) {
						t.Errorf("%s: want a 0A000 refusal, got %v", mode, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", mode, err)
				}
				if got := shards(b); !slices.Equal(got, tt.want) {
					t.Errorf("%s: targets %v, want %v (%v)", mode, got, tt.want, b.Targets)
				}
			}
		})
	}
}

func uniqSorted(s ...int) []int {
	slices.Sort(s)
	return slices.Compact(s)
}

// TestParametersRoute checks routing from $n values, in text and binary.
func TestParametersRoute(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	pl, err := p.Prepare(context.Background(), "SELECT c FROM sbtest3 WHERE id = $1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args sqlplan.Args
		want int
	}{
		{sqlplan.Args{Values: [][]byte{[]byte("42")}}, sbShard(42)},
		{sqlplan.Args{Values: [][]byte{{0, 0, 0, 42}}, Formats: []int16{1}, OIDs: []uint32{23}}, sbShard(42)},
		{sqlplan.Args{Values: [][]byte{{0, 0, 0, 0, 0, 0, 0, 43}}, Formats: []int16{1}, OIDs: []uint32{20}}, sbShard(43)},
		{sqlplan.Args{Values: [][]byte{[]byte("-1")}}, sbShard(-1)},
	} {
		b, err := pl.Bind(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if got := shards(b); !slices.Equal(got, []int{tc.want}) {
			t.Errorf("%v: %v, want [%d]", tc.args, got, tc.want)
		}
	}
	// A binary value of unknown type cannot be read as a key: the read goes everywhere.
	b, err := pl.Bind(sqlplan.Args{Values: [][]byte{{1, 2, 3}}, Formats: []int16{1}})
	if err != nil || len(b.Targets) != 2 {
		t.Errorf("undecodable key: %v, %v", shards(b), err)
	}
	if _, err := pl.Bind(sqlplan.Args{}); sqlplan.Code(err) != sqlplan.CodeProtocolViolation {
		t.Errorf("missing parameter: %v", err)
	}
	// An INSERT whose key cannot be read is refused with a clear error, never misplaced.
	ins, err := p.Prepare(context.Background(), "INSERT INTO sbtest1 (id, k) VALUES ($1, $2)")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ins.Bind(sqlplan.Args{Values: [][]byte{[]byte("1.5"), []byte("2")}}); sqlplan.Code(err) != sqlplan.CodeInvalidParameter {
		t.Errorf("INSERT with a non-integer key: %v", err)
	}
}

// TestRewrite checks the SQL each target runs: physical names, split INSERT rows with
// renumbered parameters, and the LIMIT pushed down to a merge.
func TestRewrite(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	ctx := context.Background()
	b, err := p.Simple(ctx, "SELECT o.status FROM t_order o WHERE o.order_id = 17")
	if err != nil {
		t.Fatal(err)
	}
	phys := []string{"t_order_0", "t_order_1", "t_order_0", "t_order_1"}[orderShard(17)]
	if want := "SELECT o.status FROM " + phys + " o WHERE o.order_id = 17"; b.Targets[0].SQL != want {
		t.Errorf("got %q, want %q", b.Targets[0].SQL, want)
	}
	// The client's text goes as it is where the physical name is the logical one.
	b, err = p.Simple(ctx, "select c from sbtest1 where id=5 /* comment */")
	if err != nil || b.Targets[0].SQL != "select c from sbtest1 where id=5 /* comment */" {
		t.Errorf("passthrough: %v %v", b.Targets, err)
	}
	pl, err := p.Prepare(ctx, "INSERT INTO sbtest1 (id, k) VALUES ($1, $2), ($3, $4)")
	if err != nil {
		t.Fatal(err)
	}
	// Keys 1 and 2 on different shards? Find two that are.
	a, c := int32(1), int32(2)
	for sbShard(a) == sbShard(c) {
		c++
	}
	b, err = pl.Bind(sqlplan.Args{Values: [][]byte{[]byte(fmt.Sprint(a)), []byte("10"), []byte(fmt.Sprint(c)), []byte("20")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Targets) != 2 {
		t.Fatalf("targets %v", b.Targets)
	}
	for _, tg := range b.Targets {
		if !strings.Contains(tg.SQL, "VALUES ($1, $2)") || strings.Contains(tg.SQL, "$3") {
			t.Errorf("split row not renumbered: %q", tg.SQL)
		}
		if len(tg.Params) != 2 || len(tg.RowOrder) != 1 || tg.Params[0] != tg.RowOrder[0]*2 {
			t.Errorf("params %v, row order %v", tg.Params, tg.RowOrder)
		}
	}
	b, err = p.Simple(ctx, "SELECT id FROM sbtest1 ORDER BY id LIMIT 5 OFFSET 10")
	if err != nil {
		t.Fatal(err)
	}
	if b.Merge == nil || b.Limit != 5 || b.Offset != 10 || !strings.HasSuffix(b.Targets[0].SQL, "ORDER BY id LIMIT 15") {
		t.Errorf("limit pushdown: merge %v limit %d offset %d sql %q", b.Merge, b.Limit, b.Offset, b.Targets[0].SQL)
	}
}

// TestPlanCache checks that statements differing only in literal values share a plan,
// and that a position literal (ORDER BY 2) is not mistaken for a value.
func TestPlanCache(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{CacheSize: 8})
	ctx := context.Background()
	for i := range 5 {
		if _, err := p.Simple(ctx, fmt.Sprintf("SELECT c FROM sbtest1 WHERE id = %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if s := p.CacheStats(); s.Plans != 1 || s.Hits != 4 {
		t.Errorf("after 5 point selects: %+v, want 1 plan and 4 hits", s)
	}
	a, err := p.Simple(ctx, "SELECT id, k FROM sbtest1 ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Simple(ctx, "SELECT id, k FROM sbtest1 ORDER BY 2")
	if err != nil {
		t.Fatal(err)
	}
	if a.Merge.OrderBy[0].Column != 0 || b.Merge.OrderBy[0].Column != 1 {
		t.Errorf("ORDER BY 1 sorts column %d, ORDER BY 2 column %d", a.Merge.OrderBy[0].Column, b.Merge.OrderBy[0].Column)
	}
	// A carriage return ends a -- comment, as in PostgreSQL: what follows is the
	// statement's, and tells two statements apart (it was read as comment, up to
	// 2026-11-29, and the second statement ran the first's plan).
	for _, col := range []string{"k", "pad"} {
		sql := "SELECT c -- note\r, " + col + " FROM sbtest1 WHERE id = 1"
		b, err := p.Simple(ctx, sql)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Targets[0].SQL; !strings.Contains(got, ", "+col+" ") && !strings.Contains(got, ", "+col+"\n") {
			t.Errorf("%q runs as %q", sql, got)
		}
	}
	// The cache is bounded.
	for i := range 50 {
		if _, err := p.Simple(ctx, fmt.Sprintf("SELECT c%d FROM sbtest1 WHERE id = 1", i)); err != nil {
			t.Fatal(err)
		}
	}
	if s := p.CacheStats(); s.Plans > 8 {
		t.Errorf("cache holds %d plans, bound 8", s.Plans)
	}
	// Extended-protocol plans are cached by text.
	p1, _ := p.Prepare(ctx, "SELECT c FROM sbtest1 WHERE id = $1")
	p2, _ := p.Prepare(ctx, "SELECT c FROM sbtest1 WHERE id = $1")
	if p1 != p2 {
		t.Error("the same extended statement was planned twice")
	}
	p.Invalidate()
	if p3, _ := p.Prepare(ctx, "SELECT c FROM sbtest1 WHERE id = $1"); p3 == p1 {
		t.Error("Invalidate kept a plan")
	}
}

func TestSyntaxErrors(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	for _, sql := range []string{"SELEC 1", "SELECT * FROM", "SELECT 'unterminated", "INSERT INTO t_order VALUES (1"} {
		if _, err := p.Simple(context.Background(), sql); sqlplan.Code(err) != sqlplan.CodeSyntaxError {
			t.Errorf("%q: %v, want 42601", sql, err)
		}
	}
	if _, err := p.Prepare(context.Background(), "SELECT 1; SELECT 2"); sqlplan.Code(err) != sqlplan.CodeSyntaxError {
		t.Errorf("two statements in one prepared statement: %v", err)
	}
}

// TestSplitStatements: a query string is split as PostgreSQL's grammar reads it.
func TestSplitStatements(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		want []string
	}{
		{"SELECT 1", []string{"SELECT 1"}},
		{"SELECT 1;", []string{"SELECT 1;"}}, // one statement stays as sent
		{" SELECT 1; -- done", []string{"SELECT 1; -- done"}},
		{" ; -- only a comment", nil},
		{"BEGIN; SELECT 'a;b' ; -- c;\n SELECT $$x;y$$;; /* ; */ COMMIT",
			[]string{"BEGIN", "SELECT 'a;b'", "-- c;\n SELECT $$x;y$$", "/* ; */ COMMIT"}},
		// Semicolons inside a statement do not end it.
		{"CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; SELECT 2; END; SELECT 3",
			[]string{"CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; SELECT 2; END", "SELECT 3"}},
		{"CREATE RULE r AS ON INSERT TO t DO ALSO (INSERT INTO a VALUES (1); INSERT INTO b VALUES (2)); SELECT 1",
			[]string{"CREATE RULE r AS ON INSERT TO t DO ALSO (INSERT INTO a VALUES (1); INSERT INTO b VALUES (2))", "SELECT 1"}},
		// A string PostgreSQL cannot parse runs none of its statements: it stays whole,
		// for the planner to report the syntax error.
		{"SELECT 1; SELEC 2; SELECT 3", []string{"SELECT 1; SELEC 2; SELECT 3"}},
		// A carriage return ends a -- comment, as in PostgreSQL.
		{"SELECT 1; SELECT 2; -- x\r; SELECT 3", []string{"SELECT 1", "SELECT 2", "SELECT 3"}},
		{"SELECT 1 -- x\r, 2; SELECT 3", []string{"SELECT 1 -- x\r, 2", "SELECT 3"}},
	} {
		if got := sqlplan.SplitStatements(tc.sql); !slices.Equal(got, tc.want) {
			t.Errorf("%q:\n got %q\nwant %q", tc.sql, got, tc.want)
		}
	}
}

// FuzzPlan feeds arbitrary text to the planner: it must never panic, and an error is
// either a syntax error (42601), a refusal (0A000) or another SQLSTATE, never a bare Go
// error.
func FuzzPlan(f *testing.F) {
	for _, s := range []string{
		"SELECT * FROM t_order WHERE order_id = 1", "SELECT count(*), avg(x) FROM t_order GROUP BY 1 ORDER BY 2 LIMIT 3",
		"INSERT INTO t_order (order_id) VALUES (1), (2)", "UPDATE t_order SET order_id = 2 WHERE order_id = 1",
		"SELECT * FROM t_order o JOIN t_order_item i USING (order_id)", "CREATE TABLE t_order (order_id int PRIMARY KEY)",
		"SELEC", "SELECT $1", "DROP TABLE t_order, t_config", "SELECT 'a' FROM sbtest1 ORDER BY 1 OFFSET 2",
		"WITH x AS (SELECT * FROM t_order) SELECT * FROM x", "COPY t_order FROM STDIN", "EXPLAIN SELECT 1",
	} {
		f.Add(s)
	}
	p := sqlplan.New(testRules(f), nil, sqlplan.Options{})
	f.Fuzz(func(t *testing.T, sql string) {
		pl, lits, err := p.PlanSimple(context.Background(), sql)
		if err == nil {
			_, err = pl.BindSimple(sql, lits)
		}
		if err != nil && sqlplan.Code(err) == "" {
			t.Fatalf("%q: an error without SQLSTATE: %v", sql, err)
		}
		if _, err := p.Prepare(context.Background(), sql); err != nil && sqlplan.Code(err) == "" {
			t.Fatalf("%q: an error without SQLSTATE: %v", sql, err)
		}
	})
}

func TestExplain(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	b, err := p.Simple(context.Background(), "SELECT id, k FROM sbtest1 ORDER BY k DESC LIMIT 10")
	if err != nil {
		t.Fatal(err)
	}
	got := b.Explain()
	for _, want := range []string{"select of sbtest1 -> all shards (2 targets)", "ds_0 shard 0: SELECT id, k FROM sbtest1 ORDER BY k DESC LIMIT 10",
		"ds_1 shard 1:", "merge: merge-sort(#2 desc nulls first)", "(limit 10, offset 0)"} {
		if !strings.Contains(got, want) {
			t.Errorf("explain lacks %q:\n%s", want, got)
		}
	}
}

func TestDescribeSQL(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	for sql, want := range map[string]string{
		"SELECT status FROM t_order WHERE order_id = $1":                   "SELECT status FROM t_order_0 WHERE order_id = $1",
		"SELECT c FROM sbtest1 WHERE id = $1":                              "SELECT c FROM sbtest1 WHERE id = $1",
		"INSERT INTO t_order (order_id, status) VALUES ($1, $2), ($3, $4)": "INSERT INTO t_order_0 (order_id, status) VALUES ($1, $2), ($3, $4)",
		"SELECT id FROM sbtest1 ORDER BY id LIMIT $1":                      "SELECT id FROM sbtest1 ORDER BY id LIMIT $1",
	} {
		pl, err := p.Prepare(context.Background(), sql)
		if err != nil {
			t.Fatal(err)
		}
		if ds, got := pl.DescribeSQL(); ds != 0 || got != want {
			t.Errorf("DescribeSQL(%q) = %d, %q; want 0, %q", sql, ds, got, want)
		}
	}
}

// TestPlanCacheConcurrent: sessions plan the same texts at once (each missing the
// cache, then storing its plan) while others read them; run under -race.
func TestPlanCacheConcurrent(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{CacheSize: 4})
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 300 {
				q := fmt.Sprintf("SELECT c FROM sbtest1 WHERE id = $1 AND k > %d", (i+w)%2)
				if _, err := p.Prepare(ctx, q); err != nil {
					t.Error(err)
					return
				}
				if i%10 == w%10 {
					p.Invalidate()
				}
			}
		})
	}
	wg.Wait()
}

// TestRenderedTextPerShard: a prepared statement's text for each shard is made once and
// kept; every later execution, from any goroutine, gets the same text and parameters
// as a plan made afresh would, for its own shard.
func TestRenderedTextPerShard(t *testing.T) {
	const sql = "SELECT o.status FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id WHERE o.order_id = $2 AND i.qty > $1"
	kept, err := sqlplan.New(testRules(t), nil, sqlplan.Options{}).Prepare(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	args := func(k int) sqlplan.Args {
		return sqlplan.Args{Values: [][]byte{[]byte("1"), []byte(fmt.Sprint(k))}}
	}
	want := map[int]sqlplan.Target{} // key -> target of a fresh plan
	texts := map[string]bool{}
	for k := range 16 {
		fresh, err := sqlplan.New(testRules(t), nil, sqlplan.Options{}).Prepare(context.Background(), sql)
		if err != nil {
			t.Fatal(err)
		}
		b, err := fresh.Bind(args(k))
		if err != nil || len(b.Targets) != 1 {
			t.Fatalf("key %d: %v targets, %v", k, len(b.Targets), err)
		}
		want[k] = b.Targets[0]
		texts[fmt.Sprint(b.Targets[0].DataSource, b.Targets[0].SQL)] = true
	}
	if len(texts) != 4 {
		t.Fatalf("16 keys over 4 shards gave %d distinct data source and text pairs", len(texts))
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for round := range 50 {
				k := (g + round) % 16
				b, err := kept.Bind(args(k))
				if err != nil {
					t.Error(err)
					return
				}
				got, w := b.Targets[0], want[k]
				if got.SQL != w.SQL || got.Shard != w.Shard || got.DataSource != w.DataSource || !slices.Equal(got.Params, w.Params) {
					t.Errorf("key %d: shard %d %q %v, want shard %d %q %v", k, got.Shard, got.SQL, got.Params, w.Shard, w.SQL, w.Params)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestPlannerWarm checks that a planner warmed from another holds a plan, made by its
// own rules, for each text the other had cached: a client's first statement on it
// plans nothing.
func TestPlannerWarm(t *testing.T) {
	ctx := context.Background()
	old := sqlplan.New(testRules(t), nil, sqlplan.Options{CacheSize: 64})
	four := testRules(t).Rules()
	four.DataSources = append(four.DataSources, rules.DataSource{Name: "ds_2", DSN: "postgres://c/x"}, rules.DataSource{Name: "ds_3", DSN: "postgres://d/x"})
	four.Tables = slices.DeleteFunc(four.Tables, func(t rules.Table) bool { return t.Name == "t_event" }) // its bounds are for 2
	wider, err := rules.Compile(four)
	if err != nil {
		t.Fatal(err)
	}
	extended := []string{"SELECT c FROM sbtest1 WHERE id = $1", "UPDATE t_user SET name = $2 WHERE user_id = $1"}
	simple := []string{"SELECT c FROM sbtest1 WHERE id = 7", "SELECT count(*) FROM t_user", "SET search_path = public"}
	for _, q := range extended {
		if _, err := old.Prepare(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range simple {
		if _, _, err := old.PlanSimple(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	p := sqlplan.New(wider, nil, sqlplan.Options{CacheSize: 64})
	if n := p.Warm(ctx, old); n != old.CacheStats().Plans {
		t.Errorf("warmed %d plans of the %d cached", n, old.CacheStats().Plans)
	}
	before := p.CacheStats()
	if before.Hits != 0 || before.Misses != 0 {
		t.Errorf("warming counted lookups: %+v", before)
	}
	for _, q := range extended {
		if _, err := p.Prepare(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// Another literal value of a normalised text finds the warmed plan too.
	for _, q := range append(simple, "SELECT c FROM sbtest1 WHERE id = 8") {
		b, err := p.Simple(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if q == "SELECT count(*) FROM t_user" && len(b.Targets) != 4 {
			t.Errorf("%s: %d targets, want the warmed planner's 4 data sources", q, len(b.Targets))
		}
	}
	if after := p.CacheStats(); after.Misses != before.Misses {
		t.Errorf("after warming, the clients' statements missed the cache %d times", after.Misses-before.Misses)
	}
}

// TestGroupOrder: a merge that groups asks the shards to sort by the group, the keys
// the client's ORDER BY names first and as it names them, so that the merge meets each
// group's rows together; an ORDER BY over an aggregate leaves the groups to be sorted;
// a statement with a COLLATE clause anywhere, a system column (xmin: its type hashes
// but does not sort), or SELECT DISTINCT * is merged whole; NULLs are placed only
// where the client placed them (SQLite's default differs from PostgreSQL's).
func TestGroupOrder(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	for _, c := range []struct{ sql, shard, merge string }{
		{"SELECT k, count(*) FROM sbtest1 GROUP BY k",
			"SELECT k, count(*), k FROM sbtest1 GROUP BY k ORDER BY 3", "groups merged in order(#3)"},
		{"SELECT k, c, sum(id) FROM sbtest1 GROUP BY k, c ORDER BY c DESC",
			"SELECT k, c, sum(id), k, c FROM sbtest1 GROUP BY k, c ORDER BY 5 DESC, 4", "in group order(#2 desc nulls first)"},
		{"SELECT k, count(*) FROM sbtest1 GROUP BY k ORDER BY count(*) DESC LIMIT 3",
			"SELECT k, count(*), k FROM sbtest1 GROUP BY k ORDER BY 3", "sort(#2 desc nulls first)"},
		{"SELECT count(*) FROM sbtest1", "SELECT count(*) FROM sbtest1", "aggregate(count)"},
		{"SELECT DISTINCT c, k FROM sbtest1 ORDER BY k NULLS FIRST",
			"SELECT DISTINCT c, k FROM sbtest1 ORDER BY 2 NULLS FIRST, 1", "in group order(#2 nulls first)"},
		{"SELECT k COLLATE \"C\", count(*) FROM sbtest1 GROUP BY 1", "SELECT k COLLATE \"C\", count(*), k COLLATE \"C\" FROM sbtest1 GROUP BY k COLLATE \"C\"", "aggregate(any, count, group key)"},
		{"SELECT DISTINCT * FROM sbtest1", "SELECT DISTINCT * FROM sbtest1", "distinct"},
		{"SELECT DISTINCT c FROM (SELECT c COLLATE \"C\" AS c FROM sbtest1) s", "SELECT DISTINCT c FROM (SELECT c COLLATE \"C\" AS c FROM sbtest1) s", "distinct"},
		{"SELECT xmin, count(*) FROM sbtest1 GROUP BY xmin", "SELECT xmin, count(*), xmin FROM sbtest1 GROUP BY xmin", "aggregate(any, count, group key)"},
	} {
		b, err := p.Simple(context.Background(), c.sql)
		if err != nil {
			t.Fatal(err)
		}
		got := b.Explain()
		if !strings.Contains(got, c.shard+"\n") || !strings.Contains(got, c.merge) {
			t.Errorf("%s: want shard SQL %q and merge %q in\n%s", c.sql, c.shard, c.merge, got)
		}
		if whole := !strings.Contains(c.shard, "ORDER BY"); whole && strings.Contains(got, "groups merged") {
			t.Errorf("%s: want no group order:\n%s", c.sql, got)
		}
	}
}

// TestCollateElsewhereRefused: a merge compares text under the one collation a COLLATE
// clause of the select list or ORDER BY names; one in a subquery, a condition, or two
// collations, it cannot place, so a sort or min/max beside them is refused across
// shards (0A000; the coordinator answers it) rather than compared under the wrong one.
func TestCollateElsewhereRefused(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	for sql, refused := range map[string]bool{
		`SELECT k FROM (SELECT c COLLATE "C" AS k FROM sbtest1) s ORDER BY k`:           true,
		`SELECT max(k) FROM (SELECT c COLLATE "C" AS k FROM sbtest1) s`:                 true,
		`SELECT c FROM sbtest1 WHERE c COLLATE "C" > 'a' ORDER BY c`:                    true,
		`SELECT c, pad FROM sbtest1 ORDER BY c COLLATE "C", pad COLLATE "en_US"`:        true,
		`SELECT c FROM sbtest1 ORDER BY c COLLATE "C"`:                                  false,
		`SELECT max(c COLLATE "C") FROM sbtest1`:                                        false,
		`SELECT count(*) FROM (SELECT c COLLATE "C" AS k FROM sbtest1) s`:               false,
		`SELECT k, count(*) FROM (SELECT c COLLATE "C" AS k FROM sbtest1) s GROUP BY k`: false,
	} {
		_, err := p.Simple(context.Background(), sql)
		if got := err != nil && sqlplan.Code(err) == "0A000"; got != refused {
			t.Errorf("%s: %v, want refused %v", sql, err, refused)
		}
	}
}

// TestWholeRowKeepsTheTableName: a table renamed on its shard (t_order_1) keeps its
// logical name as an alias where a column reference may read its whole row by that
// name, and only there: never for the table an UPDATE, DELETE or INSERT writes, where
// a column named like the table is the usual reason for such a reference.
func TestWholeRowKeepsTheTableName(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	for sql, alias := range map[string]bool{
		"SELECT row_to_json(t_order) FROM t_order WHERE order_id = 1":                        true,
		"SELECT order_id FROM t_order WHERE order_id = 1 AND t_order IS NOT NULL":            true,
		"SELECT t_order.status FROM t_order WHERE order_id = 1":                              true,
		"SELECT status FROM t_order WHERE order_id = 1":                                      false,
		"UPDATE t_order SET status = 'x' WHERE order_id = 1 AND t_order IS NULL":             false,
		"DELETE FROM t_order WHERE order_id = 1 AND t_order IS NULL":                         false,
		"UPDATE t_order SET status = (SELECT max(t_order) FROM t_config) WHERE order_id = 1": false,
	} {
		pl, err := p.Prepare(context.Background(), sql)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		b, err := pl.Bind(sqlplan.Args{})
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		got := b.Targets[0].SQL
		if has := regexp.MustCompile(`t_order_\d+ (AS )?t_order\b`).MatchString(got); has != alias {
			t.Errorf("%s: runs %q, alias %v, want %v", sql, got, has, alias)
		}
	}
}
