package shardsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/shardsql"
)

// TestKeysFromSequenceThroughDriver: through database/sql, an INSERT without its
// sharding key takes it from the key's sequence, with and without arguments and in a
// transaction; two handles (as two processes would) never draw the same key; every row
// is on the shard its key names.
func TestKeysFromSequenceThroughDriver(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t, "dkeys0"), pgtest.NewDatabase(t, "dkeys1")}
	r := rules.Rules{Tables: []rules.Table{{Name: "people", Strategy: rules.Strategy{Column: "id"}}}}
	for i, d := range dsns {
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d})
	}
	c, err := rules.Compile(r)
	if err != nil {
		t.Fatal(err)
	}
	a, b := openDriver(t, c, false), openDriver(t, c, false)
	if _, err := a.Exec("CREATE TABLE people (id bigserial PRIMARY KEY, name text)"); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := a.QueryRow("INSERT INTO people (name) VALUES ('first') RETURNING id").Scan(&id); err != nil || id != 1 {
		t.Fatalf("first key %d, %v", id, err)
	}
	if err := a.QueryRow("INSERT INTO people (name) VALUES ($1) RETURNING id", "second").Scan(&id); err != nil || id != 2 {
		t.Fatalf("second key %d, %v", id, err)
	}
	tx, err := a.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("INSERT INTO people (name) VALUES ($1), ($2), ($3)", "x", "y", "z"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	conn, err := a.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	text, err := shardsql.Explain(context.Background(), conn, "INSERT INTO people (name) VALUES ($1)", "w")
	conn.Close()
	if err != nil || !strings.Contains(text, "drawn from sequence public.people_id_seq") {
		t.Errorf("explain: %q %v", text, err)
	}

	// A statement prepared before the key's default changed beside the driver is
	// refused once, then draws from the new sequence.
	st, err := a.Prepare("INSERT INTO people (name) VALUES ($1) RETURNING id")
	if err != nil {
		t.Fatal(err)
	}
	direct, err := sql.Open("pgx", dsns[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"CREATE SEQUENCE people_moved START 7000000", "ALTER TABLE people ALTER COLUMN id SET DEFAULT nextval('people_moved')"} {
		if _, err := direct.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	direct.Close()
	if err := st.QueryRow("stale").Scan(&id); err == nil || !strings.Contains(err.Error(), "changed") {
		t.Errorf("prepared before the default changed: id %d, %v", id, err)
	}
	if err := st.QueryRow("again").Scan(&id); err != nil || id != 7000000 {
		t.Errorf("prepared statement run again: id %d, %v; want 7000000", id, err)
	}
	st.Close()

	var mu sync.Mutex
	seen := map[int64]bool{}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db := a
			if w%2 == 1 {
				db = b
			}
			for i := range 25 {
				var id int64
				if err := db.QueryRow("INSERT INTO people (name) VALUES ($1) RETURNING id", fmt.Sprintf("w%d-%d", w, i)).Scan(&id); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[id] || id <= 5 || id == 7000000 {
					t.Errorf("key %d drawn twice", id)
				}
				seen[id] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	var n, found int
	if err := b.QueryRow("SELECT count(*) FROM people").Scan(&n); err != nil || n != 6+8*25 {
		t.Errorf("%d rows, %v", n, err)
	}
	for id := range seen {
		var name string
		if err := b.QueryRow("SELECT name FROM people WHERE id = $1", id).Scan(&name); err == nil {
			found++
		}
	}
	if found != len(seen) {
		t.Errorf("%d of %d rows found by a point read", found, len(seen))
	}
	if n := countOn(t, dsns, "people"); n[0] == 0 || n[1] == 0 {
		t.Errorf("rows per shard %v", n)
	}
}

// TestInsertSelectRefusedOnSQLite: INSERT ... SELECT into a sharded table, which the
// driver runs on PostgreSQL data sources (TestInsertSelectThroughDriver), is refused
// on SQLite data sources with 0A000 naming it, and writes nothing.
func TestInsertSelectRefusedOnSQLite(t *testing.T) {
	dir := t.TempDir()
	r := rules.Rules{Tables: []rules.Table{{Name: "people", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt8}}}}
	for i := range 2 {
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: "sqlite:" + filepath.Join(dir, fmt.Sprintf("s%d.db", i))})
	}
	c, err := rules.Compile(r)
	if err != nil {
		t.Fatal(err)
	}
	db := openDriver(t, c, false)
	if _, err := db.Exec("CREATE TABLE people (id bigint PRIMARY KEY, name text)"); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"INSERT INTO people SELECT 1, 'n'", "INSERT INTO people SELECT id + 100, name FROM people WHERE name = $1"} {
		var err error
		if strings.Contains(q, "$1") {
			_, err = db.Exec(q, "n")
		} else {
			_, err = db.Exec(q)
		}
		if err == nil || !strings.Contains(err.Error(), "0A000") || !strings.Contains(err.Error(), "INSERT ... SELECT into sharded table people") {
			t.Errorf("%s: %v, want 0A000 naming it", q, err)
		}
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM people").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows, %v", n, err)
	}
}
