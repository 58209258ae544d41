package proxy_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// TestClockAcrossShards: one database reads now(), CURRENT_TIMESTAMP, CURRENT_DATE ...
// as one value for a whole transaction, the time it started. Through the proxy over two
// shards a statement that writes rows on both, and the statements of one transaction
// block, of one multi-statement query and of one extended-protocol batch, read one
// value too, on every shard, in the simple and the extended protocols; each kind of
// clock read relates to now() as on one database, under the client's TimeZone, and
// comes back under the column name one database gives it. On the old code each shard
// read its own transaction's start: two values. A statement the coordinator database
// answers reads its own clock, so inside a transaction block it is refused.
func TestClockAcrossShards(t *testing.T) {
	e := startProxy(t, 2, []string{"kv=id"}, nil, withCoordinator())
	ctx := context.Background()
	px := e.connect(t)
	exec1(t, px, "CREATE TABLE kv (id int PRIMARY KEY, v int, at timestamptz)")
	exec1(t, px, "INSERT INTO kv (id, v) SELECT g, g FROM generate_series(1, 20) g")
	keys := kvKeysPerShard(t, e, 2)
	a, b := keys[0][0], keys[1][0]
	distinct := func(where string) int64 {
		t.Helper()
		return queryInt(t, px, "SELECT count(DISTINCT at) FROM kv WHERE "+where)
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		name := map[pgx.QueryExecMode]string{pgx.QueryExecModeSimpleProtocol: "simple", pgx.QueryExecModeCacheStatement: "extended"}[mode]
		exec1(t, px, "UPDATE kv SET at = NULL")
		// One statement over both shards, twice: one value each time, a later one
		// the second time.
		for round := range 2 {
			if _, err := px.Exec(ctx, "UPDATE kv SET at = now() WHERE v > $1", mode, 0); err != nil {
				t.Fatal(err)
			}
			if n := distinct("true"); n != 1 {
				t.Errorf("%s, round %d: UPDATE over two shards wrote %d values of now(), want 1", name, round, n)
			}
		}
		if _, err := px.Exec(ctx, fmt.Sprintf("INSERT INTO kv (id, v, at) VALUES (%d, 0, CURRENT_TIMESTAMP), (%d, 0, CURRENT_TIMESTAMP), ($1, 0, transaction_timestamp())", 100+a, 100+b), mode, 1000+a); err != nil {
			t.Fatal(err)
		}
		if n := distinct("v = 0"); n != 1 {
			t.Errorf("%s: INSERT of rows on two shards wrote %d values, want 1", name, n)
		}
		exec1(t, px, "DELETE FROM kv WHERE v = 0")

		// A transaction block: every statement reads its start, on whichever shard.
		tx, err := px.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var first, onA, onB, later time.Time
		var before bool
		if err := tx.QueryRow(ctx, "SELECT now()", mode).Scan(&first); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if err := tx.QueryRow(ctx, "SELECT now(), now() <= statement_timestamp() FROM kv WHERE id = $1", mode, a).Scan(&onA, &before); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, "SELECT CURRENT_TIMESTAMP FROM kv WHERE id = $1", mode, b).Scan(&onB); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "UPDATE kv SET at = now() WHERE id IN ($1, $2)", mode, a, b); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, "SELECT max(at) FROM kv WHERE id IN ($1, $2) AND at = now()", mode, a, b).Scan(&later); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if !first.Equal(onA) || !first.Equal(onB) || !first.Equal(later) || !before {
			t.Errorf("%s: in one transaction now() read %v, %v on one shard, %v on the other, %v written; before the statement: %v",
				name, first, onA, onB, later, before)
		}
	}

	// A multi-statement query and an extended-protocol batch are one transaction each.
	pc := e.pgconnect(t)
	res, err := pc.Exec(ctx, fmt.Sprintf("UPDATE kv SET at = now() WHERE id = %d; SELECT pg_sleep(0.02); UPDATE kv SET at = now() WHERE id = %d", a, b)).ReadAll()
	if err != nil || len(res) != 3 {
		t.Fatal(res, err)
	}
	if n := distinct(fmt.Sprintf("id IN (%d, %d)", a, b)); n != 1 {
		t.Errorf("a multi-statement query wrote %d values of now(), want 1", n)
	}
	batch := &pgx.Batch{}
	batch.Queue("UPDATE kv SET at = now() WHERE id = $1", a)
	batch.Queue("SELECT pg_sleep(0.02)")
	batch.Queue("UPDATE kv SET at = now() WHERE id = $1", b)
	if err := px.SendBatch(ctx, batch).Close(); err != nil {
		t.Fatal(err)
	}
	if n := distinct(fmt.Sprintf("id IN (%d, %d)", a, b)); n != 1 {
		t.Errorf("a batch wrote %d values of now(), want 1", n)
	}

	// Each kind of clock read, under the client's TimeZone, against one database.
	one, err := pgx.Connect(ctx, pgtest.NewDatabase(t, "clock_one"))
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close(ctx)
	exec1(t, one, "CREATE TABLE kv (id int PRIMARY KEY, v int, at timestamptz)")
	exec1(t, one, "INSERT INTO kv (id, v) SELECT g, g FROM generate_series(1, 20) g")
	const kinds = `SELECT CURRENT_DATE = now()::date AS d, LOCALTIMESTAMP = now()::timestamp AS ts, CURRENT_TIME = now()::timetz AS tz,
		LOCALTIME = now()::time AS t, CURRENT_TIMESTAMP(2) = now()::timestamptz(2) AS p, LOCALTIMESTAMP(0) = now()::timestamp(0) AS p0,
		transaction_timestamp() = now() AS tt, current_time(1) = now()::timetz(1) AS t1, localtime(4) = now()::time(4) AS t4`
	const names = `SELECT now(), CURRENT_TIMESTAMP, current_date, now()::date, localtime(2)::text, pg_catalog.now() AS x, CURRENT_TIME, LOCALTIMESTAMP(3), transaction_timestamp()`
	for _, c := range []*pgx.Conn{one, px} {
		exec1(t, c, "SET TimeZone = 'Asia/Kathmandu'")
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		for _, q := range []string{kinds + " FROM kv WHERE id = $1", kinds + " FROM kv WHERE id > $1 ORDER BY id LIMIT 1"} {
			want, got := answerOf(one, mode, q, false, a), answerOf(px, mode, q, false, a)
			if got != want || strings.Contains(want, "false") {
				t.Errorf("%s:\n got  %s\n want %s", q, got, want)
			}
		}
		q := names + " FROM kv WHERE id = $1"
		fields := func(c *pgx.Conn) []string {
			rs, err := c.Query(ctx, q, mode, a)
			if err != nil {
				t.Fatal(err)
			}
			rs.Close()
			var out []string
			for _, f := range rs.FieldDescriptions() {
				out = append(out, f.Name)
			}
			return out
		}
		if want, got := fields(one), fields(px); !slices.Equal(got, want) {
			t.Errorf("column names %v, want %v", got, want)
		}
	}

	// The coordinator database reads its own clock: answered alone, refused inside a
	// transaction block.
	const coordinated = "SELECT count(*) FROM kv x JOIN kv y ON x.v = y.id WHERE x.at < now() + interval '1 day'"
	if n := queryInt(t, px, coordinated); n != 20 {
		t.Errorf("coordinated, alone: %d, want 20", n)
	}
	tx, err := px.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, coordinated)
	if sqlState(err) != "0A000" || !strings.Contains(err.Error(), "reads the clock") {
		t.Errorf("coordinated, in a transaction block: %v, want 0A000 naming the clock", err)
	}
	tx.Rollback(ctx)
}
