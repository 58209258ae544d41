package sqlplan_test

import (
	"context"
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
