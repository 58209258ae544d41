package proxy_test

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/internal/sqldiff"
	"github.com/shardlab/shardlab/proxy"
)

func withAggregate() option { return func(c *proxy.Config) { c.Aggregate = true } }

// schemaShards creates a database with n schemas s0, s1 ... and returns the database's
// name and a DSN per schema (search_path=sN).
func schemaShards(t *testing.T, n int) (string, []string) {
	t.Helper()
	base := pgtest.NewDatabase(t, "aggr")
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	var dsns []string
	for i := range n {
		schema := fmt.Sprintf("s%d", i)
		exec1(t, admin, "CREATE SCHEMA "+schema)
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		dsns = append(dsns, u.String())
	}
	return admin.Config().Database, dsns
}

// backendsOf counts the server connections to database db, other than the caller's.
func backendsOf(t testing.TB, c *pgx.Conn, db string) int64 {
	return queryInt(t, c, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", db)
}

// TestAggregateStaysWithinPoolSize: 32 clients through a proxy over 4 schema shards
// with a pool of 5 never make PostgreSQL see more than 5 connections to the database,
// sampled while they run, and the rows they write land in every schema.
func TestAggregateStaysWithinPoolSize(t *testing.T) {
	db, dsns := schemaShards(t, 4)
	e := startProxyOn(t, shardedRules(dsns, []string{"kv=id"}, []string{"dict"}), withAggregate(), withPool(5, 20*time.Second))
	if st := e.srv.Stats().Pools; len(st) != 1 || st[0].Size != 5 {
		t.Fatalf("pools %+v, want one of size 5", st)
	}
	c := e.connect(t)
	exec1(t, c, "CREATE TABLE kv (id int PRIMARY KEY, v int NOT NULL)")
	exec1(t, c, "CREATE TABLE dict (k int PRIMARY KEY, name text)")
	exec1(t, c, "INSERT INTO dict VALUES (1, 'one')")
	c.Close(context.Background())

	ctx := context.Background()
	sampler := e.shard(t, 0)
	const clients, perClient = 32, 40
	var wg sync.WaitGroup
	var failed atomic.Int64
	done := make(chan struct{})
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, e.url(""))
			if err != nil {
				failed.Add(1)
				t.Error(err)
				return
			}
			defer conn.Close(ctx)
			for i := range perClient {
				id := w*perClient + i
				// A transaction over two shards (most often), a cross-shard read, and a
				// join with the broadcast table.
				tx, err := conn.Begin(ctx)
				if err == nil {
					_, err = tx.Exec(ctx, "INSERT INTO kv VALUES ($1, $2)", id, id)
				}
				if err == nil {
					_, err = tx.Exec(ctx, "INSERT INTO kv VALUES ($1, $2)", id+100000, id)
				}
				if err == nil {
					err = tx.Commit(ctx)
				}
				var n int64
				if err == nil {
					err = conn.QueryRow(ctx, "SELECT count(*) FROM kv WHERE v < $1", id).Scan(&n)
				}
				if err == nil {
					var name string
					err = conn.QueryRow(ctx, "SELECT d.name FROM kv JOIN dict d ON d.k = 1 WHERE kv.id = $1", id).Scan(&name)
				}
				if err != nil {
					failed.Add(1)
					t.Errorf("client %d: %v", w, err)
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	var peak, samples int64
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-time.After(10 * time.Millisecond):
		}
		n := backendsOf(t, sampler, db)
		peak = max(peak, n)
		samples++
	}
	if failed.Load() > 0 {
		t.Fatalf("%d clients failed", failed.Load())
	}
	t.Logf("%d clients, pool size 5: at most %d server connections in %d samples", clients, peak, samples)
	if peak > 5 || peak == 0 {
		t.Errorf("PostgreSQL saw %d connections to the database at the peak, want 1..5 (the pool size)", peak)
	}
	c = e.connect(t)
	if n := queryInt(t, c, "SELECT count(*) FROM kv"); n != 2*clients*perClient {
		t.Errorf("kv holds %d rows through the proxy, want %d", n, 2*clients*perClient)
	}
	var sum int64
	for i := range 4 {
		k := queryInt(t, sampler, fmt.Sprintf("SELECT count(*) FROM s%d.kv", i))
		if k == 0 {
			t.Errorf("schema s%d holds no row", i)
		}
		sum += k
	}
	if sum != 2*clients*perClient {
		t.Errorf("the schemas hold %d rows, want %d", sum, 2*clients*perClient)
	}
	if n := queryInt(t, sampler, "SELECT count(*) FROM pg_tables WHERE tablename = 'dict'"); n != 1 {
		t.Errorf("broadcast table dict exists %d times: aggregated, one copy serves the database", n)
	}
}

// TestAggregateTransactionOnOneConnection: with a pool of ONE connection, a transaction
// over all four schema shards runs (it could not on four pools of one), is invisible to
// others until it commits, and rolls back as a whole; a statement prepared for one
// schema is never run for another.
func TestAggregateTransactionOnOneConnection(t *testing.T) {
	db, dsns := schemaShards(t, 4)
	e := startProxyOn(t, shardedRules(dsns, []string{"kv=id"}, nil), withAggregate(), withPool(1, 5*time.Second))
	ctx := context.Background()
	c := e.connect(t)
	exec1(t, c, "CREATE TABLE kv (id int PRIMARY KEY, v text NOT NULL)")
	outside := e.shard(t, 0)
	// ids 1..16 fall on every one of the four shards.
	insertAll := func(tx pgx.Tx) {
		for id := 1; id <= 16; id++ {
			if _, err := tx.Exec(ctx, "INSERT INTO kv VALUES ($1, $2)", id, "v"+strconv.Itoa(id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	insertAll(tx)
	if n := backendsOf(t, outside, db); n != 1 {
		t.Errorf("%d server connections during the transaction, want 1", n)
	}
	if n := queryInt(t, outside, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND state = 'idle in transaction'", db); n != 1 {
		t.Errorf("%d server transactions open, want 1", n)
	}
	for i := range 4 {
		if n := queryInt(t, outside, fmt.Sprintf("SELECT count(*) FROM s%d.kv", i)); n != 0 {
			t.Errorf("s%d shows %d uncommitted rows", i, n)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM kv"); n != 0 {
		t.Fatalf("%d rows after ROLLBACK", n)
	}
	tx, err = c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	insertAll(tx)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if n := queryInt(t, outside, fmt.Sprintf("SELECT count(*) FROM s%d.kv", i)); n == 0 {
			t.Errorf("s%d holds no row after COMMIT", i)
		}
	}
	// The same statement text for keys on every shard, prepared (pgx caches it) and run
	// on the one server connection: each answer is its own row.
	for round := range 3 {
		for id := 1; id <= 16; id++ {
			var v string
			if err := c.QueryRow(ctx, "SELECT v FROM kv WHERE id = $1", id).Scan(&v); err != nil {
				t.Fatal(err)
			}
			if v != "v"+strconv.Itoa(id) {
				t.Fatalf("round %d: id %d answered %q", round, id, v)
			}
		}
	}
	if st := e.srv.Stats().Pools[0]; st.Opened != 1 {
		t.Errorf("the pool opened %d connections, want 1", st.Opened)
	}
}

// TestDifferentialAggregated: the differential suite through the proxy over 4 shards
// that are schemas of one database, aggregated on one pool.
func TestDifferentialAggregated(t *testing.T) {
	layout := sqldiff.SchemaLayout()
	env := sqldiff.NewEnv(t, layout, "")
	env.InSteps = true
	e := startProxyOn(t, env.Rules.Rules(), withAggregate())
	merged, groups, err := proxy.AggregateSchemas(env.Rules)
	if err != nil || len(groups) != 1 || merged.NumDataSources() != 1 {
		t.Fatalf("aggregate: %v groups, %v", groups, err)
	}
	ctx := context.Background()
	conn, err := pgconn.Connect(ctx, e.url(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	r := sqldiff.PgConnRunner{Conn: conn}
	env.Load(t, r)
	// Placement is checked against the merged rules: one data source, shards as
	// schema-qualified tables.
	env.Rules, env.DSNs = merged, []string{merged.DataSources()[0].DSN}
	env.CheckPlacement(t)
	queries := append(sqldiff.Queries(), sqldiff.Random(uint64(len(layout.Name)), 60)...)
	reads := env.RunReads(t, r, queries)
	writes := env.RunWrites(t, r)
	if reads.Equal == 0 || writes.Equal == 0 {
		t.Errorf("nothing was answered equal: reads %+v, writes %+v", reads, writes)
	}
	t.Logf("%s aggregated: %d reads (%d answered equal, %d refused), %d writes (%d equal, %d refused)",
		layout.Name, reads.Total, reads.Equal, reads.Refused, writes.Total, writes.Equal, writes.Refused)
}
