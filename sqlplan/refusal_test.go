package sqlplan_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/sqlplan"
)

// TestRefusalsNameTheStatement: a statement type refused over several shards is named
// in SQL words, never by its parse node.
func TestRefusalsNameTheStatement(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	for sql, want := range map[string]string{
		"REINDEX TABLE t_order":                                              "REINDEX",
		"CLUSTER t_order USING t_order_pkey":                                 "CLUSTER",
		"MERGE INTO t_order USING t_config ON true WHEN MATCHED THEN DELETE": "MERGE",
		"CREATE TABLESPACE ts LOCATION '/tmp/ts'":                            "CREATE TABLESPACE",
		"CREATE DATABASE other":                                              "CREATE DATABASE",
		"ALTER SYSTEM SET work_mem = '8MB'":                                  "ALTER SYSTEM",
		"CREATE PUBLICATION pub FOR ALL TABLES":                              "CREATE PUBLICATION",
		"REFRESH MATERIALIZED VIEW mv":                                       "REFRESH MATERIALIZED VIEW",
		"IMPORT FOREIGN SCHEMA s FROM SERVER x INTO y":                       "IMPORT FOREIGN SCHEMA",
	} {
		_, err := p.Prepare(context.Background(), sql)
		if sqlplan.Code(err) != sqlplan.CodeFeatureNotSupported || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "Stmt") {
			t.Errorf("%s: %v, want 0A000 naming %s", sql, err, want)
		}
	}
}

// TestEveryPlacedTableFollowed: a sharded or copied table the analysis does not look
// into is refused (0A000 naming it), never read where the statement is sent; the
// subqueries of a set operation's LIMIT are followed; a table of the default data
// source needs no following.
func TestEveryPlacedTableFollowed(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	for sql, table := range map[string]string{
		"SELECT count(*) FROM t_user TABLESAMPLE SYSTEM (50)":                     "t_user",
		"SELECT * FROM t_config TABLESAMPLE BERNOULLI (10) REPEATABLE (1)":        "t_config",
		"SELECT d.x FROM d JOIN t_user u TABLESAMPLE SYSTEM (5) ON u.user_id = 1": "t_user",
	} {
		_, err := p.Prepare(context.Background(), sql)
		if sqlplan.Code(err) != sqlplan.CodeFeatureNotSupported || !strings.Contains(err.Error(), table) {
			t.Errorf("%s: %v, want 0A000 naming %s", sql, err, table)
		}
	}
	plan, err := p.Prepare(context.Background(), "SELECT x FROM d UNION ALL SELECT x FROM d LIMIT (SELECT count(*) FROM t_user)")
	if err == nil && !slices.Contains(plan.Tables, "t_user") {
		t.Errorf("a subquery in a UNION's LIMIT: planned over %v, without t_user", plan.Tables)
	}
	if _, err := p.Prepare(context.Background(), "SELECT * FROM d TABLESAMPLE SYSTEM (50)"); err != nil {
		t.Errorf("TABLESAMPLE of a table of the default data source: %v", err)
	}
}
