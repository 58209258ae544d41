package sqlexec_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlexec"
)

// TestLogicalNames: a server's error that names a physical table (items_0 of a table
// split in two on each data source) names the logical one, as one database would;
// values the client wrote, details and tables whose names are their own stay as they
// are.
func TestLogicalNames(t *testing.T) {
	r, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: "postgres://a/x"}, {Name: "ds_1", DSN: "postgres://b/x"}},
		Tables: []rules.Table{
			{Name: "items", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2},
			{Name: "log*", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 3},
			{Name: "users", Strategy: rules.Strategy{Column: "id"}},
			{Name: "player", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		in, want pgconn.PgError
	}{
		{pgconn.PgError{Code: "23505", Message: `duplicate key value violates unique constraint "items_1_pkey"`, Detail: `Key (id)=(1) already exists.`, TableName: "items_1", ConstraintName: "items_1_pkey"},
			pgconn.PgError{Code: "23505", Message: `duplicate key value violates unique constraint "items_pkey"`, Detail: `Key (id)=(1) already exists.`, TableName: "items", ConstraintName: "items_pkey"}},
		{pgconn.PgError{Code: "23514", Message: `new row for relation "items_1" violates check constraint "named_check"`, TableName: "items_1", ConstraintName: "named_check"},
			pgconn.PgError{Code: "23514", Message: `new row for relation "items" violates check constraint "named_check"`, TableName: "items", ConstraintName: "named_check"}},
		{pgconn.PgError{Code: "42710", Message: `constraint "items_1_v_check" for relation "items_1" already exists`},
			pgconn.PgError{Code: "42710", Message: `constraint "items_v_check" for relation "items" already exists`}},
		{pgconn.PgError{Code: "42803", Message: `column "items_0.id" must appear in the GROUP BY clause or be used in an aggregate function`},
			pgconn.PgError{Code: "42803", Message: `column "items.id" must appear in the GROUP BY clause or be used in an aggregate function`}},
		{pgconn.PgError{Code: "42703", Message: `column "nosuch" of relation "log7_2" does not exist`},
			pgconn.PgError{Code: "42703", Message: `column "nosuch" of relation "log7" does not exist`}},
		// A column named like a physical table's constraint is no constraint.
		{pgconn.PgError{Code: "42703", Message: `column "items_0_x" of relation "items_0" does not exist`},
			pgconn.PgError{Code: "42703", Message: `column "items_0_x" of relation "items" does not exist`}},
		// A column named like a physical table is the client's: only relations,
		// constraints and a column's table are renamed.
		{pgconn.PgError{Code: "42804", Message: `column "player_1" is of type integer but expression is of type text`},
			pgconn.PgError{Code: "42804", Message: `column "player_1" is of type integer but expression is of type text`}},
		{pgconn.PgError{Code: "23502", Message: `null value in column "player_1" of relation "matches" violates not-null constraint`, TableName: "matches"},
			pgconn.PgError{Code: "23502", Message: `null value in column "player_1" of relation "matches" violates not-null constraint`, TableName: "matches"}},
		{pgconn.PgError{Code: "42703", Message: `column "player_0" of relation "player_1" does not exist`},
			pgconn.PgError{Code: "42703", Message: `column "player_0" of relation "player" does not exist`}},
		{pgconn.PgError{Code: "42702", Message: `column reference "player_1" is ambiguous`},
			pgconn.PgError{Code: "42702", Message: `column reference "player_1" is ambiguous`}},
		// Hints name a column by its table.
		{pgconn.PgError{Code: "42703", Message: `column "nam" does not exist`, Hint: `Perhaps you meant to reference the column "items_0.name".`},
			pgconn.PgError{Code: "42703", Message: `column "nam" does not exist`, Hint: `Perhaps you meant to reference the column "items.name".`}},
		{pgconn.PgError{Code: "42P01", Message: `invalid reference to FROM-clause entry for table "items_1"`, Hint: `There is an entry for table "items_1", but it cannot be referenced from this part of the query.`},
			pgconn.PgError{Code: "42P01", Message: `invalid reference to FROM-clause entry for table "items"`, Hint: `There is an entry for table "items", but it cannot be referenced from this part of the query.`}},
		{pgconn.PgError{Code: "42712", Message: `table name "items_0" specified more than once`},
			pgconn.PgError{Code: "42712", Message: `table name "items" specified more than once`}},
		{pgconn.PgError{Code: "42809", Message: `"items_0" is not a view`},
			pgconn.PgError{Code: "42809", Message: `"items" is not a view`}},
		{pgconn.PgError{Code: "42P09", Message: `table reference "items_1" is ambiguous`},
			pgconn.PgError{Code: "42P09", Message: `table reference "items" is ambiguous`}},
		// Not physical names: a shard beyond the table's count, a table kept whole,
		// a number that is not one.
		{pgconn.PgError{Code: "42P01", Message: `relation "items_2" does not exist`}, pgconn.PgError{Code: "42P01", Message: `relation "items_2" does not exist`}},
		{pgconn.PgError{Code: "42P01", Message: `relation "users_0" does not exist`}, pgconn.PgError{Code: "42P01", Message: `relation "users_0" does not exist`}},
		{pgconn.PgError{Code: "42P01", Message: `relation "items_01" does not exist`}, pgconn.PgError{Code: "42P01", Message: `relation "items_01" does not exist`}},
		// A foreign key's detail names the referenced table after the values, which
		// stay the client's.
		{pgconn.PgError{Code: "23503", Message: `insert or update on table "items_0" violates foreign key constraint "items_0_k_fkey"`, Detail: `Key (k)=(table "items_0") is not present in table "items_1".`, TableName: "items_0", ConstraintName: "items_0_k_fkey"},
			pgconn.PgError{Code: "23503", Message: `insert or update on table "items" violates foreign key constraint "items_k_fkey"`, Detail: `Key (k)=(table "items_0") is not present in table "items".`, TableName: "items", ConstraintName: "items_k_fkey"}},
		{pgconn.PgError{Code: "23503", Message: `insert or update on table "items_0" violates foreign key constraint "k_fkey"`, Detail: `Key is not present in table "items_1".`, TableName: "items_0", ConstraintName: "k_fkey"},
			pgconn.PgError{Code: "23503", Message: `insert or update on table "items" violates foreign key constraint "k_fkey"`, Detail: `Key is not present in table "items".`, TableName: "items", ConstraintName: "k_fkey"}},
		// The client's values are not renamed.
		{pgconn.PgError{Code: "22P02", Message: `invalid input syntax for type integer: "items_0"`}, pgconn.PgError{Code: "22P02", Message: `invalid input syntax for type integer: "items_0"`}},
		{pgconn.PgError{Code: "23502", Message: `null value in column "v" of relation "items_0" violates not-null constraint`, Detail: `Failing row contains (2, "items_0").`, TableName: "items_0"},
			pgconn.PgError{Code: "23502", Message: `null value in column "v" of relation "items" violates not-null constraint`, Detail: `Failing row contains (2, "items_0").`, TableName: "items"}},
	} {
		in := c.in
		shardErr := &sqlexec.ShardError{DataSource: 1, Name: "ds_1", Err: &in}
		got := sqlexec.LogicalNames(shardErr, r)
		var pe *pgconn.PgError
		if !errors.As(got, &pe) {
			t.Fatalf("%v: no PgError", got)
		}
		if pe.Code != c.want.Code || pe.Message != c.want.Message || pe.Detail != c.want.Detail || pe.TableName != c.want.TableName || pe.ConstraintName != c.want.ConstraintName || pe.Hint != c.want.Hint {
			t.Errorf("%s %s:\n got  %q table %q constraint %q detail %q hint %q\n want %q table %q constraint %q detail %q hint %q", c.in.Code, c.in.Message,
				pe.Message, pe.TableName, pe.ConstraintName, pe.Detail, pe.Hint, c.want.Message, c.want.TableName, c.want.ConstraintName, c.want.Detail, c.want.Hint)
		}
		var se *sqlexec.ShardError
		if !errors.As(got, &se) || se.Name != "ds_1" || !strings.HasPrefix(got.Error(), "data source ds_1: ") || !strings.Contains(got.Error(), pe.Message) {
			t.Errorf("%s: the data source is no longer named: %v", c.in.Message, got)
		}
		if *pe == c.in && got != error(shardErr) {
			t.Errorf("%s: nothing renamed, yet the error is another", c.in.Message)
		}
	}
	if err := errors.New("plain"); sqlexec.LogicalNames(err, r) != err {
		t.Error("an error that is no server's changed")
	}
}

// TestMissingElsewhere: a description's 42P01 names a table the rules place on another
// data source (to look for there) only when they do; a table they place where the
// statement was described, physical names included, is missing on one database too.
func TestMissingElsewhere(t *testing.T) {
	r, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: "postgres://a/x"}, {Name: "ds_1", DSN: "postgres://b/x"}, {Name: "ds_2", DSN: "postgres://c/x"}},
		Tables:      []rules.Table{{Name: "items", Strategy: rules.Strategy{Column: "id"}, DataSources: []string{"ds_1", "ds_2"}, TablesPerDataSource: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ds        int
		code, msg string
		other     int
		table     string
		ok        bool
	}{
		{1, "42P01", `relation "colours" does not exist`, 0, "colours", true},
		{0, "42P01", `relation "colours" does not exist`, 0, "", false},
		{1, "42P01", `relation "items_1" does not exist`, 0, "", false},
		{0, "42P01", `relation "items_1" does not exist`, 1, "items_0", true},
		{1, "42P01", `relation "public.colours" does not exist`, 0, "public.colours", true},
		{1, "42P01", `missing FROM-clause entry for table "c"`, 0, "", false},
		{1, "42703", `column "colours" does not exist`, 0, "", false},
	} {
		err := &sqlexec.ShardError{DataSource: c.ds, Name: "x", Err: &pgconn.PgError{Code: c.code, Message: c.msg}}
		other, table, ok := sqlexec.MissingElsewhere(r, c.ds, err)
		if other != c.other || table != c.table || ok != c.ok {
			t.Errorf("%s on ds_%d: got %d %q %v, want %d %q %v", c.msg, c.ds, other, table, ok, c.other, c.table, c.ok)
		}
	}
}
