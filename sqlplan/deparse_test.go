package sqlplan

import (
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// TestDeparseReadsTheSame: a statement is printed back as SQL only when the text reads
// as the statement; pg_query's deparser prints (NOT a) IS NULL as NOT a IS NULL.
func TestDeparseReadsTheSame(t *testing.T) {
	for _, sql := range []string{
		`SELECT * FROM t WHERE a BETWEEN 1 AND 5 AND b LIKE 'x%' AND c IS DISTINCT FROM d AND NOT (e OR f)`,
		`SELECT (a > 1) IS TRUE, (a + 1) IS NULL, a = b IS NULL, date '1995-01-01', x::numeric(12,2), substring(s from 1 for 2) FROM t`,
		`UPDATE t SET a = a + 1 WHERE id IN (SELECT id FROM u WHERE u.k = $1) RETURNING *`,
		`WITH c AS MATERIALIZED (SELECT 1) SELECT * FROM c UNION ALL (SELECT 2 ORDER BY 1 LIMIT 1)`,
	} {
		tree, err := pg.Parse(sql)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := deparse(tree.Version, tree.Stmts[0].Stmt); err != nil {
			t.Errorf("%s: %v", sql, err)
		}
	}
	for _, sql := range []string{
		`SELECT * FROM t WHERE (NOT a > 1) IS NULL`,
		`UPDATE t SET a = 1 WHERE id = 5 AND (b = 'a' OR c > 1) IS NOT NULL`,
		`SELECT ((a AND b) IS NULL) FROM t`,
	} {
		tree, err := pg.Parse(sql)
		if err != nil {
			t.Fatal(err)
		}
		text, err := deparse(tree.Version, tree.Stmts[0].Stmt)
		if Code(err) != CodeFeatureNotSupported || !strings.Contains(err.Error(), "IS [NOT] NULL") {
			t.Errorf("%s: printed as %q (%v), want a 0A000 refusal naming IS NULL", sql, text, err)
		}
	}
}
