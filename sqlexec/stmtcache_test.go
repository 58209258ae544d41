package sqlexec_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/internal/postgresdb"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// TestPreparedStatementsReusedAndRefreshed: a statement with parameters is prepared
// once per backend connection; after the table changes under it, the stale statement
// is prepared again instead of failing.
func TestPreparedStatementsReusedAndRefreshed(t *testing.T) {
	ctx := context.Background()
	var dsns []string
	for i := range 2 {
		dsns = append(dsns, pgtest.NewDatabase(t, fmt.Sprintf("stmt%d", i)))
	}
	// One connection per data source, so that the statement below sees the prepared
	// statements of the connection the others ran on.
	db, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{Pool: postgresdb.Options{PoolSize: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.SimpleExec(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v text); INSERT INTO kv VALUES (1, 'a'), (2, 'b')"); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		res, err := db.Exec(ctx, "SELECT * FROM kv WHERE k = $1", text("1"), nil)
		if err != nil || len(res.Rows) != 1 || len(res.Fields) != 2 {
			t.Fatalf("%v %v", res, err)
		}
	}
	// k = 0 lives on data source 0, the default one, where pg_ catalog views are read.
	for range 3 {
		if _, err := db.Exec(ctx, "SELECT * FROM kv WHERE k = $1", text("0"), nil); err != nil {
			t.Fatal(err)
		}
	}
	res, err := db.Exec(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1", text("SELECT * FROM kv WHERE k = $1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.Rows[0][0]); got != "1" {
		t.Errorf("the statement is prepared %s times on its connection, want once", got)
	}
	if _, err := db.SimpleExec(ctx, "ALTER TABLE kv ADD COLUMN w int"); err != nil {
		t.Fatal(err)
	}
	res, err = db.Exec(ctx, "SELECT * FROM kv WHERE k = $1", text("1"), nil)
	if err != nil {
		t.Fatalf("after ALTER TABLE: %v", err)
	}
	if len(res.Fields) != 3 {
		t.Errorf("after ALTER TABLE the statement returns %d columns, want 3", len(res.Fields))
	}
}

// TestColumnCollations: a column with a collation of its own that does not compare by
// bytes cannot be sorted across shards (its keys' collation is not known to the merge):
// refused, and answered with COLLATE "C" on the sort key.
func TestColumnCollations(t *testing.T) {
	ctx := context.Background()
	dsns := []string{pgtest.NewDatabase(t, "coll0"), pgtest.NewDatabase(t, "coll1")}
	db, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.SimpleExec(ctx, `CREATE TABLE kv (k int PRIMARY KEY, v text COLLATE "en-US-x-icu");
		INSERT INTO kv VALUES (0, 'b'), (1, 'B'), (2, 'a'), (3, 'A')`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "SELECT v FROM kv ORDER BY v", sqlplan.Args{}, nil); sqlplan.Code(err) != "0A000" {
		t.Errorf("ORDER BY a column in en-US across shards: %v, want 0A000", err)
	}
	res, err := db.Exec(ctx, `SELECT v FROM kv ORDER BY v COLLATE "C"`, sqlplan.Args{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range res.Rows {
		got = append(got, string(r[0]))
	}
	if strings.Join(got, "") != "ABab" {
		t.Errorf(`ORDER BY v COLLATE "C": %v, want A B a b`, got)
	}
}

// TestPreparedStatementsByType: the same text bound with parameters of another declared
// type is another prepared statement. On the old code the cache went by text alone, and
// an int8 value was read as the float8 the statement was first prepared with.
func TestPreparedStatementsByType(t *testing.T) {
	ctx := context.Background()
	dsns := []string{pgtest.NewDatabase(t, "stmttype0"), pgtest.NewDatabase(t, "stmttype1")}
	db, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{Pool: postgresdb.Options{PoolSize: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.SimpleExec(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v text); INSERT INTO kv VALUES (1, 'v'), (2, 'v'), (3, 'v'), (4, 'v'), (5, 'v'), (6, 'v'), (7, 'v'), (8, 'v'), (9, 'v'), (10, 'v')"); err != nil {
		t.Fatal(err)
	}
	const float8OID, int8OID = 701, 20
	for _, c := range []struct {
		oid   uint32
		value []byte
		want  string
	}{
		{float8OID, binary.BigEndian.AppendUint64(nil, math.Float64bits(9.5)), "9"},
		{int8OID, binary.BigEndian.AppendUint64(nil, 3), "2"},
		{float8OID, binary.BigEndian.AppendUint64(nil, math.Float64bits(4.5)), "4"},
	} {
		res, err := db.Exec(ctx, "SELECT count(*) FROM kv WHERE k < $1",
			sqlplan.Args{Values: [][]byte{c.value}, Formats: []int16{1}, OIDs: []uint32{c.oid}}, nil)
		if err != nil {
			t.Fatalf("type %d: %v", c.oid, err)
		}
		if len(res.Rows) != 1 || string(res.Rows[0][0]) != c.want {
			t.Errorf("type %d: %q, want %s", c.oid, res.Rows, c.want)
		}
	}
}
