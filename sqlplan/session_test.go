package sqlplan_test

import (
	"context"
	"testing"

	"github.com/shardlab/shardlab/rules"
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

// TestOneShardPassesThrough: over rules of one shard, what the analysis refuses across
// shards is planned to run as written on that shard; over two it stays refused.
func TestOneShardPassesThrough(t *testing.T) {
	one, err := rules.Compile(rules.Rules{DataSources: []rules.DataSource{{Name: "ds_0", DSN: "postgres://a/x"}},
		Tables: []rules.Table{{Name: "t", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt4}}}})
	if err != nil {
		t.Fatal(err)
	}
	split, err := rules.Compile(rules.Rules{DataSources: []rules.DataSource{{Name: "ds_0", DSN: "postgres://a/x"}},
		Tables: []rules.Table{{Name: "t", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt4}, TablesPerDataSource: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if !one.OneShard() || split.OneShard() || testRules(t).OneShard() {
		t.Fatalf("OneShard: %v %v %v, want true false false", one.OneShard(), split.OneShard(), testRules(t).OneShard())
	}
	ctx := context.Background()
	for _, sql := range []string{"DO $$ BEGIN PERFORM 1; END $$", "PREPARE p AS SELECT $1::int + 1", "CALL f(1)",
		"SELECT id, rank() OVER (ORDER BY id) FROM t", "CREATE DATABASE x", "INSERT INTO t SELECT g FROM generate_series(1, 3) g"} {
		p, _, err := sqlplan.New(one, nil, sqlplan.Options{}).PlanSimple(ctx, sql)
		if err != nil || p.Kind != sqlplan.KindPassthrough && p.Kind != sqlplan.KindSelect {
			t.Errorf("one shard: %s: %v %v", sql, p, err)
			continue
		}
		b, err := p.BindSimple(sql, nil)
		if err != nil || len(b.Targets) != 1 || b.Targets[0].SQL != sql {
			t.Errorf("one shard: %s: bound %v %v", sql, b, err)
		}
		if _, _, err := sqlplan.New(split, nil, sqlplan.Options{}).PlanSimple(ctx, sql); err == nil && sql[0] == 'D' {
			t.Errorf("one data source, two tables: %s planned", sql)
		}
	}
	if p, _, _ := sqlplan.New(one, nil, sqlplan.Options{}).PlanSimple(ctx, "CREATE DATABASE x"); p == nil || !p.NoTransaction {
		t.Error("CREATE DATABASE may be wrapped in a transaction")
	}
}
