package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
)

// TestErrorsNameLogicalTables: where a table is split into several on each data source
// (items_0, items_1), a server's error names the logical table, its constraints by the
// names one database gives them, as one database's error does: message, table and
// constraint fields (which ORMs read to tell which constraint failed), and detail.
func TestErrorsNameLogicalTables(t *testing.T) {
	r := shardedRules([]string{pgtest.NewDatabase(t, "errnames_s0"), pgtest.NewDatabase(t, "errnames_s1")}, nil, nil)
	r.Tables = []rules.Table{
		{Name: "items", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2},
		{Name: "later", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2},
	}
	e := startProxyOn(t, r)
	ctx := context.Background()
	one, err := pgconn.Connect(ctx, pgtest.NewDatabase(t, "errnames_one"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Close(context.Background()) })
	pc := e.pgconnect(t)
	answer := func(c *pgconn.PgConn, sql string) string {
		_, err := c.Exec(ctx, sql).ReadAll()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			return fmt.Sprint(err)
		}
		return fmt.Sprintf("%s %s | detail %q | hint %q | table %q | constraint %q", pe.Code, pe.Message, pe.Detail, pe.Hint, pe.TableName, pe.ConstraintName)
	}
	for _, sql := range []string{
		"CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL CHECK (v > 0), w text, CONSTRAINT named_check CHECK (v < 1000))",
		"INSERT INTO items VALUES (1, 1, 'a'), (2, 2, 'b'), (3, 3, 'c')",
		"INSERT INTO items VALUES (1, 1, 'b')",
		"INSERT INTO items VALUES (2, 7, 'items_0')",
		"INSERT INTO items VALUES (4, NULL, 'items_1')",
		"INSERT INTO items VALUES (4, -1, 'b')",
		"INSERT INTO items VALUES (4, 5000, 'b')",
		"UPDATE items SET v = -v WHERE id = 3",
		"UPDATE items SET nosuch = 1 WHERE id = 1",
		"SELECT id FROM items GROUP BY v",
		// A hint names a column by its table.
		"SELECT idd FROM items WHERE id = 1",
		"UPDATE items SET v = 1 WHERE id = 1 AND idd = 2",
		"SELECT 'items_0'::int",
		"ALTER TABLE items ADD CONSTRAINT named_check CHECK (v < 10)",
		// A column named like a physical table is the client's.
		"CREATE TABLE matches (id int PRIMARY KEY, items_1 int NOT NULL)",
		"INSERT INTO matches VALUES (1, NULL)",
		"INSERT INTO matches SELECT 2, 'x'::text",
		// A deferred constraint fails at COMMIT.
		"CREATE TABLE later (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED, v int)",
		"BEGIN; INSERT INTO later VALUES (1, 1); INSERT INTO later VALUES (1, 2); COMMIT",
	} {
		if want, got := answer(one, sql), answer(pc, sql); got != want {
			t.Errorf("%s:\n got  %s\n want %s", sql, got, want)
		}
	}
}

// TestForeignKeysAcrossShards: a foreign key between tables split alike and bound
// references, shard by shard, the physical table that holds the referenced rows, and
// answers as one database does, names included; one that no data source could check
// (from a default data source's table to a sharded one) is refused with 0A000. Up to
// this change the first failed with 42P01 ("orders" exists on no shard) and the second
// was accepted, then rejected rows whose order lives on another data source.
func TestForeignKeysAcrossShards(t *testing.T) {
	r := shardedRules([]string{pgtest.NewDatabase(t, "fk_s0"), pgtest.NewDatabase(t, "fk_s1")}, nil, nil)
	r.Tables = []rules.Table{
		{Name: "orders", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2},
		{Name: "lines", Strategy: rules.Strategy{Column: "order_id"}, TablesPerDataSource: 2},
	}
	r.Bindings = [][]string{{"orders", "lines"}}
	e := startProxyOn(t, r)
	ctx := context.Background()
	one, err := pgconn.Connect(ctx, pgtest.NewDatabase(t, "fk_one"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Close(context.Background()) })
	pc := e.pgconnect(t)
	answer := func(c *pgconn.PgConn, sql string) string {
		_, err := c.Exec(ctx, sql).ReadAll()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			return fmt.Sprint(err)
		}
		return fmt.Sprintf("%s %s | detail %q | table %q | constraint %q", pe.Code, pe.Message, pe.Detail, pe.TableName, pe.ConstraintName)
	}
	for _, sql := range []string{
		"CREATE TABLE orders (id bigint PRIMARY KEY, who text)",
		"CREATE TABLE lines (order_id bigint REFERENCES orders (id), n int)",
		"INSERT INTO orders SELECT g, 'x' FROM generate_series(1, 10) g",
		"INSERT INTO lines SELECT g, 1 FROM generate_series(1, 10) g",
		"INSERT INTO lines VALUES (99, 1)",
		"DELETE FROM orders WHERE id = 3",
	} {
		if want, got := answer(one, sql), answer(pc, sql); got != want {
			t.Errorf("%s:\n got  %s\n want %s", sql, got, want)
		}
	}
	got := answer(pc, "CREATE TABLE reviews (id int PRIMARY KEY, order_id bigint REFERENCES orders (id))")
	if !strings.HasPrefix(got, "0A000 ") || !strings.Contains(got, "foreign key") {
		t.Errorf("a foreign key no data source can check: %s, want 0A000", got)
	}
}

// TestErrorPositions: a server's error points (its position, psql's caret) at the word
// of the client's statement that one database points at, in both protocols, though the
// statement each shard ran was rewritten (deparsed, its tables renamed) and though
// several statements came in one query string, from whose start PostgreSQL counts.
// Until this change the caret stood where the rewritten text had the word.
func TestErrorPositions(t *testing.T) {
	r := shardedRules([]string{pgtest.NewDatabase(t, "errpos_s0"), pgtest.NewDatabase(t, "errpos_s1")}, nil, nil)
	r.Tables = []rules.Table{{Name: "items", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2}}
	e := startProxyOn(t, r)
	ctx := context.Background()
	one, err := pgconn.Connect(ctx, pgtest.NewDatabase(t, "errpos_one"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Close(context.Background()) })
	pc := e.pgconnect(t)
	answer := func(c *pgconn.PgConn, sql string, extended bool) string {
		var err error
		if extended {
			_, err = c.ExecParams(ctx, sql, nil, nil, nil, nil).Close()
		} else {
			_, err = c.Exec(ctx, sql).ReadAll()
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			return fmt.Sprint(err)
		}
		return fmt.Sprintf("%s %s at %d", pe.Code, pe.Message, pe.Position)
	}
	for _, sql := range []string{
		"CREATE TABLE items (id int PRIMARY KEY, v int, w text)",
		"INSERT INTO items VALUES (1, 1, 'a'), (2, 2, 'b'), (3, 3, 'c')",
	} {
		for _, c := range []*pgconn.PgConn{one, pc} {
			if _, err := c.Exec(ctx, sql).ReadAll(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		sql    string
		simple bool // several statements: the simple protocol only
	}{
		{sql: "select   id,    nosuch   from   items"},
		{sql: "select  id  from  items  where id = 1 and   nosuch = 2"},
		{sql: "   select  count(*)  from   items  where   x  > 1"},
		{sql: "select 'é',  nosuch from items order by 1"},
		{sql: "select  i.id from items i join items j on i.id = j.id where i.id = 3 and  j.nosuch = 1"},
		{sql: "select  v  from items where id = 2 and  v = 'xyz'::int"},
		{sql: "select 1;  select nosuch from items where id = 1", simple: true},
		{sql: "select 1; /* select nosuch */; select  nosuch from items", simple: true},
		{sql: "copy (select  nosuch from items) to stdout", simple: true},
		{sql: "copy items from stdin where  nosuch > 1", simple: true},
		{sql: "select v from items where id = 1 and  w != 1"},
		{sql: "copy (select  nosuch from items where id = 1) to stdout", simple: true},
		// White space only to Unicode, not to PostgreSQL's scanner: part of a word there.
		{sql: "select 1;\u00a0", simple: true},
		{sql: "\u00a0select 1", simple: true},
		{sql: "/* x */\u00a0;", simple: true},
	} {
		for _, extended := range []bool{false, true} {
			if extended && tc.simple {
				continue
			}
			want, got := answer(one, tc.sql, extended), answer(pc, tc.sql, extended)
			if got != want {
				t.Errorf("%q (extended %v):\n got  %s\n want %s", tc.sql, extended, got, want)
			}
			if !strings.Contains(want, " at ") || strings.HasSuffix(want, " at 0") {
				t.Errorf("%q: one database gave no position (%s); the case tests nothing", tc.sql, want)
			}
		}
	}
}

// TestCoordinatorErrorOfOneDatabase: where tables are split into several on each data
// source, so that no data source holds them under their logical names, a statement the
// coordinator database fails in its analysis is analysed as its first shard runs it:
// an error one database raises there too is the client's, with one database's name and
// position. Up to this change it was refused with 0A000 (with one table per data
// source, the client's error, with its position).
func TestCoordinatorErrorOfOneDatabase(t *testing.T) {
	for _, perSource := range []int{2, 1} {
		t.Run(fmt.Sprintf("%d tables per data source", perSource), func(t *testing.T) {
			coordinatorErrorOfOneDatabase(t, perSource)
		})
	}
}

// coordinatorErrorOfOneDatabase: with one table per data source the default data
// source analyses the client's text itself, and its position stands.
func coordinatorErrorOfOneDatabase(t *testing.T, perSource int) {
	name := fmt.Sprintf("coorderr%d", perSource)
	r := shardedRules([]string{pgtest.NewDatabase(t, name+"_s0"), pgtest.NewDatabase(t, name+"_s1")}, nil, nil)
	r.Tables = []rules.Table{{Name: "items", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: perSource}}
	e := startProxyOn(t, r, withCoordinator())
	ctx := context.Background()
	one, err := pgconn.Connect(ctx, pgtest.NewDatabase(t, name+"_one"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Close(context.Background()) })
	pc := e.pgconnect(t)
	for _, c := range []*pgconn.PgConn{one, pc} {
		if _, err := c.Exec(ctx, "CREATE TABLE items (id int PRIMARY KEY, v int); INSERT INTO items VALUES (1, 1), (2, 2), (3, 3)").ReadAll(); err != nil {
			t.Fatal(err)
		}
	}
	answer := func(c *pgconn.PgConn, sql string) string {
		_, err := c.Exec(ctx, sql).ReadAll()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			return fmt.Sprint(err)
		}
		return fmt.Sprintf("%s %s at %d", pe.Code, pe.Message, pe.Position)
	}
	for _, sql := range []string{
		"select  sum(id) +  nosuch  from items",
		"select  id, count(*) over () from items where  items.nosuch = 1",
		"select  v, count(*) from items group by 1 having  max(nosuch) > 1",
		"select 1;  copy (select  sum(id) +  nosuch  from items) to stdout",
	} {
		want, got := answer(one, sql), answer(pc, sql)
		if got != want {
			t.Errorf("%q:\n got  %s\n want %s", sql, got, want)
		}
		if !strings.HasPrefix(want, "42703") {
			t.Errorf("%q: one database answered %s; the case tests nothing", sql, want)
		}
	}
	// What one database accepts is answered.
	if got := answer(pc, "select sum(id) + 1 from items"); got != "<nil>" {
		t.Errorf("sum(id) + 1: %s", got)
	}
}
