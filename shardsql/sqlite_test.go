package shardsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/sqldiff"
	"github.com/shardlab/shardlab/internal/sqlitedb"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/shardsql"
	"github.com/shardlab/shardlab/sqlplan"
)

// pgOnly marks suite statements that use PostgreSQL constructs SQLite lacks.
var pgOnly = []string{"::", "COLLATE", "ILIKE", "FETCH", "DISTINCT ON", "ROLLUP", "CUBE", "FILTER", "WITHIN GROUP",
	"now()", "FOR UPDATE", "LIMIT ALL", "bool_and", "array_agg", "string_agg", "percentile", "OVER", "ON CONFLICT",
	"created >", "RETURNING *", "row_to_json"}

func sqliteCompatible(q sqldiff.Query) bool {
	for _, s := range pgOnly {
		if strings.Contains(q.SQL, s) {
			return false
		}
	}
	return true
}

// TestSQLiteShards runs the differential suite's SQLite-compatible part on SQLite
// shards against one unsharded SQLite file: whatever the driver answers must be what
// SQLite itself answers; what it cannot answer exactly it refuses (0A000).
func TestSQLiteShards(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	refDB, err := sqlitedb.OpenDB(ctx, filepath.Join(dir, "ref.db"), sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer refDB.Close()
	ref := sqldiff.SQLRunner{DB: refDB.Writer(), NoTypeNames: true}
	var dsns []string
	for i := range 3 {
		dsns = append(dsns, "sqlite:"+filepath.Join(dir, fmt.Sprintf("s%d.db", i)))
	}
	layout := sqldiff.Layouts()[1] // 3 shards
	c, err := rules.Compile(layout.Rules(dsns))
	if err != nil {
		t.Fatal(err)
	}
	db, err := shardsql.Open(shardsql.Config{Rules: c})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	sharded := sqldiff.SQLRunner{DB: db, NoTypeNames: true}
	for _, stmt := range append(append([]string{}, sqldiff.Schema...), sqldiff.Data(1)...) {
		if _, err := ref.Simple(ctx, stmt); err != nil {
			t.Fatalf("reference: %s: %v", stmt, err)
		}
		if _, err := sharded.Simple(ctx, stmt); err != nil {
			t.Fatalf("sharded: %s: %v", stmt, err)
		}
	}
	// Every row of t_order is on the shard the rules name.
	rule := c.Lookup("t_order")
	total := 0
	for n, node := range rule.Nodes {
		f, err := sqlitedb.OpenDB(ctx, strings.TrimPrefix(dsns[node.DataSource], "sqlite:"), sqlitedb.Options{})
		if err != nil {
			t.Fatal(err)
		}
		rows, err := f.Reader().Query("SELECT order_id FROM " + node.Table)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var k int64
			rows.Scan(&k)
			got, err := rule.ShardsFor(map[string]rules.Key{"order_id": rules.IntKey(k)}, nil)
			if err != nil || got[0] != n {
				t.Errorf("order %d is on shard %d, the rules say %v", k, n, got)
			}
			total++
		}
		rows.Close()
		f.Close()
	}
	if total != 246 {
		t.Errorf("%d orders on the shards, want 246", total)
	}

	// An avg() merged across shards is named avg, where SQLite names the column after
	// its expression (documented): compare the names without the argument.
	refNames := avgNames{ref}
	shardNames := avgNames{sharded}
	answered, refused := 0, 0
	for i, q := range append(sqldiff.Queries(), sqldiff.Random(3, 30)...) {
		if !sqliteCompatible(q) {
			continue
		}
		if !q.Refused {
			q.MayRefuse = true
		}
		for _, mode := range []string{"simple", "text"} {
			if sqldiff.Compare(ctx, t, fmt.Sprintf("sqlite query %d", i), q, refNames, shardNames, mode, true) {
				refused++
			} else {
				answered++
			}
		}
	}
	t.Logf("SQLite shards: %d answers equal to one SQLite file, %d refused", answered, refused)
	if answered < 150 {
		t.Errorf("only %d answers: the SQLite path refuses too much", answered)
	}

	// PostgreSQL-only syntax is refused with a clear error before a shard sees it.
	for _, q := range []string{"SELECT order_id::text FROM t_order WHERE order_id = 1", "SELECT * FROM t_order WHERE status ILIKE 'a%'",
		"SELECT * FROM t_order WHERE order_id = 1 FOR UPDATE"} {
		_, err := db.Query(q)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "0A000" || !strings.Contains(pe.Message, "SQLite") {
			t.Errorf("%s: %v, want a 0A000 naming SQLite", q, err)
		}
	}
	// Transactions commit on every file they touched.
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{700001, 700002, 700003, 700004} {
		if _, err := tx.Exec("INSERT INTO t_order (order_id, user_id) VALUES ($1, $2)", id, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM t_order WHERE order_id BETWEEN $1 AND $2", 700000, 800000).Scan(&n); err != nil || n != 4 {
		t.Errorf("after commit: %d %v", n, err)
	}
	if _, err := shardsql.Open(shardsql.Config{Rules: c, TwoPhase: true}); err == nil {
		t.Error("two-phase commit over SQLite was accepted")
	}
}

// avgNames renames columns avg(...) to avg.
type avgNames struct{ r sqldiff.Runner }

func (a avgNames) fix(ans *sqldiff.Answer, err error) (*sqldiff.Answer, error) {
	if ans != nil {
		for i, c := range ans.Columns {
			if strings.HasPrefix(c, "avg(") {
				ans.Columns[i] = "avg"
			}
		}
	}
	return ans, err
}

func (a avgNames) Extended(ctx context.Context, sql string, params []*string, binary bool) (*sqldiff.Answer, error) {
	return a.fix(a.r.Extended(ctx, sql, params, binary))
}

func (a avgNames) Simple(ctx context.Context, sql string) (*sqldiff.Answer, error) {
	return a.fix(a.r.Simple(ctx, sql))
}

// TestRefusalsMatchErrUnsupported: every refusal the driver makes, its own and the
// planner's and the SQLite path's, matches sqlplan.ErrUnsupported and carries SQLSTATE
// 0A000, so that a program can tell "not supported" from any other failure.
func TestRefusalsMatchErrUnsupported(t *testing.T) {
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.toml")
	if err := os.WriteFile(rulesFile, []byte(fmt.Sprintf(`
[[data_source]]
name = "ds_0"
dsn  = "sqlite:%s"

[[data_source]]
name = "ds_1"
dsn  = "sqlite:%s"

[[sharded_table]]
name = "t"
column = "id"
type = "int"
`, filepath.Join(dir, "s0.db"), filepath.Join(dir, "s1.db"))), 0o644); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("shardlab", rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE t (id int PRIMARY KEY, v int)"); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"SET work_mem = '8MB'",
		"DISCARD ALL",
		"COPY t FROM STDIN",
		"LISTEN jobs",
		"SELECT id, rank() OVER (ORDER BY v) FROM t",        // the planner's
		"SELECT id FROM t WHERE CAST(v AS text) ILIKE 'a%'", // the SQLite path's
		"SELECT sum(v::real) FROM t",                        // a merge's or SQLite's
	} {
		_, err := db.ExecContext(ctx, q)
		if err == nil {
			t.Errorf("%s: no error", q)
			continue
		}
		if !errors.Is(err, sqlplan.ErrUnsupported) || sqlplan.Code(err) != "0A000" {
			t.Errorf("%s: %v (SQLSTATE %q) does not match sqlplan.ErrUnsupported", q, err, sqlplan.Code(err))
		}
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "SAVEPOINT s"); !errors.Is(err, sqlplan.ErrUnsupported) {
		t.Errorf("SAVEPOINT on SQLite shards: %v does not match sqlplan.ErrUnsupported", err)
	}
}

// TestConcurrentCrossShardWritesOnSQLite: statements that write to several SQLite
// shards at once take the shards' writers in one order, so that two of them never
// each hold a writer the other waits for.
func TestConcurrentCrossShardWritesOnSQLite(t *testing.T) {
	dir := t.TempDir()
	var dsns []string
	for i := range 3 {
		dsns = append(dsns, "sqlite:"+filepath.Join(dir, fmt.Sprintf("s%d.db", i)))
	}
	r := rules.Rules{Tables: []rules.Table{{Name: "kv", Strategy: rules.Strategy{Column: "k", Type: rules.TypeInt4, Algorithm: rules.AlgorithmMod}}}}
	for i, d := range dsns {
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d})
	}
	c, err := rules.Compile(r)
	if err != nil {
		t.Fatal(err)
	}
	db, err := shardsql.Open(shardsql.Config{Rules: c})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE kv (k int PRIMARY KEY, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO kv VALUES (0, 0), (1, 0), (2, 0)"); err != nil {
		t.Fatal(err)
	}
	const workers, rounds = 8, 50
	done := make(chan error, workers)
	for range workers {
		go func() {
			for range rounds {
				if _, err := db.Exec("UPDATE kv SET n = n + 1"); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	timeout := time.After(time.Minute)
	for range workers {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-timeout:
			t.Fatal("cross-shard writes still running after a minute: they wait on each other")
		}
	}
	var sum int
	if err := db.QueryRow("SELECT sum(n) FROM kv").Scan(&sum); err != nil || sum != 3*workers*rounds {
		t.Errorf("sum %d (%v), want %d", sum, err, 3*workers*rounds)
	}
}

// TestSQLiteCoordinator: with Config.Coordinate on SQLite shards, what the merge
// cannot answer SQLite answers over every file attached to one connection: the
// differential suite's SQLite part and generated joins, subqueries, CTEs and set
// operations, each answer equal to one SQLite file's, more of them answered than by
// the merge alone; a read inside a transaction, a rowid and a table made beside the
// handle are handled as documented.
func TestSQLiteCoordinator(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	refDB, err := sqlitedb.OpenDB(ctx, filepath.Join(dir, "ref.db"), sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer refDB.Close()
	ref := avgNames{sqldiff.SQLRunner{DB: refDB.Writer(), NoTypeNames: true}}
	var dsns []string
	for i := range 2 {
		dsns = append(dsns, "sqlite:"+filepath.Join(dir, fmt.Sprintf("s%d.db", i)))
	}
	c, err := rules.Compile(sqldiff.Layouts()[0].Rules(dsns)) // 2x2: split tables, mod, range, broadcast
	if err != nil {
		t.Fatal(err)
	}
	db, err := shardsql.Open(shardsql.Config{Rules: c, Coordinate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	plainDB, err := shardsql.Open(shardsql.Config{Rules: c})
	if err != nil {
		t.Fatal(err)
	}
	defer plainDB.Close()
	sharded := avgNames{sqldiff.SQLRunner{DB: db, NoTypeNames: true}}
	plain := avgNames{sqldiff.SQLRunner{DB: plainDB, NoTypeNames: true}}
	for _, stmt := range append(append([]string{}, sqldiff.Schema...), sqldiff.Data(1)...) {
		if _, err := ref.r.Simple(ctx, stmt); err != nil {
			t.Fatalf("reference: %s: %v", stmt, err)
		}
		if _, err := sharded.r.Simple(ctx, stmt); err != nil {
			t.Fatalf("sharded: %s: %v", stmt, err)
		}
	}
	queries := append(sqldiff.Queries(), sqldiff.Random(5, 30)...)
	queries = append(queries, sqldiff.RandomShapes(11, 60)...)
	answered, alone, coordinated := 0, 0, 0
	for i, q := range queries {
		if !sqliteCompatible(q) {
			continue
		}
		q.Refused, q.MayRefuse = false, true
		if _, err := ref.Simple(ctx, q.SQL); err != nil {
			continue // SQLite itself does not take it
		}
		label := fmt.Sprintf("sqlite coordinated query %d", i)
		refusedHere := sqldiff.Compare(ctx, t, label, q, ref, sharded, "simple", true)
		refusedAlone := sqldiff.Compare(ctx, t, label+" (merge alone)", q, ref, plain, "simple", true)
		if !refusedHere {
			answered++
			if refusedAlone {
				coordinated++
			}
		}
		if !refusedAlone {
			alone++
		}
	}
	t.Logf("SQLite shards with the coordinator: %d answers equal to one SQLite file (%d the merge alone refuses); the merge alone answers %d", answered, coordinated, alone)
	if coordinated == 0 || answered <= alone {
		t.Errorf("the coordinator answered %d queries the merge refuses (%d in all, %d by the merge alone)", coordinated, answered, alone)
	}

	join := `SELECT count(*) FROM t_order o JOIN t_user u ON u.user_id = o.user_id + 1`
	var want, got int64
	if err := refDB.Writer().QueryRowContext(ctx, join).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, join).Scan(&got); err != nil || got != want {
		t.Fatalf("a join on an expression: %d, %v; want %d", got, err, want)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = tx.QueryRowContext(ctx, join).Scan(&got)
	if sqlStateOf(err) != "0A000" || !strings.Contains(err.Error(), "outside a transaction") {
		t.Errorf("in a transaction: %v, want 0A000", err)
	}
	tx.Rollback()
	_, err = db.QueryContext(ctx, `SELECT o.rowid FROM t_order o JOIN t_user u ON u.user_id = o.user_id + 1`)
	if sqlStateOf(err) != "0A000" || !strings.Contains(err.Error(), "rowid") {
		t.Errorf("a rowid: %v, want 0A000 naming it", err)
	}
	// As one file would not: sums however their names are written, a physical table,
	// a name qualified by an attached file's.
	for q, want := range map[string]string{
		`SELECT "SUM"(o.weight) FROM t_order o JOIN t_user u ON u.user_id = o.user_id`:            "SUM",
		`SELECT "GROUP_CONCAT"(o.order_id) FROM t_order o JOIN t_user u ON u.user_id = o.user_id`: "GROUP_CONCAT",
		`SELECT count(*) FROM "T_ORDER_0" o JOIN t_user u ON u.user_id = o.user_id`:               "T_ORDER_0",
		`SELECT count(*) FROM shard_1.t_user u JOIN t_order o ON u.user_id = o.user_id + 1`:       "shard_1",
	} {
		_, err := db.QueryContext(ctx, q)
		if sqlStateOf(err) != "0A000" || !strings.Contains(strings.ToUpper(err.Error()), strings.ToUpper(want)) {
			t.Errorf("%s: %v, want 0A000 naming %s", q, err, want)
		}
	}

}

// TestSQLiteCoordinatorSeesTablesMadeBeside: a table of a pattern rule made on every
// file beside the handle, after the coordinator attached them, is viewed whole when a
// statement names it, not read from the default data source's file alone.
func TestSQLiteCoordinatorSeesTablesMadeBeside(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	var dsns []string
	r := rules.Rules{Tables: []rules.Table{{Name: "ev*", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt4, Algorithm: rules.AlgorithmMod}}}}
	for i := range 2 {
		dsns = append(dsns, filepath.Join(dir, fmt.Sprintf("s%d.db", i)))
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: "sqlite:" + dsns[i]})
	}
	c, err := rules.Compile(r)
	if err != nil {
		t.Fatal(err)
	}
	db, err := shardsql.Open(shardsql.Config{Rules: c, Coordinate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	count := func(table string) int64 {
		t.Helper()
		var n int64
		if err := db.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*) FROM %s a JOIN %s b ON a.v = b.v", table, table)).Scan(&n); err != nil {
			t.Fatalf("%s: %v", table, err)
		}
		return n
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE ev0 (id int, v int)"); err != nil {
		t.Fatal(err)
	}
	for id := range 4 {
		if _, err := db.ExecContext(ctx, "INSERT INTO ev0 VALUES ($1, $1)", id); err != nil {
			t.Fatal(err)
		}
	}
	if n := count("ev0"); n != 4 {
		t.Fatalf("ev0: %d pairs, want 4", n)
	}
	for i, path := range dsns {
		f, err := sqlitedb.OpenDB(ctx, path, sqlitedb.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Writer().ExecContext(ctx, fmt.Sprintf("CREATE TABLE ev1 (id int, v int); INSERT INTO ev1 VALUES (%d, 7)", i)); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if n := count("ev1"); n != 4 {
		t.Errorf("ev1, made beside the handle: %d pairs, want 4 (2 rows, one on each file)", n)
	}
}

// TestSQLiteCoordinatorPairsColumnsByName: a table whose files list its columns in
// different orders is viewed by name, with its generated columns, and with a column
// added beside the handle; one that declares a collation, a CTE named like a table and
// a view of the default file are refused (0A000), where a view would have paired
// columns by position, lost the collation, or read one file alone.
func TestSQLiteCoordinatorPairsColumnsByName(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	var dsns []string
	r := rules.Rules{Tables: []rules.Table{{Name: "ev*", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt4, Algorithm: rules.AlgorithmMod}}}}
	for i := range 2 {
		dsns = append(dsns, filepath.Join(dir, fmt.Sprintf("s%d.db", i)))
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: "sqlite:" + dsns[i]})
	}
	c, err := rules.Compile(r)
	if err != nil {
		t.Fatal(err)
	}
	for i, path := range dsns {
		f, err := sqlitedb.OpenDB(ctx, path, sqlitedb.Options{})
		if err != nil {
			t.Fatal(err)
		}
		order := "x int, y int"
		if i == 1 {
			order = "y int, x int"
		}
		if _, err := f.Writer().ExecContext(ctx, fmt.Sprintf(`CREATE TABLE ev2 (id int, %s); INSERT INTO ev2 (id, x, y) VALUES (%d, 1, 2);
			CREATE TABLE ev3 (id int, name text COLLATE NOCASE); INSERT INTO ev3 VALUES (%d, 'a'), (%d, 'A');
			CREATE TABLE ev4 (id int, x int, g int GENERATED ALWAYS AS (x * 2)); INSERT INTO ev4 (id, x) VALUES (%d, 1)`, order, i, i, i+2, i)); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			// A view of the default data source's file reads that file alone.
			if _, err := f.Writer().ExecContext(ctx, `CREATE VIEW dv AS SELECT count(*) AS n FROM ev2`); err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
	}
	db, err := shardsql.Open(shardsql.Config{Rules: c, Coordinate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var minX, maxX, minY, maxY int64
	err = db.QueryRowContext(ctx, "SELECT min(a.x), max(a.x), min(a.y), max(a.y) FROM ev2 a JOIN ev2 b ON a.x = b.x").Scan(&minX, &maxX, &minY, &maxY)
	if err != nil || minX != 1 || maxX != 1 || minY != 2 || maxY != 2 {
		t.Errorf("columns in two orders: x %d..%d, y %d..%d, %v; want x 1, y 2", minX, maxX, minY, maxY, err)
	}
	_, err = db.QueryContext(ctx, "SELECT count(*) FROM (SELECT name FROM ev3 UNION SELECT name FROM ev3 WHERE id > 0) x")
	if sqlStateOf(err) != "0A000" || !strings.Contains(err.Error(), "collation") {
		t.Errorf("a collated table: %v, want 0A000 naming the collation", err)
	}
	for q, want := range map[string]string{
		// A CTE named like the refused table, in a subquery: outside it, ev3 would
		// reach the default file alone.
		`SELECT count(*) FROM ev3 a JOIN ev3 b ON a.name = b.name WHERE EXISTS (WITH ev3 AS (SELECT 1) SELECT 1 FROM ev3)`: "CTE",
		`SELECT d.n FROM dv d JOIN ev2 e ON e.x = d.n`:                                                                     "dv",
	} {
		_, err := db.QueryContext(ctx, q)
		if sqlStateOf(err) != "0A000" || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want 0A000 naming %s", q, err, want)
		}
	}
	columns := func(q string) string {
		t.Helper()
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		return strings.Join(cols, ",")
	}
	if got := columns("SELECT a.* FROM ev4 a JOIN ev4 b ON a.x = b.x"); got != "id,x,g" {
		t.Errorf("a generated column: columns %s, want id,x,g", got)
	}
	// A column added beside the handle, after a connection attached the files: the
	// next statement sees it.
	for _, path := range dsns {
		f, err := sqlitedb.OpenDB(ctx, path, sqlitedb.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Writer().ExecContext(ctx, `ALTER TABLE ev2 ADD COLUMN z int DEFAULT 5`); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if got := columns("SELECT a.* FROM ev2 a JOIN ev2 b ON a.x = b.x"); got != "id,x,y,z" {
		t.Errorf("a column added beside the handle: columns %s, want id,x,y,z", got)
	}
}

// TestSQLiteColumnNamedLikeItsTable: a table split into several per SQLite file
// (hits_0, hits_1) whose column has the table's name is written without an alias,
// which SQLite's UPDATE and DELETE take only with AS; a statement that may read the
// table's whole row by its name gets one (sqlplan's mayReferTo).
func TestSQLiteColumnNamedLikeItsTable(t *testing.T) {
	dir := t.TempDir()
	var ds []rules.DataSource
	for i := range 2 {
		ds = append(ds, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: "sqlite:" + filepath.Join(dir, fmt.Sprintf("s%d.db", i))})
	}
	c, err := rules.Compile(rules.Rules{DataSources: ds, Tables: []rules.Table{{Name: "hits", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	db, err := shardsql.Open(shardsql.Config{Rules: c})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	for _, q := range []string{
		"CREATE TABLE hits (id integer PRIMARY KEY, hits integer)",
		"INSERT INTO hits VALUES (1, 0), (2, 0), (3, 0), (4, 0)",
		"UPDATE hits SET hits = hits + 1 WHERE id = 1",
		"UPDATE hits SET hits = hits + 1",
		"DELETE FROM hits WHERE hits > 1",
		"DELETE FROM hits WHERE id = 2 AND hits = 1",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var n, sum int
	if err := db.QueryRowContext(ctx, "SELECT count(*), sum(hits) FROM hits WHERE hits = 1").Scan(&n, &sum); err != nil {
		t.Fatal(err)
	}
	if n != 2 || sum != 2 {
		t.Errorf("%d rows adding up to %d, want 2 and 2", n, sum)
	}
}
