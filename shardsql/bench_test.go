package shardsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
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
	var (
		a, d int
		x, y string
	)
	benchSelect(b, q, direct, router, &a, &x, &y, &d)
	router.Close()
}

// benchSelect runs q, a select of one row by an int8 key from 1 to 10000, through
// direct and through router, one client at a time, scanning into dest; it reports the
// client's own CPU per statement beside the time.
func benchSelect(b *testing.B, q string, direct, router *sql.DB, dest ...any) {
	benchPrepared(b, q, direct, router, func(st *sql.Stmt, i int) error {
		return st.QueryRow(int64(i%10000 + 1)).Scan(dest...)
	})
}

// benchPrepared prepares q on direct and on router and runs it through each, one
// client at a time, with run given the statement and the iteration (from 1); it
// reports the client's own CPU per statement beside the time.
func benchPrepared(b *testing.B, q string, direct, router *sql.DB, run func(st *sql.Stmt, i int) error) {
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
			i := 0
			before := cpuTime()
			for b.Loop() {
				i++
				if err := run(st, i); err != nil {
					b.Fatal(fmt.Errorf("%s: %w", h.name, err))
				}
			}
			// The client's own CPU per statement (the server's is in another process):
			// what the driver costs on a machine the client shares with the database.
			b.ReportMetric(float64(cpuTime()-before)/float64(i), "client-cpu-ns/op")
		})
	}
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSeedSelect is seed 004's select (seventeen columns of an order joined with
// its item on the order id), one client at a time, through plain database/sql and
// through shardlab's driver over the same tables: where routerbench's select overhead
// goes, with -cpuprofile.
//
//	SHARDLAB_PG_DSN=... go test -run XXX -bench SeedSelect -benchmem -count 6 ./shardsql
func BenchmarkSeedSelect(b *testing.B) {
	dsn := pgtest.NewDatabase(b, "bench_seed_select")
	direct, err := sql.Open("pgx", dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close()
	for _, ddl := range []string{
		`CREATE TABLE t_order (order_id bigint PRIMARY KEY, order_no varchar(50) NOT NULL, order_type int, cust_id int,
		cust_type int, cust_email varchar(50), payment_method_type int, payment_provider_id int,
		shipping_method_type int, packing_type int, preferred_shipping_time_type int, receiver_name varchar(100),
		receiver_address varchar(200), receiver_country_id int, receiver_province_id int, receiver_city_id int,
		receiver_zip varchar(20), receiver_tel varchar(50), receiver_mobile_tel varchar(50), cust_message varchar(500))`,
		`CREATE TABLE t_order_item (order_id bigint NOT NULL, idm bigint NOT NULL, order_idm varchar(50), order_typem int,
		cust_idm int, cust_typem int, PRIMARY KEY (order_id, idm))`,
		`INSERT INTO t_order SELECT g, 'no' || g, 0, 10, 1, 'dtest002@dangdang.com', 1, 6, 1, 0, 3, 'ttt ttt',
		'beijingshijinganqu', 1, 1, 1, '100000', '01088888888', '13888888888', 'test message' FROM generate_series(1, 10000) g`,
		`INSERT INTO t_order_item SELECT g, g, 'no' || g, 0, 10, 1 FROM generate_series(1, 10000) g`,
	} {
		if _, err := direct.Exec(ddl); err != nil {
			b.Fatal(err)
		}
	}
	c, err := rules.Compile(rules.Rules{DataSources: []rules.DataSource{{Name: "ds_0", DSN: dsn}},
		Tables: []rules.Table{
			{Name: "t_order", Strategy: rules.Strategy{Column: "order_id", Type: rules.TypeInt8}},
			{Name: "t_order_item", Strategy: rules.Strategy{Column: "order_id", Type: rules.TypeInt8}},
		},
		Bindings: [][]string{{"t_order", "t_order_item"}}})
	if err != nil {
		b.Fatal(err)
	}
	router, err := shardsql.Open(shardsql.Config{Rules: c})
	if err != nil {
		b.Fatal(err)
	}
	defer router.Close()
	const q = `SELECT a.cust_id, a.cust_type, a.cust_email, a.payment_method_type, a.payment_provider_id,
	a.shipping_method_type, a.packing_type, a.preferred_shipping_time_type, a.receiver_name, a.receiver_address,
	a.receiver_country_id, a.receiver_province_id, a.receiver_city_id, a.receiver_zip, a.receiver_tel,
	a.receiver_mobile_tel, a.cust_message FROM t_order a, t_order_item b WHERE a.order_id = $1 AND b.order_id = a.order_id`
	var cols [17]any
	ptrs := make([]any, len(cols))
	for i := range cols {
		ptrs[i] = &cols[i]
	}
	benchSelect(b, q, direct, router, ptrs...)
}

// BenchmarkCrossShardPair reads two rows that live on two shards (a concatenation the
// driver streams), one client at a time: through plain database/sql on one database
// holding both, and through shardlab's driver over two databases. It shows what a
// short cross-shard answer costs the client per statement (goroutines, batches).
//
//	SHARDLAB_PG_DSN=... go test -run XXX -bench CrossShardPair -benchmem -count 6 ./shardsql
func BenchmarkCrossShardPair(b *testing.B) {
	one := pgtest.NewDatabase(b, "bench_pair")
	dsns := []string{pgtest.NewDatabase(b, "bench_pair0"), pgtest.NewDatabase(b, "bench_pair1")}
	direct, err := sql.Open("pgx", one)
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close()
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: dsns[0]}, {Name: "ds_1", DSN: dsns[1]}},
		Tables:      []rules.Table{{Name: "t", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt8, Algorithm: rules.AlgorithmMod}}}})
	if err != nil {
		b.Fatal(err)
	}
	router, err := shardsql.Open(shardsql.Config{Rules: c})
	if err != nil {
		b.Fatal(err)
	}
	defer router.Close()
	var rows []string
	for g := 1; g <= 10001; g++ {
		rows = append(rows, fmt.Sprintf("(%d, %d, 'some text %d', 'more text', 7)", g, g%100, g))
	}
	for _, db := range []*sql.DB{direct, router} {
		for _, q := range []string{"CREATE TABLE t (id bigint PRIMARY KEY, a int, b text, c text, d int)",
			"INSERT INTO t VALUES " + strings.Join(rows, ", ")} {
			if _, err := db.Exec(q); err != nil {
				b.Fatal(err)
			}
		}
	}
	const q = "SELECT a, b, c, d FROM t WHERE id IN ($1::bigint, $1::bigint + 1) ORDER BY id"
	var (
		a, d int
		x, y string
	)
	benchSelect(b, q, direct, router, &a, &x, &y, &d)
}

// BenchmarkSeedUpdate is seed 004's update of one order by its id, one client at a
// time, through plain database/sql and through shardlab's driver over the same table
// (a one-shard rule): where routerbench's update overhead goes, with -cpuprofile.
//
//	SHARDLAB_PG_DSN=... go test -run XXX -bench SeedUpdate -benchmem -count 6 ./shardsql
func BenchmarkSeedUpdate(b *testing.B) {
	dsn := pgtest.NewDatabase(b, "bench_seed_update")
	direct, err := sql.Open("pgx", dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close()
	for _, ddl := range []string{
		"CREATE TABLE t_order (order_id bigint PRIMARY KEY, order_no varchar(50) NOT NULL, order_type int, cust_id int, cust_type int, cust_email varchar(50))",
		"INSERT INTO t_order SELECT g, 'no' || g, 0, 10, 1, 'dtest002@dangdang.com' FROM generate_series(1, 10000) g",
	} {
		if _, err := direct.Exec(ddl); err != nil {
			b.Fatal(err)
		}
	}
	c, err := rules.Compile(rules.Rules{DataSources: []rules.DataSource{{Name: "ds_0", DSN: dsn}},
		Tables: []rules.Table{{Name: "t_order", Strategy: rules.Strategy{Column: "order_id", Type: rules.TypeInt8}}}})
	if err != nil {
		b.Fatal(err)
	}
	router, err := shardsql.Open(shardsql.Config{Rules: c})
	if err != nil {
		b.Fatal(err)
	}
	defer router.Close()
	const q = "UPDATE t_order SET order_no = $1, order_type = 0, cust_id = 10, cust_type = 1, cust_email = 'dtest002@dangdang.com' WHERE order_id = $2"
	benchPrepared(b, q, direct, router, func(st *sql.Stmt, i int) error {
		_, err := st.Exec(fmt.Sprintf("no%d", i), int64(i%10000+1))
		return err
	})
}
