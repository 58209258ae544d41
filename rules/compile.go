package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Kind says where a logical table lives.
type Kind int

// Table kinds.
const (
	// KindDefault is a table no rule mentions: it lives on the default data source.
	KindDefault Kind = iota
	// KindSharded is a table spread over physical tables by a sharding key.
	KindSharded
	// KindBroadcast is a table copied in full to every data source.
	KindBroadcast
)

func (k Kind) String() string {
	switch k {
	case KindSharded:
		return "sharded"
	case KindBroadcast:
		return "broadcast"
	default:
		return "default"
	}
}

// Node is one physical table: a data source (by index) and the table's name there.
// Schema is set when several shards are schemas of one data source (see
// Compiled.MergeSchemas): the table is then Schema.Table, and statements name it so.
type Node struct {
	DataSource int
	Schema     string
	Table      string
}

// Compiled is a validated, immutable Rules value with its lookups built. It is safe for
// concurrent use.
type Compiled struct {
	rules     Rules
	defaultDS int
	exact     map[string]*tableSpec
	patterns  []*tableSpec // prefix rules, longest prefix first
	broadcast map[string]bool
	cache     sync.Map // logical name -> *TableRule
	bindingOf map[*tableSpec]int

	// sources are the data sources connections are made to; place maps a data source
	// of the rules to one of them and, when merged, to its schema there (nil: the
	// identity, sources are the rules' data sources).
	sources []DataSource
	place   []SchemaMerge
	// names gives some tables other physical names on some data sources
	// (WithTableNames).
	names map[TableAt]string
}

// TableAt is a logical table on a data source (by name).
type TableAt struct {
	Table      string
	DataSource string
}

// tableSpec is a Table rule after validation.
type tableSpec struct {
	table     Table
	prefix    string // for a pattern rule, the name without its '*'
	ds        []int  // data source indexes, in order
	perDS     int
	single    *Strategy // one strategy over every physical table, or
	dbStrat   *Strategy // a database strategy and
	tblStrat  *Strategy // a table strategy
	bindingID int       // -1 when in no binding group
}

// TableRule is how one logical table is placed. Rules for names matched by a pattern are
// made on first use and then reused.
type TableRule struct {
	Name string
	Kind Kind
	// Nodes are the physical tables: for a sharded table every shard in shard order; for a
	// broadcast table one per data source; for a default table the one on the default
	// data source.
	Nodes []Node
	// Binding identifies the binding group (-1 for none); two sharded tables with the same
	// Binding place equal keys on the same shard.
	Binding int
	spec    *tableSpec
}

// Compile validates r and builds its lookups. The error names every problem found, each
// with the field it concerns (for example `sharded_table[1].column`).
func Compile(r Rules) (*Compiled, error) {
	c := &Compiled{rules: r, exact: map[string]*tableSpec{}, broadcast: map[string]bool{}, bindingOf: map[*tableSpec]int{}}
	var errs []error
	bad := func(msg string, path ...any) { errs = append(errs, fieldErr(msg, path...)) }

	if len(r.DataSources) == 0 {
		bad("at least one data source is needed", "data_source")
	}
	dsIndex := map[string]int{}
	for i, ds := range r.DataSources {
		switch {
		case ds.Name == "":
			bad("a data source needs a name", "data_source", i, "name")
		case !identifier.MatchString(ds.Name):
			bad(fmt.Sprintf("data source name %q must be a lower-case identifier", ds.Name), "data_source", i, "name")
		default:
			if _, dup := dsIndex[ds.Name]; dup {
				bad(fmt.Sprintf("data source %q is defined twice", ds.Name), "data_source", i, "name")
			}
			dsIndex[ds.Name] = i
		}
		if strings.TrimSpace(ds.DSN) == "" {
			bad(fmt.Sprintf("data source %q needs a dsn", ds.Name), "data_source", i, "dsn")
		}
	}
	if r.DefaultDataSource != "" {
		if i, ok := dsIndex[r.DefaultDataSource]; ok {
			c.defaultDS = i
		} else {
			bad(fmt.Sprintf("unknown data source %q", r.DefaultDataSource), "default_data_source")
		}
	}

	for i, t := range r.Tables {
		spec, tErrs := compileTable(t, i, dsIndex, len(r.DataSources))
		errs = append(errs, tErrs...)
		if spec == nil {
			continue
		}
		// A pattern is kept under its own text too, which catches a pattern given twice.
		if _, dup := c.exact[t.Name]; dup {
			bad(fmt.Sprintf("table %q has two rules", t.Name), "sharded_table", i, "name")
			continue
		}
		c.exact[t.Name] = spec
		if spec.prefix != "" {
			c.patterns = append(c.patterns, spec)
		}
	}
	sort.SliceStable(c.patterns, func(a, b int) bool { return len(c.patterns[a].prefix) > len(c.patterns[b].prefix) })

	for i, name := range r.Broadcast {
		switch {
		case !identifier.MatchString(name):
			bad(fmt.Sprintf("broadcast table name %q must be a lower-case identifier", name), "broadcast", i)
		case c.exact[name] != nil:
			bad(fmt.Sprintf("table %q is both sharded and broadcast", name), "broadcast", i)
		case c.broadcast[name]:
			bad(fmt.Sprintf("broadcast table %q is listed twice", name), "broadcast", i)
		default:
			if spec := c.matchPattern(name); spec != nil {
				bad(fmt.Sprintf("broadcast table %q also matches the sharded pattern %q", name, spec.table.Name), "broadcast", i)
			}
			c.broadcast[name] = true
		}
	}

	for g, group := range r.Bindings {
		if len(group) < 2 {
			bad("a binding group needs at least two tables", "binding", g, "tables")
			continue
		}
		var first *tableSpec
		for j, name := range group {
			spec := c.exact[name]
			if spec == nil || spec.prefix != "" {
				bad(fmt.Sprintf("binding table %q has no sharded_table rule of its own", name), "binding", g, "tables", j)
				continue
			}
			if prev, ok := c.bindingOf[spec]; ok {
				bad(fmt.Sprintf("table %q is in binding groups %d and %d", name, prev, g), "binding", g, "tables", j)
				continue
			}
			c.bindingOf[spec] = g
			spec.bindingID = g
			if first == nil {
				first = spec
				continue
			}
			if why := samePlacement(first, spec); why != "" {
				bad(fmt.Sprintf("tables %q and %q cannot be bound: %s", first.table.Name, name, why), "binding", g, "tables", j)
			}
		}
	}
	if len(errs) > 0 {
		return nil, &invalidError{errs: errs}
	}
	c.sources = r.DataSources
	return c, nil
}

// SchemaMerge places a data source of the rules inside another: as schema Schema of
// data source Into (an index into the rules' data sources). Into equal to the data
// source's own index and Schema "" leaves it alone.
type SchemaMerge struct {
	Into   int
	Schema string
}

// MergeSchemas returns rules in which data sources that are schemas of one database
// are one data source: merge[i] says where data source i goes. The shards of a sharded
// table keep their order and become schema-qualified tables (Node.Schema) of the data
// source they were merged into, so that one connection reaches all of them and a
// transaction over several of them is one transaction. Broadcast and default tables
// are not qualified: they are the merged data source's own (found on its search_path),
// one copy per database. The merged data sources keep the DSN of their Into, in order.
func (c *Compiled) MergeSchemas(merge []SchemaMerge) (*Compiled, error) {
	if len(merge) != len(c.rules.DataSources) {
		return nil, fmt.Errorf("%w: MergeSchemas wants one entry per data source (%d), got %d", ErrInvalid, len(c.rules.DataSources), len(merge))
	}
	n := &Compiled{rules: c.rules, exact: c.exact, patterns: c.patterns, broadcast: c.broadcast, bindingOf: c.bindingOf, names: c.names}
	newIndex := map[int]int{}
	for i, m := range merge {
		if m.Into < 0 || m.Into >= len(merge) || merge[m.Into].Into != m.Into {
			return nil, fmt.Errorf("%w: data source %d is merged into %d, which is not kept", ErrInvalid, i, m.Into)
		}
		if m.Into == i {
			newIndex[i] = len(n.sources)
			n.sources = append(n.sources, c.rules.DataSources[i])
		}
	}
	seen := map[SchemaMerge]int{}
	for i, m := range merge {
		p := SchemaMerge{Into: newIndex[m.Into], Schema: m.Schema}
		if m.Schema != "" {
			if prev, dup := seen[p]; dup {
				return nil, fmt.Errorf("%w: data sources %d and %d are the same schema %q", ErrInvalid, prev, i, m.Schema)
			}
			seen[p] = i
		}
		n.place = append(n.place, p)
	}
	n.defaultDS = n.place[c.defaultDS].Into
	return n, nil
}

// WithTableNames returns rules that place every table as c does, but that name some
// of the physical tables otherwise: names maps a logical table on a data source to the
// name of the table (or view) that stands for it there. Rules and every placement stay
// c's. Between a resharding move's cutover and its finish, a data source keeps rows
// that moved away beside those it still owns; the move reads and writes the table
// there through a view that shows only the rows it owns.
func (c *Compiled) WithTableNames(names map[TableAt]string) *Compiled {
	return &Compiled{rules: c.rules, defaultDS: c.defaultDS, exact: c.exact, patterns: c.patterns, broadcast: c.broadcast,
		bindingOf: c.bindingOf, sources: c.sources, place: c.place, names: maps.Clone(names)}
}

// LayoutSetting is the server setting through which a process that routes by rules
// (the proxy, the driver) tells each server connection it opens which rules: their
// Digest. A resharding move's fence refuses the writes of connections that name
// another layout than the one in force (package reshard).
const LayoutSetting = "shardlab.layout"

// Digest identifies the layout the rules make: their data sources (by name, not DSN)
// and every rule. It
// is what a resharding move records as the layout in force, and what the proxy and the
// driver tell the servers they route by (see package reshard's fence).
func (c *Compiled) Digest() string {
	// Where rows go, not how the servers are reached: a DSN's spelling, password or
	// parameters may change without changing the layout.
	r := c.rules
	r.DataSources = slices.Clone(r.DataSources)
	for i := range r.DataSources {
		r.DataSources[i].DSN = ""
	}
	b, _ := json.Marshal(r)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// TableNames returns the physical names WithTableNames gave (nil for none).
func (c *Compiled) TableNames() map[TableAt]string { return maps.Clone(c.names) }

// node places physical table name of data source d (an index of the rules' data
// sources).
func (c *Compiled) node(d int, name string) Node {
	if c.place == nil {
		return Node{DataSource: d, Table: name}
	}
	p := c.place[d]
	return Node{DataSource: p.Into, Schema: p.Schema, Table: name}
}

// invalidError lists every problem Compile found; it matches ErrInvalid.
type invalidError struct{ errs []error }

func (e *invalidError) Error() string {
	msgs := make([]string, len(e.errs))
	for i, err := range e.errs {
		msgs[i] = err.Error()
	}
	return "rules: invalid: " + strings.Join(msgs, "; ")
}

func (e *invalidError) Unwrap() []error { return append([]error{ErrInvalid}, e.errs...) }

func compileTable(t Table, i int, dsIndex map[string]int, nDS int) (*tableSpec, []error) {
	var errs []error
	bad := func(msg string, path ...any) {
		errs = append(errs, fieldErr(msg, append([]any{"sharded_table", i}, path...)...))
	}
	spec := &tableSpec{table: t, bindingID: -1}
	name := t.Name
	if strings.HasSuffix(name, "*") {
		spec.prefix = strings.TrimSuffix(name, "*")
		name = spec.prefix
	}
	if !identifier.MatchString(name) {
		bad(fmt.Sprintf("table name %q must be a lower-case identifier, optionally ending in *", t.Name), "name")
	}
	if len(t.DataSources) == 0 {
		for d := range nDS {
			spec.ds = append(spec.ds, d)
		}
	}
	for j, n := range t.DataSources {
		d, ok := dsIndex[n]
		if !ok {
			bad(fmt.Sprintf("unknown data source %q", n), "data_sources", j)
			continue
		}
		if slices.Contains(spec.ds, d) {
			bad(fmt.Sprintf("data source %q is listed twice", n), "data_sources", j)
			continue
		}
		spec.ds = append(spec.ds, d)
	}
	spec.perDS = t.TablesPerDataSource
	if spec.perDS == 0 {
		spec.perDS = 1
	}
	if spec.perDS < 1 {
		bad(fmt.Sprintf("tables_per_data_source must be at least 1, got %d", t.TablesPerDataSource), "tables_per_data_source")
		spec.perDS = 1
	}
	total := len(spec.ds) * spec.perDS
	if total > MaxPhysicalTables {
		bad(fmt.Sprintf("%d data sources x %d tables is more than %d physical tables", len(spec.ds), spec.perDS, MaxPhysicalTables), "tables_per_data_source")
	}

	split := t.DatabaseStrategy != nil || t.TableStrategy != nil
	switch {
	case split && (t.DatabaseStrategy == nil || t.TableStrategy == nil):
		bad("give both database_strategy and table_strategy, or neither", "database_strategy")
	case split && t.Strategy.Column != "":
		bad("a table with database_strategy and table_strategy takes no column of its own", "column")
	case split:
		db, tb := *t.DatabaseStrategy, *t.TableStrategy
		errs = append(errs, checkStrategy(&db, len(spec.ds), i, "database_strategy")...)
		errs = append(errs, checkStrategy(&tb, spec.perDS, i, "table_strategy")...)
		spec.dbStrat, spec.tblStrat = &db, &tb
	default:
		s := t.Strategy
		errs = append(errs, checkStrategy(&s, total, i)...)
		spec.single = &s
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return spec, nil
}

func checkStrategy(s *Strategy, shards, table int, path ...any) []error {
	var errs []error
	bad := func(msg string, field string) {
		p := append([]any{"sharded_table", table}, path...)
		errs = append(errs, fieldErr(msg, append(p, field)...))
	}
	if s.Column == "" {
		bad("the sharding column is missing", "column")
	} else if !identifier.MatchString(s.Column) {
		bad(fmt.Sprintf("column %q must be a lower-case identifier", s.Column), "column")
	}
	if s.Algorithm == "" {
		s.Algorithm = AlgorithmPGHash
	}
	if !slices.Contains(Algorithms(), s.Algorithm) {
		bad(fmt.Sprintf("unknown algorithm %q (want one of %s)", s.Algorithm, joinNames(Algorithms())), "algorithm")
	}
	if s.Type != TypeUnknown {
		if _, err := ParseKeyType(string(s.Type)); err != nil {
			bad(err.Error(), "type")
		}
	}
	if (s.Algorithm == AlgorithmMod || s.Algorithm == AlgorithmRange) && s.Type != TypeUnknown && !s.Type.IsInteger() {
		bad(fmt.Sprintf("algorithm %s needs an integer column, not %s", s.Algorithm, s.Type), "algorithm")
	}
	if s.Algorithm == AlgorithmRange {
		if len(s.Bounds) != shards-1 {
			bad(fmt.Sprintf("range over %d shards needs %d bounds, got %d", shards, shards-1, len(s.Bounds)), "bounds")
		}
		for k := 1; k < len(s.Bounds); k++ {
			if s.Bounds[k] <= s.Bounds[k-1] {
				bad(fmt.Sprintf("bounds must ascend strictly: %d after %d", s.Bounds[k], s.Bounds[k-1]), "bounds")
				break
			}
		}
	} else if len(s.Bounds) > 0 {
		bad("bounds are only for the range algorithm", "bounds")
	}
	return errs
}

// samePlacement says why two table rules do not place equal keys on the same shard, or
// "" when they do.
func samePlacement(a, b *tableSpec) string {
	if !slices.Equal(a.ds, b.ds) {
		return "they use different data sources"
	}
	if a.perDS != b.perDS {
		return fmt.Sprintf("%d and %d tables per data source", a.perDS, b.perDS)
	}
	same := func(x, y *Strategy) string {
		switch {
		case x == nil || y == nil:
			return "one splits database and table strategies, the other does not"
		case x.Algorithm != y.Algorithm:
			return fmt.Sprintf("algorithms %s and %s differ", x.Algorithm, y.Algorithm)
		case x.Type != y.Type:
			return fmt.Sprintf("key types %q and %q differ", x.Type, y.Type)
		case !slices.Equal(x.Bounds, y.Bounds):
			return "range bounds differ"
		}
		return ""
	}
	if (a.single == nil) != (b.single == nil) {
		return "one splits database and table strategies, the other does not"
	}
	if a.single != nil {
		return same(a.single, b.single)
	}
	if why := same(a.dbStrat, b.dbStrat); why != "" {
		return "database strategy: " + why
	}
	if why := same(a.tblStrat, b.tblStrat); why != "" {
		return "table strategy: " + why
	}
	return ""
}

func (c *Compiled) matchPattern(name string) *tableSpec {
	for _, p := range c.patterns {
		if strings.HasPrefix(name, p.prefix) && len(name) > len(p.prefix) {
			return p
		}
	}
	return nil
}

// DataSources returns the data sources, in order; index i is data source i of every Node.
// After MergeSchemas they are the merged ones.
func (c *Compiled) DataSources() []DataSource { return slices.Clone(c.sources) }

// OneShard reports whether every table lives whole on one data source under its own
// name: one data source, no schemas merged into it, no table split into several
// physical tables. Every statement is then exact on that one server as written.
func (c *Compiled) OneShard() bool {
	if len(c.sources) != 1 || c.place != nil {
		return false
	}
	for _, spec := range c.exact {
		if spec.perDS > 1 {
			return false
		}
	}
	for _, spec := range c.patterns {
		if spec.perDS > 1 {
			return false
		}
	}
	return true
}

// NumDataSources returns the number of data sources.
func (c *Compiled) NumDataSources() int { return len(c.sources) }

// DefaultDataSource returns the index of the data source that holds unruled tables.
func (c *Compiled) DefaultDataSource() int { return c.defaultDS }

// Rules returns the rules c was compiled from.
func (c *Compiled) Rules() Rules { return c.rules }

// Lookup returns the rule for a logical table name (unquoted names are lower-case, as
// PostgreSQL folds them). It never fails: a table no rule names is a default table.
func (c *Compiled) Lookup(name string) *TableRule {
	if r, ok := c.cache.Load(name); ok {
		return r.(*TableRule)
	}
	r := c.build(name)
	actual, _ := c.cache.LoadOrStore(name, r)
	return actual.(*TableRule)
}

func (c *Compiled) build(name string) *TableRule {
	if c.broadcast[name] {
		r := &TableRule{Name: name, Kind: KindBroadcast, Binding: -1}
		for d := range c.sources {
			r.Nodes = append(r.Nodes, Node{DataSource: d, Table: name})
		}
		return r
	}
	spec := c.exact[name]
	if spec != nil && spec.prefix != "" {
		spec = nil // a pattern's own text is not a table name
	}
	if spec == nil && !strings.Contains(name, "*") {
		spec = c.matchPattern(name)
	}
	if spec == nil {
		return &TableRule{Name: name, Kind: KindDefault, Binding: -1, Nodes: []Node{{DataSource: c.defaultDS, Table: name}}}
	}
	r := &TableRule{Name: name, Kind: KindSharded, Binding: spec.bindingID, spec: spec}
	for _, d := range spec.ds {
		for t := range spec.perDS {
			phys := name
			if spec.perDS > 1 {
				phys = name + "_" + strconv.Itoa(t)
			}
			n := c.node(d, phys)
			if other, ok := c.names[TableAt{Table: name, DataSource: c.rules.DataSources[d].Name}]; ok {
				n.Table = other
			}
			r.Nodes = append(r.Nodes, n)
		}
	}
	return r
}

// SingleStrategy reports whether one strategy places a sharded table's keys over all
// of its shards (shard = algorithm(key) mod ShardCount), not separate database and table
// strategies.
func (r *TableRule) SingleStrategy() bool { return r.spec != nil && r.spec.single != nil }

// ShardCount returns the number of shards (physical tables) of a sharded table.
func (r *TableRule) ShardCount() int { return len(r.Nodes) }

// KeyColumns returns the sharding columns: one, or two when database and table
// strategies use different columns. A statement names a single shard only when it fixes
// every one of them.
func (r *TableRule) KeyColumns() []string {
	if r.spec == nil {
		return nil
	}
	if r.spec.single != nil {
		return []string{r.spec.single.Column}
	}
	if r.spec.dbStrat.Column == r.spec.tblStrat.Column {
		return []string{r.spec.dbStrat.Column}
	}
	return []string{r.spec.dbStrat.Column, r.spec.tblStrat.Column}
}

// KeyType returns the declared type of a sharding column, or TypeUnknown when the rule
// leaves it to the catalog.
func (r *TableRule) KeyType(column string) KeyType {
	for _, s := range r.strategies() {
		if s.Column == column && s.Type != TypeUnknown {
			return s.Type
		}
	}
	return TypeUnknown
}

// Algorithm returns the algorithm of the strategy using column ("" if none does).
func (r *TableRule) Algorithm(column string) Algorithm {
	for _, s := range r.strategies() {
		if s.Column == column {
			return s.Algorithm
		}
	}
	return ""
}

func (r *TableRule) strategies() []*Strategy {
	if r.spec == nil {
		return nil
	}
	if r.spec.single != nil {
		return []*Strategy{r.spec.single}
	}
	return []*Strategy{r.spec.dbStrat, r.spec.tblStrat}
}

// ErrKeyType is wrapped when a key value cannot be read as its column's type.
var ErrKeyType = errors.New("rules: key value does not fit the column type")

// ShardsFor returns the shards that can hold rows whose sharding columns have the given
// values. values maps a key column to its value; a column left out may hold anything.
// types gives each key column's type (the catalog's when the rule has none).
// With every key column given, the answer is exactly one shard.
func (r *TableRule) ShardsFor(values map[string]Key, types map[string]KeyType) ([]int, error) {
	if r.Kind != KindSharded {
		return nil, fmt.Errorf("rules: table %q is not sharded", r.Name)
	}
	spec := r.spec
	pick := func(s *Strategy, n int) ([]int, error) {
		v, ok := values[s.Column]
		if !ok {
			all := make([]int, n)
			for i := range all {
				all[i] = i
			}
			return all, nil
		}
		typ := s.Type
		if typ == TypeUnknown {
			typ = types[s.Column]
		}
		i, err := shardOf(s, typ, v, n)
		if err != nil {
			return nil, err
		}
		return []int{i}, nil
	}
	if spec.single != nil {
		return pick(spec.single, len(r.Nodes))
	}
	dbs, err := pick(spec.dbStrat, len(spec.ds))
	if err != nil {
		return nil, err
	}
	tbls, err := pick(spec.tblStrat, spec.perDS)
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, len(dbs)*len(tbls))
	for _, d := range dbs {
		for _, t := range tbls {
			out = append(out, d*spec.perDS+t)
		}
	}
	return out, nil
}

// SamePlacement reports whether two sharded tables put equal keys on the same shard:
// they are in one binding group, or one pattern rule covers both (sbtest1, sbtest2).
// Rows of such tables that join on equal keys meet inside one shard.
func SamePlacement(a, b *TableRule) bool {
	if a.Kind != KindSharded || b.Kind != KindSharded {
		return false
	}
	if a.spec == b.spec {
		return true
	}
	return a.Binding >= 0 && a.Binding == b.Binding
}

// ShardOf places one key of a table with a single strategy (no separate database and
// table strategies): the shard, without the maps ShardsFor takes. ok is false for
// tables that need ShardsFor.
func (r *TableRule) ShardOf(column string, k Key, typ KeyType) (shard int, ok bool, err error) {
	if r.spec == nil || r.spec.single == nil || r.spec.single.Column != column {
		return 0, false, nil
	}
	s := r.spec.single
	if s.Type != TypeUnknown {
		typ = s.Type
	}
	i, err := shardOf(s, typ, k, len(r.Nodes))
	return i, true, err
}

// Placement returns a table's rule as Lookup does, without keeping it: for names that
// come from elsewhere than the statements planned (a server's error), which the cache
// would otherwise keep without bound.
func (c *Compiled) Placement(name string) *TableRule {
	if r, ok := c.cache.Load(name); ok {
		return r.(*TableRule)
	}
	return c.build(name)
}

// LogicalName returns the logical table whose physical table on some data source is
// named physical, when the two names differ: a table split into several on a data
// source (items_0, items_1 for items), or given another name there by a resharding
// move (WithTableNames). Errors of the servers name physical tables; clients know the
// logical ones.
func (c *Compiled) LogicalName(physical string) (string, bool) {
	for at, name := range c.names {
		if name == physical && at.Table != physical {
			return at.Table, true
		}
	}
	i := strings.LastIndexByte(physical, '_')
	if i <= 0 {
		return "", false
	}
	t, err := strconv.Atoi(physical[i+1:])
	if err != nil || t < 0 || strconv.Itoa(t) != physical[i+1:] {
		return "", false
	}
	base := physical[:i]
	r := c.build(base) // not Lookup, which would keep every name an error quotes
	if r.Kind != KindSharded || r.spec.perDS <= t {
		return "", false
	}
	for _, n := range r.Nodes {
		if n.Table == physical {
			return base, true
		}
	}
	return "", false
}
