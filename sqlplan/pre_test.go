package sqlplan_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/sqlplan"
)

// TestPrePlan: an UPDATE or DELETE refused because its subqueries over sharded tables
// span shards carries how to evaluate them first (sqlplan.Pre): each subquery, its
// kind, and the statement with parameters in their places. On the old code there was
// only the refusal.
func TestPrePlan(t *testing.T) {
	ctx := context.Background()
	p := sqlplan.New(testRules(t), keyCatalog{}, sqlplan.Options{})
	for _, c := range []struct {
		sql   string
		kinds []sqlplan.SubqueryKind
		subs  []string
		then  string
	}{
		{"DELETE FROM t_order WHERE status IN (SELECT name FROM t_user WHERE name LIKE $1)",
			[]sqlplan.SubqueryKind{sqlplan.SubqueryArray}, []string{"SELECT name FROM t_user WHERE name LIKE $1"},
			"DELETE FROM t_order WHERE status = ANY($2)"},
		{"UPDATE t_order SET status = (SELECT max(name) FROM t_user), qty = 1 WHERE user_id NOT IN (SELECT user_id FROM t_user) AND EXISTS (SELECT 1 FROM t_user) RETURNING order_id",
			[]sqlplan.SubqueryKind{sqlplan.SubqueryScalar, sqlplan.SubqueryArray, sqlplan.SubqueryExists},
			[]string{"SELECT max(name) FROM t_user", "SELECT user_id FROM t_user", "SELECT 1 FROM t_user LIMIT 1"},
			"UPDATE t_order SET status = $1, qty = 1 WHERE NOT user_id = ANY($2) AND $3 RETURNING order_id"},
		{"DELETE FROM t_order WHERE qty > ALL (SELECT qty FROM t_order_item)",
			[]sqlplan.SubqueryKind{sqlplan.SubqueryArray}, []string{"SELECT qty FROM t_order_item"},
			"DELETE FROM t_order WHERE qty > ALL($1)"},
		// Joined by one equality, read nowhere else: the other tables are a subquery.
		{"UPDATE t_order o SET status = 'x' FROM t_user u WHERE u.user_id = o.user_id AND u.name LIKE $1 AND o.status <> 'y' RETURNING o.order_id",
			[]sqlplan.SubqueryKind{sqlplan.SubqueryArray}, []string{"SELECT u.user_id FROM t_user u WHERE u.name LIKE $1"},
			"UPDATE t_order o SET status = 'x' WHERE o.status <> 'y' AND o.user_id = ANY($2) RETURNING o.order_id"},
		// A semi-join written with EXISTS, correlated by one equality: the same.
		{"DELETE FROM t_order o WHERE o.status <> 'y' AND EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = o.user_id AND u.name LIKE $1) RETURNING o.order_id",
			[]sqlplan.SubqueryKind{sqlplan.SubqueryArray}, []string{"SELECT u.user_id FROM t_user u WHERE u.name LIKE $1"},
			"DELETE FROM t_order o WHERE o.status <> 'y' AND o.user_id = ANY($2) RETURNING o.order_id"},
		{"UPDATE t_order SET status = 'x' WHERE EXISTS (SELECT * FROM t_user WHERE t_order.user_id = t_user.user_id)",
			[]sqlplan.SubqueryKind{sqlplan.SubqueryArray}, []string{"SELECT t_user.user_id FROM t_user"},
			"UPDATE t_order SET status = 'x' WHERE t_order.user_id = ANY($1)"},
		// NOT EXISTS: no row joins, NULL keys included.
		{"DELETE FROM t_order o WHERE o.status <> 'y' AND NOT EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = o.user_id AND u.name = 'a')",
			[]sqlplan.SubqueryKind{sqlplan.SubqueryArray}, []string{"SELECT u.user_id FROM t_user u WHERE u.name = 'a' AND u.user_id IS NOT NULL"},
			"DELETE FROM t_order o WHERE o.status <> 'y' AND (o.user_id IS NULL OR NOT o.user_id = ANY($1))"},
		// The statement's own conditions and lists stay in the changed table's scope:
		// name, a column of t_user only, is an error there, as in the statement.
		{"UPDATE t_order o SET status = name WHERE name = 'a' AND EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = o.user_id)",
			[]sqlplan.SubqueryKind{sqlplan.SubqueryArray}, []string{"SELECT u.user_id FROM t_user u"},
			"UPDATE t_order o SET status = name WHERE name = 'a' AND o.user_id = ANY($1)"},
		{"DELETE FROM t_order USING t_user WHERE t_user.name = 'a' AND t_order.user_id = t_user.user_id + 0",
			[]sqlplan.SubqueryKind{sqlplan.SubqueryArray}, []string{"SELECT t_user.user_id + 0 FROM t_user WHERE t_user.name = 'a'"},
			"DELETE FROM t_order WHERE t_order.user_id = ANY($1)"},
	} {
		pl, err := p.Prepare(ctx, c.sql)
		if err != nil {
			t.Fatalf("%s: %v", c.sql, err)
		}
		if _, err := pl.Bind(sqlplan.Args{Values: make([][]byte, pl.NumParams)}); !errors.Is(err, sqlplan.ErrUnsupported) {
			t.Errorf("%s: bind %v, want the refusal", c.sql, err)
		}
		pre := pl.Pre
		if pre == nil || !pre.AsWritten || len(pre.Subqueries) != len(c.kinds) {
			t.Errorf("%s: pre %+v", c.sql, pre)
			continue
		}
		// The parameters are numbered in the order the subqueries were found: put
		// each subquery back in its parameter's place.
		back := pre.SQL
		for i := len(pre.Subqueries) - 1; i >= 0; i-- {
			back = strings.ReplaceAll(back, fmt.Sprintf("$%d", pre.Params+i+1), fmt.Sprintf("<%d %s>", pre.Subqueries[i].Kind, pre.Subqueries[i].SQL))
		}
		want := c.then
		for i := len(c.subs) - 1; i >= 0; i-- {
			want = strings.ReplaceAll(want, fmt.Sprintf("$%d", i+1+strings.Count(c.sql, "$")), fmt.Sprintf("<%d %s>", c.kinds[i], c.subs[i]))
		}
		if back != want {
			t.Errorf("%s:\n got  %s\n want %s", c.sql, back, want)
		}
	}
	// No Pre: a WITH clause (a subquery could name its queries), a row compared, a
	// subquery over copied tables only (the merge answers those).
	for _, sql := range []string{
		"WITH x AS (SELECT 1) DELETE FROM t_order WHERE status IN (SELECT name FROM t_user)",
		"DELETE FROM t_order WHERE (user_id, status) IN (SELECT user_id, name FROM t_user)",
		"DELETE FROM t_order WHERE status IN (SELECT v FROM t_config)",
		// A cast to a type that may be a domain: read back as its base type.
		"UPDATE t_order SET status = (SELECT max(name)::mytext FROM t_user)",
		// Printed back, (a OR b) = ANY($1) would lose its parentheses.
		"DELETE FROM t_order WHERE (status = 'a' OR qty > 1) IN (SELECT true FROM t_user)",
		// The subquery's t_user is the derived table's WITH query, not the table.
		"DELETE FROM t_order USING (WITH t_user AS (SELECT 1 AS user_id) SELECT order_id FROM t_config WHERE user_id IN (SELECT user_id FROM t_user)) d WHERE t_order.order_id = d.order_id",
		// Read elsewhere, or joined by a condition that may fail: as written (joined
		// otherwise, EXISTS, and a SET list that takes the other table's columns:
		// TestCorrelatedPlan).
		"UPDATE t_order o SET status = 'x' FROM t_user u WHERE u.user_id = o.user_id RETURNING *",
		"UPDATE t_order o SET status = 'x' FROM t_user u WHERE u.user_id = o.user_id RETURNING u.*",
		"UPDATE t_order o SET status = 'x' FROM t_user u WHERE u.user_id = o.user_id RETURNING u.name",
		"DELETE FROM t_order o USING t_user u WHERE u.user_id = o.user_id + u.user_id",
		"DELETE FROM t_order o USING t_user u WHERE o.user_id = max(u.user_id)", // an aggregate, which WHERE refuses
		"UPDATE t_order o SET status = 'x' FROM t_user u WHERE o.user_id = generate_series(u.user_id, 2)",
		"UPDATE t_order o SET status[u.user_id] = 'x' FROM t_user u WHERE o.user_id = u.user_id",                           // a subscript reading the other table
		"UPDATE t_order o SET status = 'x' FROM t_user u WHERE u.user_id = $1 AND o.status > $1 AND o.user_id = u.user_id", // a parameter read twice
		"DELETE FROM t_order o USING t_user u WHERE o.user_id = u.user_id AND nextval('s') > 0",                            // a volatile condition of no column
		"UPDATE t_order o SET status = DEFAULT FROM t_user u WHERE u.user_id = o.user_id",                                  // nextval once per joined pair
		"UPDATE t_order o SET status = DEFAULT FROM t_user u WHERE u.user_id < o.user_id",
		"DELETE FROM t_order o USING t_user u WHERE o.user_id = u.user_id RETURNING o.ctid",                                 // a system column
		"DELETE FROM t_order o USING t_user u WHERE o.user_id = u.user_id RETURNING o",                                      // the whole row
		"DELETE FROM t_order o USING t_user u WHERE u.user_id = user_id",                                                    // ambiguous
		"DELETE FROM t_order USING t_user u JOIN t_user v ON v.user_id = t_order.user_id WHERE u.user_id = t_order.user_id", // a join condition reading the changed table
	} {
		pl, err := p.Prepare(ctx, sql)
		if err == nil && pl.Pre != nil {
			t.Errorf("%s: pre %+v", sql, pl.Pre)
		}
	}
	// EXISTS not made a semi-join: under OR or a NOT of more, NOT EXISTS with a
	// condition of the changed table, a select list of columns, a function call,
	// grouped, aggregated or limited, correlated otherwise than by one equality, a name
	// both scopes hold, or a statement with FROM of its own. (Some are evaluated in two
	// steps instead: TestCorrelatedPlan.)
	for _, sql := range []string{
		"DELETE FROM t_order o WHERE NOT EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = o.user_id AND o.status = 'a')", // could not stay outside the NOT
		"DELETE FROM t_order o WHERE NOT (o.status = 'a' AND EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = o.user_id))",
		"DELETE FROM t_order o WHERE NOT EXISTS (SELECT 1 FROM t_user u WHERE o.status = ROW(u.user_id, u.name))", // a whole row
		"DELETE FROM t_order o WHERE NOT EXISTS (SELECT 1 FROM t_user u WHERE o.* = u.name)",
		"DELETE FROM t_order o WHERE o.status = 'a' OR EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = o.user_id)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT count(*) FROM t_user u WHERE u.user_id = o.user_id)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT nosuch FROM t_user u WHERE u.user_id = o.user_id)", // an error one database raises
		"DELETE FROM t_order o WHERE EXISTS (SELECT u.* FROM t_user u WHERE u.user_id = o.user_id)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = o.user_id AND u.user_id >= nextval('s'))", // once per row
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = o.user_id AND lower(u.name) = 'a')",
		"DELETE FROM t_order o WHERE EXISTS (SELECT generate_series(1, 0) FROM t_user u WHERE u.user_id = o.user_id)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = o.user_id LIMIT 0)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = o.user_id GROUP BY u.name HAVING count(*) > 1)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id < o.user_id)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = user_id)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user o WHERE o.user_id = o.user_id)",
		"DELETE FROM t_order o WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = o.user_id) AND EXISTS (SELECT 1 FROM t_user v WHERE v.name = o.status)",
		"UPDATE t_order o SET status = 'x' FROM t_user v WHERE EXISTS (SELECT 1 FROM t_user u WHERE u.user_id = o.user_id)",
	} {
		pl, err := p.Prepare(ctx, sql)
		if err != nil || pl.Pre == nil {
			continue
		}
		for _, sub := range pl.Pre.Subqueries {
			if sub.Kind == sqlplan.SubqueryArray {
				t.Errorf("%s: rewritten, pre %+v", sql, pl.Pre)
			}
		}
	}
	// A simple-protocol statement's plan is made from its normalised text: its Pre
	// says to plan the statement's own text for the literals.
	pl, _, err := p.PlanSimple(ctx, "DELETE FROM t_order WHERE status IN (SELECT name FROM t_user WHERE name = 'a')")
	if err != nil || pl.Pre == nil || pl.Pre.AsWritten {
		t.Errorf("normalised: %v %+v", err, pl)
	}
}
