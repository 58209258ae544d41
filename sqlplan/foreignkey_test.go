package sqlplan_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/sqlplan"
)

// TestForeignKeys: a foreign key in CREATE TABLE or ALTER TABLE goes to each physical
// table referencing the physical table that holds its rows on the same shard, or is
// refused with 0A000 where no one data source could check it. Up to this change a
// foreign key from a table of the default data source to a sharded table was accepted,
// and rejected the rows whose referenced row is on another data source; one between
// tables split alike referenced the logical name, which no shard has (42P01).
func TestForeignKeys(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	for _, c := range []struct {
		sql  string
		want []string // the SQL each target gets, in order; nil: refused
	}{
		// t_order_item and t_order are bound: shard by shard.
		{"CREATE TABLE t_order_item (item_id bigint, order_id bigint REFERENCES t_order (order_id))", []string{
			"t_order_item_0 (item_id bigint, order_id bigint REFERENCES t_order_0 (order_id))",
			"t_order_item_1 (item_id bigint, order_id bigint REFERENCES t_order_1 (order_id))",
			"t_order_item_0 (item_id bigint, order_id bigint REFERENCES t_order_0 (order_id))",
			"t_order_item_1 (item_id bigint, order_id bigint REFERENCES t_order_1 (order_id))",
		}},
		{"ALTER TABLE t_order_item ADD CONSTRAINT fk FOREIGN KEY (order_id) REFERENCES t_order", []string{
			"t_order_item_0 ADD CONSTRAINT fk FOREIGN KEY (order_id) REFERENCES t_order_0",
			"t_order_item_1 ADD CONSTRAINT fk FOREIGN KEY (order_id) REFERENCES t_order_1",
			"t_order_item_0 ADD CONSTRAINT fk FOREIGN KEY (order_id) REFERENCES t_order_0",
			"t_order_item_1 ADD CONSTRAINT fk FOREIGN KEY (order_id) REFERENCES t_order_1",
		}},
		// A broadcast table has a copy on every data source; a default table's table
		// on the default data source.
		{"CREATE TABLE t_region (id int, k text REFERENCES t_config (k))", []string{"t_region (id int, k text REFERENCES t_config (k))"}},
		{"CREATE TABLE t_city (id int, region int REFERENCES t_region (id))", []string{"t_city (id int, region int REFERENCES t_region (id))"}},
		// No one data source can check these.
		{"CREATE TABLE t_review (id int, order_id bigint REFERENCES t_order (order_id))", nil},
		{"CREATE TABLE t_user (user_id int, region int REFERENCES t_region (id))", nil},
		{"CREATE TABLE t_config (k text, order_id bigint REFERENCES t_order (order_id))", nil},
		{"CREATE TABLE t_order_item (item_id bigint, order_id bigint, o2 bigint REFERENCES t_order (order_id))", nil},
		{"ALTER TABLE t_order_item ADD FOREIGN KEY (item_id) REFERENCES t_order (order_id)", nil},
		{"CREATE TABLE t_order (order_id bigint PRIMARY KEY, parent bigint REFERENCES t_order)", nil},
		{"CREATE TABLE t_user (user_id int, order_id bigint REFERENCES t_order (order_id))", nil},
	} {
		b, err := p.Simple(context.Background(), c.sql)
		if c.want == nil {
			if !errors.Is(err, sqlplan.ErrUnsupported) || !strings.Contains(err.Error(), "foreign key") {
				t.Errorf("%s: %v, want a refusal naming the foreign key", c.sql, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.sql, err)
			continue
		}
		var got []string
		for _, tg := range b.Targets {
			_, rest, _ := strings.Cut(tg.SQL, "TABLE ")
			got = append(got, rest)
		}
		if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Errorf("%s:\n got  %q\n want %q", c.sql, got, c.want)
		}
	}
}
