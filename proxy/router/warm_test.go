package router

import (
	"context"
	"testing"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/rules"
)

// newTestRouter makes a router over two data sources that it never connects to.
func newTestRouter(t *testing.T) *Router {
	t.Helper()
	l, err := rules.Compile(rules.Rules{DataSources: []rules.DataSource{
		{Name: "ds_0", DSN: "postgres://a@127.0.0.1:1/x"}, {Name: "ds_1", DSN: "postgres://a@127.0.0.1:1/y"}}})
	if err != nil {
		t.Fatal(err)
	}
	var pools []*backend.Pool
	for _, d := range l.DataSources() {
		p, err := backend.NewPool(d.Name, d.DSN, backend.Options{})
		if err != nil {
			t.Fatal(err)
		}
		pools = append(pools, p)
	}
	r, err := New(Config{Rules: l, Pools: pools, DeadlockInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// TestWarmForgottenAfterDDL: a router warmed from the one in force keeps its plans and
// descriptions when it takes that one's place, unless DDL ran through the one in force
// in between, which may have made them stale.
func TestWarmForgottenAfterDDL(t *testing.T) {
	ctx := context.Background()
	for _, ddl := range []bool{false, true} {
		old, n := newTestRouter(t), newTestRouter(t)
		if _, err := old.planner.Prepare(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		k := describeKey{sql: "SELECT 1"}
		old.describes.put(k, &description{})
		if plans, descriptions := n.Warm(ctx, old); plans != 1 || descriptions != 1 {
			t.Fatalf("warmed %d plans and %d descriptions, want 1 and 1", plans, descriptions)
		}
		if ddl {
			old.schemaChanged()
		}
		if err := old.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if err := old.Supersede(n); err != nil {
			t.Fatal(err)
		}
		kept := n.PlanCacheStats().Plans == 1 && n.describes.get(k) != nil
		if kept == ddl {
			t.Errorf("DDL before the switch %v: the warmed plans and descriptions kept %v", ddl, kept)
		}
	}
}
