package sqlplan_test

import (
	"context"
	"testing"

	"github.com/shardlab/shardlab/sqlplan"
)

// TestSessionEffects: what a statement may do to its server connection's session is
// read from its parse tree, through both the extended and the simple protocol's plans.
func TestSessionEffects(t *testing.T) {
	const (
		none    = sqlplan.SessionEffects(0)
		config  = sqlplan.EffectSetConfig
		binds   = sqlplan.EffectBinds
		unbinds = sqlplan.EffectUnbinds
	)
	tests := []struct {
		sql  string
		want sqlplan.SessionEffects
	}{
		{"SELECT c FROM sbtest1 WHERE id = 1", none},
		{"SELECT 'set_config(temp) drop advisory'", none}, // words in a string are not calls
		{"SELECT set_config('app.user', '7', false)", config},
		{"SELECT pg_catalog.set_config('work_mem', '8MB', true)", config},
		{"SELECT myschema.set_config('x', 'y', false)", none},
		{"SELECT pg_advisory_lock(1)", binds},
		{"SELECT pg_try_advisory_lock_shared(1, 2)", binds},
		{"SELECT pg_advisory_xact_lock(1)", none}, // released with its transaction
		{"SELECT pg_advisory_unlock(1)", unbinds},
		{"SELECT pg_advisory_unlock_all()", unbinds},
		{"CREATE TEMP TABLE scratch (x int)", binds},
		{"CREATE TEMPORARY TABLE scratch (x int) ON COMMIT DROP", binds},
		{"CREATE TABLE pg_temp.scratch (x int)", binds},
		{"CREATE TABLE attempts (x int)", none}, // "temp" inside a word
		{"CREATE TEMP VIEW v AS SELECT 1", binds},
		{"CREATE TEMP TABLE s AS SELECT 1 AS x", binds},
		{"DROP TABLE scratch", unbinds},
		{"SELECT set_config('a.b', 'c', false), pg_advisory_lock(2)", config | binds},
	}
	planner := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	ctx := context.Background()
	for _, tc := range tests {
		p, _, err := planner.PlanSimple(ctx, tc.sql)
		if err != nil {
			t.Errorf("%s: %v", tc.sql, err)
			continue
		}
		if p.Session != tc.want {
			t.Errorf("%s: simple protocol: effects %b, want %b", tc.sql, p.Session, tc.want)
		}
		p, err = planner.Prepare(ctx, tc.sql)
		if err != nil {
			t.Errorf("%s: %v", tc.sql, err)
			continue
		}
		if p.Session != tc.want {
			t.Errorf("%s: extended protocol: effects %b, want %b", tc.sql, p.Session, tc.want)
		}
	}
}
