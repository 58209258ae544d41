package sqlplan_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// TestCorrelatedPlan: a subquery of an UPDATE or DELETE that reads the changed table's
// columns is evaluated in two steps: the columns of its own tables that it reads,
// first, and the subquery over unnest of their arrays in the statement. On the old
// code such a statement was refused (correlated), its Pre a subquery that fails alone.
func TestCorrelatedPlan(t *testing.T) {
	ctx := context.Background()
	p := sqlplan.New(testRules(t), typedKeyCatalog{}, sqlplan.Options{})
	for _, c := range []struct {
		sql    string
		first  []string
		then   string
		summed []int
	}{
		{"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id = o.user_id AND u.name >= $1 AND u.name LIKE 'a%')",
			[]string{"SELECT u.name, u.user_id FROM t_user u WHERE u.name >= $1 AND u.name LIKE 'a%'"},
			"UPDATE t_order o SET status = (SELECT shardlab_pre.shardlab_1 FROM ROWS FROM (pg_catalog.unnest($2) , pg_catalog.unnest($3) ) shardlab_pre(shardlab_1, shardlab_2) WHERE shardlab_pre.shardlab_2 = o.user_id)", nil},
		// EXISTS correlated by two conditions; unqualified names resolve innermost first.
		{"DELETE FROM t_order o WHERE o.status <> 'x' AND EXISTS (SELECT * FROM t_user WHERE user_id = o.user_id AND name = status)",
			[]string{"SELECT t_user.user_id, t_user.name FROM t_user"},
			"DELETE FROM t_order o WHERE o.status <> 'x' AND EXISTS (SELECT 1 FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) ) shardlab_pre(shardlab_1, shardlab_2) WHERE shardlab_pre.shardlab_1 = o.user_id AND shardlab_pre.shardlab_2 = status)", nil},
		// UPDATE ... FROM, DELETE ... USING joined otherwise than by one equality: the
		// same statement with EXISTS, in two steps.
		{"DELETE FROM t_order o USING t_user u WHERE u.user_id < o.user_id AND o.status = 'x' AND u.name = 'a' RETURNING o.order_id",
			[]string{"SELECT u.user_id FROM t_user u WHERE u.name = 'a'"},
			"DELETE FROM t_order o WHERE o.status = 'x' AND EXISTS (SELECT 1 FROM ROWS FROM (pg_catalog.unnest($1) ) shardlab_pre(shardlab_1) WHERE shardlab_pre.shardlab_1 < o.user_id) RETURNING o.order_id", nil},
		{"UPDATE t_order o SET status = 'y' FROM t_user u WHERE u.user_id = o.user_id AND (u.name = o.status OR u.name IS NULL)",
			[]string{"SELECT u.user_id, u.name FROM t_user u"},
			"UPDATE t_order o SET status = 'y' WHERE EXISTS (SELECT 1 FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) ) shardlab_pre(shardlab_1, shardlab_2) WHERE shardlab_pre.shardlab_1 = o.user_id AND (shardlab_pre.shardlab_2 = o.status OR shardlab_pre.shardlab_2 IS NULL))", nil},
		// Aggregates over the same rows; the values added are checked when read.
		{"UPDATE t_order o SET status = (SELECT sum(u.user_id) + count(*) FROM t_user u WHERE u.user_id < o.order_id)::text WHERE o.status <> $1",
			[]string{"SELECT u.user_id FROM t_user u"},
			"UPDATE t_order o SET status = (SELECT sum(shardlab_pre.shardlab_1) + count(*) FROM ROWS FROM (pg_catalog.unnest($2) ) shardlab_pre(shardlab_1) WHERE shardlab_pre.shardlab_1 < o.order_id)::text WHERE o.status <> $1", []int{0}},
		// IN and NOT IN keep the operand; only the number of rows counts for one.
		{"DELETE FROM t_order o WHERE o.status NOT IN (SELECT o.status FROM t_user u WHERE u.name = 'a') OR o.user_id IN (SELECT u.user_id FROM t_user u WHERE u.name = o.status)",
			[]string{"SELECT 1 FROM t_user u WHERE u.name = 'a'", "SELECT u.user_id, u.name FROM t_user u"},
			"DELETE FROM t_order o WHERE NOT o.status IN (SELECT o.status FROM ROWS FROM (pg_catalog.unnest($1) ) shardlab_pre(shardlab_1)) OR o.user_id IN (SELECT shardlab_pre.shardlab_1 FROM ROWS FROM (pg_catalog.unnest($2) , pg_catalog.unnest($3) ) shardlab_pre(shardlab_1, shardlab_2) WHERE shardlab_pre.shardlab_2 = o.status)", nil},
		// The latest row: ORDER BY and LIMIT stay in the statement, over the same
		// rows; the first step reads the sort keys too.
		{"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id ORDER BY u.user_id DESC NULLS LAST, score LIMIT 1 OFFSET 2)",
			[]string{"SELECT u.name, u.user_id, u.score FROM t_user u"},
			"UPDATE t_order o SET status = (SELECT shardlab_pre.shardlab_1 FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) , pg_catalog.unnest($3) ) shardlab_pre(shardlab_1, shardlab_2, shardlab_3) WHERE shardlab_pre.shardlab_2 < o.user_id ORDER BY shardlab_pre.shardlab_2 DESC NULLS LAST, shardlab_pre.shardlab_3 LIMIT 1 OFFSET 2)", nil},
		// An output column's name, read as the very column it names.
		{"UPDATE t_order o SET status = (SELECT name FROM t_user u WHERE u.user_id < o.user_id ORDER BY name LIMIT 1)",
			[]string{"SELECT u.name, u.user_id FROM t_user u"},
			"UPDATE t_order o SET status = (SELECT shardlab_pre.shardlab_1 FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) ) shardlab_pre(shardlab_1, shardlab_2) WHERE shardlab_pre.shardlab_2 < o.user_id ORDER BY shardlab_pre.shardlab_1 LIMIT 1)", nil},
		// An alias of the very column the name reads; an operator's value, named ?column?.
		{"UPDATE t_order o SET status = (SELECT u.name AS name FROM t_user u WHERE u.user_id < o.user_id ORDER BY name LIMIT 1)",
			[]string{"SELECT u.name, u.user_id FROM t_user u"},
			"UPDATE t_order o SET status = (SELECT shardlab_pre.shardlab_1 AS name FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) ) shardlab_pre(shardlab_1, shardlab_2) WHERE shardlab_pre.shardlab_2 < o.user_id ORDER BY shardlab_pre.shardlab_1 LIMIT 1)", nil},
		{"UPDATE t_order o SET user_id = (SELECT u.user_id * 2 FROM t_user u WHERE u.user_id < o.user_id ORDER BY name LIMIT 1)",
			[]string{"SELECT u.user_id * 2, u.user_id, u.name FROM t_user u"},
			"UPDATE t_order o SET user_id = (SELECT shardlab_pre.shardlab_1 FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) , pg_catalog.unnest($3) ) shardlab_pre(shardlab_1, shardlab_2, shardlab_3) WHERE shardlab_pre.shardlab_2 < o.user_id ORDER BY shardlab_pre.shardlab_3 LIMIT 1)", nil},
		{"DELETE FROM t_order o WHERE o.user_id IN (SELECT u.user_id FROM t_user u WHERE u.name = o.status ORDER BY u.score FETCH FIRST 2 ROWS WITH TIES)",
			[]string{"SELECT u.user_id, u.name, u.score FROM t_user u"},
			"DELETE FROM t_order o WHERE o.user_id IN (SELECT shardlab_pre.shardlab_1 FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) , pg_catalog.unnest($3) ) shardlab_pre(shardlab_1, shardlab_2, shardlab_3) WHERE shardlab_pre.shardlab_2 = o.status ORDER BY shardlab_pre.shardlab_3 FETCH FIRST 2 ROWS WITH TIES)", nil},
		// Values computed over the subquery's own tables, in its select list and in an
		// aggregate's argument: by the first step, one column each.
		{"UPDATE t_order o SET status = (SELECT u.name || '-' || u.user_id FROM t_user u WHERE u.user_id = o.user_id)",
			[]string{"SELECT (u.name || '-') || u.user_id, u.user_id FROM t_user u"},
			"UPDATE t_order o SET status = (SELECT shardlab_pre.shardlab_1 FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) ) shardlab_pre(shardlab_1, shardlab_2) WHERE shardlab_pre.shardlab_2 = o.user_id)", nil},
		{"UPDATE t_order o SET user_id = (SELECT sum(u.user_id * 2) + count(DISTINCT CASE WHEN u.score > 1 THEN u.name END) FROM t_user u WHERE u.user_id < o.order_id)",
			[]string{"SELECT u.user_id * 2, CASE WHEN u.score > 1 THEN u.name END, u.user_id FROM t_user u"},
			"UPDATE t_order o SET user_id = (SELECT sum(shardlab_pre.shardlab_1) + count(DISTINCT shardlab_pre.shardlab_2) FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) , pg_catalog.unnest($3) ) shardlab_pre(shardlab_1, shardlab_2, shardlab_3) WHERE shardlab_pre.shardlab_3 < o.order_id)", []int{0}},
		// PostgreSQL's functions: over the aggregates' values in the second step, once per
		// evaluation; over the subquery's own rows in the first, once per row, where
		// they answer the same whatever the session; sort keys computed first.
		{"UPDATE t_order o SET user_id = (SELECT round(avg(u.user_id), 2) + abs(max(u.score)) + length(o.status) FROM t_user u WHERE u.user_id < o.order_id)",
			[]string{"SELECT u.user_id, u.score FROM t_user u"},
			"UPDATE t_order o SET user_id = (SELECT (round(avg(shardlab_pre.shardlab_1), 2) + abs(max(shardlab_pre.shardlab_2))) + length(o.status) FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) ) shardlab_pre(shardlab_1, shardlab_2) WHERE shardlab_pre.shardlab_1 < o.order_id)", []int{0}},
		{"UPDATE t_order o SET status = (SELECT to_char(sum(floor(u.score)), '999') FROM t_user u WHERE u.user_id < o.order_id)",
			[]string{"SELECT floor(u.score), u.user_id FROM t_user u"},
			"UPDATE t_order o SET status = (SELECT to_char(sum(shardlab_pre.shardlab_1), '999') FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) ) shardlab_pre(shardlab_1, shardlab_2) WHERE shardlab_pre.shardlab_2 < o.order_id)", []int{0}},
		{"UPDATE t_order o SET status = (SELECT upper(btrim(u.name)) FROM t_user u WHERE u.user_id = o.user_id)",
			[]string{"SELECT upper(btrim(u.name)), u.user_id FROM t_user u"},
			"UPDATE t_order o SET status = (SELECT shardlab_pre.shardlab_1 FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) ) shardlab_pre(shardlab_1, shardlab_2) WHERE shardlab_pre.shardlab_2 = o.user_id)", nil},
		{"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id ORDER BY lower(u.name) DESC, u.user_id % 7 LIMIT 1)",
			[]string{"SELECT u.name, u.user_id, lower(u.name), u.user_id % 7 FROM t_user u"},
			"UPDATE t_order o SET status = (SELECT shardlab_pre.shardlab_1 FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) , pg_catalog.unnest($3) , pg_catalog.unnest($4) ) shardlab_pre(shardlab_1, shardlab_2, shardlab_3, shardlab_4) WHERE shardlab_pre.shardlab_2 < o.user_id ORDER BY shardlab_pre.shardlab_3 DESC, shardlab_pre.shardlab_4 LIMIT 1)", nil},
		// Grouped: the same rows in the same groups; HAVING over aggregates compared
		// with constants and group keys; a group key selected is picked.
		{"UPDATE t_order o SET status = (SELECT max(u.name) FROM t_user u WHERE u.user_id = o.user_id GROUP BY u.name)",
			[]string{"SELECT u.name, u.user_id FROM t_user u"},
			"UPDATE t_order o SET status = (SELECT max(shardlab_pre.shardlab_1) FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) ) shardlab_pre(shardlab_1, shardlab_2) WHERE shardlab_pre.shardlab_2 = o.user_id GROUP BY shardlab_pre.shardlab_1)", nil},
		{"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name HAVING count(*) > 1 AND (max(u.user_id) >= 3 OR u.name IS NULL))",
			[]string{"SELECT u.user_id, u.name FROM t_user u"},
			"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) ) shardlab_pre(shardlab_1, shardlab_2) WHERE shardlab_pre.shardlab_1 < o.user_id GROUP BY shardlab_pre.shardlab_2 HAVING count(*) > 1 AND (max(shardlab_pre.shardlab_1) >= 3 OR shardlab_pre.shardlab_2 IS NULL))", nil},
		{"UPDATE t_order o SET user_id = (SELECT sum(u.user_id * 2) FROM t_user u WHERE u.user_id < o.order_id GROUP BY u.name HAVING u.name = o.status)",
			[]string{"SELECT u.user_id * 2, u.user_id, u.name FROM t_user u"},
			"UPDATE t_order o SET user_id = (SELECT sum(shardlab_pre.shardlab_1) FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) , pg_catalog.unnest($3) ) shardlab_pre(shardlab_1, shardlab_2, shardlab_3) WHERE shardlab_pre.shardlab_2 < o.order_id GROUP BY shardlab_pre.shardlab_3 HAVING shardlab_pre.shardlab_3 = o.status)", []int{0}},
		// UPDATE ... FROM whose SET list reads the other table: the same statement
		// over that table's rows that meet its own conditions, read first, as arrays.
		{"UPDATE t_order o SET status = u.name FROM t_user u WHERE u.user_id = o.user_id AND u.name <> $1 AND o.order_id > 5",
			[]string{"SELECT u.name, u.user_id FROM t_user u WHERE u.name <> $1"},
			"UPDATE t_order o SET status = shardlab_pre.shardlab_1 FROM ROWS FROM (pg_catalog.unnest($2) , pg_catalog.unnest($3) ) shardlab_pre(shardlab_1, shardlab_2) WHERE o.order_id > 5 AND shardlab_pre.shardlab_2 = o.user_id", nil},
		{"UPDATE t_order o SET status = u.name || o.status, user_id = u.user_id + 1 FROM t_user u WHERE u.user_id < o.user_id AND (o.status = name OR u.name IS NULL) RETURNING o.*",
			[]string{"SELECT u.name, u.user_id FROM t_user u"},
			"UPDATE t_order o SET status = shardlab_pre.shardlab_1 || o.status, user_id = shardlab_pre.shardlab_2 + 1 FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) ) shardlab_pre(shardlab_1, shardlab_2) " +
				"WHERE shardlab_pre.shardlab_2 < o.user_id AND (o.status = shardlab_pre.shardlab_1 OR shardlab_pre.shardlab_1 IS NULL) RETURNING o.*", nil},
		// Two other tables joined to each other, one by its join's ON, one by WHERE.
		{"UPDATE t_order o SET status = v.name FROM t_user u JOIN t_user v ON v.name = u.name, t_user w WHERE u.user_id = o.user_id AND w.user_id = v.user_id",
			[]string{"SELECT v.name, u.user_id FROM t_user u JOIN t_user v ON v.name = u.name, t_user w WHERE w.user_id = v.user_id"},
			"UPDATE t_order o SET status = shardlab_pre.shardlab_1 FROM ROWS FROM (pg_catalog.unnest($1) , pg_catalog.unnest($2) ) shardlab_pre(shardlab_1, shardlab_2) WHERE shardlab_pre.shardlab_2 = o.user_id", nil},
	} {
		pl, err := p.Prepare(ctx, c.sql)
		if err != nil {
			t.Fatalf("%s: %v", c.sql, err)
		}
		if _, err := pl.Bind(sqlplan.Args{Values: make([][]byte, pl.NumParams)}); !errors.Is(err, sqlplan.ErrUnsupported) {
			t.Errorf("%s: bind %v, want the refusal", c.sql, err)
		}
		pre := pl.Pre
		if pre == nil || len(pre.Subqueries) != len(c.first) {
			t.Errorf("%s: pre %+v", c.sql, pre)
			continue
		}
		for i, sub := range pre.Subqueries {
			if sub.Kind != sqlplan.SubqueryColumns || sub.SQL != c.first[i] {
				t.Errorf("%s: first step %d: %d %s, want %s", c.sql, i, sub.Kind, sub.SQL, c.first[i])
			}
		}
		if pre.SQL != c.then {
			t.Errorf("%s:\n got  %s\n want %s", c.sql, pre.SQL, c.then)
		}
		if got := pre.Subqueries[0].Summed; len(got) != len(c.summed) || len(got) > 0 && got[0] != c.summed[0] {
			t.Errorf("%s: summed %v, want %v", c.sql, got, c.summed)
		}
		// The statement, its subqueries over parameters, runs where its own conditions say.
		np := pre.Params
		for _, sub := range pre.Subqueries {
			np += sub.Params
		}
		then, err := p.Prepare(ctx, pre.SQL)
		if err != nil {
			t.Errorf("%s: then: %v", c.sql, err)
			continue
		}
		if _, err := then.Bind(sqlplan.Args{Values: make([][]byte, np)}); err != nil {
			t.Errorf("%s: then: %v", c.sql, err)
		}
	}
	// Not of the shape: evaluated alone (where a correlated subquery fails, and the
	// statement is refused) or not in steps at all.
	for _, sql := range []string{
		// ORDER BY and LIMIT: beside an aggregate, of an expression over the changed
		// table's column (which may fail), of the changed table's column, of an output column's name, a position, USING,
		// a limit that is not a constant count.
		"UPDATE t_order o SET status = (SELECT count(*) FROM t_user u WHERE u.user_id < o.user_id LIMIT 1)::text",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id ORDER BY o.order_id LIMIT 1)",
		"UPDATE t_order o SET status = (SELECT u.name AS user_id FROM t_user u WHERE u.user_id < o.user_id ORDER BY user_id LIMIT 1)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id ORDER BY 1 LIMIT 1)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id ORDER BY u.user_id USING > LIMIT 1)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id ORDER BY u.user_id LIMIT $1)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id ORDER BY u.user_id LIMIT 1 OFFSET o.order_id)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id ORDER BY u.user_id LIMIT -1)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id ORDER BY u.user_id FETCH FIRST NULL ROWS WITH TIES)",
		// A bare name in ORDER BY reads the output column of that name first: here the
		// changed table's o.user_id, one value per evaluation, not u.user_id.
		"UPDATE t_order o SET order_id = (SELECT o.user_id FROM t_user u WHERE u.user_id < o.order_id ORDER BY user_id FETCH FIRST 1 ROW WITH TIES)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT lower(u.name) FROM t_user u WHERE u.user_id < o.order_id ORDER BY name LIMIT 1)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id = o.user_id AND random() > 0.5)",
		"UPDATE t_order o SET status = (SELECT sum(u.user_id::float8) FROM t_user u WHERE u.user_id = o.user_id)",
		"UPDATE t_order o SET status = (SELECT string_agg(u.name, ',') FROM t_user u WHERE u.user_id = o.user_id)",
		"UPDATE t_order o SET status = (SELECT sum(o.order_id + u.user_id) FROM t_user u WHERE u.user_id = o.user_id)", // the changed table in an aggregate
		"UPDATE t_order o SET status = (SELECT u.name || count(*) FROM t_user u WHERE u.user_id = o.user_id)",          // a column beside an aggregate
		// Grouped: a column outside an aggregate that is no group key, a group key that
		// is an expression, a position, a grouping set, the changed table's column, or
		// GROUP BY DISTINCT; a HAVING that compares an aggregate with a column, may
		// fail or calls a function; ORDER BY or a value computed first beside grouping.
		"UPDATE t_order o SET status = (SELECT u.score FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name)",
		"UPDATE t_order o SET status = (SELECT count(*) FROM t_user u WHERE u.user_id < o.user_id GROUP BY lower(u.name))",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id GROUP BY 1)",
		"UPDATE t_order o SET status = (SELECT count(*) FROM t_user u WHERE u.user_id < o.user_id GROUP BY ROLLUP (u.name))",
		"UPDATE t_order o SET status = (SELECT count(*) FROM t_user u WHERE u.user_id < o.user_id GROUP BY o.status)",
		"UPDATE t_order o SET status = (SELECT count(*) FROM t_user u WHERE u.user_id < o.user_id GROUP BY DISTINCT u.name)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name HAVING count(*) > o.order_id)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name HAVING 10 / count(*) > 1)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name HAVING round(avg(u.user_id)) > 1)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name HAVING max(u.score) > 1 AND u.user_id > 2)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name ORDER BY u.name LIMIT 1)",
		"UPDATE t_order o SET status = (SELECT lower(u.name) FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name)",
		"UPDATE t_order o SET status = (SELECT u.name || 'x' FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT * FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name)", // 42803 on one database
		// Beside grouping, a value computed over aggregates or keys, once per group in
		// the groups' order: one that may fail fails here on another group first.
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 / (count(*) - 2) FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name)",
		"UPDATE t_order o SET user_id = (SELECT 1 / (count(*) - 2) FROM t_user u WHERE u.user_id < o.order_id GROUP BY u.name)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 / u.user_id FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.user_id HAVING u.user_id IS NOT NULL)",
		"UPDATE t_order o SET status = (SELECT upper(max(u.name)) FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name)",
		"UPDATE t_order o SET status = (SELECT DISTINCT u.name FROM t_user u WHERE u.user_id = o.user_id)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id = o.user_id AND u.name IN (SELECT name FROM t_user))",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u JOIN t_user v ON v.user_id = o.user_id WHERE u.user_id = v.user_id)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id = o.nosuch)",
		"UPDATE t_order o SET status = (SELECT u FROM t_user u WHERE u.user_id = o.user_id)", // a whole row
		"UPDATE t_order o SET status = 'x' FROM t_config WHERE t_config.v = (SELECT u.name FROM t_user u WHERE u.user_id = o.user_id)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u, t_user v WHERE u.user_id = o.user_id AND name = 'a')", // ambiguous
		"DELETE FROM t_order o WHERE EXISTS (SELECT nosuch.* FROM t_user u WHERE u.user_id < o.user_id)",                   // an error one database raises
		"DELETE FROM t_order o WHERE EXISTS (SELECT o.* FROM t_user u WHERE u.user_id < o.user_id)",
		"UPDATE t_order o SET status = array_to_string(ARRAY(SELECT u.name FROM t_user u WHERE u.user_id < o.user_id), ',')", // in the rows' order
		"UPDATE t_order o SET (status, user_id) = (SELECT u.name, u.user_id FROM t_user u WHERE u.user_id < o.user_id)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u JOIN t_user v ON 10 / v.user_id > 1 WHERE u.user_id < o.user_id)",
		"UPDATE t_order o SET status = 'x' RETURNING (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id)", // the answer's type modifier
		// A condition that may fail (a division, a LIKE pattern that may end in its
		// escape), evaluated by one database on the rows and in the order of its plan.
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id = o.user_id AND 10 / u.user_id > 1)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id = o.user_id AND u.name LIKE $1)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id = o.user_id AND u.name::int > 1)",
		"UPDATE t_order o SET status = (SELECT count(*) FILTER (WHERE 1 / u.user_id > 0) FROM t_user u WHERE u.user_id < o.user_id)::text",
		// A scalar subquery in WHERE: whether it runs (and raises 21000) follows the costs
		// of the conditions beside it, which the rewrite changes.
		"DELETE FROM t_order o WHERE o.status = (SELECT u.name FROM t_user u WHERE u.user_id = o.user_id) AND o.user_id IN (SELECT user_id FROM t_user)",
		"DELETE FROM t_order o WHERE o.status = (SELECT u.name FROM t_user u WHERE u.user_id = o.user_id) AND length(o.status) > 1",
		"DELETE FROM t_order o WHERE o.status = (SELECT u.name FROM t_user u WHERE u.user_id = o.user_id) AND o.order_id > 3",
		// Values the statement compares through a cast that may fail, or by an operator
		// that may fail, or of a type the client chose (a parameter).
		"DELETE FROM t_order o WHERE o.user_id IN (SELECT u.weight FROM t_user u WHERE u.name = o.status)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.weight < o.user_id)",
		"DELETE FROM t_order o WHERE o.status ~ ANY (SELECT u.name FROM t_user u WHERE u.user_id = o.user_id)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = o.user_id AND (u.name = $1 OR u.name = o.status))",
		// UPDATE ... FROM: a function in the SET list (once per joined pair on one
		// database), a condition of the changed table that may fail.
		"UPDATE t_order o SET status = nextval('s')::text FROM t_user u WHERE u.user_id < o.user_id",
		"DELETE FROM t_order o USING t_user u WHERE u.user_id < o.user_id AND 10 / o.order_id > 1",
		// Joined by a condition that may fail: the join evaluates it over every pair,
		// EXISTS stops at a row's first match.
		"DELETE FROM t_order o USING t_user u WHERE u.user_id < o.user_id AND 10 / u.user_id > 1",
		"DELETE FROM t_order o USING t_user u WHERE u.user_id < o.user_id AND u.user_id / 2 < o.order_id",
		// The SET list reads the other table in a function call, a subscript, a
		// multiple assignment, or RETURNING reads it; a join condition that may fail,
		// or compares a parameter.
		"UPDATE t_order o SET status = lower(u.name) FROM t_user u WHERE u.user_id < o.user_id",
		"UPDATE t_order o SET status[u.user_id] = u.name FROM t_user u WHERE u.user_id < o.user_id",
		"UPDATE t_order o SET (status, user_id) = (u.name, u.user_id) FROM t_user u WHERE u.user_id < o.user_id",
		"UPDATE t_order o SET status = u.name FROM t_user u WHERE u.user_id < o.user_id RETURNING u.name",
		// A value computed over the changed table's columns too, a function that reads
		// the session's settings or is no scalar function of PostgreSQL's, a parameter,
		// a cast to a type that may be the user's: not computed first.
		"UPDATE t_order o SET status = (SELECT u.name || o.status FROM t_user u WHERE u.user_id = o.user_id)",
		"UPDATE t_order o SET status = (SELECT u.name || $1 FROM t_user u WHERE u.user_id = o.user_id)",
		"UPDATE t_order o SET status = (SELECT to_char(u.score, '999') FROM t_user u WHERE u.user_id = o.user_id)",
		"UPDATE t_order o SET status = (SELECT public.lower(u.name) FROM t_user u WHERE u.user_id = o.user_id)",
		"UPDATE t_order o SET status = (SELECT \"LOWER\"(u.name) FROM t_user u WHERE u.user_id = o.user_id)",
		"UPDATE t_order o SET status = (SELECT md5(u.name || random()) FROM t_user u WHERE u.user_id = o.user_id)",
		"UPDATE t_order o SET user_id = (SELECT sum(abs(VARIADIC ARRAY[u.user_id])) FROM t_user u WHERE u.user_id < o.order_id)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id ORDER BY u.user_id + o.order_id LIMIT 1)",
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id ORDER BY random() LIMIT 1)",
		// A scalar function beside an aggregate that reads a column outside it.
		"UPDATE t_order o SET user_id = (SELECT round(u.score) + count(*) FROM t_user u WHERE u.user_id < o.order_id)",
		"UPDATE t_order o SET status = (SELECT string_agg(u.name, ',') FROM t_user u WHERE u.user_id < o.order_id)",
		"UPDATE t_order o SET user_id = (SELECT round(avg(u.user_id)) OVER () FROM t_user u WHERE u.user_id < o.order_id)",
		"UPDATE t_order o SET status = (SELECT u.name::my_domain FROM t_user u WHERE u.user_id = o.user_id)",
		"UPDATE t_order o SET user_id = (SELECT sum(u.user_id + o.order_id) FROM t_user u WHERE u.user_id < o.order_id)",
		// A name column (its collation is C, a text array's is not); the clock; a cast
		// to a date, or to an object's identifier.
		"UPDATE t_order o SET status = (SELECT u.login || 'x' FROM t_user u WHERE u.user_id = o.user_id)",
		"UPDATE t_order o SET status = (SELECT CASE WHEN u.score > 1 THEN 'Today' END FROM t_user u WHERE u.user_id = o.user_id)",
		"UPDATE t_order o SET status = (SELECT (u.name::date + 1)::text FROM t_user u WHERE u.user_id = o.user_id)",
		"UPDATE t_order o SET status = (SELECT u.name::pg_catalog.regclass::oid FROM t_user u WHERE u.user_id = o.user_id)",
		// A cast to name: one database keeps the operand's collation, a name array's
		// elements take C.
		"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id ORDER BY u.name::name LIMIT 1)",
		"UPDATE t_order o SET status = (SELECT max(u.name::name) FROM t_user u WHERE u.user_id < o.user_id)",
		// Other tables joined only through the changed one: read first as their cross
		// product.
		"UPDATE t_order o SET status = u.name FROM t_user u, t_user v WHERE u.user_id = o.user_id AND v.user_id = o.order_id",
		"UPDATE t_order o SET status = u.name FROM t_user u JOIN t_user v ON true WHERE u.user_id = o.user_id AND v.user_id = o.order_id",
		// A broadcast table changed by a pick among rows: each copy could pick another.
		"UPDATE t_config g SET name = u.name FROM t_user u WHERE u.user_id = g.user_id",
		"UPDATE t_config g SET name = (SELECT u.name FROM t_user u WHERE u.user_id > g.user_id LIMIT 1)",
		"UPDATE t_config g SET name = (SELECT u.name FROM t_user u WHERE u.user_id > g.user_id ORDER BY u.user_id LIMIT 1)",
		"UPDATE t_order o SET status = u.name FROM t_user u WHERE u.weight < o.user_id",
		"UPDATE t_order o SET status = u.name FROM t_user u WHERE u.user_id = o.user_id AND o.status = u.name || 'x'",
		"UPDATE t_order o SET status = u.name FROM t_user u WHERE u.user_id = o.user_id AND (o.status = $1 OR u.name = o.status)",
		// In WHERE, whether the subquery runs for a row follows the costs beside it,
		// which the rewrite changes: nothing computed over aggregates, which may fail
		// (the review of 2026-11-28 found a DELETE that one database failed with 22012
		// delete nothing in two steps), and no sum of an unbounded numeric, which
		// overflows past 1e131072; nor beside grouping, whose groups are finished in
		// another order.
		"DELETE FROM t_order o WHERE EXISTS (SELECT mod(count(*), 0) FROM t_user u WHERE u.user_id = o.user_id)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT count(*)::int FROM t_user u WHERE u.user_id < o.user_id)",
		"DELETE FROM t_order o WHERE o.user_id IN (SELECT max(u.user_id) + 1 FROM t_user u WHERE u.name = o.status)",
		"DELETE FROM t_order o WHERE o.user_id IN (SELECT sum(u.amount) FROM t_user u WHERE u.name = o.status)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name HAVING sum(u.amount) > 1)",
		"UPDATE t_order o SET status = (SELECT avg(u.amount) FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name HAVING u.name = o.status)::text",
	} {
		pl, err := p.Prepare(ctx, sql)
		if err != nil || pl.Pre == nil {
			continue
		}
		for _, sub := range pl.Pre.Subqueries {
			if sub.Kind == sqlplan.SubqueryColumns {
				t.Errorf("%s: in two steps: %+v", sql, pl.Pre)
			}
		}
	}
}

// TestCorrelatedBounded: where the rewrite changes whether or when a sum's overflow
// would come (grouped, or in WHERE), sums of integers and of numeric columns with a
// precision are answered, and a value computed first is checked when the first step
// answers (Subquery.Bounded: refused when numeric); elsewhere nothing is bounded, and
// in the SET list a value computed over aggregates stays answered.
func TestCorrelatedBounded(t *testing.T) {
	ctx := context.Background()
	p := sqlplan.New(testRules(t), typedKeyCatalog{}, sqlplan.Options{})
	for _, c := range []struct {
		sql     string
		bounded []int
	}{
		{"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id < o.user_id GROUP BY u.name HAVING sum(u.score) > 1 AND avg(u.user_id) > 2)", nil},
		{"UPDATE t_order o SET user_id = (SELECT sum(u.user_id * 2) FROM t_user u WHERE u.user_id < o.order_id GROUP BY u.name HAVING u.name = o.status)", []int{0}},
		{"DELETE FROM t_order o WHERE EXISTS (SELECT sum(u.user_id * 2) FROM t_user u WHERE u.name = o.status)", []int{0}},
		{"UPDATE t_order o SET user_id = (SELECT sum(u.user_id * 2) + count(*) FROM t_user u WHERE u.user_id < o.order_id)", nil},
		{"UPDATE t_order o SET user_id = (SELECT round(avg(u.amount), 2) FROM t_user u WHERE u.user_id < o.order_id)", nil},
	} {
		pl, err := p.Prepare(ctx, c.sql)
		if err != nil || pl.Pre == nil || len(pl.Pre.Subqueries) != 1 || pl.Pre.Subqueries[0].Kind != sqlplan.SubqueryColumns {
			t.Errorf("%s: not in two steps: %v %v", c.sql, err, pl)
			continue
		}
		if got := pl.Pre.Subqueries[0].Bounded; !slices.Equal(got, c.bounded) {
			t.Errorf("%s: bounded %v, want %v", c.sql, got, c.bounded)
		}
	}
}

// TestCorrelatedPicked: a sort key under a limit that reads a column the select list
// reads, plainly or inside a computed value, is picked (its type must be one whose
// equal values are alike: min in another form); one that reads none is not.
func TestCorrelatedPicked(t *testing.T) {
	ctx := context.Background()
	p := sqlplan.New(testRules(t), typedKeyCatalog{}, sqlplan.Options{})
	for _, c := range []struct {
		sql    string
		picked []int
	}{
		{"UPDATE t_order o SET user_id = (SELECT abs(u.score) FROM t_user u WHERE u.user_id < o.user_id ORDER BY abs(u.score) LIMIT 1)", []int{2}},
		{"UPDATE t_order o SET status = (SELECT (u.score + 0)::text FROM t_user u WHERE u.user_id < o.user_id ORDER BY u.score * 1 LIMIT 1)", []int{2}},
		{"UPDATE t_order o SET status = (SELECT (u.score + 0)::text FROM t_user u WHERE u.user_id < o.user_id ORDER BY u.score LIMIT 1)", []int{2}},
		{"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id ORDER BY u.name, abs(u.score) LIMIT 1)", []int{0}},
		{"UPDATE t_order o SET status = (SELECT u.name FROM t_user u WHERE u.user_id < o.user_id ORDER BY abs(u.score) LIMIT 1)", nil},
		// A group key selected: the value of its group's first row, picked where a
		// scalar subquery answers it; compared by IN, or never read by EXISTS, any
		// of equal values answers alike.
		{"UPDATE t_order o SET status = (SELECT u.score FROM t_user u WHERE u.name = o.status GROUP BY u.score HAVING count(*) > 1)::text", []int{0}},
		{"DELETE FROM t_order o WHERE o.user_id IN (SELECT u.score FROM t_user u WHERE u.name = o.status GROUP BY u.score HAVING count(*) > 1)", nil},
		{"DELETE FROM t_order o WHERE o.user_id > ALL (SELECT u.score FROM t_user u WHERE u.name = o.status GROUP BY u.score)", nil},
		{"DELETE FROM t_order o WHERE EXISTS (SELECT u.score FROM t_user u WHERE u.name = o.status GROUP BY u.score)", nil},
		{"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.name = o.status GROUP BY u.score)", nil},
	} {
		pl, err := p.Prepare(ctx, c.sql)
		if err != nil {
			t.Fatalf("%s: %v", c.sql, err)
		}
		if pl.Pre == nil || len(pl.Pre.Subqueries) != 1 || pl.Pre.Subqueries[0].Kind != sqlplan.SubqueryColumns {
			t.Errorf("%s: not in two steps: %+v", c.sql, pl.Pre)
			continue
		}
		if got := pl.Pre.Subqueries[0].Picked; !slices.Equal(got, c.picked) {
			t.Errorf("%s: picked %v, want %v (first step %s)", c.sql, got, c.picked, pl.Pre.Subqueries[0].SQL)
		}
	}
}

// UserOverloads: the database defines no operator, cast or function of PostgreSQL's
// names of its own.
func (typedKeyCatalog) UserOverloads(context.Context) (bool, error) { return false, nil }

// userOverloadsCatalog is typedKeyCatalog in a database with operators of its own.
type userOverloadsCatalog struct{ typedKeyCatalog }

func (userOverloadsCatalog) UserOverloads(context.Context) (bool, error) { return true, nil }

// TestComputedValuesNeedBuiltinOperators: where the database defines operators or
// casts of its own, a correlated subquery's values are not computed first (an
// operator could be a volatile function of the user's).
func TestComputedValuesNeedBuiltinOperators(t *testing.T) {
	ctx := context.Background()
	sql := "UPDATE t_order o SET status = (SELECT u.name || '-' || u.user_id FROM t_user u WHERE u.user_id = o.user_id)"
	for _, c := range []struct {
		cat      sqlplan.Catalog
		computed bool
	}{{typedKeyCatalog{}, true}, {userOverloadsCatalog{}, false}} {
		pl, err := sqlplan.New(testRules(t), c.cat, sqlplan.Options{}).Prepare(ctx, sql)
		if err != nil {
			t.Fatal(err)
		}
		steps := pl.Pre != nil && len(pl.Pre.Subqueries) == 1 && pl.Pre.Subqueries[0].Kind == sqlplan.SubqueryColumns
		if steps != c.computed {
			t.Errorf("%T: in two steps %v, want %v (%+v)", c.cat, steps, c.computed, pl.Pre)
		}
	}
}

// typedKeyCatalog is keyCatalog with its columns' types (the two steps compare only
// values whose types need no cast that may fail).
type typedKeyCatalog struct{ keyCatalog }

func (typedKeyCatalog) ColumnTypes(_ context.Context, t *rules.TableRule) (map[string]string, error) {
	if t.Name == "t_order" {
		return map[string]string{"order_id": "bigint", "user_id": "integer", "status": "text"}, nil
	}
	return map[string]string{"user_id": "integer", "name": "text", "score": "numeric(10,2)", "weight": "double precision", "login": "name", "amount": "numeric"}, nil
}
