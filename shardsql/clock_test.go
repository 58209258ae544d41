package shardsql_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// TestClockThroughDriver: through database/sql over two shards (kv by k mod 2), a
// statement that writes rows on both shards reads one value of now(), with arguments
// and without, and every statement of a transaction reads its start, as on one
// database; a statement the coordinator database answers is refused inside a
// transaction, where its clock would be its own. On the old code each shard read its
// own transaction's start.
func TestClockThroughDriver(t *testing.T) {
	ctx := context.Background()
	var dsns []string
	for i := range 2 {
		dsns = append(dsns, pgtest.NewDatabase(t, fmt.Sprintf("dclock_s%d", i)))
	}
	db := openCoordinated(t, kv(t, dsns), nil)
	for _, q := range []string{
		"CREATE TABLE kv (k int PRIMARY KEY, v text, at timestamptz)",
		"INSERT INTO kv (k, v) SELECT g, g::text FROM generate_series(1, 20) g",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	distinct := func() int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, "SELECT count(DISTINCT at) FROM kv").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{"UPDATE kv SET at = now()", nil},
		{"UPDATE kv SET at = CURRENT_TIMESTAMP WHERE k > $1", []any{0}},
	} {
		if _, err := db.ExecContext(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
		if n := distinct(); n != 1 {
			t.Errorf("%s over two shards wrote %d values of now(), want 1", q.sql, n)
		}
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() // a failed check leaves no transaction open at the handle's close
	var first, on1, on2 time.Time
	if err := tx.QueryRowContext(ctx, "SELECT now() FROM kv WHERE k = 1").Scan(&first); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if err := tx.QueryRowContext(ctx, "SELECT now() FROM kv WHERE k = $1", 2).Scan(&on2); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "UPDATE kv SET at = now()"); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRowContext(ctx, "SELECT min(at) FROM kv WHERE at = now()").Scan(&on1); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if !first.Equal(on1) || !first.Equal(on2) {
		t.Errorf("in one transaction now() read %v on one shard, %v on the other, %v written", first, on2, on1)
	}
	// In a transaction that has not written (which would refuse it for another reason).
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, "SELECT count(*) FROM kv x JOIN kv y ON x.v = y.k::text WHERE x.at <= now()")
	if err == nil || !strings.Contains(err.Error(), "reads the clock") {
		t.Errorf("coordinated, in a transaction: %v, want a refusal naming the clock", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM kv x JOIN kv y ON x.v = y.k::text WHERE x.at <= now()").Scan(&n); err != nil || n != 20 {
		t.Errorf("coordinated, alone: %d %v, want 20", n, err)
	}
}
