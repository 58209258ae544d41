package proxy_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// TestSchemaShards: a --shard DSN with search_path=NAME is a shard that is a schema of
// its database; statements, COPY and settings resets keep each shard in its schema.
func TestSchemaShards(t *testing.T) {
	base := pgtest.NewDatabase(t, "schemas")
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var dsns []string
	for _, schema := range []string{"shard_a", "shard_b"} {
		if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		dsns = append(dsns, u.String())
	}
	e := startProxyOn(t, shardedRules(dsns, []string{"m=id"}, nil))
	c := e.connect(t)
	exec1(t, c, "CREATE TABLE m (id int PRIMARY KEY, v text)")
	exec1(t, c, "SET application_name = 'resets RESET ALL on the server connections'")
	for i := 1; i <= 20; i++ {
		exec1(t, c, "INSERT INTO m VALUES ($1, 'x')", i)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM m"); n != 20 {
		t.Errorf("count %d, want 20", n)
	}
	a := queryInt(t, admin, "SELECT count(*) FROM shard_a.m")
	b := queryInt(t, admin, "SELECT count(*) FROM shard_b.m")
	if a == 0 || b == 0 || a+b != 20 {
		t.Errorf("schemas hold %d and %d rows, want both some, 20 in all", a, b)
	}
	if n := queryInt(t, admin, "SELECT count(*) FROM pg_tables WHERE tablename = 'm' AND schemaname = 'public'"); n != 0 {
		t.Error("a table landed in the public schema")
	}
}
