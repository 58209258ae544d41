package sqlplan

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/shardlab/shardlab/rules"
)

func shardAggRules(t testing.TB) *rules.Compiled {
	t.Helper()
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: "postgres://a/x"}, {Name: "ds_1", DSN: "postgres://b/x"}},
		Tables: []rules.Table{
			{Name: "t_order", Strategy: rules.Strategy{Column: "order_id", Type: rules.TypeInt8}, TablesPerDataSource: 2},
			{Name: "t_order_item", Strategy: rules.Strategy{Column: "order_id", Type: rules.TypeInt8}, TablesPerDataSource: 2},
			{Name: "t_user", Strategy: rules.Strategy{Column: "user_id", Type: rules.TypeInt4}},
		},
		Bindings:  [][]string{{"t_order", "t_order_item"}},
		Broadcast: []string{"t_config"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// shardAggCatalog is what the planner would read of shardAggRules' tables.
func shardAggCatalog() *joinCatalog {
	return &joinCatalog{columns: map[string]map[string]string{
		"t_order":      {"order_id": "bigint", "user_id": "integer", "amount": "numeric(12,2)", "status": "text"},
		"t_order_item": {"order_id": "bigint", "item_id": "integer", "qty": "integer", "price": "numeric(10,3)"},
		"t_user":       {"user_id": "integer", "city": "text", "age": "integer", "name": "text"},
		"t_config":     {"k": "text", "v": "text", "n": "integer"},
	}}
}

// TestShardAggregatesRewrites: which statements aggregate on the shards, and what the
// coordinator then runs.
func TestShardAggregatesRewrites(t *testing.T) {
	r := shardAggRules(t)
	rewritten := []struct{ sql, want string }{
		{`SELECT coalesce(sum(amount), 0) FROM t_order`,
			`SELECT COALESCE(shardlab_merge.sum(__sl_tp1), 0) AS "coalesce" FROM (((SELECT sum(amount) AS __sl_tp1 FROM shardlab_shards."t_order/0" t_order UNION ALL ` +
				`SELECT sum(amount) AS __sl_tp1 FROM shardlab_shards."t_order/1" t_order) UNION ALL SELECT sum(amount) AS __sl_tp1 FROM shardlab_shards."t_order/2" t_order) UNION ALL ` +
				`SELECT sum(amount) AS __sl_tp1 FROM shardlab_shards."t_order/3" t_order) t_order`},
		{`SELECT count(*) FROM t_user`,
			`SELECT shardlab_merge.count(__sl_tp1) AS count FROM (SELECT count(*) AS __sl_tp1 FROM shardlab_shards."t_user/0" t_user UNION ALL SELECT count(*) AS __sl_tp1 FROM shardlab_shards."t_user/1" t_user) t_user`},
		{`SELECT u.city, round(avg(u.age), 2) FROM t_user u WHERE u.age > $1 GROUP BY u.city HAVING max(age) FILTER (WHERE age < 90) > 3 ORDER BY count(*) DESC, 1 LIMIT 5`,
			`SELECT u.city AS city, round(shardlab_merge.avg(shardlab_merge.sum(__sl_tp1), shardlab_merge.count(__sl_tp2)), 2) AS round FROM (` +
				`SELECT u.city AS city, sum(u.age) AS __sl_tp1, count(u.age) AS __sl_tp2, count(*) AS __sl_tp3, max(age) FILTER (WHERE age < 90) AS __sl_tp4 FROM shardlab_shards."t_user/0" u WHERE u.age > $1 GROUP BY u.city UNION ALL ` +
				`SELECT u.city AS city, sum(u.age) AS __sl_tp1, count(u.age) AS __sl_tp2, count(*) AS __sl_tp3, max(age) FILTER (WHERE age < 90) AS __sl_tp4 FROM shardlab_shards."t_user/1" u WHERE u.age > $1 GROUP BY u.city) u ` +
				`GROUP BY u.city HAVING max(__sl_tp4) > 3 ORDER BY shardlab_merge.count(__sl_tp3) DESC, 1 LIMIT 5`},
		{`EXPLAIN SELECT DISTINCT city FROM t_user GROUP BY city`, ""},
		// Named as one database names them: count, not sum.
		{`SELECT CASE WHEN false THEN 0 ELSE count(*) END, count(*)::int, max(age) FROM t_user`,
			`SELECT CASE WHEN false THEN 0 ELSE shardlab_merge.count(__sl_tp1) END AS count, shardlab_merge.count(__sl_tp1)::int AS count, max(__sl_tp2) AS max FROM (` +
				`SELECT count(*) AS __sl_tp1, max(age) AS __sl_tp2 FROM shardlab_shards."t_user/0" t_user UNION ALL SELECT count(*) AS __sl_tp1, max(age) AS __sl_tp2 FROM shardlab_shards."t_user/1" t_user) t_user`},
		// Aggregates over DISTINCT values: each shard groups by the value too.
		{`SELECT city, count(DISTINCT age), sum(DISTINCT age) + 1, count(*) FROM t_user GROUP BY city`,
			`SELECT city AS city, count(DISTINCT __sl_td1) AS count, sum(DISTINCT __sl_td1) + 1 AS "?column?", shardlab_merge.count(__sl_tp2) AS count FROM (` +
				`SELECT city AS city, age AS __sl_td1, count(*) AS __sl_tp2 FROM shardlab_shards."t_user/0" t_user GROUP BY city, age UNION ALL ` +
				`SELECT city AS city, age AS __sl_td1, count(*) AS __sl_tp2 FROM shardlab_shards."t_user/1" t_user GROUP BY city, age) t_user GROUP BY city`},
		// Positions and expressions in GROUP BY: the branches group by them and send
		// them as hidden columns, which the coordinator reads where the statement
		// writes them alike.
		{`SELECT city, count(*) FROM t_user GROUP BY 1`,
			`SELECT city AS city, shardlab_merge.count(__sl_tp1) AS count FROM (SELECT city AS city, count(*) AS __sl_tp1 FROM shardlab_shards."t_user/0" t_user GROUP BY city UNION ALL ` +
				`SELECT city AS city, count(*) AS __sl_tp1 FROM shardlab_shards."t_user/1" t_user GROUP BY city) t_user GROUP BY city`},
		{`SELECT age / 10 AS decade, count(*), max(city) FROM t_user GROUP BY 1 HAVING age / 10 > 1 ORDER BY decade`,
			`SELECT __sl_tg1 AS decade, shardlab_merge.count(__sl_tp1) AS count, max(__sl_tp2) AS max FROM (` +
				`SELECT age / 10 AS __sl_tg1, count(*) AS __sl_tp1, max(city) AS __sl_tp2 FROM shardlab_shards."t_user/0" t_user GROUP BY age / 10 UNION ALL ` +
				`SELECT age / 10 AS __sl_tg1, count(*) AS __sl_tp1, max(city) AS __sl_tp2 FROM shardlab_shards."t_user/1" t_user GROUP BY age / 10) t_user GROUP BY __sl_tg1 HAVING __sl_tg1 > 1 ORDER BY decade`},
		{`SELECT lower(city), count(*) FROM t_user GROUP BY lower(city) ORDER BY lower(city)`, ""},
		// An aggregate written twice shares its partial, so that ORDER BY matches it.
		{`SELECT DISTINCT count(*) + 0 FROM t_user GROUP BY city ORDER BY count(*) + 0`, ""},
	}
	for _, c := range rewritten {
		got, ok := shardAggregates(r, c.sql, shardAggCatalog())
		if !ok {
			t.Errorf("not rewritten: %s", c.sql)
			continue
		}
		if _, err := pg.Parse(got); err != nil {
			t.Errorf("rewritten %s into what does not parse: %s: %v", c.sql, got, err)
		}
		if strings.Contains(c.sql, "DISTINCT count(*)") && strings.Count(got, "count(*) AS") != 2 {
			t.Errorf("the partial of count(*) is not shared: %s", got)
		}
		if c.want != "" && got != c.want {
			t.Errorf("%s\n got %s\nwant %s", c.sql, got, c.want)
		}
	}
	// Each exact only as written, or not rewritten for a reason of its own.
	for _, sql := range []string{
		`SELECT count(DISTINCT city) FILTER (WHERE user_id > 1) FROM t_user`,                   // DISTINCT with FILTER
		`SELECT count(DISTINCT 1), count(*) + 1 FROM t_user`,                                   // a constant would group by position
		`SELECT count(DISTINCT NULL) + 1 FROM t_user`,                                          // or fail to group
		`SELECT sum(DISTINCT (random()*9)::int) - sum(DISTINCT (random()*9)::int) FROM t_user`, // volatile, written twice
		`SELECT string_agg(DISTINCT city, ',') FROM t_user`,                                    // another aggregate over DISTINCT
		`SELECT string_agg(city, ',' ORDER BY city) FROM t_user`,                               // another aggregate
		`SELECT sum(age) OVER () FROM t_user`,                                                  // window
		`SELECT count(*) FROM t_user WHERE age > (SELECT 1)`,                                   // subquery
		`SELECT count(*) FROM t_user u JOIN t_order o ON o.user_id = u.user_id`,                // a join
		`SELECT count(*) FROM t_config`,                                                        // not sharded
		`SELECT age AS city, count(*) FROM t_user GROUP BY city`,
		`SELECT lower(u.city), count(*) FROM t_user u GROUP BY lower(city)`,                                                            // written otherwise than grouped
		`SELECT count(*) FROM t_user GROUP BY generate_series(1, age) HAVING generate_series(1, age) > 2`,                              // a set-returning function
		`SELECT city COLLATE "C" < name, count(*) FROM t_user GROUP BY city COLLATE "C", name`,                                         // an explicit collation
		`SELECT (regexp_split_to_array(city, ' ') || city)[1], count(*) FROM t_user GROUP BY regexp_split_to_array(city, ' ') || city`, // named after a hidden column
		`SELECT lower(city) AS age, count(*) FROM t_user GROUP BY 1 ORDER BY age + 0`,                                                  // a name inside an ORDER BY expression is a column
		`SELECT city, age, count(*) + 1 FROM t_user GROUP BY city`,                                                                     // a column not grouped
		`SELECT 1, count(*) + 1 FROM t_user GROUP BY 1`,                                                                                // a constant group
		`SELECT age / 10 AS decade, count(*) + 1 FROM t_user GROUP BY decade`,                                                          // an output's name                               // an output's name
		`SELECT t_user, count(*) FROM t_user GROUP BY t_user`,                                                                          // the whole row
		`SELECT *, count(*) FROM t_user GROUP BY user_id`,                                                                              // a star
		`SELECT x.city, count(*) FROM t_user u GROUP BY x.city`,                                                                        // another table's column
		`SELECT count(*) FROM ONLY t_user`,                                                                                             // ONLY
		`WITH c AS (SELECT 1) SELECT count(*) FROM t_user`,                                                                             // a CTE
		`SELECT city FROM t_user`,                                                                                                      // no aggregate, no group
		`SELECT city, count(*) FROM t_user GROUP BY ROLLUP (city)`,                                                                     // grouping sets
		`SELECT other.sum(age) FROM t_user`,                                                                                            // a function of another schema
		`SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age) FROM t_user`,                                                          // ordered-set
		`SELECT count(*) + $1 FROM t_user WHERE age > $1`,                                                                              // a parameter read twice
		`SELECT count(*) + 1, "SUM"(age) FROM t_user`,                                                                                  // no aggregate of PostgreSQL's
		`SELECT coalesce(sum(age), 0), upper(city) FROM t_user GROUP BY upper`,                                                         // an output's inferred name
	} {
		if got, ok := shardAggregates(r, sql, shardAggCatalog()); ok {
			t.Errorf("rewritten: %s\n into %s", sql, got)
		}
	}
}

// TestShardAggregatesWithin: a SELECT within a statement that reads no column of a
// query around it (a common table expression, a subquery in FROM, an arm of a set
// operation) aggregates on the shards as a statement would, and the rest of the
// statement reads its groups as written.
func TestShardAggregatesWithin(t *testing.T) {
	r := shardAggRules(t)
	branch := func(shard int) string {
		return `SELECT city AS city, count(*) AS __sl_tp1 FROM shardlab_shards."t_user/` + string(rune('0'+shard)) + `" t_user GROUP BY city`
	}
	rewritten := []struct{ sql, want string }{
		{`WITH c AS (SELECT city, count(*) AS n FROM t_user GROUP BY city) SELECT n, count(*) FROM c GROUP BY n ORDER BY n`,
			`WITH c AS (SELECT city AS city, shardlab_merge.count(__sl_tp1) AS n FROM (` + branch(0) + ` UNION ALL ` + branch(1) + `) t_user GROUP BY city) ` +
				`SELECT n, count(*) FROM c GROUP BY n ORDER BY n`},
		{`SELECT s.n, v FROM (SELECT city, count(*) AS n FROM t_user GROUP BY city) s JOIN t_config ON k = s.city`,
			`SELECT s.n, v FROM (SELECT city AS city, shardlab_merge.count(__sl_tp1) AS n FROM (` + branch(0) + ` UNION ALL ` + branch(1) + `) t_user GROUP BY city) s ` +
				`JOIN t_config ON k = s.city`},
		{`SELECT count(*) FROM t_user UNION ALL SELECT count(*) FROM t_order ORDER BY 1`, ""},
		{`SELECT * FROM (WITH c AS (SELECT max(age) AS m FROM t_user) SELECT m FROM c) x`, ""},
		{`WITH c AS (SELECT count(*) FROM t_user WHERE age > $1) SELECT * FROM c`, ""},
		{`WITH c AS (SELECT o.user_id, sum(i.qty) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id GROUP BY o.user_id) SELECT count(*) FROM c`, ""},
	}
	for _, c := range rewritten {
		got, ok := shardAggregates(r, c.sql, shardAggCatalog())
		if !ok {
			t.Errorf("not rewritten: %s", c.sql)
			continue
		}
		if _, err := pg.Parse(got); err != nil {
			t.Errorf("rewritten %s into what does not parse: %s: %v", c.sql, got, err)
		}
		if c.want != "" && got != c.want {
			t.Errorf("%s\n got %s\nwant %s", c.sql, got, c.want)
		}
		if strings.Contains(c.sql, "t_user") && !strings.Contains(got, `shardlab_shards."t_user/1"`) {
			t.Errorf("%s: t_user's shards do not aggregate: %s", c.sql, got)
		}
		if strings.Contains(c.sql, "t_order") && !strings.Contains(got, `shardlab_shards."t_order/3"`) {
			t.Errorf("%s: t_order's shards do not aggregate: %s", c.sql, got)
		}
	}
	for _, sql := range []string{
		`WITH t_user AS (SELECT 1 AS age) SELECT * FROM (SELECT max(age) FROM t_user) s`,                                   // the name is the CTE's
		`WITH t_user AS (SELECT 1 AS age) SELECT max(age) FROM t_user UNION ALL SELECT 1`,                                  // likewise
		`WITH RECURSIVE c AS (SELECT count(*) AS n FROM t_user UNION ALL SELECT n + 1 FROM c WHERE n < 3) SELECT * FROM c`, // recursive
		`SELECT * FROM t_config, LATERAL (SELECT count(*) FROM t_user WHERE city = k) s`,                                   // reads the row around it
		`SELECT k FROM t_config WHERE n > (SELECT count(*) FROM t_user WHERE city = k)`,                                    // likewise
		`WITH c AS (SELECT count(*) AS n FROM t_user WHERE age > $1) SELECT n + $1 FROM c`,                                 // a parameter read elsewhere too
		`SELECT * FROM (SELECT count(*) FROM t_user WHERE age > (SELECT 1)) s`,                                             // not exact itself
	} {
		if got, ok := shardAggregates(r, sql, shardAggCatalog()); ok {
			t.Errorf("rewritten: %s\n into %s", sql, got)
		}
	}
}

// TestShardAggregatesUnderJoins: under inner joins, the tables the aggregates read,
// with those joined to them on the sharding key and placed alike, are read by each
// shard, which groups its rows by every column the coordinator reads of them; the
// coordinator joins the groups with the other tables.
func TestShardAggregatesUnderJoins(t *testing.T) {
	r, cat := shardAggRules(t), shardAggCatalog()
	branch := func(s string) string {
		var out []string
		for i := range 4 {
			out = append(out, strings.ReplaceAll(s, "/N", "/"+string(rune('0'+i))))
		}
		return "((" + out[0] + " UNION ALL " + out[1] + ") UNION ALL " + out[2] + ") UNION ALL " + out[3]
	}
	for _, c := range []struct{ sql, want string }{
		// Bound tables joined on their key: each shard joins and aggregates its rows.
		{`SELECT o.status, sum(i.qty) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id WHERE o.amount > 10 GROUP BY o.status`,
			`SELECT o.status AS status, shardlab_merge.sum(__sl_tp1) AS sum FROM (` +
				branch(`SELECT o.status AS status, sum(i.qty) AS __sl_tp1 FROM shardlab_shards."t_order/N" o, shardlab_shards."t_order_item/N" i WHERE o.amount > 10 AND i.order_id = o.order_id GROUP BY o.status`) +
				`) o GROUP BY o.status`},
		// ... and another table joined on a column of theirs: sent, and grouped by.
		{`SELECT u.city, sum(qty * price) AS revenue FROM t_user u, t_order o, t_order_item i WHERE u.user_id = o.user_id AND i.order_id = o.order_id AND u.age > 30 GROUP BY u.city ORDER BY revenue DESC`,
			`SELECT u.city AS city, shardlab_merge.sum(__sl_tp1) AS revenue FROM t_user u, (` +
				branch(`SELECT o.user_id AS user_id, sum(qty * price) AS __sl_tp1 FROM shardlab_shards."t_order/N" o, shardlab_shards."t_order_item/N" i WHERE i.order_id = o.order_id GROUP BY o.user_id`) +
				`) o WHERE u.user_id = o.user_id AND u.age > 30 GROUP BY u.city ORDER BY revenue DESC`},
		// A column of the bound table read as the first's; the coordinator joins the
		// shards' groups with a copied table on an integer column.
		{`SELECT i.item_id, max(o.amount) FROM t_order o JOIN t_order_item i ON o.order_id = i.order_id JOIN t_config c ON c.n = i.qty GROUP BY i.item_id`,
			`SELECT o.item_id AS item_id, max(__sl_tp1) AS max FROM (` +
				branch(`SELECT i.item_id AS item_id, i.qty AS qty, max(o.amount) AS __sl_tp1 FROM shardlab_shards."t_order/N" o, shardlab_shards."t_order_item/N" i WHERE o.order_id = i.order_id GROUP BY i.item_id, i.qty`) +
				`) o, t_config c WHERE c.n = o.qty GROUP BY o.item_id`},
		// No groups on the shards: each sends no row over no rows, which the
		// coordinator would join with every city.
		{`SELECT u.city, sum(i.qty) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id, t_user u WHERE o.status = 'none' GROUP BY u.city`,
			`SELECT u.city AS city, shardlab_merge.sum(__sl_tp1) AS sum FROM (` +
				branch(`SELECT sum(i.qty) AS __sl_tp1 FROM shardlab_shards."t_order/N" o, shardlab_shards."t_order_item/N" i WHERE o.status = 'none' AND i.order_id = o.order_id HAVING count(*) > 0`) +
				`) o, t_user u GROUP BY u.city`},
		{`SELECT u.city, sum(i.price * 1.5 - o.amount) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_user u ON u.user_id = o.user_id GROUP BY 1`, ""},
		// Only count(*), which reads no table: the bound tables, the most sharded ones
		// joined on their keys, aggregate on the shards.
		{`SELECT count(*) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id`, ""},
		{`SELECT u.city, count(*) FROM t_user u JOIN t_order o ON o.user_id = u.user_id JOIN t_order_item i ON i.order_id = o.order_id GROUP BY u.city`,
			`SELECT u.city AS city, shardlab_merge.count(__sl_tp1) AS count FROM t_user u, (` +
				branch(`SELECT o.user_id AS user_id, count(*) AS __sl_tp1 FROM shardlab_shards."t_order/N" o, shardlab_shards."t_order_item/N" i WHERE i.order_id = o.order_id GROUP BY o.user_id`) +
				`) o WHERE o.user_id = u.user_id GROUP BY u.city`},
		// A self-join on the key.
		{`SELECT count(*), sum(a.amount) FROM t_order a, t_order b WHERE a.order_id = b.order_id AND b.status = 'x'`, ""},
	} {
		got, ok := shardAggregates(r, c.sql, cat)
		if !ok {
			t.Errorf("not rewritten: %s", c.sql)
			continue
		}
		if _, err := pg.Parse(got); err != nil {
			t.Errorf("rewritten %s into what does not parse: %s: %v", c.sql, got, err)
		}
		if c.want != "" && got != c.want {
			t.Errorf("%s\n got %s\nwant %s", c.sql, got, c.want)
		}
	}
	for _, sql := range []string{
		`SELECT o.status, sum(i.qty) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id WHERE o.amount > 10 GROUP BY o.status`,                                    // (without the catalog)
		`SELECT u.city, count(*) FROM t_user u JOIN t_order o ON o.user_id = u.user_id GROUP BY u.city`,                                                                      // only count(*): one table grouped
		`SELECT u.city FROM t_user u JOIN t_order o ON o.user_id = u.user_id JOIN t_order_item i ON i.order_id = o.order_id`,                                                 // no aggregate: a group would stand for its rows once
		`SELECT count(*) FROM (SELECT u.city FROM t_user u JOIN t_order o ON o.user_id = u.user_id JOIN t_order_item i ON i.order_id = o.order_id) s`,                        // ... within a statement too
		`SELECT sum(o.amount) FROM t_order o LEFT JOIN t_order_item i ON i.order_id = o.order_id`,                                                                            // an outer join
		`SELECT sum(o.amount) FROM t_order o JOIN t_order_item i USING (order_id)`,                                                                                           // USING
		`SELECT sum(o.amount + u.age) FROM t_order o JOIN t_user u ON u.user_id = o.user_id`,                                                                                 // tables placed otherwise in one aggregate
		`SELECT sum(o.amount), max(u.age) FROM t_order o JOIN t_user u ON u.user_id = o.user_id`,                                                                             // ... or in two
		`SELECT sum(o.amount), sum(i.qty) FROM t_order o JOIN t_order_item i ON i.qty = o.amount`,                                                                            // not joined on the key
		`SELECT sum(o.amount), sum(i.qty) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id + 1`,                                                                 // nor by equal keys
		`SELECT sum(o.amount) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_user u ON u.user_id = o.user_id + 1`,                                      // a condition over a sent column
		`SELECT sum(o.amount) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_user u ON u.user_id = o.user_id OR u.age = 1`,                             // ... or two
		`SELECT sum(order_id) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id`,                                                                                 // an ambiguous column
		`SELECT o.status, sum(i.qty) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_user u ON u.user_id = o.user_id GROUP BY u.city`,                   // a column not grouped
		`SELECT sum(o.amount) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_user u ON u.user_id = o.order_id AND u.age = i.order_id`,                  // two columns of one name sent
		`SELECT sum(o.amount) FROM t_order o JOIN t_user o2 ON o2.user_id = o.user_id JOIN t_user o2 ON true`,                                                                // two entries of one name
		`SELECT sum(o.amount), nope FROM t_order o JOIN t_user u ON u.user_id = o.user_id`,                                                                                   // a column of no table
		`SELECT sum(o.amount) AS s FROM t_order o JOIN t_user u ON u.user_id = o.user_id WHERE s > 1`,                                                                        // an output's name in WHERE
		`SELECT sum(o.amount) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_user u ON u.user_id = o.user_id GROUP BY lower(u.city || o.status)`,       // a group of both
		`SELECT sum(o.amount) FROM t_order o JOIN t_user u ON u.user_id = o.user_id JOIN t_nope n ON true`,                                                                   // a table the catalog does not know
		`SELECT u.city, count(DISTINCT o.status), round(avg(amount), 2) FROM t_order o JOIN t_user u ON u.user_id = o.user_id GROUP BY 1`,                                    // one table grouped by a join's column (measured slower)
		`SELECT c.v, sum(i.qty) FROM t_order o JOIN t_order_item i ON o.order_id = i.order_id JOIN t_config c ON c.v = o.status GROUP BY c.v`,                                // a text comparison the coordinator keeps
		`SELECT u.city, sum(100 / i.qty) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_user u ON u.user_id = o.user_id GROUP BY 1`,                    // a division over rows the coordinator may drop
		`SELECT u.city, sum(i.qty * i.qty) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_user u ON u.user_id = o.user_id GROUP BY 1`,                  // an integer product, which may overflow
		`SELECT u.city, sum(i.qty) FILTER (WHERE i.qty > 1) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_user u ON u.user_id = o.user_id GROUP BY 1`, // a FILTER
		`SELECT lower(o.status), sum(i.qty) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_user u ON u.user_id = o.user_id GROUP BY 1`,                 // a grouping expression
		`SELECT sum(i.qty) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id AND o.user_id = u.user_id, t_user u`,                                                // a join condition reading outside its join
		`SELECT sum(i.qty) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id WHERE random() < 0.5`,                                                               // a volatile condition of no column
		`SELECT u.city, sum(i.qty * 10000000000) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_user u ON u.user_id = o.user_id GROUP BY 1`,            // an int8 literal: an int8 product
		`SELECT u.city, sum(i.price * 1e3) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_user u ON u.user_id = o.user_id GROUP BY 1`,                  // an exponent
		`SELECT u.city, sum(o.status) FROM t_order o JOIN t_order_item i ON i.order_id = o.order_id JOIN t_user u ON u.user_id = o.user_id GROUP BY 1`,                       // a sum of no integer or numeric
		`SELECT sum(o.amount), sum(i.qty) FROM t_order o JOIN t_order_item i ON i.order_id::text = o.status JOIN t_user u ON u.user_id = o.user_id`,                          // not on the keys
	} {
		c := cat
		if strings.Contains(sql, "WHERE o.amount > 10") {
			c = nil
		}
		if got, ok := shardAggregates(r, sql, c); ok {
			t.Errorf("rewritten: %s\n into %s", sql, got)
		}
	}
}

// TestShardAggregatesOneTableByStatistics: one table joined with the coordinator's
// tables aggregates on the shards only where PostgreSQL's statistics say its groups by
// the columns it is joined by are few.
func TestShardAggregatesOneTableByStatistics(t *testing.T) {
	r := shardAggRules(t)
	few := `SELECT c.v, sum(i.price), count(*) FROM t_order_item i JOIN t_config c ON c.n = i.qty GROUP BY c.v`
	many := `SELECT c.v, sum(i.price) FROM t_order_item i JOIN t_config c ON c.n = i.item_id GROUP BY c.v`
	if got, ok := shardAggregates(r, few, shardAggCatalog()); ok {
		t.Errorf("rewritten without statistics: %s", got)
	}
	cat := shardAggCatalog()
	cat.rows = map[string]float64{"t_order_item": 1000}
	cat.distinct = map[string]map[string]float64{"t_order_item": {"qty": 10, "item_id": 900}}
	got, ok := shardAggregates(r, few, cat)
	want := `SELECT c.v AS v, shardlab_merge.sum(__sl_tp1) AS sum, shardlab_merge.count(__sl_tp2) AS count FROM (`
	if !ok || !strings.HasPrefix(got, want) || !strings.Contains(got, `count(*) AS __sl_tp2 FROM shardlab_shards."t_order_item/3" i GROUP BY i.qty`) ||
		!strings.HasSuffix(got, `) i, t_config c WHERE c.n = i.qty GROUP BY c.v`) {
		t.Errorf("%s: with 10 values in 1000 rows: %v %s", few, ok, got)
	}
	if got, ok := shardAggregates(r, many, cat); ok {
		t.Errorf("rewritten with 900 groups in 1000 rows: %s", got)
	}
	// The groups by a DISTINCT aggregate's argument count too: 10 x 900.
	if got, ok := shardAggregates(r, `SELECT c.v, count(DISTINCT i.item_id) FROM t_order_item i JOIN t_config c ON c.n = i.qty GROUP BY c.v`, cat); ok {
		t.Errorf("rewritten with 9000 groups in 1000 rows: %s", got)
	}
}

// FuzzShardAggregates: whatever it rewrites parses, and names each shard once.
func FuzzShardAggregates(f *testing.F) {
	for _, s := range []string{`SELECT count(*) FROM t_user`, `SELECT city, sum(age) + 1 FROM t_user u WHERE age > 2 GROUP BY city HAVING count(*) > 1`,
		`SELECT u.city, sum(i.qty * i.price) AS r FROM t_user u, t_order o, t_order_item i WHERE u.user_id = o.user_id AND i.order_id = o.order_id GROUP BY u.city ORDER BY r`,
		`WITH c AS (SELECT city, count(*) AS n FROM t_user GROUP BY city) SELECT n, count(*) FROM c GROUP BY n`,
		`SELECT * FROM (SELECT max(age) FROM t_user) s, t_config UNION ALL SELECT count(*), 'a', 'b', 1 FROM t_order`} {
		f.Add(s)
	}
	r := shardAggRules(f)
	f.Fuzz(func(t *testing.T, sql string) {
		got, ok := shardAggregates(r, sql, shardAggCatalog())
		if !ok {
			return
		}
		if _, err := pg.Parse(got); err != nil {
			t.Fatalf("%s rewritten into %s: %v", sql, got, err)
		}
		// Every table read on the shards is read once in each branch.
		total := 0
		for _, table := range []string{"t_user", "t_order", "t_order_item"} {
			n := strings.Count(got, `"`+table+`/0"`)
			if n != strings.Count(got, `"`+table+`/1"`) {
				t.Fatalf("%s rewritten into %s", sql, got)
			}
			total += n
		}
		if total == 0 {
			t.Fatalf("%s rewritten into %s", sql, got)
		}
	})
}

// changingStats is a typed catalog whose statistics a test changes, as autovacuum's
// ANALYZE changes the shards' without the planner hearing of it.
type changingStats struct {
	jc    *joinCatalog
	reads int
}

func (c *changingStats) KeyType(context.Context, *rules.TableRule, string) (rules.KeyType, error) {
	return "", errors.New("no key types here")
}

func (c *changingStats) Columns(_ context.Context, t *rules.TableRule) ([]string, error) {
	return slices.Sorted(maps.Keys(c.jc.columns[t.Name])), nil
}

func (c *changingStats) IsAggregate(_ context.Context, name string) (bool, error) {
	return slices.Contains([]string{"sum", "count", "avg", "min", "max"}, name), nil
}

func (c *changingStats) ColumnTypes(_ context.Context, t *rules.TableRule) (map[string]string, error) {
	return c.jc.columns[t.Name], nil
}

func (c *changingStats) FloatColumns(context.Context, *rules.TableRule) ([]string, error) {
	return nil, nil
}

func (c *changingStats) ShardStats(_ context.Context, t *rules.TableRule) (float64, map[string]float64, error) {
	c.reads++
	return c.jc.rows[t.Name], c.jc.distinct[t.Name], nil
}

// TestCachedPlansReadStatisticsAgain: a cached plan that chose where aggregates run
// from the statistics keeps them statsMaxAge at most; then its text is planned again,
// and statistics that appeared meanwhile (autovacuum's ANALYZE) choose the shards. Up
// to this change the plan kept them while it stayed cached.
func TestCachedPlansReadStatisticsAgain(t *testing.T) {
	cat := &changingStats{jc: shardAggCatalog()}
	p := New(shardAggRules(t), cat, Options{Coordinate: true, ShardAggregates: true})
	sql := `SELECT u.city, sum(i.price), count(*) FROM t_order_item i JOIN t_user u ON u.age = i.qty GROUP BY u.city`
	onShards := func(pl *Plan) bool {
		t.Helper()
		b, err := pl.Bind(Args{})
		if err != nil || !b.Coordinated() {
			t.Fatalf("%s: %v, coordinated %v", sql, err, err == nil && b.Coordinated())
		}
		return strings.Contains(b.Targets[0].SQL, "shardlab_merge.sum")
	}
	first, err := p.Prepare(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	if onShards(first) || cat.reads == 0 {
		t.Fatalf("without statistics: aggregated on the shards, or read none (%d reads)", cat.reads)
	}
	cat.jc.rows = map[string]float64{"t_order_item": 1000}
	cat.jc.distinct = map[string]map[string]float64{"t_order_item": {"qty": 10}}
	reads := cat.reads
	if again, _ := p.Prepare(context.Background(), sql); again != first || cat.reads != reads {
		t.Fatalf("a fresh cached plan was planned again")
	}
	first.joins.readAt = first.joins.readAt.Add(-statsMaxAge - time.Second)
	again, err := p.Prepare(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	if again == first || cat.reads == reads || !onShards(again) {
		t.Errorf("statistics %v old: planned again %v, read again %v, on the shards %v", statsMaxAge, again != first, cat.reads != reads, onShards(again))
	}
	if cached, _ := p.Prepare(context.Background(), sql); cached != again {
		t.Errorf("the plan made again is not the cached one")
	}
}
