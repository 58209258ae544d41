package shardsql_test

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	_ "github.com/shardlab/shardlab/shardsql" // registers the "shardlab" driver
)

// The driver over two SQLite files: orders sharded by customer, written and read
// through plain database/sql. A query that names the key runs on one shard; one that
// does not runs on both, and the driver merges the answers as one database would.
func Example() {
	dir, err := os.MkdirTemp("", "shardsql-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	rulesFile := filepath.Join(dir, "rules.toml")
	err = os.WriteFile(rulesFile, []byte(fmt.Sprintf(`
[[data_source]]
name = "ds_0"
dsn  = "sqlite:%s"

[[data_source]]
name = "ds_1"
dsn  = "sqlite:%s"

[[sharded_table]]
name = "orders"
column = "customer"
type = "text"
`, filepath.Join(dir, "s0.db"), filepath.Join(dir, "s1.db"))), 0o644)
	if err != nil {
		panic(err)
	}
	db, err := sql.Open("shardlab", rulesFile)
	if err != nil {
		panic(err)
	}
	defer db.Close()
	for _, q := range []string{
		"CREATE TABLE orders (customer text NOT NULL, id int NOT NULL, total int NOT NULL, PRIMARY KEY (customer, id))",
		"INSERT INTO orders VALUES ('ann', 1, 30), ('ann', 2, 12), ('bob', 3, 7), ('cid', 4, 50)",
	} {
		if _, err := db.Exec(q); err != nil {
			panic(err)
		}
	}
	var n, sum int
	if err := db.QueryRow("SELECT count(*), sum(total) FROM orders WHERE customer = $1", "ann").Scan(&n, &sum); err != nil {
		panic(err)
	}
	fmt.Printf("ann: %d orders, %d in all\n", n, sum)
	rows, err := db.Query("SELECT customer, sum(total) FROM orders GROUP BY customer ORDER BY 2 DESC")
	if err != nil {
		panic(err)
	}
	defer rows.Close()
	for rows.Next() {
		var c string
		if err := rows.Scan(&c, &sum); err != nil {
			panic(err)
		}
		fmt.Println(c, sum)
	}
	if err := rows.Err(); err != nil {
		panic(err)
	}
	// Output:
	// ann: 2 orders, 42 in all
	// cid 50
	// ann 42
	// bob 7
}
