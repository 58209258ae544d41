package pgtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
)

func ping(t *testing.T, dsn string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

func TestUniqueName(t *testing.T) {
	a, b := pgtest.UniqueName("My Test/1"), pgtest.UniqueName("My Test/1")
	if a == b {
		t.Errorf("UniqueName gave %q twice", a)
	}
	if !strings.HasPrefix(a, "my_test_1_") {
		t.Errorf("UniqueName(\"My Test/1\") = %q, want prefix my_test_1_", a)
	}
	if n := pgtest.UniqueName(strings.Repeat("x", 100)); len(n) > 63 {
		t.Errorf("UniqueName of a long prefix is %d bytes, over PostgreSQL's 63", len(n))
	}
	if n := pgtest.UniqueName("7up"); n[0] < 'a' || n[0] > 'z' {
		t.Errorf("UniqueName(\"7up\") = %q starts with a digit", n)
	}
}

func TestNewDatabaseIsDroppedAtCleanup(t *testing.T) {
	var dsn string
	t.Run("use", func(t *testing.T) {
		dsn = pgtest.NewDatabase(t, "pgtest_self")
		if err := ping(t, dsn); err != nil {
			t.Fatalf("new database: %v", err)
		}
	})
	if dsn == "" {
		t.Skip("subtest skipped")
	}
	if err := ping(t, dsn); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("database still reachable after its test ended (err = %v)", err)
	}
}

func TestClusterStopStart(t *testing.T) {
	c := pgtest.StartCluster(t)
	dsn := c.NewDatabase("pgtest_cluster")
	if err := ping(t, dsn); err != nil {
		t.Fatalf("fresh cluster: %v", err)
	}
	c.Stop()
	if err := ping(t, dsn); err == nil {
		t.Fatal("stopped cluster answers")
	}
	c.Stop() // no-op
	c.Start()
	if err := ping(t, dsn); err != nil {
		t.Fatalf("restarted cluster: %v", err)
	}
	c.Start() // no-op
}
