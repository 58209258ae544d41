package sqldiff

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/shardlab/shardlab/rules"
)

// Schema creates the suite's tables. Run it on the unsharded database as it is, and on
// a sharded layout through the sharding layer (which creates every physical table).
var Schema = []string{
	`CREATE TABLE t_order (order_id bigint PRIMARY KEY, user_id int NOT NULL, status text, amount numeric(12,2),
		qty int, weight float8, note text, created date, code char(3))`,
	`CREATE TABLE t_order_item (order_id bigint NOT NULL, item_id int NOT NULL, sku text, qty int, price numeric(10,3),
		PRIMARY KEY (order_id, item_id))`,
	`CREATE TABLE t_user (user_id int PRIMARY KEY, name text, city text, score int)`,
	`CREATE TABLE t_event (event_id bigint PRIMARY KEY, kind text, v int)`,
	`CREATE TABLE t_config (k text PRIMARY KEY, v text, n int)`,
	`CREATE TABLE t_region (region_id int PRIMARY KEY, name text)`,
}

// Tables lists the suite's tables with their primary keys, to compare whole tables.
var Tables = map[string]string{
	"t_order": "order_id", "t_order_item": "order_id, item_id", "t_user": "user_id",
	"t_event": "event_id", "t_config": "k", "t_region": "region_id",
}

// Layouts are the sharded arrangements the suite runs on: seed 004's 2 databases x 2
// tables, and 3 shards (one table each).
func Layouts() []Layout {
	return []Layout{
		{Name: "2x2", DataSources: 2, ByteOrder: true, Rules: func(dsns []string) rules.Rules {
			return rules.Rules{
				DataSources: dataSources(dsns),
				Tables: []rules.Table{
					{Name: "t_order", Strategy: rules.Strategy{Column: "order_id"}, TablesPerDataSource: 2},
					{Name: "t_order_item", Strategy: rules.Strategy{Column: "order_id"}, TablesPerDataSource: 2},
					{Name: "t_user", Strategy: rules.Strategy{Column: "user_id", Algorithm: rules.AlgorithmMod}},
					{Name: "t_event", Strategy: rules.Strategy{Column: "event_id", Algorithm: rules.AlgorithmRange, Bounds: []int64{100, 200, 300}}, TablesPerDataSource: 2},
				},
				Bindings:  [][]string{{"t_order", "t_order_item"}},
				Broadcast: []string{"t_config"},
			}
		}},
		{Name: "3shards", DataSources: 3, ByteOrder: true, Rules: threeShards},
	}
}

// ICULayout is the 3-shard layout on databases whose default collation is ICU's en-US.
func ICULayout() Layout {
	return Layout{Name: "3shards-icu", DataSources: 3, ByteOrder: false, Rules: threeShards}
}

// SchemaLayout is the 3-shard layout's rules over 4 shards that are schemas of one
// database (the proxy's --aggregate runs them on one pool).
func SchemaLayout() Layout {
	return Layout{Name: "4schemas", DataSources: 4, ByteOrder: true, Schemas: true, Rules: func(dsns []string) rules.Rules {
		r := threeShards(dsns)
		r.Tables[3].Strategy.Bounds = []int64{100, 200, 300}
		return r
	}}
}

func threeShards(dsns []string) rules.Rules {
	return rules.Rules{
		DataSources: dataSources(dsns),
		Tables: []rules.Table{
			{Name: "t_order", Strategy: rules.Strategy{Column: "order_id", Type: rules.TypeInt8}},
			{Name: "t_order_item", Strategy: rules.Strategy{Column: "order_id", Type: rules.TypeInt8}},
			{Name: "t_user", Strategy: rules.Strategy{Column: "user_id", Algorithm: rules.AlgorithmCRC32}},
			{Name: "t_event", Strategy: rules.Strategy{Column: "event_id", Algorithm: rules.AlgorithmRange, Bounds: []int64{150, 300}}},
		},
		Bindings:          [][]string{{"t_order", "t_order_item"}},
		Broadcast:         []string{"t_config"},
		DefaultDataSource: "ds_1",
	}
}

func dataSources(dsns []string) []rules.DataSource {
	out := make([]rules.DataSource, len(dsns))
	for i, d := range dsns {
		out[i] = rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d}
	}
	return out
}

// Data returns the INSERT statements that load the suite's rows: seeded, so every run
// loads the same data. It has NULLs, negative and 64-bit keys, numeric scales that
// differ, mixed-case and non-ASCII text, and a table (t_event) whose keys straddle range
// bounds.
func Data(seed uint64) []string {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	statuses := []string{"'new'", "'paid'", "'shipped'", "'Cancelled'", "'cancelled'", "'ÄÖ straße'", "'zebra'", "'Apple'", "'apple'", "NULL", "'ñandú'", "'Zürich'"}
	notes := []string{"'plain'", "'Ünïcödé'", "'日本語'", "'emoji 🙂'", "''", "NULL", "'b'", "'B'", "'a b'"}
	var out []string
	var orders []string
	var items []string
	ids := []int64{}
	for i := 1; i <= 240; i++ {
		ids = append(ids, int64(i))
	}
	ids = append(ids, -7, -1, 0, 5000000000, 9007199254740993, 4294967296)
	for _, id := range ids {
		amount := "NULL"
		if r.IntN(10) > 0 {
			amount = fmt.Sprintf("%d.%02d", r.IntN(5000)-500, r.IntN(100))
		}
		qty := "NULL"
		if r.IntN(8) > 0 {
			qty = fmt.Sprint(r.IntN(9))
		}
		weight := "NULL"
		if r.IntN(6) > 0 {
			weight = fmt.Sprintf("%g", float64(r.IntN(100000))/64)
		}
		created := "NULL"
		if r.IntN(7) > 0 {
			created = fmt.Sprintf("'20%02d-%02d-%02d'", r.IntN(25), 1+r.IntN(12), 1+r.IntN(28))
		}
		code := []string{"'ab'", "'ab '", "'xyz'", "'A'", "NULL"}[r.IntN(5)]
		orders = append(orders, fmt.Sprintf("(%d, %d, %s, %s, %s, %s, %s, %s, %s)", id, 1+r.IntN(30),
			statuses[r.IntN(len(statuses))], amount, qty, weight, notes[r.IntN(len(notes))], created, code))
		for item := range r.IntN(4) {
			price := fmt.Sprintf("%d.%03d", r.IntN(200), r.IntN(1000))
			if r.IntN(5) == 0 {
				price = fmt.Sprintf("%d.5", r.IntN(200))
			}
			items = append(items, fmt.Sprintf("(%d, %d, 'sku-%d', %d, %s)", id, item+1, r.IntN(20), 1+r.IntN(5), price))
		}
	}
	out = append(out, chunks("INSERT INTO t_order VALUES ", orders, 40)...)
	out = append(out, chunks("INSERT INTO t_order_item VALUES ", items, 40)...)
	var users []string
	cities := []string{"'Oslo'", "'oslo'", "'Berlin'", "'Åre'", "NULL", "'Zagreb'"}
	for u := 1; u <= 30; u++ {
		users = append(users, fmt.Sprintf("(%d, 'user %d', %s, %d)", u, u, cities[r.IntN(len(cities))], r.IntN(100)))
	}
	out = append(out, chunks("INSERT INTO t_user VALUES ", users, 40)...)
	var events []string
	for _, e := range []int{1, 50, 99, 100, 101, 149, 150, 151, 199, 200, 250, 299, 300, 301, 450, 1000, -5} {
		events = append(events, fmt.Sprintf("(%d, '%s', %d)", e, []string{"click", "view", "buy"}[r.IntN(3)], r.IntN(50)))
	}
	out = append(out, chunks("INSERT INTO t_event VALUES ", events, 40)...)
	out = append(out,
		"INSERT INTO t_config VALUES ('a', 'alpha', 1), ('b', 'beta', 2), ('c', NULL, 3), ('Ä', 'umlaut', 4), ('z', 'zulu', NULL)",
		"INSERT INTO t_region VALUES (1, 'north'), (2, 'south'), (3, 'east'), (4, 'west')")
	return out
}

func chunks(prefix string, rows []string, n int) []string {
	var out []string
	for i := 0; i < len(rows); i += n {
		out = append(out, prefix+strings.Join(rows[i:min(i+n, len(rows))], ", "))
	}
	return out
}

// Queries are the suite's read statements: every supported shape and every refused one.
func Queries() []Query {
	o := func(sql string) Query { return Query{SQL: sql, Ordered: true} }
	m := func(sql string) Query { return Query{SQL: sql} } // compared as multisets
	ot := func(sql string) Query { return Query{SQL: sql, Ordered: true, TextOrder: true} }
	mt := func(sql string) Query { return Query{SQL: sql, TextOrder: true} }
	ref := func(sql string) Query { return Query{SQL: sql, Refused: true} }
	p := func(sql string, ordered bool, params ...string) Query {
		return Query{SQL: sql, Params: P(params...), Ordered: ordered}
	}
	return []Query{
		// Point reads and key lists: one shard, or the shards the keys name.
		m("SELECT * FROM t_order WHERE order_id = 17"),
		m("SELECT * FROM t_order WHERE order_id = -7"),
		m("SELECT * FROM t_order WHERE order_id = 5000000000"),
		m("SELECT * FROM t_order WHERE order_id = 999999"),
		m("SELECT order_id, status FROM t_order WHERE 17 = order_id"),
		o("SELECT order_id, status FROM t_order WHERE order_id IN (1, 2, 3, 50, 150, 9007199254740993) ORDER BY order_id"),
		o("SELECT order_id FROM t_order WHERE order_id = 3 OR order_id = 4 ORDER BY 1"),
		m("SELECT order_id FROM t_order WHERE order_id = 3 AND order_id = 4"),
		m("SELECT order_id FROM t_order WHERE order_id IN (3, 4) AND order_id IN (4, 5)"),
		m("SELECT order_id, user_id FROM t_order WHERE order_id = 12 AND status IS NOT NULL"),
		m("SELECT * FROM t_order WHERE order_id IS NULL"),
		m("SELECT order_id FROM t_order WHERE order_id = '42'"),
		p("SELECT * FROM t_order WHERE order_id = $1", false, "17"),
		p("SELECT order_id, status FROM t_order WHERE order_id IN ($1, $2, $3) ORDER BY order_id", true, "1", "2", "200"),
		p("SELECT order_id FROM t_order WHERE order_id = $1 OR order_id = $2 ORDER BY order_id DESC", true, "-1", "0"),
		p("SELECT order_id, amount FROM t_order WHERE order_id = $1", false, "5000000000"),
		p("SELECT count(*) FROM t_order WHERE note = $1", false, ""),
		p("SELECT order_id FROM t_order WHERE note = $1 OR status = $2 ORDER BY order_id", true, "", "paid"),
		// Scans that span every shard, concatenated.
		m("SELECT order_id, user_id, status FROM t_order WHERE qty > 3"),
		// A table's whole row by its name, where the shards name it otherwise.
		m("SELECT row_to_json(t_order) FROM t_order WHERE qty > 3"),
		m("SELECT order_id FROM t_order WHERE row_to_json(t_order)->>'status' = 'paid'"),
		m("SELECT * FROM t_order WHERE status IS NULL"),
		m("SELECT order_id, amount * 2, upper(status) FROM t_order WHERE amount > 100"),
		m("SELECT order_id FROM t_order WHERE note LIKE 'p%'"),
		m("SELECT * FROM t_order WHERE user_id = 7"),
		p("SELECT order_id, qty FROM t_order WHERE qty > $1 AND user_id < $2", false, "5", "10"),
		m("SELECT order_id FROM t_order WHERE false"),
		// Aggregates without GROUP BY.
		m("SELECT count(*) FROM t_order"),
		m("SELECT count(*) FROM t_order WHERE order_id < -100"),
		m("SELECT count(status), count(*), count(qty), count(1) FROM t_order"),
		m("SELECT sum(qty), sum(amount), sum(order_id), sum(user_id::smallint) FROM t_order"),
		m("SELECT sum(qty) FROM t_order WHERE order_id < -100"),
		m("SELECT sum(amount) FROM t_order WHERE amount IS NULL"),
		m("SELECT min(amount), max(amount), min(created), max(created), min(order_id), max(order_id) FROM t_order"),
		m("SELECT min(weight), max(weight), min(qty), max(qty) FROM t_order"),
		m("SELECT avg(qty), avg(amount), avg(order_id), avg(user_id) FROM t_order"),
		m("SELECT avg(qty) FROM t_order WHERE qty IS NULL"),
		m("SELECT avg(qty::smallint), avg(amount) FROM t_order WHERE user_id < 5"),
		m("SELECT avg(price) FROM t_order_item"),
		m("SELECT sum(price), min(price), max(price), count(price) FROM t_order_item"),
		m("SELECT count(*) AS n, sum(qty) AS total, avg(amount) AS mean FROM t_order WHERE status = 'paid'"),
		m("SELECT 1 AS one, count(*) FROM t_order"),
		mt("SELECT min(status), max(status) FROM t_order"),
		mt("SELECT min(note), max(code) FROM t_order"),
		m("SELECT max(status COLLATE \"C\") FROM t_order"),
		m("SELECT count(*), min(order_id) FROM t_order WHERE order_id IN (1, 2, 3)"),
		p("SELECT count(*), sum(qty) FROM t_order WHERE user_id = $1", false, "3"),
		p("SELECT avg(amount) FROM t_order WHERE qty >= $1", false, "4"),
		// GROUP BY.
		m("SELECT user_id, count(*) FROM t_order GROUP BY user_id"),
		o("SELECT user_id, count(*), sum(amount), avg(qty), min(created), max(weight) FROM t_order GROUP BY user_id ORDER BY user_id"),
		ot("SELECT status, count(*) FROM t_order GROUP BY status ORDER BY count(*) DESC, status"),
		ot("SELECT user_id, status, count(*) FROM t_order GROUP BY user_id, status ORDER BY 1, 2 NULLS FIRST"),
		o("SELECT count(*), user_id FROM t_order GROUP BY 2 ORDER BY 2"),
		o("SELECT user_id % 3 AS bucket, sum(qty) FROM t_order GROUP BY user_id % 3 ORDER BY bucket"),
		o("SELECT user_id, max(amount) m FROM t_order GROUP BY user_id ORDER BY m DESC NULLS LAST, user_id LIMIT 5"),
		o("SELECT user_id, max(amount) m FROM t_order GROUP BY user_id ORDER BY m NULLS FIRST, user_id LIMIT 4 OFFSET 2"),
		o("SELECT qty, count(*) FROM t_order GROUP BY qty ORDER BY qty NULLS FIRST"),
		o("SELECT qty, count(*) FROM t_order GROUP BY qty ORDER BY qty DESC NULLS LAST"),
		o("SELECT created, count(*) FROM t_order WHERE created IS NOT NULL GROUP BY created ORDER BY created LIMIT 10"),
		m("SELECT status, avg(amount) FROM t_order GROUP BY status"),
		m("SELECT code, count(*) FROM t_order GROUP BY code"),
		m("SELECT user_id, qty, count(*) FROM t_order GROUP BY user_id, qty"),
		o("SELECT user_id, count(*) FROM t_order GROUP BY user_id ORDER BY count(*) DESC, user_id"),
		o("SELECT user_id, sum(qty) FROM t_order GROUP BY user_id ORDER BY sum(amount) NULLS FIRST, user_id"),
		o("SELECT user_id FROM t_order GROUP BY user_id ORDER BY avg(qty) DESC NULLS LAST, user_id"),
		o("SELECT user_id, count(*) FROM t_order WHERE order_id < 0 GROUP BY user_id ORDER BY 1"),
		// A GROUP BY name that is both a column and an output alias means the column.
		m("SELECT city AS name, count(*) FROM t_user GROUP BY city, name"),
		ot("SELECT user_id, status, count(*) FROM t_order GROUP BY user_id, status ORDER BY 1 DESC, 2 DESC NULLS LAST LIMIT 7 OFFSET 3"),
		// A set-returning function beside an aggregate: several rows from each shard.
		ref("SELECT generate_series(1, 2) AS g, count(*) FROM t_order"),
		ref("SELECT user_id, generate_series(1, 2) AS g, count(*) FROM t_order GROUP BY user_id"),
		o("SELECT weight > 500 AS heavy, count(*) FROM t_order GROUP BY weight > 500 ORDER BY 1"),
		p("SELECT user_id, count(*) FROM t_order WHERE qty > $1 GROUP BY user_id ORDER BY 1", true, "2"),
		p("SELECT user_id, sum(amount) FROM t_order GROUP BY user_id ORDER BY 2 DESC NULLS LAST, 1 LIMIT $1", true, "6"),
		// DISTINCT.
		o("SELECT DISTINCT user_id FROM t_order ORDER BY user_id"),
		m("SELECT DISTINCT qty FROM t_order"),
		mt("SELECT DISTINCT status FROM t_order ORDER BY status"),
		m("SELECT DISTINCT status FROM t_order"),
		o("SELECT DISTINCT user_id, qty FROM t_order ORDER BY 1, 2 LIMIT 10 OFFSET 3"),
		o("SELECT DISTINCT qty FROM t_order ORDER BY qty DESC NULLS FIRST LIMIT 4"),
		m("SELECT DISTINCT amount FROM t_order WHERE amount < 0"),
		o("SELECT DISTINCT count(*) FROM t_order GROUP BY user_id ORDER BY 1"),
		// ORDER BY, LIMIT and OFFSET: a merge of sorted streams.
		o("SELECT order_id, amount FROM t_order ORDER BY amount DESC NULLS LAST, order_id LIMIT 7"),
		o("SELECT order_id FROM t_order ORDER BY order_id LIMIT 5 OFFSET 10"),
		o("SELECT order_id FROM t_order ORDER BY order_id DESC OFFSET 240"),
		o("SELECT order_id FROM t_order ORDER BY order_id LIMIT 0"),
		o("SELECT order_id FROM t_order ORDER BY order_id LIMIT ALL"),
		o("SELECT order_id FROM t_order ORDER BY order_id OFFSET 1000"),
		o("SELECT order_id FROM t_order ORDER BY order_id FETCH FIRST 3 ROWS ONLY"),
		o("SELECT order_id, created FROM t_order ORDER BY created NULLS FIRST, order_id"),
		o("SELECT order_id, created FROM t_order ORDER BY created DESC, order_id DESC"),
		o("SELECT order_id, weight FROM t_order ORDER BY weight, order_id"),
		o("SELECT * FROM t_order ORDER BY order_id"),
		o("SELECT * FROM t_order ORDER BY user_id DESC, order_id LIMIT 20"),
		o("SELECT t_order.* FROM t_order ORDER BY 1 LIMIT 3"),
		o("SELECT order_id AS id, qty FROM t_order ORDER BY id"),
		o("SELECT order_id, qty FROM t_order ORDER BY qty * -1 NULLS LAST, order_id"),
		o("SELECT order_id FROM t_order ORDER BY amount, order_id"),
		o("SELECT order_id, amount FROM t_order WHERE amount IS NOT NULL ORDER BY amount, order_id DESC LIMIT 12"),
		ot("SELECT order_id, status FROM t_order ORDER BY status, order_id"),
		ot("SELECT order_id, status FROM t_order ORDER BY status DESC NULLS LAST, order_id LIMIT 15"),
		ot("SELECT order_id, note FROM t_order ORDER BY note NULLS FIRST, order_id"),
		ot("SELECT order_id, code FROM t_order ORDER BY code, order_id"),
		ot("SELECT order_id FROM t_order ORDER BY lower(status), order_id LIMIT 9"),
		o("SELECT order_id, note FROM t_order ORDER BY note COLLATE \"C\", order_id"),
		o("SELECT order_id, status FROM t_order ORDER BY status COLLATE \"C\" DESC, order_id LIMIT 11"),
		// A COLLATE clause the merge cannot place: the sort key's collation is a subquery's.
		ref("SELECT order_id, k FROM (SELECT order_id, status COLLATE \"C\" AS k FROM t_order) s ORDER BY k, order_id"),
		p("SELECT order_id FROM t_order ORDER BY order_id LIMIT $1 OFFSET $2", true, "5", "3"),
		p("SELECT order_id, amount FROM t_order WHERE amount > $1 ORDER BY amount, order_id LIMIT $2", true, "1000", "4"),
		p("SELECT order_id FROM t_order ORDER BY order_id DESC LIMIT $1", true, "3"),
		// Bound tables joined on the sharding key; broadcast tables anywhere.
		o("SELECT o.order_id, i.item_id, i.sku FROM t_order o JOIN t_order_item i ON o.order_id = i.order_id WHERE o.order_id = 12 ORDER BY 2"),
		o("SELECT o.order_id, count(i.item_id) FROM t_order o LEFT JOIN t_order_item i ON o.order_id = i.order_id GROUP BY o.order_id ORDER BY o.order_id"),
		o("SELECT o.user_id, sum(i.price * i.qty) FROM t_order o JOIN t_order_item i USING (order_id) GROUP BY o.user_id ORDER BY 1"),
		m("SELECT o.order_id, i.item_id FROM t_order o, t_order_item i WHERE o.order_id = i.order_id AND i.qty > 3"),
		o("SELECT i.order_id, i.item_id, o.status FROM t_order_item i JOIN t_order o ON i.order_id = o.order_id WHERE i.order_id IN (5, 6, 7) ORDER BY 1, 2"),
		m("SELECT o.order_id, c.v FROM t_order o JOIN t_config c ON c.n = o.qty"),
		o("SELECT c.k, count(*) FROM t_order o JOIN t_config c ON c.n = o.qty GROUP BY c.k ORDER BY 2, c.k COLLATE \"C\""),
		m("SELECT o.order_id, c.k FROM t_order o LEFT JOIN t_config c ON c.n = o.qty WHERE o.user_id = 5"),
		o("SELECT * FROM t_config ORDER BY k"),
		o("SELECT k, v FROM t_config WHERE n > 1 ORDER BY v NULLS FIRST"),
		o("SELECT * FROM t_region ORDER BY region_id"),
		m("SELECT count(*) FROM t_config"),
		m("SELECT 1"),
		m("SELECT now() IS NOT NULL"),
		// Subqueries: pinned, correlated on the key, or over copied tables.
		m("SELECT order_id FROM t_order WHERE order_id = 5 AND EXISTS (SELECT 1 FROM t_order_item i WHERE i.order_id = t_order.order_id)"),
		o("SELECT order_id FROM t_order o WHERE EXISTS (SELECT 1 FROM t_order_item i WHERE i.order_id = o.order_id AND i.qty > 2) ORDER BY 1"),
		o("SELECT order_id, (SELECT count(*) FROM t_order_item i WHERE i.order_id = o.order_id) AS items FROM t_order o ORDER BY 1"),
		o("SELECT order_id FROM t_order o WHERE NOT EXISTS (SELECT 1 FROM t_order_item i WHERE i.order_id = o.order_id) ORDER BY 1 LIMIT 20"),
		m("SELECT order_id FROM t_order WHERE qty IN (SELECT n FROM t_config)"),
		m("SELECT order_id FROM t_order WHERE order_id = 8 AND user_id IN (SELECT user_id FROM t_order WHERE order_id = 8)"),
		o("SELECT x.order_id FROM (SELECT order_id FROM t_order WHERE qty = 2) x ORDER BY 1"),
		Query{SQL: "SELECT order_id FROM t_order WHERE order_id = 1 UNION ALL SELECT order_id FROM t_order WHERE order_id = 1"},
		Query{SQL: "SELECT order_id FROM t_order WHERE order_id = 1 UNION SELECT order_id FROM t_order WHERE order_id = 2", MayRefuse: true},
		Query{SQL: "SELECT o.order_id, u.name FROM t_order o JOIN t_user u ON u.user_id = 3 WHERE o.order_id = 3", MayRefuse: true},
		// Range sharding: BETWEEN and comparisons route to the overlapping shards.
		o("SELECT * FROM t_event WHERE event_id BETWEEN 100 AND 250 ORDER BY event_id"),
		m("SELECT count(*), sum(v) FROM t_event WHERE event_id >= 300"),
		o("SELECT event_id FROM t_event WHERE event_id < 100 ORDER BY 1"),
		o("SELECT event_id FROM t_event WHERE event_id > 150 AND event_id <= 301 ORDER BY 1 DESC"),
		o("SELECT kind, count(*), avg(v) FROM t_event GROUP BY kind ORDER BY kind COLLATE \"C\""),
		m("SELECT * FROM t_event WHERE event_id = 150"),
		// Window functions, HAVING and the like are exact on one shard.
		m("SELECT order_id, row_number() OVER (ORDER BY order_id) FROM t_order WHERE order_id = 9"),
		m("SELECT user_id, count(*) FROM t_order WHERE order_id = 9 GROUP BY user_id HAVING count(*) > 0"),
		m("SELECT count(DISTINCT user_id) FROM t_order WHERE order_id IN (9)"),
		m("SELECT string_agg(sku, ',' ORDER BY item_id) FROM t_order_item WHERE order_id = 10"),

		// Refused: what a merge cannot answer exactly.
		ref("SELECT order_id, row_number() OVER (ORDER BY order_id) FROM t_order"),
		ref("SELECT user_id, count(*) FROM t_order GROUP BY user_id HAVING count(*) > 3"),
		ref("SELECT count(DISTINCT user_id) FROM t_order"),
		ref("SELECT string_agg(status, ',') FROM t_order"),
		ref("SELECT sum(qty) + 1 FROM t_order"),
		ref("SELECT coalesce(max(qty), 0) FROM t_order"),
		ref("SELECT sum(weight) FROM t_order"),
		ref("SELECT avg(weight) FROM t_order"),
		ref("SELECT o.order_id, u.name FROM t_order o JOIN t_user u ON o.user_id = u.user_id"),
		ref("SELECT order_id FROM t_order UNION SELECT user_id FROM t_user"),
		ref("SELECT o.order_id FROM t_order o JOIN t_order_item i ON o.user_id = i.qty"),
		ref("SELECT DISTINCT ON (user_id) user_id, order_id FROM t_order ORDER BY user_id, order_id"),
		ref("SELECT user_id, count(*) FROM t_order GROUP BY ROLLUP (user_id)"),
		ref("SELECT order_id FROM t_order ORDER BY order_id LIMIT 3 + 1"),
		{SQL: "SELECT r.name FROM t_region r JOIN t_order o ON o.user_id = r.region_id", Refused: true, OtherDatabase: true},
		ref("SELECT count(*) FILTER (WHERE qty > 2) FROM t_order"),
		ref("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY qty) FROM t_order"),
		ref("SELECT order_id FROM t_order ORDER BY user_id FETCH FIRST 3 ROWS WITH TIES"),
		ref("SELECT order_id FROM t_order WHERE user_id = (SELECT max(user_id) FROM t_user)"),
		ref("SELECT c.k, o.order_id FROM t_config c LEFT JOIN t_order o ON o.qty = c.n"),
		ref("SELECT array_agg(order_id) FROM t_order"),
		ref("SELECT max(qty) - min(qty) FROM t_order"),
		ref("SELECT user_id, count(*) FROM t_order GROUP BY CUBE (user_id, qty)"),
		ref("SELECT order_id, sum(qty) OVER (PARTITION BY user_id) FROM t_order"),
		ref("SELECT * FROM t_user u WHERE u.user_id IN (SELECT user_id FROM t_order)"),
		ref("SELECT bool_and(qty > 0) FROM t_order"),
		// No aggregate inside, count(*) outside: each joined row counts (the coordinator
		// does not group the inner join's rows on the shards).
		ref("SELECT count(*), count(DISTINCT city) FROM (SELECT u.city FROM t_user u JOIN t_order o ON o.user_id = u.user_id JOIN t_order_item i ON i.order_id = o.order_id) s"),
		// A condition the deparser would print without its parentheses (reading
		// otherwise): refused where the tables are renamed, else sent as written.
		{SQL: "SELECT order_id FROM t_order WHERE (NOT amount > 100) IS NULL", MayRefuse: true},
	}
}

// Writes are the suite's write statements, run in order on both sides; after them
// every table must hold the same rows.
func Writes() []Query {
	w := func(sql string) Query { return Query{SQL: sql} }
	ref := func(sql string) Query { return Query{SQL: sql, Refused: true} }
	return []Query{
		w("UPDATE t_order SET qty = qty + 1 WHERE status = 'paid'"),
		w("UPDATE t_order SET status = 'touched' WHERE order_id = 9 RETURNING order_id, status"),
		w("DELETE FROM t_order_item WHERE qty = 1"),
		{SQL: "INSERT INTO t_order (order_id, user_id, status, amount) VALUES (100001, 3, 'new', 1.50), (100002, 4, 'new', 2.25), (100003, 5, NULL, NULL), (100004, 6, 'x', 0) RETURNING order_id, amount", Ordered: true},
		{SQL: "INSERT INTO t_order (order_id, user_id, status) VALUES ($1, $2, $3), ($4, $5, $6) RETURNING *", Params: P("200001", "1", "p1", "200002", "2", "p2"), Ordered: true},
		w("INSERT INTO t_order (order_id, user_id, qty) VALUES (100001, 3, 7) ON CONFLICT (order_id) DO UPDATE SET qty = EXCLUDED.qty"),
		w("INSERT INTO t_order_item VALUES (100001, 1, 'new-sku', 2, 9.990)"),
		w("UPDATE t_config SET v = 'changed' WHERE k = 'a'"),
		w("INSERT INTO t_config VALUES ('new', 'copied', 9)"),
		w("DELETE FROM t_order WHERE order_id IN (100002, 100003)"),
		w("UPDATE t_order SET order_id = 100004 WHERE order_id = 100004"),
		w("UPDATE t_event SET v = v + 100 WHERE event_id BETWEEN 140 AND 160"),
		w("DELETE FROM t_region WHERE region_id = 4"),
		w("UPDATE t_user SET score = score + 1 WHERE user_id = 3"),
		// Refused where the tables are renamed (see Queries), else sent as written; it
		// writes what was there, so that a refusal leaves the tables equal.
		{SQL: "UPDATE t_order SET note = note WHERE order_id = 11 AND (status = 'paid' OR qty > 1) IS NOT NULL RETURNING order_id", MayRefuse: true},
		ref("INSERT INTO t_order (user_id, status) VALUES (1, 'no key')"),
		ref("UPDATE t_order SET order_id = order_id + 1 WHERE order_id = 5"),
		ref("UPDATE t_order SET order_id = 7 WHERE order_id > 5"),
		// Answered through the proxy (a duplicate key, as on one database), refused
		// through the driver; either way nothing is written.
		{SQL: "INSERT INTO t_order SELECT * FROM t_order WHERE order_id = 1", MayRefuse: true},
		ref("CREATE UNIQUE INDEX ON t_order (user_id)"),
		// The wire proxy counts first, then writes the count to every copy.
		{SQL: "UPDATE t_config SET n = (SELECT count(*) FROM t_order)", Refused: true, InSteps: true},
		{SQL: "DELETE FROM t_order_item WHERE order_id IN (SELECT order_id FROM t_order WHERE status = 'paid' AND qty > 2)", Refused: true, InSteps: true},
		// A semi-join written with EXISTS: in steps, the subquery made one that reads
		// no column of the statement; refused where nothing evaluates it first.
		{SQL: "UPDATE t_order o SET note = 'has user' WHERE o.qty > 1 AND EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = o.user_id AND u.score > 10) RETURNING o.order_id, o.note", Refused: true, InSteps: true},
		// NOT EXISTS, over columns with NULLs on both sides.
		{SQL: "DELETE FROM t_order o WHERE o.order_id > 20 AND NOT EXISTS (SELECT 1 FROM t_user u WHERE u.score = o.qty) RETURNING o.order_id", Refused: true, InSteps: true},
		// Correlated otherwise than by one equality: the columns the subquery reads
		// first, then the subquery over them (sqlplan.SubqueryColumns).
		{SQL: "UPDATE t_order o SET note = (SELECT u.name FROM t_user u WHERE u.user_id = o.user_id AND u.score > 3) WHERE o.qty > 2 RETURNING o.order_id, o.note", Refused: true, InSteps: true},
		{SQL: "DELETE FROM t_order_item i WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = i.item_id AND u.score < i.qty) RETURNING i.order_id, i.item_id", Refused: true, InSteps: true},
		{SQL: "UPDATE t_user u SET score = (SELECT count(*) + sum(o.qty) FROM t_order o WHERE o.user_id = u.user_id AND o.status IS NOT NULL) WHERE u.user_id < 6 RETURNING u.user_id, u.score", Refused: true, InSteps: true},
		{SQL: "DELETE FROM t_order_item i USING t_user u WHERE u.user_id = i.item_id AND u.score > i.qty AND u.city IS NOT NULL RETURNING i.order_id, i.item_id", Refused: true, InSteps: true},
		{SQL: "UPDATE t_order o SET note = 'lonely' WHERE o.order_id < 40 AND o.qty NOT IN (SELECT u.score FROM t_user u WHERE u.city <> o.status) RETURNING o.order_id", Refused: true, InSteps: true},
		// The latest row (ORDER BY a unique key, LIMIT), sorted by the statement.
		{SQL: "UPDATE t_order o SET note = (SELECT u.name FROM t_user u WHERE u.score > o.qty ORDER BY u.user_id DESC LIMIT 1) WHERE o.order_id < 30 RETURNING o.order_id, o.note", Refused: true, InSteps: true},
		// UPDATE ... FROM whose SET list reads the other table: over its rows read
		// first, in the statement's FROM; values computed over a subquery's tables.
		{SQL: "UPDATE t_order o SET note = u.name || ':' || o.status FROM t_user u WHERE u.user_id = o.user_id AND u.score > 3 AND o.qty > 2 RETURNING o.order_id, o.note", Refused: true, InSteps: true},
		{SQL: "UPDATE t_user u SET score = (SELECT sum(o.qty * 2) + count(DISTINCT o.status || 'x') FROM t_order o WHERE o.user_id = u.user_id) WHERE u.user_id < 6 RETURNING u.user_id, u.score", Refused: true, InSteps: true},
		// PostgreSQL's functions over a subquery's aggregates, over its rows (computed
		// first), and in its ORDER BY.
		{SQL: "UPDATE t_user u SET score = (SELECT round(avg(o.qty)) + coalesce(length(u.name), 0) FROM t_order o WHERE o.user_id = u.user_id) WHERE u.user_id < 8 RETURNING u.user_id, u.score", Refused: true, InSteps: true},
		{SQL: "UPDATE t_order o SET note = (SELECT upper(u.name) FROM t_user u WHERE u.score < o.order_id ORDER BY u.score % 10, lower(u.name) DESC LIMIT 1) WHERE o.order_id < 60 RETURNING o.order_id, o.note", Refused: true, InSteps: true},
		// Grouped: HAVING over aggregates and group keys; a group key selected.
		{SQL: "UPDATE t_user u SET city = (SELECT max(o.status) FROM t_order o WHERE o.user_id = u.user_id GROUP BY o.user_id HAVING count(*) >= 2) WHERE u.user_id < 10 RETURNING u.user_id, u.city", Refused: true, InSteps: true},
		{SQL: "DELETE FROM t_order_item i WHERE i.qty IN (SELECT o.qty FROM t_order o WHERE o.user_id <= i.item_id GROUP BY o.qty HAVING count(*) > 1) RETURNING i.order_id, i.item_id", Refused: true, InSteps: true},
		ref("ALTER TABLE t_order ADD CONSTRAINT u_status UNIQUE (status)"),
		ref("INSERT INTO t_order (order_id, user_id) VALUES (DEFAULT, 1)"),
	}
}

// Random returns n random queries from a seeded generator, within the supported
// grammar and with a total order (or none, compared as multisets).
func Random(seed uint64, n int) []Query {
	r := rand.New(rand.NewPCG(seed, 0xd1ff))
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	var out []Query
	for range n {
		var where []string
		for range r.IntN(3) {
			where = append(where, pick(
				fmt.Sprintf("order_id = %d", r.IntN(250)),
				fmt.Sprintf("order_id IN (%d, %d, %d)", r.IntN(250), r.IntN(250), r.IntN(250)),
				fmt.Sprintf("qty > %d", r.IntN(8)),
				fmt.Sprintf("amount < %d", r.IntN(3000)),
				fmt.Sprintf("user_id BETWEEN %d AND %d", r.IntN(10), 10+r.IntN(20)),
				"status IS NOT NULL", "created > '2010-01-01'", "weight IS NULL",
				fmt.Sprintf("(order_id < %d OR qty = %d)", r.IntN(100), r.IntN(5)),
			))
		}
		w := ""
		if len(where) > 0 {
			w = " WHERE " + strings.Join(where, " AND ")
		}
		q := Query{}
		switch r.IntN(3) {
		case 0: // rows, ordered by a unique key
			cols := pick("order_id, qty", "order_id, amount, created", "*", "order_id, user_id, weight")
			dir := pick("", " DESC")
			lead := pick("", "qty NULLS FIRST, ", "amount DESC NULLS LAST, ", "created, ", "user_id DESC, ")
			q.SQL = "SELECT " + cols + " FROM t_order" + w + " ORDER BY " + lead + "order_id" + dir
			if r.IntN(2) == 0 {
				q.SQL += fmt.Sprintf(" LIMIT %d", r.IntN(20))
				if r.IntN(2) == 0 {
					q.SQL += fmt.Sprintf(" OFFSET %d", r.IntN(30))
				}
			}
			q.Ordered = true
		case 1: // grouped aggregates
			key := pick("user_id", "qty", "user_id % 4", "created IS NULL")
			aggs := pick("count(*)", "count(*), sum(amount)", "avg(qty), max(created)", "min(amount), avg(amount), count(qty)", "sum(qty), avg(order_id)")
			q.SQL = "SELECT " + key + ", " + aggs + " FROM t_order" + w + " GROUP BY " + key + " ORDER BY 1 NULLS FIRST"
			q.Ordered = true
		default: // plain aggregates, or distinct values
			if r.IntN(2) == 0 {
				q.SQL = "SELECT " + pick("count(*)", "sum(qty), min(order_id)", "avg(amount), max(weight)", "count(note), min(created)") + " FROM t_order" + w
			} else {
				q.SQL = "SELECT DISTINCT " + pick("qty", "user_id", "created") + " FROM t_order" + w
			}
		}
		out = append(out, q)
	}
	return out
}

// ShardAggregatedJoins are coordinated statements that aggregate sharded tables under
// inner joins: each shard joins the aggregated tables with those bound to them on the
// sharding key and aggregates their rows, grouped by every column the coordinator
// reads of them; the coordinator joins the groups with the other tables.
func ShardAggregatedJoins() []Query {
	return []Query{
		{SQL: `SELECT o.status, count(*), sum(i.qty), round(avg(i.price), 2) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id GROUP BY o.status HAVING count(*) > 0 ORDER BY o.status COLLATE "C" NULLS FIRST`, Ordered: true},
		{SQL: `SELECT status, sum(price) + 0, count(DISTINCT i.qty) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id WHERE amount > 0 GROUP BY status ORDER BY status COLLATE "C" NULLS FIRST`, Ordered: true},
		{SQL: `SELECT u.city, sum(i.price) AS revenue, max(o.status), count(DISTINCT o.code) FROM t_user u, t_order o, t_order_item i WHERE u.user_id = o.user_id AND i.order_id = o.order_id AND u.score > 10 GROUP BY u.city ORDER BY revenue DESC NULLS LAST, u.city COLLATE "C" NULLS FIRST`, Ordered: true},
		{SQL: `SELECT o.order_id, sum(i.price * i.qty) AS rev, o.created FROM t_user u, t_order o, t_order_item i WHERE u.user_id = o.user_id AND i.order_id = o.order_id AND u.city IS NOT NULL AND i.qty > $1 GROUP BY o.order_id, o.created ORDER BY rev DESC NULLS LAST, o.created, o.order_id LIMIT 10`, Params: P("1"), Ordered: true},
		{SQL: `SELECT c.v, max(o.amount), count(o.qty) + 0 FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_config c ON c.n = i.qty GROUP BY c.v ORDER BY c.v COLLATE "C" NULLS FIRST`, Ordered: true},
		{SQL: `SELECT count(*) + 0, sum(a.amount) FROM t_order a JOIN t_order b ON a.order_id = b.order_id WHERE b.status IS NOT NULL`},
		{SQL: `SELECT u.city, sum(i.qty) * 1, avg(i.price * (1 - o.amount)) FROM t_user u JOIN t_order o ON o.user_id < u.user_id AND u.score > 50 JOIN t_order_item i ON i.order_id = o.order_id GROUP BY u.city ORDER BY u.city COLLATE "C" NULLS FIRST`, Ordered: true},
		// No row of the bound tables: no group per city, and one row without GROUP BY.
		{SQL: `SELECT u.city, sum(i.qty) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id, t_user u WHERE o.status = 'none' GROUP BY u.city`},
		{SQL: `SELECT sum(i.qty), count(*) * 1, max(o.status) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id, t_user u WHERE o.status = 'none'`},
		{SQL: `SELECT count(*) * 1, sum(i.qty) FROM t_order o CROSS JOIN t_config c JOIN t_order_item i ON i.order_id = o.order_id WHERE c.n > 2`},
		// Only count(*): the bound tables aggregate on the shards.
		{SQL: `SELECT u.city, count(*) FROM t_user u JOIN t_order o ON o.user_id = u.user_id JOIN t_order_item i ON i.order_id = o.order_id GROUP BY u.city ORDER BY u.city COLLATE "C" NULLS FIRST`, Ordered: true},
		{SQL: `SELECT count(*) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_user u ON u.user_id = o.user_id WHERE u.score > 10`},
	}
}

// ShardAggregatedWithin are coordinated statements that read the groups of SELECTs
// within them that aggregate sharded tables and read no column of a query around them
// (common table expressions, subqueries in FROM, arms of a set operation): each such
// SELECT aggregates on the shards as a statement would.
func ShardAggregatedWithin() []Query {
	return []Query{
		{SQL: `WITH per_user AS (SELECT user_id, count(*) AS n FROM t_order GROUP BY user_id) SELECT n, count(*) FROM per_user GROUP BY n ORDER BY n`, Ordered: true},
		{SQL: `SELECT s.status, s.total, c.v FROM (SELECT status, sum(qty) AS total FROM t_order GROUP BY status) s LEFT JOIN t_config c ON c.n = s.total ORDER BY s.status COLLATE "C" NULLS FIRST, c.v COLLATE "C"`, Ordered: true},
		{SQL: `SELECT count(*) AS n FROM t_order UNION ALL SELECT count(*) FROM t_user UNION ALL SELECT count(*) FROM t_order_item`},
		{SQL: `WITH a AS (SELECT user_id, sum(amount) AS spent FROM t_order WHERE qty > $1 GROUP BY user_id), b AS (SELECT city, user_id FROM t_user) SELECT b.city, max(a.spent), count(*) FROM a JOIN b USING (user_id) GROUP BY b.city ORDER BY b.city COLLATE "C" NULLS FIRST`, Params: P("1"), Ordered: true},
		{SQL: `SELECT avg(n), max(n) FROM (SELECT o.user_id, count(i.qty) AS n FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id GROUP BY o.user_id) s`},
		// Over no rows: one row of the aggregates, none of the groups.
		{SQL: `WITH e AS (SELECT max(amount) AS m, count(*) AS c FROM t_order WHERE qty < -100), g AS (SELECT status FROM t_order WHERE qty < -100 GROUP BY status) SELECT m IS NULL, c, (SELECT count(*) FROM g) FROM e`},
		{SQL: `SELECT status FROM t_order GROUP BY status HAVING count(*) > 1 EXCEPT SELECT city FROM t_user GROUP BY city`},
	}
}

// ShardAggregated are coordinated statements that aggregate one sharded table: each
// shard aggregates its own rows and the coordinator combines one row per group per
// shard (sqlplan.Options.ShardAggregates).
func ShardAggregated() []Query {
	return []Query{
		{SQL: `SELECT coalesce(sum(amount), 0) FROM t_order`},
		{SQL: `SELECT sum(order_id) + 1, count(*)::int, round(avg(amount), 2), avg(qty), min(note), max(created) FROM t_order`},
		{SQL: `SELECT count(weight) * 2, max(weight) FROM t_order`},
		{SQL: `SELECT status, count(*), sum(qty) FILTER (WHERE qty > 2), avg(amount), avg(order_id) FROM t_order GROUP BY status HAVING count(*) > 1 ORDER BY status COLLATE "C" NULLS FIRST`, Ordered: true},
		{SQL: `SELECT o.user_id, max(o.amount) - min(o.amount) AS spread FROM t_order o WHERE o.qty > $1 GROUP BY o.user_id ORDER BY spread DESC NULLS LAST, 1 LIMIT 5`, Params: P("1"), Ordered: true},
		{SQL: `SELECT DISTINCT code FROM t_order GROUP BY status, code HAVING count(*) > 0 ORDER BY 1 NULLS FIRST`, Ordered: true},
		{SQL: `SELECT sum(qty) * 2, avg(amount), count(*) - 1, max(status) FROM t_order WHERE qty < -100`},
		{SQL: `SELECT status, avg(qty) FROM t_order GROUP BY status HAVING avg(qty) > 1 ORDER BY avg(qty) DESC NULLS LAST, status COLLATE "C" NULLS FIRST`, Ordered: true},
		{SQL: `SELECT city, count(*) * 10, sum(score) FROM t_user WHERE score > 0 GROUP BY city ORDER BY 1 NULLS FIRST`, Ordered: true},
		{SQL: `SELECT CASE WHEN count(*) > 1000 THEN 0 ELSE count(*) END, count(*)::int, sum(qty) FILTER (WHERE status = 'paid') FROM t_order`},
		{SQL: `SELECT DISTINCT count(*) + 0 FROM t_order GROUP BY status HAVING count(*) > 0 ORDER BY count(*) + 0`, Ordered: true},
		{SQL: `SELECT count(DISTINCT status) FROM t_order`},
		{SQL: `SELECT status, count(DISTINCT code), min(DISTINCT code), count(*), sum(qty) FROM t_order GROUP BY status ORDER BY status COLLATE "C" NULLS FIRST`, Ordered: true},
		{SQL: `SELECT sum(DISTINCT qty), avg(DISTINCT qty), count(DISTINCT qty), max(amount) FROM t_order`},
		{SQL: `SELECT count(DISTINCT user_id), count(*), sum(qty), avg(amount) FROM t_order WHERE qty < -100`},
		{SQL: `SELECT qty / 2 AS h, count(*), sum(amount) FROM t_order GROUP BY 1 HAVING count(*) > 0 ORDER BY 1 NULLS FIRST`, Ordered: true},
		{SQL: `SELECT lower(status), count(*) + 0, max(code) FROM t_order GROUP BY lower(status) ORDER BY lower(status) COLLATE "C" NULLS FIRST`, Ordered: true},
		{SQL: `SELECT qty % 3 AS r, count(DISTINCT user_id), max(amount) FROM t_order GROUP BY qty % 3 HAVING qty % 3 IS NOT NULL ORDER BY r`, Ordered: true},
	}
}
