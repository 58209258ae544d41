package shardsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
)

// TestErrorsNameLogicalTables: through the driver too, where a table is split into
// several on each data source (items_0, items_1), a server's error names the logical
// table and its constraints as one database's error does.
func TestErrorsNameLogicalTables(t *testing.T) {
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: pgtest.NewDatabase(t, "drverr_s0")}, {Name: "ds_1", DSN: pgtest.NewDatabase(t, "drverr_s1")}},
		Tables:      []rules.Table{{Name: "items", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2}},
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
	} {
		if want, got := answer(one, q.sql, q.args...), answer(sharded, q.sql, q.args...); got != want {
			t.Errorf("%s %v:\n got  %s\n want %s", q.sql, q.args, got, want)
		}
	}
}
