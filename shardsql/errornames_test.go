package shardsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// TestErrorsNameLogicalTables: through the driver too, where a table is split into
// several on each data source (items_0, items_1), a server's error names the logical
// table and its constraints as one database's error does.
func TestErrorsNameLogicalTables(t *testing.T) {
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: pgtest.NewDatabase(t, "drverr_s0")}, {Name: "ds_1", DSN: pgtest.NewDatabase(t, "drverr_s1")}},
		Tables: []rules.Table{
			{Name: "items", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2},
			{Name: "later", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	sharded := openDriver(t, c, false)
	one, err := sql.Open("pgx", pgtest.NewDatabase(t, "drverr_one"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Close() })
	ctx := context.Background()
	answer := func(db *sql.DB, sql string, args ...any) string {
		_, err := db.ExecContext(ctx, sql, args...)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			return fmt.Sprint(err)
		}
		return fmt.Sprintf("%s %s | detail %q | table %q | constraint %q", pe.Code, pe.Message, pe.Detail, pe.TableName, pe.ConstraintName)
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{"CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL CHECK (v > 0), CONSTRAINT named_check CHECK (v < 1000))", nil},
		{"INSERT INTO items VALUES (1, 1), (2, 2), (3, 3)", nil},
		{"INSERT INTO items VALUES ($1, $2)", []any{1, 1}},
		{"INSERT INTO items VALUES ($1, $2)", []any{4, nil}},
		{"INSERT INTO items VALUES (4, -1)", nil},
		{"UPDATE items SET v = 5000 WHERE id = $1", []any{2}},
		{"UPDATE items SET v = -v", nil},
		// Described before it runs, with its arguments.
		{"UPDATE items SET nosuch = $1 WHERE id = $2", []any{1, 1}},
		// A column named like a physical table is the client's.
		{"CREATE TABLE matches (id int PRIMARY KEY, items_1 int NOT NULL)", nil},
		{"INSERT INTO matches VALUES (1, NULL)", nil},
		{"INSERT INTO matches SELECT 2, 'x'::text", nil},
		{"CREATE TABLE later (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED, v int)", nil},
	} {
		if want, got := answer(one, q.sql, q.args...), answer(sharded, q.sql, q.args...); got != want {
			t.Errorf("%s %v:\n got  %s\n want %s", q.sql, q.args, got, want)
		}
	}
	// A deferred constraint fails at COMMIT.
	commit := func(db *sql.DB) string {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []int{1, 2} {
			if _, err := tx.ExecContext(ctx, "INSERT INTO later VALUES (1, $1)", v); err != nil {
				t.Fatal(err)
			}
		}
		err = tx.Commit()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			return fmt.Sprint(err)
		}
		return fmt.Sprintf("%s %s | table %q | constraint %q", pe.Code, pe.Message, pe.TableName, pe.ConstraintName)
	}
	if want, got := commit(one), commit(sharded); got != want {
		t.Errorf("COMMIT:\n got  %s\n want %s", got, want)
	}
}

// TestPrepareAnalyses: Prepare reports what PostgreSQL's analysis finds wrong with a
// statement, as pgx's driver does on one database, with the same error; a statement
// that is right prepares, and a transaction's Prepare leaves the error to the statement.
func TestPrepareAnalyses(t *testing.T) {
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: pgtest.NewDatabase(t, "drvprep_s0")}, {Name: "ds_1", DSN: pgtest.NewDatabase(t, "drvprep_s1")}},
		Tables:      []rules.Table{{Name: "items", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	sharded := openDriver(t, c, false)
	one, err := sql.Open("pgx", pgtest.NewDatabase(t, "drvprep_one"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Close() })
	ctx := context.Background()
	for _, db := range []*sql.DB{one, sharded} {
		if _, err := db.ExecContext(ctx, "CREATE TABLE items (id int PRIMARY KEY, v int)"); err != nil {
			t.Fatal(err)
		}
	}
	prepare := func(db *sql.DB, q string) string {
		st, err := db.PrepareContext(ctx, q)
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) {
				return fmt.Sprintf("%s %s | table %q", pe.Code, pe.Message, pe.TableName)
			}
			return err.Error()
		}
		st.Close()
		return "prepared"
	}
	for _, q := range []string{
		"SELECT nosuch FROM items WHERE id = $1",
		"SELECT v FROM items WHERE id = $1",
		"UPDATE items SET nosuch = $1 WHERE id = $2",
		"INSERT INTO items VALUES ($1, nosuch(1))",
		"DELETE FROM items WHERE v = 'x'::int",
		"SELECT count(*) FROM items WHERE v = $1",
		"SELECT v, count(*) FROM items",
		"SELECT * FROM nosuch",
		"SELECT i.v FROM items i JOIN nosuch n ON n.id = i.id WHERE i.id = $1",
		"INSERT INTO nosuch VALUES ($1)",
	} {
		if want, got := prepare(one, q), prepare(sharded, q); got != want {
			t.Errorf("Prepare %s:\n got  %s\n want %s", q, got, want)
		}
	}
	// Inside a transaction the statement, not Prepare, reports it; the transaction
	// goes on until then.
	tx, err := sharded.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "CREATE TABLE later (id int)"); err != nil {
		t.Fatal(err)
	}
	st, err := tx.PrepareContext(ctx, "SELECT id FROM later")
	if err != nil {
		t.Fatalf("Prepare of a table the transaction made: %v", err)
	}
	if err := st.QueryRowContext(ctx).Scan(new(int)); !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("a table the transaction made: %v", err)
	}
}

// TestDescribeOverTablesNoOneSourceHolds: a statement with arguments is described
// before it runs, on a data source that holds its sharded table; when that data source
// lacks another table the statement names (items sharded over ds_1 and ds_2, colours on
// ds_0), the statement is refused with 0A000, as it is without arguments, not failed
// with the shard's 42P01, which one database would not raise; a table that exists
// nowhere is one database's 42P01.
func TestDescribeOverTablesNoOneSourceHolds(t *testing.T) {
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{
			{Name: "ds_0", DSN: pgtest.NewDatabase(t, "drvheld_s0")},
			{Name: "ds_1", DSN: pgtest.NewDatabase(t, "drvheld_s1")},
			{Name: "ds_2", DSN: pgtest.NewDatabase(t, "drvheld_s2")},
		},
		Tables: []rules.Table{{Name: "items", Strategy: rules.Strategy{Column: "id"}, DataSources: []string{"ds_1", "ds_2"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	db := openDriver(t, c, false)
	ctx := context.Background()
	for _, q := range []string{"CREATE TABLE items (id int PRIMARY KEY, v int)", "CREATE TABLE colours (id int PRIMARY KEY, name text)"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]any{nil, {1}} {
		q := "SELECT i.v, c.name FROM items i JOIN colours c ON c.id = i.id"
		if args != nil {
			q += " WHERE i.id = $1"
		}
		_, err := db.QueryContext(ctx, q, args...)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "0A000" || !errors.Is(err, sqlplan.ErrUnsupported) {
			t.Errorf("%s %v: %v, want a refusal (0A000)", q, args, err)
		}
	}
	// A table that exists nowhere is one database's 42P01, at Prepare and when the
	// statement runs with arguments.
	q := "SELECT i.v FROM items i JOIN nosuch n ON n.id = i.id WHERE i.id = $1"
	_, err = db.PrepareContext(ctx, q)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42P01" || pe.Message != `relation "nosuch" does not exist` {
		t.Errorf("Prepare %s: %v, want 42P01", q, err)
	}
	_, err = db.QueryContext(ctx, q, 1)
	if !errors.As(err, &pe) || pe.Code != "42P01" || pe.Message != `relation "nosuch" does not exist` {
		t.Errorf("%s: %v, want 42P01", q, err)
	}
}

// TestErrorPositions: through the driver too, a server's error points (its position)
// at the word of the client's statement one database points at, though the statement
// each shard ran was rewritten, and counted from the start of a string of several.
func TestErrorPositions(t *testing.T) {
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: pgtest.NewDatabase(t, "drvpos_s0")}, {Name: "ds_1", DSN: pgtest.NewDatabase(t, "drvpos_s1")}},
		Tables:      []rules.Table{{Name: "items", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	sharded := openDriver(t, c, false)
	one, err := sql.Open("pgx", pgtest.NewDatabase(t, "drvpos_one"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Close() })
	ctx := context.Background()
	answer := func(db *sql.DB, sql string, args ...any) string {
		_, err := db.ExecContext(ctx, sql, args...)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			return fmt.Sprint(err)
		}
		return fmt.Sprintf("%s %s at %d", pe.Code, pe.Message, pe.Position)
	}
	for _, db := range []*sql.DB{one, sharded} {
		if _, err := db.ExecContext(ctx, "CREATE TABLE items (id int PRIMARY KEY, v int)"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO items VALUES (1, 1), (2, 2), (3, 3)"); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{"select   id,    nosuch   from   items", nil},
		{"select  id  from  items  where id = 1 and   nosuch = 2", nil},
		{"select  id  from  items  where id = $1 and   nosuch = 2", []any{1}},
		{"update  items set   v = 1 where   nosuch = $1", []any{1}},
		{"select 1;  select nosuch from items where id = 1", nil},
	} {
		want, got := answer(one, q.sql, q.args...), answer(sharded, q.sql, q.args...)
		if got != want {
			t.Errorf("%q %v:\n got  %s\n want %s", q.sql, q.args, got, want)
		}
		if !strings.Contains(want, " at ") || strings.HasSuffix(want, " at 0") {
			t.Errorf("%q: one database gave no position (%s); the case tests nothing", q.sql, want)
		}
	}
}

// TestCoordinatorErrorOfOneDatabase: through the driver too, a statement the
// coordinator database fails in its analysis, over tables split into several on each
// data source, gets one database's error, analysed as its first shard runs it; up to
// this change it was refused with 0A000.
func TestCoordinatorErrorOfOneDatabase(t *testing.T) {
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: pgtest.NewDatabase(t, "drvcoorderr_s0")}, {Name: "ds_1", DSN: pgtest.NewDatabase(t, "drvcoorderr_s1")}},
		Tables:      []rules.Table{{Name: "items", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	sharded := openCoordinated(t, c, nil)
	one, err := sql.Open("pgx", pgtest.NewDatabase(t, "drvcoorderr_one"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Close() })
	ctx := context.Background()
	for _, db := range []*sql.DB{one, sharded} {
		if _, err := db.ExecContext(ctx, "CREATE TABLE items (id int PRIMARY KEY, v int)"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO items VALUES (1, 1), (2, 2), (3, 3)"); err != nil {
			t.Fatal(err)
		}
	}
	answer := func(db *sql.DB, sql string) string {
		rows, err := db.QueryContext(ctx, sql)
		if err == nil {
			for rows.Next() {
			}
			err = rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			return fmt.Sprint(err)
		}
		return fmt.Sprintf("%s %s at %d", pe.Code, pe.Message, pe.Position)
	}
	for _, q := range []string{
		"select  sum(id) +  nosuch  from items",
		"select  id, count(*) over () from items where  items.nosuch = 1",
	} {
		want, got := answer(one, q), answer(sharded, q)
		if got != want {
			t.Errorf("%q:\n got  %s\n want %s", q, got, want)
		}
		if !strings.HasPrefix(want, "42703") {
			t.Errorf("%q: one database answered %s; the case tests nothing", q, want)
		}
	}
}
