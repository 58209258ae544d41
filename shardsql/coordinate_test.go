package shardsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/coordinator"
	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/internal/sqldiff"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/shardsql"
)

// openCoordinated opens the driver with the coordinator database over c, dropped
// when the test ends.
func openCoordinated(t *testing.T, c *rules.Compiled, edit func(*shardsql.Config)) *sql.DB {
	t.Helper()
	cfg := shardsql.Config{Rules: c, Coordinate: true}
	if edit != nil {
		edit(&cfg)
	}
	// The database the handle makes, dropped when the test ends (named as the
	// configuration names it).
	coord, err := coordinator.New(c, cfg.CoordinatorDatabase)
	if err != nil {
		t.Fatal(err)
	}
	db, err := shardsql.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.Close()
		if err := coord.Drop(context.Background()); err != nil {
			t.Errorf("dropping the coordinator database: %v", err)
		}
	})
	return db
}

// coordinatedEnv makes a layout's databases, opens the driver with the coordinator over
// them and loads the suite's data through it.
func coordinatedEnv(t *testing.T, layout sqldiff.Layout, options string, edit func(*shardsql.Config)) (*sqldiff.Env, sqldiff.SQLRunner) {
	t.Helper()
	env := sqldiff.NewEnv(t, layout, options)
	ref, err := sql.Open("pgx", env.RefDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ref.Close() })
	env.Ref = sqldiff.SQLRunner{DB: ref}
	env.Modes = []string{"simple", "text"}
	sharded := sqldiff.SQLRunner{DB: openCoordinated(t, env.Rules, edit)}
	env.Load(t, sharded)
	return env, sharded
}

// TestCoordinatorThroughDriver: with Config.Coordinate, the queries the merge must
// refuse may be answered by the coordinator database, and every answer the driver
// gives equals one database's, in the differential suite and in generated joins,
// subqueries, CTEs, set operations and window functions; without it, the merge alone
// answers fewer of them. The layouts are the proxy's (TestCoordinatorDifferential):
// hash partitions and views, ICU's en-US collation, shards that are schemas.
func TestCoordinatorThroughDriver(t *testing.T) {
	type layout struct {
		sqldiff.Layout
		options string
	}
	layouts := []layout{{sqldiff.ICULayout(), sqldiff.ICUOptions}, {sqldiff.SchemaLayout(), ""}}
	for _, l := range sqldiff.Layouts() {
		layouts = append(layouts, layout{l, ""})
	}
	for _, l := range layouts {
		layout := l.Layout
		t.Run(layout.Name, func(t *testing.T) {
			env, sharded := coordinatedEnv(t, layout, l.options, nil)
			env.Coordinated = true
			queries := append(sqldiff.Queries(), sqldiff.Random(uint64(len(layout.Name)), 30)...)
			mustRefuse := 0
			for _, q := range queries {
				if q.Refused {
					mustRefuse++
				}
			}
			reads := env.RunReads(t, sharded, queries)
			if reads.Coordinated == 0 {
				t.Errorf("the coordinator answered none of the %d queries the merge refuses", mustRefuse)
			}
			generated := append(sqldiff.RandomShapes(uint64(len(layout.Name))+21, 40), sqldiff.RandomJoinAggregates(uint64(len(layout.Name))+1, 15)...)
			shapes := env.RunReads(t, sharded, generated)
			plain := env
			plain.Coordinated = false
			merge := sqldiff.SQLRunner{DB: openDriver(t, env.Rules, false)}
			alone := plain.RunReads(t, merge, generated)
			t.Logf("%s through database/sql with the coordinator: %d reads, %d equal (%d of the %d the merge refuses); generated shapes %d of %d answered, %d by the merge alone",
				layout.Name, reads.Total, reads.Equal, reads.Coordinated, mustRefuse, shapes.Equal, shapes.Total, alone.Equal)
			if shapes.Equal < shapes.Total*85/100 || alone.Equal >= shapes.Equal {
				t.Errorf("%d of %d generated shapes answered, %d by the merge alone", shapes.Equal, shapes.Total, alone.Equal)
			}
		})
	}
}

func sqlStateOf(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// TestCoordinatorRulesThroughDriver: what the coordinator does not answer through the
// driver, and how its failures read: a statement inside a transaction that wrote, or
// is not READ COMMITTED, is refused with 0A000 (the coordinator's sessions cannot see
// the transaction's writes or snapshot), and answered in one that is; an error one
// database raises is that database's, with its SQLSTATE; a statement that reads more
// than Config.CoordinatorMaxMoved from the shards fails with 54000 naming the setting,
// and the handle goes on answering.
func TestCoordinatorRulesThroughDriver(t *testing.T) {
	layout := sqldiff.Layouts()[1]
	env, sharded := coordinatedEnv(t, layout, "", func(c *shardsql.Config) { c.CoordinatorMaxMoved = 20000 })
	ctx := context.Background()
	db := sharded.DB
	join := `SELECT count(*) FROM t_order o JOIN t_user u ON u.city = o.note WHERE o.order_id BETWEEN 10 AND 19`
	var want, got int64
	if err := env.Ref.(sqldiff.SQLRunner).DB.QueryRowContext(ctx, join).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, join).Scan(&got); err != nil || got != want {
		t.Fatalf("a join on non-key columns: %d, %v; want %d", got, err, want)
	}
	// The same with an argument, prepared: described by the coordinator database.
	if err := db.QueryRowContext(ctx, strings.Replace(join, "19", "$1", 1), 19).Scan(&got); err != nil || got != want {
		t.Fatalf("the join with an argument: %d, %v; want %d", got, err, want)
	}

	// In a READ COMMITTED transaction that has not written, the coordinator answers,
	// and the transaction then writes and commits; after its write, or in another
	// isolation level, or after set_config, it refuses (0A000), naming why. Up to this
	// change every coordinated read in a transaction was refused.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRowContext(ctx, join).Scan(&got); err != nil || got != want {
		t.Errorf("in a transaction that has not written: %d, %v; want %d", got, err, want)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE t_order SET note = note WHERE order_id = 10`); err != nil {
		t.Fatal(err)
	}
	err = tx.QueryRowContext(ctx, join).Scan(&got)
	if sqlStateOf(err) != "0A000" || !strings.Contains(err.Error(), "wrote") {
		t.Errorf("in a transaction that wrote: %v, want 0A000 naming the write", err)
	}
	tx.Rollback()
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRowContext(ctx, join).Scan(&got); err != nil || got != want {
		t.Errorf("in a transaction: %d, %v; want %d", got, err, want)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE t_order SET note = note WHERE order_id = 10`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("COMMIT after a coordinated read: %v", err)
	}
	for _, c := range []struct {
		opts  *sql.TxOptions
		first string
		want  string
	}{
		{&sql.TxOptions{Isolation: sql.LevelRepeatableRead}, "", "REPEATABLE READ"},
		{&sql.TxOptions{Isolation: sql.LevelSerializable}, "", "SERIALIZABLE"},
		{nil, `SELECT set_config('TimeZone', 'Asia/Kathmandu', true) FROM t_user WHERE user_id = 1`, "set_config"},
	} {
		tx, err := db.BeginTx(ctx, c.opts)
		if err != nil {
			t.Fatal(err)
		}
		if c.first != "" {
			if _, err := tx.ExecContext(ctx, c.first); err != nil {
				t.Fatalf("%s: %v", c.first, err)
			}
		}
		err = tx.QueryRowContext(ctx, join).Scan(&got)
		if sqlStateOf(err) != "0A000" || !strings.Contains(err.Error(), c.want) {
			t.Errorf("in a transaction (%q): %v, want 0A000 naming %q", c.want, err, c.want)
		}
		tx.Rollback()
	}

	// An unknown column: one database's error, not the coordinator's.
	bad := `SELECT count(*) FROM t_order o JOIN t_user u ON u.city = o.no_such_column`
	_, refErr := env.Ref.(sqldiff.SQLRunner).DB.ExecContext(ctx, bad)
	_, err = db.QueryContext(ctx, bad)
	if sqlStateOf(err) != "42703" || sqlStateOf(refErr) != "42703" {
		t.Errorf("an unknown column: %v, one database: %v; want 42703 from both", err, refErr)
	}

	// Every row of t_order, twice: past 20,000 bytes, read as rows stream.
	rows, err := db.QueryContext(ctx, `SELECT a.*, b.* FROM t_order a JOIN t_order b ON a.note = b.note`)
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
		rows.Close()
	}
	if sqlStateOf(err) != "54000" || !strings.Contains(err.Error(), "CoordinatorMaxMoved") {
		t.Fatalf("past the bound: %v, want 54000 naming CoordinatorMaxMoved", err)
	}
	if err := db.QueryRowContext(ctx, join).Scan(&got); err != nil || got != want {
		t.Fatalf("after the cut: %d, %v; want %d", got, err, want)
	}

	// A column added through the driver is in the coordinator's next answer: the
	// schema change rebuilds its database.
	if _, err := db.ExecContext(ctx, `ALTER TABLE t_user ADD COLUMN extra int DEFAULT 7`); err != nil {
		t.Fatal(err)
	}
	var extra int64
	if err := db.QueryRowContext(ctx, strings.Replace(join, "count(*)", "coalesce(sum(u.extra), 0)", 1)).Scan(&extra); err != nil || extra != 7*want {
		t.Fatalf("the added column through the coordinator: %d, %v; want %d", extra, err, 7*want)
	}
}

// TestCoordinatorDescribesWhatNoShardHolds: a statement with arguments over a table of
// the default data source beside a table sharded elsewhere is described by no one
// data source: a SELECT, and an INSERT ... SELECT, are described by the coordinator
// database and answered; without it, INSERT ... SELECT is refused (0A000).
func TestCoordinatorDescribesWhatNoShardHolds(t *testing.T) {
	ctx := context.Background()
	var dsns []string
	for i := range 3 {
		dsns = append(dsns, pgtest.NewDatabase(t, fmt.Sprintf("drvco%d", i)))
	}
	r := rules.Rules{DefaultDataSource: "ds_0",
		Tables: []rules.Table{{Name: "t_a", DataSources: []string{"ds_1", "ds_2"}, Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt4}}}}
	for i, d := range dsns {
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d})
	}
	c, err := rules.Compile(r)
	if err != nil {
		t.Fatal(err)
	}
	db := openCoordinated(t, c, nil)
	for _, q := range []string{
		"CREATE TABLE t_a (id int PRIMARY KEY, w int)",
		"CREATE TABLE t_b (id int PRIMARY KEY, w int)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for i := 1; i <= 20; i++ {
		if _, err := db.ExecContext(ctx, "INSERT INTO t_b VALUES ($1, $2)", i, i%5); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO t_a VALUES ($1, $1)", i); err != nil {
			t.Fatal(err)
		}
	}
	var n int64
	err = db.QueryRowContext(ctx, "SELECT count(*) FROM t_a JOIN t_b ON t_a.id = t_b.id WHERE t_b.w > $1", 2).Scan(&n)
	if err != nil || n != 8 {
		t.Errorf("a join of the default data source's table and a sharded one, with an argument: %d, %v; want 8", n, err)
	}
	// INSERT ... SELECT naming both, with an argument: described by the coordinator
	// database; without it, refused.
	plain := openDriver(t, c, false)
	_, err = plain.ExecContext(ctx, "INSERT INTO t_a SELECT id + 100, w FROM t_b WHERE w > $1", 1)
	if sqlStateOf(err) != "0A000" {
		t.Errorf("INSERT ... SELECT without the coordinator: %v, want 0A000", err)
	}
	if _, err = db.ExecContext(ctx, "INSERT INTO t_a SELECT id + 100, w FROM t_b WHERE w > $1", 1); err != nil {
		t.Errorf("INSERT ... SELECT with the coordinator: %v", err)
	}
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM t_a WHERE id > 100").Scan(&n); err != nil || n != 12 {
		t.Errorf("rows inserted: %d, %v; want 12", n, err)
	}

	// A correlated subquery over such tables: evaluated in two steps, t_a's columns
	// first (up to the two-step plans it was refused: one database would run it, and its
	// 42P01 on the default data source alone is no answer); each of t_b's 20 rows has its
	// t_a row of w = id. With an argument, the statement is described by the
	// coordinator database; without it, refused.
	for i, h := range []*sql.DB{plain, db} {
		res, err := h.ExecContext(ctx, fmt.Sprintf("UPDATE t_b SET w = 0 WHERE id IN (SELECT id FROM t_a WHERE t_a.w = t_b.id AND t_a.id > %d AND t_a.id <= %d)", 10*i, 10*i+10))
		if err != nil {
			t.Errorf("a correlated subquery (coordinator %v): %v", i == 1, err)
		} else if n, _ := res.RowsAffected(); n != 10 {
			t.Errorf("a correlated subquery (coordinator %v): %d rows, want 10", i == 1, n)
		}
	}
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM t_b WHERE w = 0").Scan(&n); err != nil || n != 20 {
		t.Errorf("rows of w 0 after the correlated subqueries: %d, %v; want 20", n, err)
	}
	withArg := "UPDATE t_b SET w = 1 WHERE id IN (SELECT id FROM t_a WHERE t_a.w = t_b.id AND t_a.id > $1)"
	if _, err := plain.ExecContext(ctx, withArg, 15); sqlStateOf(err) != "0A000" {
		t.Errorf("a correlated subquery with an argument, without the coordinator: %v, want 0A000", err)
	}
	if res, err := db.ExecContext(ctx, withArg, 15); err != nil {
		t.Errorf("a correlated subquery with an argument: %v", err)
	} else if n, _ := res.RowsAffected(); n != 5 {
		t.Errorf("a correlated subquery with an argument: %d rows, want 5", n)
	}
}

// TestCoordinatorTakesTheDataSourcesOptions: the settings a data source's connection
// string gives in its options (here a time zone, which writes every timestamptz) are
// the coordinator's sessions' too, so that a coordinated answer writes values as the
// merge's do; a setting it cannot carry (a role) leaves coordinated statements refused,
// naming it.
func TestCoordinatorTakesTheDataSourcesOptions(t *testing.T) {
	ctx := context.Background()
	var dsns []string
	for i := range 2 {
		dsns = append(dsns, pgtest.NewDatabase(t, fmt.Sprintf("drvtz%d", i))+"&options=-c%20TimeZone%3DAsia%2FKathmandu")
	}
	layout := func(dsns []string) *rules.Compiled {
		r := rules.Rules{Tables: []rules.Table{{Name: "ev", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt4}}}}
		for i, d := range dsns {
			r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d})
		}
		c, err := rules.Compile(r)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	db := openCoordinated(t, layout(dsns), nil)
	if _, err := db.ExecContext(ctx, "CREATE TABLE ev (id int PRIMARY KEY, at timestamptz)"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 4; i++ {
		if _, err := db.ExecContext(ctx, "INSERT INTO ev VALUES ($1, '2026-01-01 00:00:00+00')", i); err != nil {
			t.Fatal(err)
		}
	}
	var merged, coordinated string
	if err := db.QueryRowContext(ctx, "SELECT max(at::text) FROM ev").Scan(&merged); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, "SELECT max(a.at::text) FROM ev a JOIN ev b ON a.at = b.at").Scan(&coordinated); err != nil {
		t.Fatal(err)
	}
	if merged != "2026-01-01 05:45:00+05:45" || coordinated != merged {
		t.Errorf("merged %q, coordinated %q; want both 2026-01-01 05:45:00+05:45", merged, coordinated)
	}

	for i := range dsns {
		dsns[i] = strings.Replace(dsns[i], "options=", "options=-c%20role%3Dpostgres%20", 1)
	}
	other := openCoordinated(t, layout(dsns), nil)
	_, err := other.QueryContext(ctx, "SELECT max(a.at::text) FROM ev a JOIN ev b ON a.at = b.at")
	if sqlStateOf(err) != "0A000" || !strings.Contains(err.Error(), "role") {
		t.Errorf("with a role in the options: %v, want 0A000 naming it", err)
	}
}

// TestCoordinatorAggregatesOnTheShardsThroughDriver: through the driver too, a
// coordinated statement that aggregates one sharded table has each shard aggregate its
// own rows (Explain shows the shards' aggregates), and answers as one database does.
func TestCoordinatorAggregatesOnTheShardsThroughDriver(t *testing.T) {
	layout := sqldiff.Layouts()[0]
	env, sharded := coordinatedEnv(t, layout, "", nil)
	ctx := context.Background()
	for i, q := range slices.Concat(sqldiff.ShardAggregated(), sqldiff.ShardAggregatedJoins(), sqldiff.ShardAggregatedWithin()) {
		for _, mode := range env.Modes {
			if sqldiff.Compare(ctx, t, "shard aggregates", q, env.Ref, sharded, mode, layout.ByteOrder) {
				t.Errorf("query %d [%s] refused: %s", i, mode, q.SQL)
			}
		}
	}
	conn, err := sharded.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	text, err := shardsql.Explain(ctx, conn, sqldiff.ShardAggregated()[0].SQL)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, `shardlab_shards."t_order/3"`) || !strings.Contains(text, "each shard aggregates its own rows") {
		t.Errorf("Explain does not show the shards' aggregates:\n%s", text)
	}
	text, err = shardsql.Explain(ctx, conn, sqldiff.ShardAggregatedJoins()[0].SQL)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, `shardlab_shards."t_order_item/3"`) || !strings.Contains(text, "each shard aggregates its own rows") {
		t.Errorf("Explain does not show the shards' joins and aggregates:\n%s", text)
	}
	text, err = shardsql.Explain(ctx, conn, sqldiff.ShardAggregatedWithin()[0].SQL)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, `shardlab_shards."t_order/3"`) || !strings.Contains(text, "each shard aggregates its own rows") {
		t.Errorf("Explain does not show the shards' aggregates within the statement:\n%s", text)
	}
}
