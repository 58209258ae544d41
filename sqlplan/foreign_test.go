package sqlplan_test

import (
	"context"
	"testing"

	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// TestForeignTextKeys: with Args.ForeignText, a text key outside ASCII names no shard:
// a read by it goes to every shard, an INSERT by it is refused; an ASCII key, or one
// without ForeignText, routes to its shard.
func TestForeignTextKeys(t *testing.T) {
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "a", DSN: "postgres://a/x"}, {Name: "b", DSN: "postgres://b/x"}},
		Tables:      []rules.Table{{Name: "city", Strategy: rules.Strategy{Column: "name", Type: rules.TypeText}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := sqlplan.New(c, nil, sqlplan.Options{})
	ctx := context.Background()
	sel, err := p.Prepare(ctx, "SELECT * FROM city WHERE name = $1")
	if err != nil {
		t.Fatal(err)
	}
	ins, err := p.Prepare(ctx, "INSERT INTO city (name) VALUES ($1)")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key     string
		foreign bool
		targets int
	}{{"\x93\x8c\x8b\x9e", true, 2}, {"東京", false, 1}, {"Tokyo", true, 1}} {
		args := sqlplan.Args{Values: [][]byte{[]byte(tc.key)}, ForeignText: tc.foreign}
		b, err := sel.Bind(args)
		if err != nil || len(b.Targets) != tc.targets {
			t.Errorf("SELECT by %q (foreign %v): %d targets (%v), want %d", tc.key, tc.foreign, len(b.Targets), err, tc.targets)
		}
		_, err = ins.Bind(args)
		if refused := sqlplan.Code(err) == sqlplan.CodeFeatureNotSupported; refused != (tc.targets == 2) {
			t.Errorf("INSERT of %q (foreign %v): %v", tc.key, tc.foreign, err)
		}
	}
	lit, lits, err := p.PlanSimple(ctx, "SELECT * FROM city WHERE name = '\x93\x8c\x8b\x9e'")
	if err != nil {
		t.Fatal(err)
	}
	stmt := "SELECT * FROM city WHERE name = '\x93\x8c\x8b\x9e'"
	if b, err := lit.BindSimpleForeign(stmt, lits); err != nil || len(b.Targets) != 2 {
		t.Errorf("a foreign literal key: %v %v, want every shard", b, err)
	}
	if b, err := lit.BindSimple(stmt, lits); err != nil || len(b.Targets) != 1 {
		t.Errorf("the same literal as the server's encoding: %v %v, want one shard", b, err)
	}
}
