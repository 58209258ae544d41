package shardsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/shardsql"
)

// BenchmarkPointSelect compares one point select by primary key through plain
// database/sql (pgx's driver) and through shardlab's driver over the same database and
// table (a one-shard rule), one client at a time: the driver's own cost per statement,
// CPU profile included with -cpuprofile.
//
//	SHARDLAB_PG_DSN=... go test -run XXX -bench PointSelect -benchmem -count 6 ./shardsql
func BenchmarkPointSelect(b *testing.B) {
	dsn := pgtest.NewDatabase(b, "bench_point")
	direct, err := sql.Open("pgx", dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close()
	if _, err := direct.Exec("CREATE TABLE t (id bigint PRIMARY KEY, a int, b text, c text, d int)"); err != nil {
		b.Fatal(err)
	}
	if _, err := direct.Exec("INSERT INTO t SELECT g, g % 100, 'some text ' || g, 'more text', 7 FROM generate_series(1, 10000) g"); err != nil {
		b.Fatal(err)
	}
	c, err := rules.Compile(rules.Rules{DataSources: []rules.DataSource{{Name: "ds_0", DSN: dsn}},
		Tables: []rules.Table{{Name: "t", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt8}}}})
	if err != nil {
		b.Fatal(err)
	}
	router, err := shardsql.Open(shardsql.Config{Rules: c})
	if err != nil {
		b.Fatal(err)
	}
	const q = "SELECT a, b, c, d FROM t WHERE id = $1"
	for _, h := range []struct {
		name string
		db   *sql.DB
	}{{"direct", direct}, {"router", router}} {
		b.Run(h.name, func(b *testing.B) {
			st, err := h.db.PrepareContext(context.Background(), q)
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			var (
				a, d int
				s, t string
			)
			i := 0
			before := cpuTime()
			for b.Loop() {
				i++
				if err := st.QueryRow(int64(i%10000+1)).Scan(&a, &s, &t, &d); err != nil {
					b.Fatal(fmt.Errorf("%s: %w", h.name, err))
				}
			}
			// The client's own CPU per statement (the server's is in another process):
			// what the driver costs on a machine the client shares with the database.
			b.ReportMetric(float64(cpuTime()-before)/float64(i), "client-cpu-ns/op")
		})
	}
	router.Close()
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
