package sqlplan

import (
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/shardlab/shardlab/rules"
)

func shardAggRules(t testing.TB) *rules.Compiled {
	t.Helper()
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: "postgres://a/x"}, {Name: "ds_1", DSN: "postgres://b/x"}},
		Tables: []rules.Table{
			{Name: "t_order", Strategy: rules.Strategy{Column: "order_id", Type: rules.TypeInt8}, TablesPerDataSource: 2},
			{Name: "t_user", Strategy: rules.Strategy{Column: "user_id", Type: rules.TypeInt4}},
		},
		Broadcast: []string{"t_config"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
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
		got, ok := shardAggregates(r, c.sql)
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
		`SELECT count(*) FROM t_user UNION ALL SELECT count(*) FROM t_user`,                                                            // a set operation
		`SELECT city FROM t_user`,                                                                                                      // no aggregate, no group
		`SELECT city, count(*) FROM t_user GROUP BY ROLLUP (city)`,                                                                     // grouping sets
		`SELECT other.sum(age) FROM t_user`,                                                                                            // a function of another schema
		`SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age) FROM t_user`,                                                          // ordered-set
		`SELECT count(*) + $1 FROM t_user WHERE age > $1`,                                                                              // a parameter read twice
		`SELECT count(*) + 1, "SUM"(age) FROM t_user`,                                                                                  // no aggregate of PostgreSQL's
		`SELECT coalesce(sum(age), 0), upper(city) FROM t_user GROUP BY upper`,                                                         // an output's inferred name
	} {
		if got, ok := shardAggregates(r, sql); ok {
			t.Errorf("rewritten: %s\n into %s", sql, got)
		}
	}
}

// FuzzShardAggregates: whatever it rewrites parses, and names each shard once.
func FuzzShardAggregates(f *testing.F) {
	for _, s := range []string{`SELECT count(*) FROM t_user`, `SELECT city, sum(age) + 1 FROM t_user u WHERE age > 2 GROUP BY city HAVING count(*) > 1`} {
		f.Add(s)
	}
	r := shardAggRules(f)
	f.Fuzz(func(t *testing.T, sql string) {
		got, ok := shardAggregates(r, sql)
		if !ok {
			return
		}
		if _, err := pg.Parse(got); err != nil {
			t.Fatalf("%s rewritten into %s: %v", sql, got, err)
		}
		if strings.Count(got, `"t_user/0"`)+strings.Count(got, `"t_order/0"`) != 1 {
			t.Fatalf("%s rewritten into %s", sql, got)
		}
	})
}
