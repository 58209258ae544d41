package sqlplan_test

import (
	"context"
	"testing"

	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// floatCatalog says t_order's weight column is double precision, and nothing else.
type floatCatalog struct{}

func (floatCatalog) KeyType(context.Context, *rules.TableRule, string) (rules.KeyType, error) {
	return rules.TypeUnknown, nil
}
func (floatCatalog) Columns(context.Context, *rules.TableRule) ([]string, error) { return nil, nil }
func (floatCatalog) IsAggregate(context.Context, string) (bool, error)           { return false, nil }
func (floatCatalog) FloatColumns(_ context.Context, t *rules.TableRule) ([]string, error) {
	if t.Name == "t_order" {
		return []string{"weight"}, nil
	}
	return []string{}, nil
}

// TestCoordinatorPlans: with Options.Coordinate, a SELECT the merge refuses goes to
// the coordinator as the client wrote it; what the coordinator would not answer as one
// database would stays refused; without the option nothing changes.
func TestCoordinatorPlans(t *testing.T) {
	ctx := context.Background()
	r := testRules(t)
	p := sqlplan.New(r, floatCatalog{}, sqlplan.Options{Coordinate: true})
	plain := sqlplan.New(r, floatCatalog{}, sqlplan.Options{})
	coordinated := []string{
		"SELECT sum(qty) + 1 FROM t_order",
		"SELECT count(DISTINCT status) FROM t_order",
		"WITH t AS (SELECT order_id FROM t_order) SELECT count(*) FROM t",
		"SELECT order_id, rank() OVER (ORDER BY qty) FROM t_order",
		"SELECT string_agg(status, ',' ORDER BY order_id) FROM t_order",
		"SELECT row_number() OVER (ORDER BY order_id) FROM t_order",
		"SELECT u.name FROM t_order o JOIN t_user u ON u.user_id = o.qty",
		"SELECT sum(weight::numeric) FROM t_order o JOIN t_user u ON u.user_id = o.qty", // cast before the sum: exact
		"SELECT order_id FROM t_order WHERE qty > $1 UNION SELECT user_id FROM t_user",
	}
	for _, sql := range coordinated {
		b := bindAll(t, p, sql)
		if !b.Coordinated() || b.Targets[0].SQL != sql || b.Targets[0].DataSource != sqlplan.CoordinatorSource(r) {
			t.Errorf("%s: not coordinated as written: %s", sql, b.Explain())
		}
		if _, err := plain.Prepare(ctx, sql); err == nil {
			if pb, err := bindOnce(plain, sql); err == nil && pb != nil {
				t.Errorf("%s: answered without the coordinator too; the case proves nothing", sql)
			}
		}
	}
	refused := []string{
		"SELECT sum(weight) + 1 FROM t_order",                                  // a float summed in another order
		"SELECT avg(w) FROM (SELECT weight AS w FROM t_order) s",               // through an alias
		"SELECT sum(qty::float8) + 1 FROM t_order",                             // a cast to float
		"SELECT sum(sqrt(qty)) + 1 FROM t_order",                               // a float function
		"SELECT sum(qty ^ 2) + 1 FROM t_order",                                 // a float operator over integers
		"SELECT string_agg(status, ',') FROM t_order o JOIN t_user u ON true",  // heap order
		"SELECT row_number() OVER () FROM t_order",                             // heap order
		"SELECT current_database(), count(DISTINCT status) FROM t_order",       // the coordinator's own session
		"SELECT count(DISTINCT status) FROM t_order FOR UPDATE",                // locks
		"SELECT count(DISTINCT status), nextval('s') FROM t_order",             // sequences
		"SELECT round(avg(weight)::numeric, 2) FROM t_order",                   // a cast after the sum
		"SELECT sum(weight)::int8 FROM t_order",                                // likewise
		"SELECT sum((o).weight) + 1 FROM (SELECT t_order AS o FROM t_order) s", // a whole row's field
		"SELECT count(DISTINCT status), percent_rank() OVER (ORDER BY qty) + sum(qty) OVER () FROM t_order GROUP BY status, qty",
		"SELECT ARRAY(SELECT status FROM t_order)",                                        // heap order
		"SELECT current_catalog, count(DISTINCT status) FROM t_order",                     // the coordinator's name
		"SELECT tableoid::regclass, count(*) FROM t_order GROUP BY 1 HAVING count(*) > 0", // its partitions
		"SELECT o.ctid FROM t_order o JOIN t_user u ON u.name = o.status",                 // duplicated across shards
		"SELECT umoptions FROM pg_user_mappings WHERE EXISTS (SELECT 1 FROM t_order o JOIN t_user u ON u.name = o.status)",
		"SELECT count(DISTINCT status), 't_order'::regclass FROM t_order",
		"SELECT lo_from_bytea(0, 'x'), count(DISTINCT status) FROM t_order",                    // writes there
		"SELECT query_to_xml('SELECT 1', true, true, ''), count(DISTINCT status) FROM t_order", // runs any SQL there
		"SELECT setseed(0.5), count(DISTINCT status) FROM t_order",                             // leaves state there
	}
	// Each is refused, or answered by the merge where its values allow (which the
	// engine may still refuse when it reads the types): never coordinated.
	for _, sql := range refused {
		b, err := bindOnce(p, sql)
		switch {
		case err != nil && sqlplan.Code(err) != sqlplan.CodeFeatureNotSupported:
			t.Errorf("%s: %v, want a 0A000 refusal", sql, err)
		case err == nil && b.Coordinated():
			t.Errorf("%s: coordinated, want refused", sql)
		}
	}
	// A statement that pins one shard keeps the fast path.
	b := bindAll(t, p, "SELECT order_id, rank() OVER (ORDER BY qty) FROM t_order WHERE order_id = 7")
	if b.Coordinated() || len(b.Targets) != 1 {
		t.Errorf("a pinned window query went to the coordinator: %s", b.Explain())
	}
}

func bindAll(t *testing.T, p *sqlplan.Planner, sql string) *sqlplan.Bound {
	t.Helper()
	pl, err := p.Prepare(context.Background(), sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	args := sqlplan.Args{}
	for range pl.NumParams {
		args.Values = append(args.Values, []byte("1"))
	}
	b, err := pl.Bind(args)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return b
}

func bindOnce(p *sqlplan.Planner, sql string) (*sqlplan.Bound, error) {
	pl, err := p.Prepare(context.Background(), sql)
	if err != nil {
		return nil, err
	}
	args := sqlplan.Args{}
	for range pl.NumParams {
		args.Values = append(args.Values, []byte("1"))
	}
	return pl.Bind(args)
}
