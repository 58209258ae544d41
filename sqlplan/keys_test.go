package sqlplan_test

import (
	"context"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// keyCatalog gives t_order's key a serial's sequence and t_user's an identity
// GENERATED ALWAYS; other keys have no sequence.
type keyCatalog struct{ floatCatalog }

func (keyCatalog) Columns(_ context.Context, t *rules.TableRule) ([]string, error) {
	if t.Name == "t_order" {
		return []string{"order_id", "user_id", "status"}, nil
	}
	return []string{"user_id", "name"}, nil
}

func (keyCatalog) KeySequence(_ context.Context, t *rules.TableRule, col string) (sqlplan.KeyDefault, error) {
	switch t.Name + "." + col {
	case "t_order.order_id":
		return sqlplan.KeyDefault{Sequence: "public.t_order_0_order_id_seq"}, nil
	case "t_user.user_id":
		return sqlplan.KeyDefault{Sequence: `"My Schema"."it's"`, Always: true}, nil
	case "t_event.event_id":
		return sqlplan.KeyDefault{Sequence: "public.ev", Always: true, OtherAlways: true}, nil
	}
	return sqlplan.KeyDefault{}, nil
}

// TestKeysDrawnFromSequence: an INSERT that leaves a sharded key out takes keys drawn
// before Bind, one per row in order, writes each into its row and routes the row by it.
func TestKeysDrawnFromSequence(t *testing.T) {
	ctx := context.Background()
	r := testRules(t)
	p := sqlplan.New(r, keyCatalog{}, sqlplan.Options{})
	pl, err := p.Prepare(ctx, "INSERT INTO t_order (user_id, status) VALUES (1, 'a'), ($1, 'b'), (3, 'c') RETURNING order_id")
	if err != nil {
		t.Fatal(err)
	}
	k := pl.Keys
	if k == nil || k.Count != 3 || k.DataSource != r.Lookup("t_order").Nodes[0].DataSource || pl.NumParams != 1 {
		t.Fatalf("keys %+v, %d params", k, pl.NumParams)
	}
	if want := "SELECT pg_catalog.nextval('public.t_order_0_order_id_seq'::pg_catalog.regclass) FROM pg_catalog.generate_series(1, 3)"; k.SQL() != want {
		t.Errorf("draw: %s", k.SQL())
	}
	keys := []string{"10", "11", "12"}
	b, err := pl.Bind(sqlplan.Args{Values: [][]byte{[]byte("2")}, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, tg := range b.Targets {
		for _, row := range tg.RowOrder {
			rows++
			if tg.Shard != orderShard(10+int64(row)) || !strings.Contains(tg.SQL, keys[row]+")") {
				t.Errorf("row %d (key %s) on shard %d: %s", row, keys[row], tg.Shard, tg.SQL)
			}
		}
		if !strings.Contains(tg.SQL, "(user_id, status, order_id)") {
			t.Errorf("the key column is not written: %s", tg.SQL)
		}
	}
	if rows != 3 {
		t.Errorf("%d rows routed", rows)
	}
	for _, bad := range [][]string{nil, {"1", "2"}, {"1", "2", "3); DROP TABLE x; --"}} {
		if _, err := pl.Bind(sqlplan.Args{Values: [][]byte{[]byte("2")}, Keys: bad}); err == nil {
			t.Errorf("keys %q bound", bad)
		}
	}
	// The description a shard gives: the key's default in its place.
	if _, sql := pl.DescribeSQL(); !strings.Contains(sql, "DEFAULT") {
		t.Errorf("describe: %s", sql)
	}

	// DEFAULT, DEFAULT VALUES, the simple protocol, an identity GENERATED ALWAYS.
	cases := []struct{ sql, want string }{
		{"INSERT INTO t_order (order_id, user_id) VALUES (DEFAULT, 7)", "(DEFAULT"},
		{"INSERT INTO t_order DEFAULT VALUES", "(order_id) VALUES (10)"},
		{"INSERT INTO t_order VALUES (DEFAULT, 1, 'x')", "VALUES (10, 1, 'x')"},
		{"INSERT INTO t_user (name) VALUES ('x')", "OVERRIDING SYSTEM VALUE VALUES ('x', 10)"},
		{"INSERT INTO t_user DEFAULT VALUES", "OVERRIDING SYSTEM VALUE VALUES (10)"},
	}
	for _, c := range cases {
		pl, lits, err := p.PlanSimple(ctx, c.sql)
		if err != nil {
			t.Errorf("%s: %v", c.sql, err)
			continue
		}
		if pl.Keys == nil || pl.Keys.Count != 1 {
			t.Errorf("%s: keys %+v", c.sql, pl.Keys)
			continue
		}
		b, err := pl.BindSimpleArgs(c.sql, lits, sqlplan.Args{Keys: []string{"10"}})
		if err != nil {
			t.Errorf("%s: %v", c.sql, err)
			continue
		}
		got := b.Targets[0].SQL
		if strings.Contains(got, "DEFAULT") || (c.want != "(DEFAULT" && !strings.Contains(got, c.want)) {
			t.Errorf("%s: %s, want %q", c.sql, got, c.want)
		}
	}
	// A row with a key of its own beside a drawn one: no OVERRIDING, so that an
	// identity GENERATED ALWAYS fails on the shard as on one database.
	pl, lits, err := p.PlanSimple(ctx, "INSERT INTO t_user (user_id, name) VALUES (DEFAULT, 'x'), (5, 'y')")
	if err != nil {
		t.Fatal(err)
	}
	b, err = pl.BindSimpleArgs(pl.SQL, lits, sqlplan.Args{Keys: []string{"10"}})
	if err != nil || pl.Keys == nil || pl.Keys.Count != 1 {
		t.Fatal(err, pl.Keys)
	}
	for _, tg := range b.Targets {
		if strings.Contains(tg.SQL, "OVERRIDING") {
			t.Errorf("mixed rows got OVERRIDING: %s", tg.SQL)
		}
	}
	// Every row with a key: nothing drawn.
	if pl, err := p.Prepare(ctx, "INSERT INTO t_order (order_id, user_id) VALUES (5, 1)"); err != nil || pl.Keys != nil {
		t.Errorf("keyed insert: %v, plan %+v", err, pl)
	}
	// Refused: a key without a sequence, OVERRIDING USER VALUE, a catalog that cannot
	// name sequences.
	for _, c := range []struct {
		p   *sqlplan.Planner
		sql string
	}{
		{p, "INSERT INTO t_event (qty) VALUES (1)"},
		{p, "INSERT INTO t_user OVERRIDING USER VALUE VALUES (1, 'x')"},
		{sqlplan.New(r, floatCatalog{}, sqlplan.Options{}), "INSERT INTO t_order (user_id) VALUES (1)"},
		{p, "INSERT INTO t_event (kind) VALUES ('x')"}, // another GENERATED ALWAYS column
	} {
		_, err := c.p.Prepare(ctx, c.sql)
		if code := sqlplan.Code(err); code != "0A000" {
			t.Errorf("%s: %v, want 0A000", c.sql, err)
		}
	}
	// The numbers of the planner's own slots are no client's parameters: PostgreSQL
	// has none such, and a value there must not be taken for a drawn key.
	for _, sql := range []string{"INSERT INTO t_user (name) VALUES ($1000005)", "SELECT * FROM t_order WHERE status = $1000002",
		"INSERT INTO t_order (status, user_id) VALUES ('a', $1000001)", "SELECT * FROM t_order WHERE status = $1000000 LIMIT 1"} {
		_, err := p.Prepare(ctx, sql)
		_, _, errSimple := p.PlanSimple(ctx, sql)
		if sqlplan.Code(err) != "42P02" || sqlplan.Code(errSimple) != "42P02" {
			t.Errorf("%s: %v / %v, want 42P02", sql, err, errSimple)
		}
	}
	// More columns than values: PostgreSQL's 42601, no key drawn.
	if _, err := p.Prepare(ctx, "INSERT INTO t_order (status, order_id) VALUES ('x')"); sqlplan.Code(err) != "42601" {
		t.Errorf("more columns than values: %v", err)
	}
	// Rules of one shard: the statement runs there as written, drawing nothing.
	one, err := rules.Compile(rules.Rules{DataSources: []rules.DataSource{{Name: "ds_0", DSN: "postgres://a/x"}},
		Tables: []rules.Table{{Name: "t_order", Strategy: rules.Strategy{Column: "order_id", Type: rules.TypeInt8}}}})
	if err != nil {
		t.Fatal(err)
	}
	if pl, err := sqlplan.New(one, keyCatalog{}, sqlplan.Options{}).Prepare(ctx, "INSERT INTO t_order (user_id) VALUES (1)"); err != nil || pl.Keys != nil {
		t.Errorf("one shard: %v, plan %+v", err, pl)
	}
	// An identity's quoted, qualified name is one SQL literal.
	pl, err = p.Prepare(ctx, "INSERT INTO t_user (name) VALUES ('x')")
	if err != nil {
		t.Fatal(err)
	}
	if want := `nextval('"My Schema"."it''s"'::pg_catalog.regclass)`; !strings.Contains(pl.Keys.SQL(), want) {
		t.Errorf("draw: %s", pl.Keys.SQL())
	}
}
