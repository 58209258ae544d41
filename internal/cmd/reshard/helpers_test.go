package reshard

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// buildCommands builds the named commands of this module into a temporary directory
// and returns their paths.
func buildCommands(t *testing.T, names ...string) []string {
	t.Helper()
	dir := t.TempDir()
	args := []string{"build", "-o", dir + "/"}
	var paths []string
	for _, n := range names {
		args = append(args, "github.com/shardlab/shardlab/cmd/"+n)
		paths = append(paths, filepath.Join(dir, n))
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("building %v: %v\n%s", names, err, out)
	}
	return paths
}

// twoDatabases starts a throwaway cluster that can carry a move of one data source to
// two, and makes two databases in it, each with the hash oracle (a table partitioned
// by hash, whose satisfies_hash_partition says where the layout places a key); the
// first holds items 1..1000.
func twoDatabases(t *testing.T, name string) (a, b string) {
	t.Helper()
	c := pgtest.StartClusterWith(t, "wal_level = logical", "max_logical_replication_workers = 8", "max_worker_processes = 12")
	a, b = c.NewDatabase(name), c.NewDatabase(name)
	for _, d := range []string{a, b} {
		execOn(t, d, "CREATE TABLE hash_oracle (id int) PARTITION BY HASH (id)")
	}
	execOn(t, a, "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 1000)")
	return a, b
}

func execOn(t *testing.T, dsn, q string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func queryInt(t *testing.T, dsn, q string) int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}
