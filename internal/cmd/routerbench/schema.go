// Package routerbench reproduces seed 004, Sharding-JDBC's performance report, with
// shardlab's database/sql driver: the cost of the sharding layer against plain
// database/sql on one database and one table (the "overhead" experiment), and the
// throughput of 1 database x 2 tables, 2 databases x 1 table and 2 databases x 2 tables
// against one database (the "limit" experiment), each with the seed's insert, select
// joined with the item table, and update by id.
//
// Two adaptations of the seed, said in the report too: the seed's select joins on
// a.id%100=b.idm%100, which spans shards, so the select joins on the shared sharding
// key instead; and its AUTO_INCREMENT ids would collide across shards, so the benchmark
// makes order ids itself (seeded, 64-bit).
package routerbench

import (
	"fmt"
	"strings"
)

// The seed's tables: order (20 columns) and its item table, bound by order id.
const (
	orderColumns = `order_id bigint PRIMARY KEY, order_no varchar(50) NOT NULL, order_type int, cust_id int,
	cust_type int, cust_email varchar(50), payment_method_type int, payment_provider_id int,
	shipping_method_type int, packing_type int, preferred_shipping_time_type int, receiver_name varchar(100),
	receiver_address varchar(200), receiver_country_id int, receiver_province_id int, receiver_city_id int,
	receiver_zip varchar(20), receiver_tel varchar(50), receiver_mobile_tel varchar(50), cust_message varchar(500)`
	itemColumns = `order_id bigint NOT NULL, idm bigint NOT NULL, order_idm varchar(50), order_typem int,
	cust_idm int, cust_typem int, PRIMARY KEY (order_id, idm)`
)

func createOrder(table string) string { return "CREATE TABLE " + table + " (" + orderColumns + ")" }
func createItem(table string) string  { return "CREATE TABLE " + table + " (" + itemColumns + ")" }

// insertSQL is the seed's insert: one order, nineteen values, all but the ids constant.
func insertSQL(table string) string {
	return "INSERT INTO " + table + ` (order_id, order_no, order_type, cust_id, cust_type, cust_email,
	payment_method_type, payment_provider_id, shipping_method_type, packing_type, preferred_shipping_time_type,
	receiver_name, receiver_address, receiver_country_id, receiver_province_id, receiver_city_id, receiver_zip,
	receiver_tel, receiver_mobile_tel, cust_message) VALUES ($1, $2, 0, 10, 1, 'dtest002@dangdang.com', 1, 6, 1, 0, 3,
	'ttt ttt', 'beijingshijinganqu', 1, 1, 1, '100000', '01088888888', '13888888888', 'test message')`
}

// selectSQL is the seed's select of seventeen columns, joined with the item table on the
// sharding key (the seed joins on a.id%100=b.idm%100, which spans shards).
func selectSQL(order, item string) string {
	return `SELECT a.cust_id, a.cust_type, a.cust_email, a.payment_method_type, a.payment_provider_id,
	a.shipping_method_type, a.packing_type, a.preferred_shipping_time_type, a.receiver_name, a.receiver_address,
	a.receiver_country_id, a.receiver_province_id, a.receiver_city_id, a.receiver_zip, a.receiver_tel,
	a.receiver_mobile_tel, a.cust_message FROM ` + order + " a, " + item + " b WHERE a.order_id = $1 AND b.order_id = a.order_id"
}

// updateSQL is the seed's update by id.
func updateSQL(table string) string {
	return "UPDATE " + table + " SET order_no = $1, order_type = 0, cust_id = 10, cust_type = 1, cust_email = 'dtest002@dangdang.com' WHERE order_id = $2"
}

// rulesTOML writes the rules of a layout over data sources dsns: t_order and
// t_order_item bound, sharded by order_id (pghash), tables per data source each.
func rulesTOML(dsns []string, tables int) string {
	var b strings.Builder
	for i, d := range dsns {
		fmt.Fprintf(&b, "[[data_source]]\nname = \"ds_%d\"\ndsn = %q\n\n", i, d)
	}
	for _, t := range []string{"t_order", "t_order_item"} {
		fmt.Fprintf(&b, "[[sharded_table]]\nname = %q\ncolumn = \"order_id\"\ntype = \"bigint\"\ntables_per_data_source = %d\n\n", t, tables)
	}
	b.WriteString("[[binding]]\ntables = [\"t_order\", \"t_order_item\"]\n")
	return b.String()
}

// orderID is the seeded 64-bit order id number i (splitmix64, kept positive): ids spread
// over every shard, and two runs with one seed make the same ids.
func orderID(seed uint64, i uint64) int64 {
	z := seed + (i+1)*0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	z ^= z >> 31
	return int64(z >> 1)
}
