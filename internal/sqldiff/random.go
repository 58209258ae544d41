package sqldiff

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// RandomShapes returns n random queries from a seeded generator over the suite's
// tables, beyond what the merge answers: joins on keys and on other columns (inner,
// left, with the broadcast, range and default-source tables), subqueries (IN, EXISTS,
// correlated scalar ones), CTEs, set operations, window functions, HAVING, DISTINCT
// ON, count(DISTINCT), expressions over aggregates, and floating-point values (summed,
// which must be refused, or only compared and carried, which may be answered). Every
// other answer is determined (window orders end in a unique key or rank ties alike),
// so that one database and the sharding layer must agree on it; each may be answered
// or refused with 0A000 (MayRefuse), and the caller reports the share answered.
func RandomShapes(seed uint64, n int) []Query {
	r := rand.New(rand.NewPCG(seed, 0x5a4e))
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	orderFilter := func(alias string) string {
		p := alias + "."
		return pick(
			fmt.Sprintf("%sqty > %d", p, r.IntN(8)),
			fmt.Sprintf("%samount < %d", p, r.IntN(4000)),
			fmt.Sprintf("%sstatus IN ('paid', 'new', 'zebra')", p),
			fmt.Sprintf("%suser_id BETWEEN %d AND %d", p, r.IntN(10), 10+r.IntN(20)),
			fmt.Sprintf("%sorder_id < %d", p, r.IntN(250)),
			fmt.Sprintf("%screated > '20%02d-01-01'", p, r.IntN(25)),
			p+"note IS NOT NULL",
		)
	}
	where := func(alias string) string {
		switch r.IntN(3) {
		case 0:
			return ""
		case 1:
			return " WHERE " + orderFilter(alias)
		}
		return " WHERE " + orderFilter(alias) + " AND " + orderFilter(alias)
	}
	agg := func(alias string) string {
		p := alias + "."
		return pick("count(*)", "sum("+p+"qty)", "round(avg("+p+"amount), 2)", "max("+p+"created)",
			"count(DISTINCT "+p+"status)", "sum("+p+"amount) + 1", "count("+p+"note)::int", "min("+p+"order_id)",
			"string_agg("+p+"code, ',' ORDER BY "+p+"order_id)", "coalesce(sum("+p+"qty) FILTER (WHERE "+p+"qty > 3), 0)")
	}
	var out []Query
	for range n {
		q := Query{MayRefuse: true}
		switch r.IntN(13) {
		case 0: // a join on a column that is not both sides' key
			q.SQL = fmt.Sprintf("SELECT o.order_id, u.%s FROM t_order o %s t_user u ON u.user_id = o.%s%s",
				pick("city", "name", "score"), pick("JOIN", "LEFT JOIN"), pick("user_id", "qty"), where("o"))
		case 1: // a join, grouped, maybe with HAVING
			q.SQL = fmt.Sprintf("SELECT u.%s, %s, %s FROM t_order o JOIN t_user u ON u.user_id = o.user_id%s GROUP BY 1",
				pick("city", "score % 3", "user_id % 4"), agg("o"), agg("o"), where("o"))
			if r.IntN(2) == 0 {
				q.SQL += fmt.Sprintf(" HAVING count(*) > %d", r.IntN(8))
			}
		case 2: // bound tables on their key, outer, grouped
			q.SQL = fmt.Sprintf("SELECT o.order_id, count(i.item_id), sum(i.price) FROM t_order o LEFT JOIN t_order_item i ON i.order_id = o.order_id%s%s GROUP BY o.order_id",
				pick("", " AND i.qty > 2"), where("o"))
		case 3: // a join on text with the broadcast table, keeping its unmatched rows
			q.SQL = fmt.Sprintf("SELECT c.k, count(o.order_id), %s FROM t_config c LEFT JOIN t_order o ON o.%s = c.v GROUP BY c.k",
				agg("o"), pick("status", "note"))
		case 4: // IN and NOT IN subqueries over another sharded table
			q.SQL = fmt.Sprintf("SELECT order_id, user_id FROM t_order WHERE user_id %s (SELECT user_id FROM t_user WHERE score %s %d)%s",
				pick("IN", "NOT IN"), pick("<", ">"), r.IntN(100), strings.Replace(where("t_order"), " WHERE ", " AND ", 1))
		case 5: // a correlated EXISTS
			q.SQL = fmt.Sprintf("SELECT u.user_id, u.city FROM t_user u WHERE %sEXISTS (SELECT 1 FROM t_order o WHERE o.user_id = u.user_id AND %s)",
				pick("", "NOT "), orderFilter("o"))
		case 6: // a correlated scalar subquery
			q.SQL = fmt.Sprintf("SELECT o.order_id, (SELECT %s FROM t_order_item i WHERE i.%s) FROM t_order o%s",
				pick("max(i.price)", "count(*)", "sum(i.qty)"), pick("order_id = o.order_id", "qty = o.qty"), where("o"))
		case 7: // a CTE, joined
			q.SQL = fmt.Sprintf("WITH per_user AS (SELECT user_id, %s AS v FROM t_order o%s GROUP BY user_id) SELECT u.%s, max(p.v), count(*) FROM per_user p JOIN t_user u USING (user_id) GROUP BY 1",
				agg("o"), where("o"), pick("city", "score % 5"))
		case 8: // set operations
			q.SQL = fmt.Sprintf("SELECT user_id FROM t_order WHERE %s %s SELECT user_id FROM t_user WHERE score %s %d",
				orderFilter("t_order"), pick("UNION", "UNION ALL", "INTERSECT", "EXCEPT", "EXCEPT ALL"), pick("<", ">"), r.IntN(100))
		case 9: // window functions, ordered to a unique key
			q.SQL = fmt.Sprintf("SELECT order_id, user_id, %s, %s FROM t_order o%s",
				pick("rank() OVER (PARTITION BY user_id ORDER BY amount DESC NULLS LAST)", "row_number() OVER (PARTITION BY user_id ORDER BY order_id)",
					"dense_rank() OVER (ORDER BY qty NULLS FIRST)", "lag(order_id) OVER (PARTITION BY status ORDER BY order_id)"),
				pick("sum(qty) OVER (PARTITION BY user_id)", "count(*) OVER ()", "sum(amount) OVER (ORDER BY order_id)",
					"first_value(order_id) OVER (PARTITION BY qty ORDER BY order_id)"), where("o"))
		case 10: // DISTINCT ON, LIMIT over a join: ordered to a unique key
			if r.IntN(2) == 0 {
				q.SQL = fmt.Sprintf("SELECT DISTINCT ON (user_id) user_id, order_id, amount FROM t_order o%s ORDER BY user_id, amount DESC NULLS LAST, order_id", where("o"))
			} else {
				q.SQL = fmt.Sprintf("SELECT o.order_id, u.city FROM t_order o JOIN t_user u ON u.user_id = o.user_id%s ORDER BY o.%s, o.order_id LIMIT %d",
					where("o"), pick("qty NULLS FIRST", "amount DESC NULLS LAST", "user_id"), 1+r.IntN(30))
			}
			q.Ordered = true
		case 11: // floating point: a sum in another order is another number, so these
			// must come back refused unless the answer does not depend on the order
			q.SQL = pick(
				fmt.Sprintf("SELECT u.city, sum(o.weight) FROM t_order o JOIN t_user u ON u.user_id = o.user_id%s GROUP BY 1", where("o")),
				fmt.Sprintf("SELECT order_id, avg(weight) OVER (PARTITION BY user_id) FROM t_order o%s", where("o")),
				fmt.Sprintf("SELECT o.order_id, o.weight * 2, u.name FROM t_order o JOIN t_user u ON u.user_id = o.qty%s", where("o")),
				fmt.Sprintf("SELECT max(o.weight), min(o.weight), count(o.weight) FROM t_order o JOIN t_user u ON u.user_id = o.user_id%s", where("o")),
			)
		default: // joins with the range-sharded and default-source tables
			q.SQL = pick(
				fmt.Sprintf("SELECT e.kind, count(*), sum(o.qty) FROM t_event e JOIN t_order o ON o.qty = e.v %% 9%s GROUP BY e.kind", strings.Replace(where("o"), " WHERE ", " AND ", 1)),
				fmt.Sprintf("SELECT r.name, count(u.user_id) FROM t_region r LEFT JOIN t_user u ON u.user_id %% 5 = r.region_id GROUP BY r.name HAVING count(*) >= %d", r.IntN(3)),
				"SELECT e.event_id, e.v, (SELECT count(*) FROM t_event f WHERE f.v < e.v) FROM t_event e",
			)
		}
		out = append(out, q)
	}
	return out
}

// RandomJoinAggregates returns n random aggregates over the bound tables t_order and
// t_order_item joined on their key, alone or with t_user joined by a comparison (the
// shapes the coordinator has the shards join and aggregate, or, where that would not
// be exact, evaluates as written), with random filters, groups, HAVING and aggregates
// that may fail over rows the join drops. Every answer is determined.
func RandomJoinAggregates(seed uint64, n int) []Query {
	r := rand.New(rand.NewPCG(seed, 0x1a99))
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	var out []Query
	for range n {
		from := "t_order o JOIN t_order_item i ON i.order_id = o.order_id"
		keys := []string{"o.status", "i.sku", "o.qty", "i.qty", "o.created IS NULL"}
		if r.IntN(2) == 0 {
			from += fmt.Sprintf(" JOIN t_user u ON u.user_id %s o.user_id", pick("=", "=", "<", ">="))
			keys = append(keys, "u.city", "u.score % 3", "u.user_id")
		}
		var where []string
		for range r.IntN(3) {
			where = append(where, pick(
				fmt.Sprintf("o.qty > %d", r.IntN(8)),
				fmt.Sprintf("i.qty < %d", 1+r.IntN(5)),
				fmt.Sprintf("o.amount < %d", r.IntN(4000)),
				"o.status IS NOT NULL",
				fmt.Sprintf("i.price > %d", r.IntN(150)),
			))
		}
		if strings.Contains(from, "t_user") && r.IntN(2) == 0 {
			where = append(where, fmt.Sprintf("u.score %s %d", pick("<", ">"), r.IntN(100)))
		}
		w := ""
		if len(where) > 0 {
			w = " WHERE " + strings.Join(where, " AND ")
		}
		agg := func() string {
			return pick("count(*)", "sum(i.qty)", "sum(i.price * (1 - o.amount))", "round(avg(i.price), 2)", "max(o.created)",
				"count(DISTINCT o.status)", "min(i.sku)", "sum(i.qty) FILTER (WHERE i.qty > 2)", "sum(100 / i.qty)", "avg(o.amount) + 1")
		}
		q := Query{MayRefuse: true}
		if r.IntN(4) == 0 {
			q.SQL = fmt.Sprintf("SELECT %s, %s FROM %s%s", agg(), agg(), from, w)
		} else {
			q.SQL = fmt.Sprintf("SELECT %s, %s, %s FROM %s%s GROUP BY 1", pick(keys...), agg(), agg(), from, w)
			if r.IntN(3) == 0 {
				q.SQL += fmt.Sprintf(" HAVING count(*) > %d", r.IntN(4))
			}
		}
		out = append(out, q)
	}
	return out
}
