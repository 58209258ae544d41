package rules_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/routing"
	"github.com/shardlab/shardlab/rules"
)

func twoDS() []rules.DataSource {
	return []rules.DataSource{{Name: "ds_0", DSN: "postgres://a/x"}, {Name: "ds_1", DSN: "postgres://b/x"}}
}

// seed004 is seed 004's layout: t_order and t_order_item over 2 databases x 2 tables,
// bound, sharded by order id.
func seed004() rules.Rules {
	return rules.Rules{
		DataSources: twoDS(),
		Tables: []rules.Table{
			{Name: "t_order", Strategy: rules.Strategy{Column: "order_id", Type: rules.TypeInt8}, TablesPerDataSource: 2},
			{Name: "t_order_item", Strategy: rules.Strategy{Column: "order_id", Type: rules.TypeInt8}, TablesPerDataSource: 2},
		},
		Bindings:  [][]string{{"t_order", "t_order_item"}},
		Broadcast: []string{"t_config"},
	}
}

func TestLookupPlacesTables(t *testing.T) {
	c, err := rules.Compile(seed004())
	if err != nil {
		t.Fatal(err)
	}
	o := c.Lookup("t_order")
	if o.Kind != rules.KindSharded || o.ShardCount() != 4 {
		t.Fatalf("t_order: kind %v, %d shards", o.Kind, o.ShardCount())
	}
	want := []rules.Node{{0, "", "t_order_0"}, {0, "", "t_order_1"}, {1, "", "t_order_0"}, {1, "", "t_order_1"}}
	if !slices.Equal(o.Nodes, want) {
		t.Errorf("t_order nodes %v, want %v", o.Nodes, want)
	}
	if it := c.Lookup("t_order_item"); it.Binding != o.Binding || it.Binding < 0 {
		t.Errorf("binding ids %d and %d", o.Binding, it.Binding)
	}
	if b := c.Lookup("t_config"); b.Kind != rules.KindBroadcast || len(b.Nodes) != 2 {
		t.Errorf("t_config: %v %v", b.Kind, b.Nodes)
	}
	if d := c.Lookup("t_user"); d.Kind != rules.KindDefault || !slices.Equal(d.Nodes, []rules.Node{{0, "", "t_user"}}) {
		t.Errorf("t_user: %v %v", d.Kind, d.Nodes)
	}
}

func TestPatternRules(t *testing.T) {
	c, err := rules.Compile(rules.Rules{
		DataSources: twoDS(),
		Tables: []rules.Table{
			{Name: "sbtest*", Strategy: rules.Strategy{Column: "id"}},
			{Name: "sbtest_special", Strategy: rules.Strategy{Column: "k"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"sbtest1", "sbtest10"} {
		r := c.Lookup(name)
		if r.Kind != rules.KindSharded || r.Nodes[1].Table != name || r.KeyColumns()[0] != "id" {
			t.Errorf("%s: %+v", name, r)
		}
	}
	if r := c.Lookup("sbtest_special"); r.KeyColumns()[0] != "k" {
		t.Errorf("an exact rule must win over a pattern: %v", r.KeyColumns())
	}
	if r := c.Lookup("sbtest"); r.Kind != rules.KindDefault {
		t.Errorf("the bare prefix is not a match: %v", r.Kind)
	}
	if r := c.Lookup("sbtest*"); r.Kind != rules.KindDefault {
		t.Errorf("a pattern's text is not a table: %v", r.Kind)
	}
}

// TestShardsForMatchesRouting checks that each algorithm places keys where package routing
// says, and that separate database and table strategies combine into one shard number.
func TestShardsForMatchesRouting(t *testing.T) {
	one := func(alg rules.Algorithm, typ rules.KeyType, bounds ...int64) *rules.TableRule {
		c, err := rules.Compile(rules.Rules{DataSources: twoDS(), Tables: []rules.Table{
			{Name: "t", Strategy: rules.Strategy{Column: "k", Type: typ, Algorithm: alg, Bounds: bounds}, TablesPerDataSource: 2},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return c.Lookup("t")
	}
	shard := func(r *rules.TableRule, k rules.Key) int {
		got, err := r.ShardsFor(map[string]rules.Key{"k": k}, nil)
		if err != nil || len(got) != 1 {
			t.Fatalf("ShardsFor(%v) = %v, %v", k, got, err)
		}
		return got[0]
	}
	for _, v := range []int64{0, 1, 7, -5, 123456789} {
		if got, want := shard(one(rules.AlgorithmPGHash, rules.TypeInt4), rules.IntKey(v)), routing.PGPartition(routing.PGHashInt4(int32(v)), 4); got != want {
			t.Errorf("pghash int4 %d: %d, want %d", v, got, want)
		}
		if got, want := shard(one(rules.AlgorithmPGHash, rules.TypeInt8), rules.IntKey(v)), routing.PGPartition(routing.PGHashInt8(v), 4); got != want {
			t.Errorf("pghash int8 %d: %d, want %d", v, got, want)
		}
		if got, want := shard(one(rules.AlgorithmMod, rules.TypeInt8), rules.IntKey(v)), int(((v%4)+4)%4); got != want {
			t.Errorf("mod %d: %d, want %d", v, got, want)
		}
	}
	for _, s := range []string{"alice", "", "Zürich"} {
		if got, want := shard(one(rules.AlgorithmCRC32, rules.TypeText), rules.TextKey(s)), routing.CRC32Shard(s, 4); got != want {
			t.Errorf("crc32 %q: %d, want %d", s, got, want)
		}
		if got, want := shard(one(rules.AlgorithmJump, rules.TypeText), rules.TextKey(s)), routing.JumpShard(s, 4); got != want {
			t.Errorf("jump %q: %d, want %d", s, got, want)
		}
	}
	rng := one(rules.AlgorithmRange, rules.TypeInt8, 100, 200, 300)
	for v, want := range map[int64]int{-1: 0, 99: 0, 100: 1, 250: 2, 300: 3, 1 << 40: 3} {
		if got := shard(rng, rules.IntKey(v)); got != want {
			t.Errorf("range %d: %d, want %d", v, got, want)
		}
	}
	lo, hi := int64(150), int64(250)
	if got, ok := rng.RangeShards("k", &lo, &hi); !ok || !slices.Equal(got, []int{1, 2}) {
		t.Errorf("RangeShards(150..250) = %v %v", got, ok)
	}
	if _, ok := one(rules.AlgorithmPGHash, rules.TypeInt8).RangeShards("k", &lo, &hi); ok {
		t.Error("a hash must not narrow a range")
	}
	// A text key for an integer column is read as PostgreSQL would read the literal.
	if got, want := shard(one(rules.AlgorithmPGHash, rules.TypeInt4), rules.TextKey(" 42 ")), routing.PGPartition(routing.PGHashInt4(42), 4); got != want {
		t.Errorf("text '42' for int4: %d, want %d", got, want)
	}
	if _, err := one(rules.AlgorithmPGHash, rules.TypeInt4).ShardsFor(map[string]rules.Key{"k": rules.IntKey(1 << 40)}, nil); !errors.Is(err, rules.ErrKeyType) {
		t.Errorf("an int8 value out of int4 range: %v", err)
	}
	// NULL keys go where PostgreSQL's hash partitioning puts them: partition 0.
	if got := shard(one(rules.AlgorithmPGHash, rules.TypeInt4), rules.NullKey()); got != 0 {
		t.Errorf("NULL key: shard %d", got)
	}

	split, err := rules.Compile(rules.Rules{DataSources: twoDS(), Tables: []rules.Table{{
		Name:                "t_order",
		DatabaseStrategy:    &rules.Strategy{Column: "user_id", Type: rules.TypeInt8, Algorithm: rules.AlgorithmMod},
		TableStrategy:       &rules.Strategy{Column: "order_id", Type: rules.TypeInt8, Algorithm: rules.AlgorithmMod},
		TablesPerDataSource: 2,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	r := split.Lookup("t_order")
	if cols := r.KeyColumns(); !slices.Equal(cols, []string{"user_id", "order_id"}) {
		t.Errorf("key columns %v", cols)
	}
	got, _ := r.ShardsFor(map[string]rules.Key{"user_id": rules.IntKey(3), "order_id": rules.IntKey(4)}, nil)
	if !slices.Equal(got, []int{2}) { // data source 1, table 0
		t.Errorf("user 3, order 4: %v", got)
	}
	got, _ = r.ShardsFor(map[string]rules.Key{"user_id": rules.IntKey(3)}, nil)
	if !slices.Equal(got, []int{2, 3}) {
		t.Errorf("user 3 only: %v", got)
	}
}

func TestTypeFromCatalog(t *testing.T) {
	c, err := rules.Compile(rules.Rules{DataSources: twoDS(), Tables: []rules.Table{{Name: "t", Strategy: rules.Strategy{Column: "k"}}}})
	if err != nil {
		t.Fatal(err)
	}
	r := c.Lookup("t")
	if r.KeyType("k") != rules.TypeUnknown {
		t.Fatal("the type was not declared")
	}
	if _, err := r.ShardsFor(map[string]rules.Key{"k": rules.IntKey(1)}, nil); err == nil {
		t.Error("routing without a known type must fail")
	}
	got, err := r.ShardsFor(map[string]rules.Key{"k": rules.IntKey(1)}, map[string]rules.KeyType{"k": rules.TypeInt4})
	if err != nil || !slices.Equal(got, []int{routing.PGPartition(routing.PGHashInt4(1), 2)}) {
		t.Errorf("with the catalog's type: %v %v", got, err)
	}
}

func TestCompileRefusesBadRules(t *testing.T) {
	tests := []struct {
		name string
		r    rules.Rules
		want string
	}{
		{"no data source", rules.Rules{}, "at least one data source"},
		{"duplicate data source", rules.Rules{DataSources: []rules.DataSource{{"a", "x"}, {"a", "y"}}}, "defined twice"},
		{"missing dsn", rules.Rules{DataSources: []rules.DataSource{{Name: "a"}}}, "needs a dsn"},
		{"unknown default", rules.Rules{DataSources: twoDS(), DefaultDataSource: "zz"}, "unknown data source"},
		{"no column", rules.Rules{DataSources: twoDS(), Tables: []rules.Table{{Name: "t"}}}, "sharding column is missing"},
		{"bad algorithm", rules.Rules{DataSources: twoDS(), Tables: []rules.Table{{Name: "t", Strategy: rules.Strategy{Column: "k", Algorithm: "md5"}}}}, "unknown algorithm"},
		{"mod on text", rules.Rules{DataSources: twoDS(), Tables: []rules.Table{{Name: "t", Strategy: rules.Strategy{Column: "k", Type: rules.TypeText, Algorithm: rules.AlgorithmMod}}}}, "needs an integer column"},
		{"range bounds count", rules.Rules{DataSources: twoDS(), Tables: []rules.Table{{Name: "t", Strategy: rules.Strategy{Column: "k", Algorithm: rules.AlgorithmRange, Bounds: []int64{1, 2}}}}}, "needs 1 bounds"},
		{"range bounds order", rules.Rules{DataSources: twoDS(), Tables: []rules.Table{{Name: "t", TablesPerDataSource: 2, Strategy: rules.Strategy{Column: "k", Algorithm: rules.AlgorithmRange, Bounds: []int64{5, 2, 9}}}}}, "ascend"},
		{"unknown table data source", rules.Rules{DataSources: twoDS(), Tables: []rules.Table{{Name: "t", Strategy: rules.Strategy{Column: "k"}, DataSources: []string{"ds_9"}}}}, "unknown data source \"ds_9\""},
		{"half split", rules.Rules{DataSources: twoDS(), Tables: []rules.Table{{Name: "t", DatabaseStrategy: &rules.Strategy{Column: "k"}}}}, "give both"},
		{"sharded and broadcast", rules.Rules{DataSources: twoDS(), Tables: []rules.Table{{Name: "t", Strategy: rules.Strategy{Column: "k"}}}, Broadcast: []string{"t"}}, "both sharded and broadcast"},
		{"two rules", rules.Rules{DataSources: twoDS(), Tables: []rules.Table{{Name: "t", Strategy: rules.Strategy{Column: "k"}}, {Name: "t", Strategy: rules.Strategy{Column: "j"}}}}, "two rules"},
		{"bad name", rules.Rules{DataSources: twoDS(), Tables: []rules.Table{{Name: "T-1", Strategy: rules.Strategy{Column: "k"}}}}, "lower-case identifier"},
		{"binding of unequal layouts", rules.Rules{DataSources: twoDS(), Tables: []rules.Table{
			{Name: "a", Strategy: rules.Strategy{Column: "k"}, TablesPerDataSource: 2},
			{Name: "b", Strategy: rules.Strategy{Column: "k"}},
		}, Bindings: [][]string{{"a", "b"}}}, "cannot be bound"},
		{"binding of unknown table", rules.Rules{DataSources: twoDS(), Tables: []rules.Table{{Name: "a", Strategy: rules.Strategy{Column: "k"}}}, Bindings: [][]string{{"a", "zz"}}}, "no sharded_table rule"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := rules.Compile(tt.r)
			if err == nil || !errors.Is(err, rules.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Compile: %v, want an ErrInvalid containing %q", err, tt.want)
			}
		})
	}
}

const goodFile = `# seed 004's layout
broadcast = ["t_config"]

[[data_source]]
name = "ds_0"
dsn = "postgres://postgres@127.0.0.1:5432/s0"

[[data_source]]
name = "ds_1"
dsn = "postgres://postgres@127.0.0.1:5432/s1"

[[sharded_table]]
name = "t_order"
column = "order_id"
type = "bigint"
tables_per_data_source = 2

[[sharded_table]]
name = "t_order_item"
column = "order_id"
type = "bigint"
tables_per_data_source = 2

[[sharded_table]]
name = "t_user"
  [sharded_table.database_strategy]
  column = "user_id"
  algorithm = "mod"
  [sharded_table.table_strategy]
  column = "user_id"
  algorithm = "crc32"

[[binding]]
tables = ["t_order", "t_order_item"]
`

func TestLoadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.toml")
	if err := os.WriteFile(path, []byte(goodFile), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := rules.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.NumDataSources() != 2 || c.Lookup("t_order").ShardCount() != 4 || c.Lookup("t_config").Kind != rules.KindBroadcast {
		t.Errorf("loaded rules are wrong: %+v", c.Rules())
	}
	if cols := c.Lookup("t_user").KeyColumns(); !slices.Equal(cols, []string{"user_id"}) {
		t.Errorf("t_user key columns %v", cols)
	}
}

// TestFileErrorsNameLineAndField checks that each kind of mistake in a rules file is
// reported with the line it is on.
func TestFileErrorsNameLineAndField(t *testing.T) {
	tests := []struct {
		name, edit, with string
		line             int
		want             string
	}{
		{"unknown algorithm", "type = \"bigint\"\ntables_per_data_source = 2\n\n[[sharded_table]]\nname = \"t_order_item\"", "type = \"bigint\"\ntables_per_data_source = 2\n\n[[sharded_table]]\nname = \"t_order_item\"\nalgorithm = \"md5\"", 20, "sharded_table[1].algorithm: unknown algorithm \"md5\""},
		{"misspelt field", "column = \"order_id\"\ntype = \"bigint\"\ntables_per_data_source = 2\n\n[[sharded_table]]", "colum = \"order_id\"\ntype = \"bigint\"\ntables_per_data_source = 2\n\n[[sharded_table]]", 14, "unknown field"},
		{"bad type", "type = \"bigint\"\ntables_per_data_source = 2\n\n[[sharded_table]]\nname = \"t_user\"", "type = \"bigint\"\ntables_per_data_source = 2\n\n[[sharded_table]]\nname = \"t_user\"\ntype = \"float\"", 0, "unsupported sharding column type"},
		{"unknown data source in binding", "tables = [\"t_order\", \"t_order_item\"]", "tables = [\"t_order\", \"t_orders\"]", 34, "binding[0].tables[1]"},
		{"nested strategy", "  algorithm = \"crc32\"", "  algorithm = \"sha\"", 31, "sharded_table[2].table_strategy.algorithm"},
		{"wrong value type", "tables_per_data_source = 2\n\n[[sharded_table]]\nname = \"t_user\"", "tables_per_data_source = \"two\"\n\n[[sharded_table]]\nname = \"t_user\"", 0, "tables_per_data_source"},
		{"syntax", "[[binding]]", "[[binding]", 33, ""},
		{"bad dsn list", "name = \"ds_1\"\ndsn = \"postgres://postgres@127.0.0.1:5432/s1\"", "name = \"ds_1\"", 8, "data_source[1].dsn"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(goodFile, tt.edit) {
				t.Fatalf("test edit %q not found", tt.edit)
			}
			text := strings.Replace(goodFile, tt.edit, tt.with, 1)
			_, err := rules.Parse([]byte(text))
			if err == nil {
				t.Fatal("Parse accepted a bad file")
			}
			if !errors.Is(err, rules.ErrInvalid) {
				t.Errorf("error %v does not match ErrInvalid", err)
			}
			var fe *rules.FileError
			if !errors.As(err, &fe) {
				t.Fatalf("error %T %v is not a FileError", err, err)
			}
			if tt.line > 0 && fe.Line != tt.line {
				t.Errorf("line %d, want %d (%v)", fe.Line, tt.line, err)
			}
			if tt.line == 0 && fe.Line == 0 {
				t.Errorf("no line in %v", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func TestMergeSchemas(t *testing.T) {
	c, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: "a0"}, {Name: "ds_1", DSN: "a1"}, {Name: "ds_2", DSN: "b"}, {Name: "ds_3", DSN: "a3"}},
		Tables:      []rules.Table{{Name: "sbtest*", Strategy: rules.Strategy{Column: "id"}}},
		Broadcast:   []string{"dict"},
	})
	if err != nil {
		t.Fatal(err)
	}
	// ds_0, ds_1 and ds_3 are schemas s0, s1, s3 of one database; ds_2 stays alone.
	m, err := c.MergeSchemas([]rules.SchemaMerge{{0, "s0"}, {0, "s1"}, {2, ""}, {0, "s3"}})
	if err != nil {
		t.Fatal(err)
	}
	if m.NumDataSources() != 2 || m.DataSources()[0].DSN != "a0" || m.DataSources()[1].DSN != "b" {
		t.Fatalf("merged data sources %v", m.DataSources())
	}
	want := []rules.Node{{0, "s0", "sbtest1"}, {0, "s1", "sbtest1"}, {1, "", "sbtest1"}, {0, "s3", "sbtest1"}}
	if got := m.Lookup("sbtest1").Nodes; !slices.Equal(got, want) {
		t.Errorf("sbtest1 nodes %v, want %v", got, want)
	}
	// The shard a key maps to does not change.
	for k := int64(0); k < 100; k++ {
		key := map[string]rules.Key{"id": rules.IntKey(k)}
		types := map[string]rules.KeyType{"id": rules.TypeInt4}
		a, err1 := c.Lookup("sbtest1").ShardsFor(key, types)
		b, err2 := m.Lookup("sbtest1").ShardsFor(key, types)
		if err1 != nil || err2 != nil || !slices.Equal(a, b) {
			t.Fatalf("key %d: shards %v and %v (%v, %v)", k, a, b, err1, err2)
		}
	}
	if got := m.Lookup("dict").Nodes; len(got) != 2 || got[0].Schema != "" {
		t.Errorf("broadcast nodes %v: one unqualified copy per merged data source", got)
	}
	if got := m.Lookup("other").Nodes; !slices.Equal(got, []rules.Node{{0, "", "other"}}) {
		t.Errorf("default table nodes %v", got)
	}
	if c.NumDataSources() != 4 || c.Lookup("sbtest1").Nodes[1] != (rules.Node{1, "", "sbtest1"}) {
		t.Error("MergeSchemas changed the rules it was called on")
	}
	for _, bad := range [][]rules.SchemaMerge{
		{{0, "s0"}, {1, "s1"}, {2, ""}},            // too short
		{{1, "s0"}, {0, "s1"}, {2, ""}, {0, "s3"}}, // into a data source that is merged itself
		{{0, "s0"}, {0, "s0"}, {2, ""}, {3, ""}},   // one schema twice
	} {
		if _, err := c.MergeSchemas(bad); !errors.Is(err, rules.ErrInvalid) {
			t.Errorf("MergeSchemas(%v): %v, want ErrInvalid", bad, err)
		}
	}
}
