package sqlexec

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// TestQueryInParts reads cross-shard answers in parts inside a transaction, on real
// servers: the sort merge comes out whole and in order while the transaction runs other
// statements on the same connections between parts (which readers holding the
// connections could not allow); an answer closed early leaves no portal open on the
// shards; a row that fails in a later part fails the transaction; and outside a
// transaction the engine refuses, since the portals would end with the first part.
func TestQueryInParts(t *testing.T) {
	ctx := context.Background()
	dsns := []string{pgtest.NewDatabase(t, "parts0"), pgtest.NewDatabase(t, "parts1")}
	r := rules.Rules{Tables: []rules.Table{{Name: "kv", Strategy: rules.Strategy{Column: "k", Type: rules.TypeInt4, Algorithm: rules.AlgorithmMod}}}}
	for i, d := range dsns {
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d})
	}
	compiled, err := rules.Compile(r)
	if err != nil {
		t.Fatal(err)
	}
	db, err := Open(ctx, compiled, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const n = 2000
	if _, err := db.SimpleExec(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	var values []string
	for k := range n {
		values = append(values, fmt.Sprintf("(%d, '%s')", k, strings.Repeat("v", k%50)))
	}
	if _, err := db.SimpleExec(ctx, "INSERT INTO kv VALUES "+strings.Join(values, ", ")); err != nil {
		t.Fatal(err)
	}
	bound := func(sql string) *sqlplan.Bound {
		t.Helper()
		plan, err := db.planner.Prepare(ctx, sql)
		if err != nil {
			t.Fatal(err)
		}
		b, err := plan.Bind(sqlplan.Args{})
		if err != nil {
			t.Fatal(err)
		}
		if !b.MultiTarget() {
			t.Fatalf("%s: one target", sql)
		}
		return b
	}
	// openPortals counts the protocol-level portals open in the transaction, on every
	// data source.
	openPortals := func(s *Session) int {
		t.Helper()
		total := 0
		for ds := range dsns {
			err := s.Run(ctx, ds, func(pg *pgconn.PgConn) error {
				res, err := pg.Exec(ctx, "SELECT count(*) FROM pg_cursors WHERE name LIKE '"+portalPrefix+"%'").ReadAll()
				if err != nil {
					return err
				}
				var k int
				fmt.Sscan(string(res[0].Rows[0][0]), &k)
				total += k
				return nil
			})
			s.Release(ds, err)
			if err != nil {
				t.Fatal(err)
			}
		}
		return total
	}

	if _, err := db.engine.QueryInParts(ctx, bound("SELECT k, v FROM kv ORDER BY k"), sqlplan.Args{}, nil, NewSession(db.pools, db.committer)); err == nil {
		t.Error("in parts outside a transaction: no error")
	}

	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { tx.Rollback(ctx) }() // a failed check leaves no connection held (db.Close waits for them)
	rows, err := db.engine.QueryInParts(ctx, bound("SELECT k, v FROM kv ORDER BY k DESC"), sqlplan.Args{}, nil, tx.s)
	if err != nil {
		t.Fatal(err)
	}
	if got := openPortals(tx.s); got != 2 {
		t.Errorf("%d portals open on the shards after the first part, want 2 (one a target)", got)
	}
	want := n - 1
	for rows.Next() {
		if got := string(rows.Values()[0]); got != fmt.Sprint(want) {
			t.Fatalf("row %d: k %s, want %d", n-1-want, got, want)
		}
		if want%500 == 0 {
			// Another statement on the same connections, between two parts.
			if _, err := tx.Exec(ctx, "UPDATE kv SET v = 'seen' WHERE k = $1 OR k = $1 + 1", sqlplan.Args{Values: [][]byte{[]byte(fmt.Sprint(want))}}, nil); err != nil {
				t.Fatalf("a statement between parts: %v", err)
			}
		}
		want--
	}
	if tag, err := rows.Close(); err != nil || want != -1 || tag.String() != fmt.Sprintf("SELECT %d", n) {
		t.Fatalf("after %d rows: %v %v", n-1-want, tag, err)
	}

	// Closed early: its portals close on the shards.
	before := openPortals(tx.s)
	rows, err = db.engine.QueryInParts(ctx, bound("SELECT k, v FROM kv"), sqlplan.Args{}, nil, tx.s)
	if err != nil {
		t.Fatal(err)
	}
	rows.FetchHint(5) // parts of 5 rows: the first target does not end, the second never runs
	for range 5 {
		if !rows.Next() {
			t.Fatal("fewer than 5 rows")
		}
	}
	if _, err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	if after := openPortals(tx.s); after != before {
		t.Errorf("%d portals open after closing an answer read in part, %d before it", after, before)
	}

	// A concatenation computes nothing on a target before it is read: every row of
	// the second target (odd keys, on ds_1) fails.
	b := bound("SELECT k, 10 / (k % 2 - 1) FROM kv")
	if b.Targets[0].DataSource != 0 {
		t.Fatalf("the first target is on data source %d", b.Targets[0].DataSource)
	}
	rows, err = db.engine.QueryInParts(ctx, b, sqlplan.Args{}, nil, tx.s)
	if err != nil {
		t.Fatalf("a concatenation whose second target's first row fails: %v", err)
	}
	rows.FetchHint(1)
	if !rows.Next() {
		_, err := rows.Close()
		t.Fatalf("a concatenation whose second target's first row fails: no first row: %v", err)
	}
	if _, err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	// Rows an OFFSET skips count in what a part asks for.
	rows, err = db.engine.QueryInParts(ctx, bound("SELECT k FROM kv ORDER BY k OFFSET 1500"), sqlplan.Args{}, nil, tx.s)
	if err != nil {
		t.Fatal(err)
	}
	rows.FetchHint(1)
	if h := rows.st.parts.hint; h != partsRows {
		t.Errorf("OFFSET 1500, the caller reading 1 row: parts of %d rows, want %d", h, partsRows)
	}
	if !rows.Next() || string(rows.Values()[0]) != "1500" {
		t.Errorf("OFFSET 1500: first row %q", rows.Values())
	}
	if _, err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	// Groups handed out as they come: a shard sends a row a group, and the merge reads
	// one more to close the last; groups gathered to be sorted are read whole anyway.
	for sql, want := range map[string]uint32{
		"SELECT k, count(*) FROM kv GROUP BY k ORDER BY k":           3,
		"SELECT k, count(*) FROM kv GROUP BY k ORDER BY count(*), k": 0,
	} {
		rows, err = db.engine.QueryInParts(ctx, bound(sql), sqlplan.Args{}, nil, tx.s)
		if err != nil {
			t.Fatal(err)
		}
		rows.FetchHint(2)
		if h := rows.st.parts.hint; h != want {
			t.Errorf("%s, the caller reading 2 rows: parts of %d rows, want %d", sql, h, want)
		}
		if _, err := rows.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// A row failing in a later part fails the transaction.
	rows, err = db.engine.QueryInParts(ctx, bound("SELECT k, 10 / (k - 1500) FROM kv ORDER BY k"), sqlplan.Args{}, nil, tx.s)
	if err != nil {
		t.Fatal(err)
	}
	rows.FetchHint(100) // a shard computes at most 100 rows past the merge
	read := 0
	for rows.Next() {
		read++
	}
	if _, err := rows.Close(); sqlplan.Code(err) != "22012" || read < 1000 || read >= 1500 {
		t.Errorf("a row failing in a later part: %d rows, then %v; want some rows, then 22012", read, err)
	}
	if _, err := tx.Exec(ctx, "SELECT count(*) FROM kv", sqlplan.Args{}, nil); sqlplan.Code(err) != "25P02" {
		t.Errorf("after the failure: %v, want 25P02", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := db.Exec(ctx, "SELECT count(*) FROM kv WHERE v = 'seen'", sqlplan.Args{}, nil)
	if err != nil || string(res.Rows[0][0]) != "0" {
		t.Errorf("after ROLLBACK: %v %v rows changed between parts remain", res, err)
	}

	// Wide rows: a shard is asked for one at a time, the first fetch included, so the
	// merge holds about a row per shard whatever their size.
	wide := strings.Repeat("w", 300000)
	for k := 10000; k < 10020; k++ {
		if _, err := db.Exec(ctx, "INSERT INTO kv VALUES ($1, $2)", sqlplan.Args{Values: [][]byte{[]byte(fmt.Sprint(k)), []byte(wide)}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	tx, err = db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rows, err = db.engine.QueryInParts(ctx, bound("SELECT k, v FROM kv WHERE k >= 10000 ORDER BY k"), sqlplan.Args{}, nil, tx.s)
	if err != nil {
		t.Fatal(err)
	}
	read, most := 0, 0
	for rows.Next() {
		read++
		for _, c := range rows.st.curs {
			most = max(most, len(c.rows))
		}
	}
	if _, err := rows.Close(); err != nil || read != 20 || most != 1 {
		t.Errorf("wide rows: %d read, at most %d held by a shard's cursor, %v; want 20, 1", read, most, err)
	}
}
