// Command orders is a small program that uses a sharded PostgreSQL database through
// plain database/sql: it imports shardlab's driver for its side effect, opens the
// database by the path of a rules file, and never mentions a shard again.
//
//	go run . -rules rules.toml
//
// The rules file names the data sources and shards t_order and t_order_item by order
// id (see rules.example.toml). The program creates the tables, writes orders in one
// transaction, and reads them back across the shards.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"os"

	_ "github.com/shardlab/shardlab/shardsql" // registers the "shardlab" driver
)

func main() {
	rulesFile := flag.String("rules", "rules.toml", "the sharding rules file")
	flag.Parse()
	if err := run(context.Background(), *rulesFile); err != nil {
		log.SetFlags(0)
		log.Fatalf("orders: %v", err)
	}
}

func run(ctx context.Context, rulesFile string) error {
	db, err := sql.Open("shardlab", rulesFile)
	if err != nil {
		return err
	}
	defer db.Close()

	for _, ddl := range []string{
		`CREATE TABLE IF NOT EXISTS t_order (order_id bigint PRIMARY KEY, customer text NOT NULL, total numeric(10,2) NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS t_order_item (order_id bigint NOT NULL, line int NOT NULL, sku text NOT NULL, PRIMARY KEY (order_id, line))`,
	} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			return err
		}
	}

	// Ids come from the client: a per-shard sequence would hand out the same ids twice.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	for id := int64(1); id <= 6; id++ {
		if _, err := tx.ExecContext(ctx, `INSERT INTO t_order VALUES ($1, $2, $3)`, id, fmt.Sprint("customer-", id%3), float64(id)*10.5); err != nil {
			tx.Rollback()
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO t_order_item VALUES ($1, 1, $2)`, id, fmt.Sprint("sku-", id)); err != nil {
			tx.Rollback()
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}

	// One shard answers a point read, the join of bound tables stays on it.
	var customer, sku string
	err = db.QueryRowContext(ctx, `SELECT o.customer, i.sku FROM t_order o JOIN t_order_item i ON o.order_id = i.order_id WHERE o.order_id = $1`, 4).Scan(&customer, &sku)
	if err != nil {
		return err
	}
	fmt.Printf("order 4: %s bought %s\n", customer, sku)

	// Every shard answers, and the driver merges: group, aggregate, sort, limit.
	rows, err := db.QueryContext(ctx, `SELECT customer, count(*), sum(total) FROM t_order GROUP BY customer ORDER BY customer LIMIT 2`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var n int64
		var sum string
		if err := rows.Scan(&customer, &n, &sum); err != nil {
			return err
		}
		fmt.Printf("%s: %d orders, %s in all\n", customer, n, sum)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `DROP TABLE t_order_item, t_order`); err != nil {
		return err
	}
	fmt.Fprintln(os.Stdout, "done")
	return nil
}
