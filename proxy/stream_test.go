package proxy_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jackc/pgx/v5"
)

// TestCrossShardRowsStream: the rows of a read over several shards reach the client
// as they arrive, before the other shards have answered. The second data source's
// answer waits on an advisory lock the test holds there; the first data source's rows
// must come through meanwhile, in the simple protocol and the extended one. With ORDER
// BY a sort merge needs a row of every shard: the blocked shard, scanning its index in
// order, waits only after sending its first 500 rows (more than the server's 8 kB
// output buffer), and the merged rows up to there must come through.
func TestCrossShardRowsStream(t *testing.T) {
	e := startProxy(t, 2, []string{"items=id"}, nil)
	ctx := context.Background()
	c := e.connect(t)
	if _, err := c.Exec(ctx, "CREATE TABLE items (id int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "INSERT INTO items SELECT g, repeat('v', 100) FROM generate_series(1, 2000) g"); err != nil {
		t.Fatal(err)
	}
	holder, err := pgx.Connect(ctx, e.dsns[1])
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)

	// The second data source's scan waits at its 501st row (the lock is per database:
	// the first data source never waits). An index scan keeps the rows in order.
	var second int
	if err := holder.QueryRow(ctx, "SELECT id FROM items ORDER BY id OFFSET 500 LIMIT 1").Scan(&second); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "SET enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mode pgx.QueryExecMode
		sql  string
	}{
		{"simple", pgx.QueryExecModeSimpleProtocol, "SELECT id, v FROM items WHERE id <> $1 OR pg_advisory_xact_lock_shared(4242)::text = ''"},
		{"extended", pgx.QueryExecModeExec, "SELECT id, v FROM items WHERE id <> $1 OR pg_advisory_xact_lock_shared(4242)::text = ''"},
		{"ordered", pgx.QueryExecModeExec, "SELECT id, v FROM items WHERE id <> $1 OR pg_advisory_xact_lock_shared(4242)::text = '' ORDER BY id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock(4242)"); err != nil {
				t.Fatal(err)
			}
			released := false
			release := func() {
				if !released {
					released = true
					if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock(4242)"); err != nil {
						t.Error(err)
					}
				}
			}
			defer release()
			first := make(chan error, 1)
			done := make(chan int, 1)
			go func() {
				qctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				rows, err := c.Query(qctx, tc.sql, tc.mode, second)
				if err != nil {
					first <- err
					done <- 0
					return
				}
				n := 0
				for rows.Next() {
					if n == 0 {
						first <- nil
					}
					n++
				}
				rows.Close()
				if n == 0 {
					first <- rows.Err()
				}
				done <- n
			}()
			select {
			case err := <-first:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(20 * time.Second):
				t.Error("no row reached the client while one shard's answer waited")
			}
			release()
			if n := <-done; n != 2000 {
				t.Errorf("%d rows, want 2000", n)
			}
		})
	}
}

// TestNoticesReachTheClient: a notice reaches the client once, whichever path read
// it: a relayed one-shard statement's, a streamed read over two shards', and one a
// deferred constraint trigger raises at COMMIT, which the core runs.
func TestNoticesReachTheClient(t *testing.T) {
	e := startProxy(t, 2, []string{"items=id"}, nil)
	ctx := context.Background()
	setup := e.connect(t)
	for _, q := range []string{
		"CREATE TABLE items (id int PRIMARY KEY)",
		"INSERT INTO items VALUES (1), (2), (3)",
		`CREATE FUNCTION shout(n int) RETURNS int LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'row %', n; RETURN n; END $$`,
		`CREATE FUNCTION late() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'late %', NEW.id; RETURN NULL; END $$`,
		"CREATE CONSTRAINT TRIGGER items_late AFTER INSERT ON items DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION late()",
	} {
		if _, err := setup.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	cfg, err := pgconn.ParseConfig(e.url(""))
	if err != nil {
		t.Fatal(err)
	}
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Message) }
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, tc := range []struct {
		sql  string
		want []string
	}{
		{"SELECT shout(id) FROM items WHERE id = 2", []string{"row 2"}},
		{"SELECT shout(id) FROM items ORDER BY id", []string{"row 1", "row 2", "row 3"}},
		{"BEGIN; INSERT INTO items VALUES (10); COMMIT", []string{"late 10"}},
	} {
		notices = nil
		if _, err := c.Exec(ctx, tc.sql).ReadAll(); err != nil {
			t.Fatalf("%s: %v", tc.sql, err)
		}
		got := slices.Clone(notices)
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: notices %q, want %q", tc.sql, got, tc.want)
		}
	}
}
