package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/coordinator"
	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
)

// layout makes two databases with the physical tables of people (pghash over 2
// shards), orders (crc32, 2 databases x 2 tables), a broadcast table and a default
// table, rows placed by the rules, and returns the compiled rules.
func layout(t *testing.T) *rules.Compiled {
	t.Helper()
	ctx := context.Background()
	dss := []rules.DataSource{{Name: "ds_0", DSN: pgtest.NewDatabase(t, "coord0")}, {Name: "ds_1", DSN: pgtest.NewDatabase(t, "coord1")}}
	r, err := rules.Compile(rules.Rules{DataSources: dss,
		Tables: []rules.Table{
			{Name: "people", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt8}},
			{Name: "orders", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt8, Algorithm: rules.AlgorithmCRC32}, TablesPerDataSource: 2},
		},
		Broadcast: []string{"colors"}})
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]*pgx.Conn, len(dss))
	for i, ds := range dss {
		c, err := pgx.Connect(ctx, ds.DSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		conns[i] = c
		exec(t, c, `CREATE TABLE colors (id int PRIMARY KEY, name text COLLATE "C")`)
		exec(t, c, `INSERT INTO colors VALUES (0, 'red'), (1, 'green'), (2, 'blue')`)
		exec(t, c, `CREATE TABLE people (id bigint PRIMARY KEY, name text NOT NULL, color int)`)
	}
	exec(t, conns[0], `CREATE TABLE settings (k text PRIMARY KEY, v text)`)
	exec(t, conns[0], `INSERT INTO settings VALUES ('a', 'x')`)
	orders := r.Lookup("orders")
	for _, n := range orders.Nodes {
		exec(t, conns[n.DataSource], fmt.Sprintf(`CREATE TABLE %s (id bigint PRIMARY KEY, person bigint, amount numeric)`, pgx.Identifier{n.Table}.Sanitize()))
	}
	people := r.Lookup("people")
	for id := int64(1); id <= 300; id++ {
		k := rules.IntKey(id)
		s, _, err := people.ShardOf("id", k, rules.TypeInt8)
		if err != nil {
			t.Fatal(err)
		}
		exec(t, conns[people.Nodes[s].DataSource], `INSERT INTO people VALUES ($1, $2, $3)`, id, fmt.Sprintf("p%d", id%7), id%3)
		s, _, err = orders.ShardOf("id", k, rules.TypeInt8)
		if err != nil {
			t.Fatal(err)
		}
		n := orders.Nodes[s]
		exec(t, conns[n.DataSource], fmt.Sprintf(`INSERT INTO %s VALUES ($1, $2, $3)`, pgx.Identifier{n.Table}.Sanitize()), id, id%50+1, fmt.Sprintf("%d.25", id))
	}
	return r
}

func exec(t *testing.T, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestCoordinatorAnswersOverEveryShard(t *testing.T) {
	r := layout(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := coordinator.New(r, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Drop(context.Background()) })
	if err := c.Ready(ctx, 1); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	one := func(sql string, args ...any) string {
		t.Helper()
		var s string
		if err := conn.QueryRow(ctx, sql, args...).Scan(&s); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return s
	}
	// Pruning by the partition bounds finds every row: a bound that placed keys
	// unlike the rules would miss the rows of the shards it did not pick.
	for id := 1; id <= 300; id++ {
		if got := one(`SELECT count(*)::text FROM people WHERE id = $1`, id); got != "1" {
			t.Fatalf("people id %d: %s rows through the partition bounds, want 1", id, got)
		}
	}
	cases := []struct{ sql, want string }{
		{`SELECT count(*)::text FROM people`, "300"},
		{`SELECT count(*)::text FROM orders`, "300"},
		{`SELECT string_agg(name, ',' ORDER BY id) FROM colors`, "red,green,blue"},
		{`SELECT v FROM settings`, "x"},
		{`WITH t AS (SELECT id FROM people WHERE color = 1) SELECT count(*)::text FROM t`, "100"},
		{`SELECT count(DISTINCT name)::text FROM people`, "7"},
		{`SELECT (sum(amount) + 1)::text FROM orders`, "45226.00"},
		{`SELECT count(*)::text FROM orders o JOIN people p ON p.id = o.person JOIN colors c ON c.id = p.color WHERE c.name = 'red'`, "96"},
		{`SELECT max(r)::text FROM (SELECT rank() OVER (ORDER BY name) AS r FROM people) x`, "258"},
	}
	for _, tc := range cases {
		if got := one(tc.sql); got != tc.want {
			t.Errorf("%s = %s, want %s", tc.sql, got, tc.want)
		}
	}
	// The shards' tables are not the client's: a split table's physical names stay out.
	if got := one(`SELECT count(*)::text FROM pg_class WHERE relname IN ('orders_0', 'orders_1') AND relnamespace = 'public'::regnamespace`); got != "0" {
		t.Errorf("physical tables in the coordinator's public schema: %s", got)
	}
	// A schema change made beside the coordinator, on the shards themselves, is seen
	// by the next Ready's survey, which rebuilds.
	for _, ds := range r.DataSources() {
		src, err := pgx.Connect(ctx, ds.DSN)
		if err != nil {
			t.Fatal(err)
		}
		exec(t, src, `ALTER TABLE people ADD COLUMN age int`)
		src.Close(context.Background())
	}
	if _, err := conn.Exec(ctx, `SELECT age FROM people`); err == nil {
		t.Fatal("the coordinator saw a new column before a rebuild; the test proves nothing")
	}
	if err := c.Ready(ctx, 1); !errors.Is(err, coordinator.ErrSchemaChanged) {
		t.Fatalf("Ready after a change on the shards: %v, want ErrSchemaChanged", err)
	}
	if err := c.Ready(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := one(`SELECT count(age)::text FROM people`); got != "0" {
		t.Errorf("after the rebuild: count(age) = %s", got)
	}
}

func TestCoordinatorRefusesDataSourcesThatSortDifferently(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := pgtest.DSN(t)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	a := pgtest.NewDatabase(t, "coordloc")
	name := pgtest.UniqueName("coordloc_c")
	exec(t, admin, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE template0 LC_COLLATE 'POSIX' LC_CTYPE 'POSIX'`, name))
	t.Cleanup(func() {
		// On a connection of its own: the test's is closed by then.
		c, err := pgx.Connect(context.Background(), base)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, name)); err != nil {
			t.Error(err)
		}
	})
	var collate string
	if err := admin.QueryRow(ctx, `SELECT datcollate FROM pg_database WHERE datname = current_database()`).Scan(&collate); err != nil {
		t.Fatal(err)
	}
	if collate == "POSIX" {
		t.Skip("the server's default collation is POSIX: no second collation to disagree with")
	}
	cfg, err := pgx.ParseConfig(a)
	if err != nil {
		t.Fatal(err)
	}
	b := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
	r, err := rules.Compile(rules.Rules{DataSources: []rules.DataSource{{Name: "ds_0", DSN: a}, {Name: "ds_1", DSN: b}},
		Tables: []rules.Table{{Name: "people", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt8}}}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := coordinator.New(r, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Drop(context.Background()) })
	err = c.Ready(ctx, 1)
	if err == nil || !strings.Contains(err.Error(), "would sort text unlike one of them") {
		t.Fatalf("a coordinator over data sources of different collations: %v", err)
	}
	t.Log(err)
}

// TestRelayCountsAndBoundsWhatMoves: through the relay, the rows a coordinator
// statement reads from the shards are counted while it runs, and a statement that
// passes its bound is cut off; the coordinator session stays usable, and a second
// owner of the same coordinator database is refused.
func TestRelayCountsAndBoundsWhatMoves(t *testing.T) {
	r := layout(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := coordinator.New(r, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Drop(context.Background()) })
	if err := c.StartRelay("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetTempFileLimit(64 << 20)
	if err := c.Ready(ctx, 1); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	pid := conn.PgConn().PID()
	var limit string
	if err := conn.QueryRow(ctx, "SHOW temp_file_limit").Scan(&limit); err != nil || limit != "64MB" {
		t.Errorf("temp_file_limit in the coordinator database: %q, %v", limit, err)
	}

	m := c.Track(pid, 0)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT p.id FROM people p JOIN orders o ON o.person = p.id WHERE p.name = 'p3') s`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	c.Untrack(pid)
	// Every shard sends its rows of both tables (the join is not pushed down across
	// shards); people's filter goes to the shards with it.
	if m.Rows() < 300 || m.Rows() > 300+300 || m.Bytes() <= 0 || m.Exceeded() {
		t.Errorf("moved %d rows, %d bytes (exceeded %v); want between 300 and 600 rows", m.Rows(), m.Bytes(), m.Exceeded())
	}
	t.Logf("join: %d rows, %d bytes moved; answer %d", m.Rows(), m.Bytes(), n)

	m = c.Track(pid, 2000)
	_, err = conn.Exec(ctx, `SELECT * FROM orders o JOIN people p ON p.name = 'p' || o.id`)
	c.Untrack(pid)
	if err == nil || !m.Exceeded() {
		t.Fatalf("a statement past its bound: err %v, exceeded %v", err, m.Exceeded())
	}
	t.Logf("past the bound: %v after %d bytes", err, m.Bytes())
	c.Track(pid, 0)
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM colors`).Scan(&n); err != nil || n != 3 {
		t.Errorf("the coordinator session after a cut: %d, %v", n, err)
	}
	c.Untrack(pid)
	// A statement nobody tracks reads nothing through the relay.
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM colors`).Scan(&n); err == nil {
		t.Errorf("an untracked statement read the shards through the relay: %d", n)
	}

	other, err := coordinator.New(r, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.StartRelay("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Ready(ctx, 1); err == nil || !strings.Contains(err.Error(), "in use by another proxy") {
		t.Errorf("a second owner: %v", err)
	}
}
