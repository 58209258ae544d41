package rules_test

import (
	"fmt"

	"github.com/shardlab/shardlab/rules"
)

// Rules in TOML: two data sources, t_order sharded by order_id over two tables on each
// (four shards), t_config copied to both. Lookup tells where a table's rows live, and
// ShardsFor which shard holds a key (pghash: PostgreSQL's own hash partitioning,
// so order 42 is where MODULUS 4 REMAINDER 2 would put it).
func ExampleParse() {
	c, err := rules.Parse([]byte(`
broadcast = ["t_config"]

[[data_source]]
name = "ds_0"
dsn  = "postgres://app@db1:5432/orders"

[[data_source]]
name = "ds_1"
dsn  = "postgres://app@db2:5432/orders"

[[sharded_table]]
name = "t_order"
column = "order_id"
type = "bigint"
tables_per_data_source = 2
`))
	if err != nil {
		panic(err)
	}
	orders := c.Lookup("t_order")
	for i, n := range orders.Nodes {
		fmt.Printf("shard %d: %s.%s\n", i, c.DataSources()[n.DataSource].Name, n.Table)
	}
	shards, err := orders.ShardsFor(map[string]rules.Key{"order_id": rules.IntKey(42)}, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("order 42 is on shard", shards)
	fmt.Println("t_config:", c.Lookup("t_config").Kind, len(c.Lookup("t_config").Nodes), "copies")
	fmt.Println("t_user:", c.Lookup("t_user").Kind, "on", c.DataSources()[c.DefaultDataSource()].Name)
	// Output:
	// shard 0: ds_0.t_order_0
	// shard 1: ds_0.t_order_1
	// shard 2: ds_1.t_order_0
	// shard 3: ds_1.t_order_1
	// order 42 is on shard [2]
	// t_config: broadcast 2 copies
	// t_user: default on ds_0
}
