package reshard_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/reshard"
	"github.com/shardlab/shardlab/rules"
)

func exec(t *testing.T, dsn string, sqls ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, sql := range sqls {
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// queryOne runs a query that answers one value, on a connection of its own.
func queryOne[T any](t *testing.T, dsn, sql string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var v T
	if err := c.QueryRow(ctx, sql).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func queryInt(t *testing.T, dsn, sql string) int64 { t.Helper(); return queryOne[int64](t, dsn, sql) }

func queryString(t *testing.T, dsn, sql string) string {
	t.Helper()
	return queryOne[string](t, dsn, sql)
}

// layout compiles a layout of people (sharded by id) and countries (broadcast) over
// the given data sources.
func layout(t *testing.T, dsns []string, mutate ...func(*rules.Rules)) *rules.Compiled {
	t.Helper()
	r := rules.Rules{Broadcast: []string{"countries"}}
	for i, d := range dsns {
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d})
	}
	r.Tables = []rules.Table{{Name: "people", Strategy: rules.Strategy{Column: "id"}}}
	for _, m := range mutate {
		m(&r)
	}
	c, err := rules.Compile(r)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fill creates people and countries in each of the first n databases and puts each id
// of 1..rows where PostgreSQL's own hash partitioning of modulus n puts it (a
// partitioned table of the key's type stands for the rules, so the placement does not
// come from the code under test).
func fill(t *testing.T, dsns []string, n, rows int) {
	t.Helper()
	for i, d := range dsns {
		exec(t, d, "CREATE TABLE people (id bigint PRIMARY KEY, name text)", "CREATE TABLE countries (code text PRIMARY KEY, name text)",
			"CREATE TABLE hash_oracle (id bigint) PARTITION BY HASH (id)")
		if i >= n {
			continue
		}
		exec(t, d, fmt.Sprintf(`INSERT INTO people SELECT g, repeat('x', g %% 50) FROM generate_series(1, %d) g
			WHERE satisfies_hash_partition('hash_oracle'::regclass, %d, %d, g::bigint)`, rows, n, i),
			"INSERT INTO countries VALUES ('fr', 'France'), ('de', 'Germany'), ('jp', 'Japan')")
	}
}

// TestPlanDoubling plans 2 data sources to 4 under pghash: every row is counted once;
// old shard i keeps exactly the rows whose hash mod 4 is i and sends the others to
// i+2, as PostgreSQL's own hash partitioning says; about half moves; the sizes are the
// rows' own; the broadcast table is copied to the new data sources; the streams and
// the server's needs follow. With PostgreSQL's default of 4 logical replication
// workers the plan is blocked, saying so; with more it can run.
func TestPlanDoubling(t *testing.T) {
	c := pgtest.StartClusterWith(t, "wal_level = logical")
	var dsns []string
	for range 4 {
		dsns = append(dsns, c.NewDatabase("reshard"))
	}
	const rows = 3000
	fill(t, dsns, 2, rows)
	from, to := layout(t, dsns[:2]), layout(t, dsns)
	ctx := context.Background()
	p, err := reshard.MakePlan(ctx, from, to, reshard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Tables) != 1 || p.Tables[0].Name != "people" {
		t.Fatalf("tables %+v", p.Tables)
	}
	tp := p.Tables[0]
	if tp.Misplaced != 0 {
		t.Errorf("%d rows misplaced: the plan's pghash disagrees with PostgreSQL's hash partitioning", tp.Misplaced)
	}
	got := map[string]int64{}
	for _, m := range tp.Moves {
		got[m.From.DataSource+"->"+m.To.DataSource] += m.Rows
	}
	want := map[string]int64{}
	for src := range 2 {
		for r := range 4 {
			n := queryInt(t, dsns[src], fmt.Sprintf("SELECT count(*) FROM people WHERE satisfies_hash_partition('hash_oracle'::regclass, 4, %d, id)", r))
			if n > 0 {
				want[fmt.Sprintf("ds_%d->ds_%d", src, r)] = n
			}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("moves %v, want %v (by PostgreSQL's hash partitioning of modulus 4)", got, want)
	}
	for k := range want {
		if k != "ds_0->ds_0" && k != "ds_0->ds_2" && k != "ds_1->ds_1" && k != "ds_1->ds_3" {
			t.Errorf("rows go %s: doubling keeps shard i's rows on i or sends them to i+2", k)
		}
	}
	all, moving := tp.Rows()
	if all != rows || moving < rows*4/10 || moving > rows*6/10 {
		t.Errorf("%d of %d rows move, want all %d counted and about half moving", moving, all, rows)
	}
	size, _ := tp.Bytes()
	wantSize := queryInt(t, dsns[0], "SELECT sum(pg_column_size(t.*)) FROM people t") + queryInt(t, dsns[1], "SELECT sum(pg_column_size(t.*)) FROM people t")
	// PostgreSQL sizes a whole row a few bytes apart in an aggregate and in a plain
	// projection (3 bytes in 3000 rows here): the plan's is the projection's.
	if d := size - wantSize; d < -wantSize/1000 || d > wantSize/1000 {
		t.Errorf("size %d bytes, want %d (within 0.1%%)", size, wantSize)
	}
	if len(p.Broadcast) != 1 || p.Broadcast[0].Rows != 3 || fmt.Sprint(p.Broadcast[0].To) != "[ds_2 ds_3]" {
		t.Errorf("broadcast %+v, want countries' 3 rows copied to ds_2 and ds_3", p.Broadcast)
	}
	if got := fmt.Sprint(p.Streams); got != "[{ds_0 ds_2 [countries people] 2} {ds_0 ds_3 [countries] 1} {ds_1 ds_3 [people] 1}]" {
		t.Errorf("streams %s", got)
	}
	if len(p.Servers) != 1 || p.Servers[0].WALLevel != "logical" || p.Servers[0].SlotsNeeded != 7 || p.Servers[0].WorkersNeeded != 7 {
		t.Errorf("servers %+v: want one, wal_level logical, 7 slots and 7 workers needed (3 streams, 4 tables being copied)", p.Servers)
	}
	if p.Runnable() || len(p.Problems) != 1 || !strings.Contains(p.Problems[0], "max_logical_replication_workers = 4") {
		t.Errorf("problems %q: want the default of 4 logical replication workers named as too few", p.Problems)
	}
	var text bytes.Buffer
	if err := p.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"table people (key id int8; target algorithm pghash)", "ds_0.people", "ds_2.people", "stays", "moves",
		"broadcast table countries: 3 rows", "ds_1 -> ds_3: people", "the move cannot start", "a plan changes nothing"} {
		if !strings.Contains(text.String(), w) {
			t.Errorf("the text lacks %q:\n%s", w, text.String())
		}
	}

	exec(t, c.DSN(), "ALTER SYSTEM SET max_logical_replication_workers = 10", "ALTER SYSTEM SET max_worker_processes = 16")
	c.Stop()
	c.Start()
	p, err = reshard.MakePlan(ctx, from, to, reshard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Runnable() {
		t.Errorf("with 10 workers: problems %q", p.Problems)
	}
	// A plan changes nothing: every row is where it was, and no slot or publication
	// exists.
	for i, d := range dsns {
		n := queryInt(t, d, "SELECT count(*) FROM people")
		if (i >= 2) != (n == 0) {
			t.Errorf("ds_%d has %d people after the plan", i, n)
		}
		if n := queryInt(t, d, "SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_replication_slots)"); n != 0 {
			t.Errorf("ds_%d: %d publications and slots after a plan", i, n)
		}
	}
}

// TestPlanFindsStrandedRows: a row on a data source where the current layout does not
// place it is counted as misplaced, and planned like the others.
func TestPlanFindsStrandedRows(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t, "reshard"), pgtest.NewDatabase(t, "reshard"), pgtest.NewDatabase(t, "reshard")}
	fill(t, dsns, 2, 200)
	// A key whose place under modulus 2 is ds_1, put on ds_0.
	stray := queryInt(t, dsns[0], "SELECT g FROM generate_series(100001, 100100) g WHERE satisfies_hash_partition('hash_oracle'::regclass, 2, 1, g::bigint) LIMIT 1")
	exec(t, dsns[0], fmt.Sprintf("INSERT INTO people VALUES (%d, 'stray')", stray))
	p, err := reshard.MakePlan(context.Background(), layout(t, dsns[:2]), layout(t, dsns), reshard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Tables[0].Misplaced != 1 {
		t.Errorf("misplaced %d, want the one stray row", p.Tables[0].Misplaced)
	}
	if all, _ := p.Tables[0].Rows(); all != 201 {
		t.Errorf("%d rows planned, want 201", all)
	}
	// The main server runs with wal_level = replica: the plan says what to change.
	found := false
	for _, pr := range p.Problems {
		found = found || strings.Contains(pr, "wal_level = replica") && strings.Contains(pr, "set wal_level = logical")
	}
	if queryInt(t, dsns[0], "SELECT (current_setting('wal_level') = 'replica')::int") == 1 && !found {
		t.Errorf("problems %q: want wal_level named", p.Problems)
	}
}

// TestPlanRefuses: a target that is not a reshard, and a data source that does not
// answer, are refused before anything is read, each saying why.
func TestPlanRefuses(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t, "reshard"), pgtest.NewDatabase(t, "reshard"), pgtest.NewDatabase(t, "reshard")}
	fill(t, dsns, 2, 50)
	from := layout(t, dsns[:2])
	for _, tc := range []struct {
		name   string
		to     *rules.Compiled
		layout bool // ErrLayout
		want   string
	}{
		{"a lost table", layout(t, dsns, func(r *rules.Rules) { r.Tables = nil }), true,
			"table people is sharded now and would be on the default data source"},
		{"a lost broadcast table", layout(t, dsns, func(r *rules.Rules) { r.Broadcast = nil }), true,
			"table countries is broadcast now and would be on the default data source"},
		{"a key type changed", layout(t, dsns, func(r *rules.Rules) { r.Tables[0].Strategy.Type = rules.TypeText }), true,
			"key column id is int8 now and would be text"},
		{"another key column", layout(t, dsns, func(r *rules.Rules) { r.Tables[0].Strategy.Column = "name" }), true,
			"sharded by id now and would be by name"},
		{"a table newly sharded", layout(t, dsns, func(r *rules.Rules) {
			r.Tables = append(r.Tables, rules.Table{Name: "orders", Strategy: rules.Strategy{Column: "id"}})
		}), true, "table orders would be sharded"},
		{"another default data source", layout(t, dsns, func(r *rules.Rules) { r.DefaultDataSource = "ds_1" }), true,
			"the default data source is ds_0 now and would be ds_1"},
		{"a data source's DSN changed", layout(t, []string{dsns[0], dsns[2]}), true,
			"data source ds_1 is"},
		{"a data source down", layout(t, []string{dsns[0], dsns[1], "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=2"}), false,
			"data source ds_2 does not answer"},
		{"a database not created", layout(t, []string{dsns[0], dsns[1], strings.Replace(dsns[0], "/reshard", "/no_such_reshard", 1)}), false,
			"data source ds_2: its database \"no_such_reshard"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := reshard.MakePlan(context.Background(), from, tc.to, reshard.Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, reshard.ErrLayout) != tc.layout {
				t.Errorf("error %v, want one containing %q (ErrLayout: %v)", err, tc.want, tc.layout)
			}
		})
	}
}

// TestPlanLayouts plans layouts beyond one pghash table: a server reached as localhost
// and as 127.0.0.1 is one server; a pattern rule and an exact rule of one table plan it
// once; a partitioned shard is read through its partitions; a pattern over tables per
// data source finds the logical tables; a data source renamed (a new name for an old
// database) cannot stream into itself, and the plan says so.
func TestPlanLayouts(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t, "reshard"), pgtest.NewDatabase(t, "reshard")}
	local := strings.Replace(dsns[1], "127.0.0.1", "localhost", 1)
	if local == dsns[1] {
		t.Skip("the test server's DSN does not name 127.0.0.1")
	}
	fill(t, dsns, 2, 400)
	ctx := context.Background()

	t.Run("one server by two names", func(t *testing.T) {
		p, err := reshard.MakePlan(ctx, layout(t, dsns[:1]), layout(t, []string{dsns[0], local}), reshard.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Servers) != 1 || fmt.Sprint(p.Servers[0].DataSources) != "[ds_0 ds_1]" {
			t.Errorf("servers %+v: want one, holding ds_0 and ds_1", p.Servers)
		}
	})
	t.Run("a pattern and an exact rule", func(t *testing.T) {
		twice := func(r *rules.Rules) {
			r.Tables = append([]rules.Table{{Name: "peop*", Strategy: rules.Strategy{Column: "id"}}}, r.Tables...)
		}
		p, err := reshard.MakePlan(ctx, layout(t, dsns, twice), layout(t, dsns, twice), reshard.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Tables) != 1 {
			t.Fatalf("tables %+v", p.Tables)
		}
		if all, moving := p.Tables[0].Rows(); all != 400 || moving != 0 {
			t.Errorf("%d rows, %d moving; want 400, none moving", all, moving)
		}
	})
	t.Run("a partitioned shard", func(t *testing.T) {
		for i, d := range dsns {
			exec(t, d, "CREATE TABLE events (id bigint, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)",
				"CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')",
				fmt.Sprintf(`INSERT INTO events SELECT g, '2026-06-01' FROM generate_series(1, 300) g
					WHERE satisfies_hash_partition('hash_oracle'::regclass, 2, %d, g::bigint)`, i))
		}
		ev := func(r *rules.Rules) {
			r.Tables = []rules.Table{{Name: "events", Strategy: rules.Strategy{Column: "id"}}}
		}
		p, err := reshard.MakePlan(ctx, layout(t, dsns, ev), layout(t, dsns[:1], ev), reshard.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if all, moving := p.Tables[0].Rows(); all != 300 || moving == 0 {
			t.Errorf("events: %d rows, %d moving; want all 300 read, ds_1's moving", all, moving)
		}
	})
	t.Run("tables per data source under a pattern", func(t *testing.T) {
		for _, d := range dsns {
			exec(t, d, "CREATE TABLE orders_0 (id bigint PRIMARY KEY)", "CREATE TABLE orders_1 (id bigint PRIMARY KEY)")
		}
		two := func(r *rules.Rules) {
			r.Tables = []rules.Table{{Name: "orde*", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2}}
		}
		p, err := reshard.MakePlan(ctx, layout(t, dsns, two), layout(t, dsns, two), reshard.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Tables) != 1 || p.Tables[0].Name != "orders" {
			t.Errorf("tables %+v, want the logical table orders", p.Tables)
		}
	})
	t.Run("a data source renamed", func(t *testing.T) {
		renamed := layout(t, dsns[:1])
		r := renamed.Rules()
		r.DataSources = append(r.DataSources, rules.DataSource{Name: "ds_9", DSN: dsns[0] + "&application_name=renamed"})
		to, err := rules.Compile(r)
		if err != nil {
			t.Fatal(err)
		}
		p, err := reshard.MakePlan(ctx, layout(t, dsns[:1]), to, reshard.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(p.Problems, func(s string) bool { return strings.Contains(s, "data sources ds_0 and ds_9 are one database") }) {
			t.Errorf("problems %q: want ds_0 and ds_9 named as one database", p.Problems)
		}
	})
}

// TestPlanRangeStreams: growing a range layout by a new top range streams only into the
// new data source, from the source whose keys reach it, so that the move can start.
func TestPlanRangeStreams(t *testing.T) {
	c := logicalCluster(t)
	dsns := []string{c.NewDatabase("reshard"), c.NewDatabase("reshard"), c.NewDatabase("reshard")}
	for i, d := range dsns[:2] {
		exec(t, d, "CREATE TABLE people (id bigint PRIMARY KEY, name text)", "CREATE TABLE countries (code text PRIMARY KEY, name text)")
		lo, hi := 1, 999
		if i == 1 {
			lo, hi = 1000, 2500
		}
		exec(t, d, fmt.Sprintf("INSERT INTO people SELECT g, 'p' FROM generate_series(%d, %d) g", lo, hi))
	}
	ranged := func(bounds ...int64) func(*rules.Rules) {
		return func(r *rules.Rules) {
			r.Tables[0].Strategy.Algorithm = rules.AlgorithmRange
			r.Tables[0].Strategy.Bounds = bounds
		}
	}
	p, err := reshard.MakePlan(context.Background(), layout(t, dsns[:2], ranged(1000)), layout(t, dsns, ranged(1000, 2000)), reshard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(p.Streams); got != "[{ds_0 ds_2 [countries] 1} {ds_1 ds_2 [people] 1}]" {
		t.Errorf("streams %s, want countries from ds_0 and people from ds_1 only, into ds_2", got)
	}
	if _, moving := p.Tables[0].Rows(); moving != 501 {
		t.Errorf("%d rows move, want the 501 of 2000..2500", moving)
	}
}
