package sqlplan

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/shardlab/shardlab/routing"
	"github.com/shardlab/shardlab/rules"
)

// Args are the parameter values of one extended-protocol execution, as the Bind message
// carries them.
type Args struct {
	Values  [][]byte // one per parameter; nil is NULL
	Formats []int16  // none: every value is text; one: for every value; else one each
	OIDs    []uint32 // the parameters' types where known (declared or described), else 0
	// ForeignText says that text (parameters and literals alike) arrives in a client
	// encoding other than the server's. A text sharding key with a byte outside ASCII
	// would then hash unlike the value the server stores, so it names no shard: a
	// statement that reads or changes rows by it goes to every shard, and one that
	// must place a row by it is refused (0A000).
	ForeignText bool
	// Keys are the values drawn from Plan.Keys's sequence, one per row that takes one,
	// as the server printed them.
	Keys []string
}

// errForeignKey is the refusal of a sharding key that ForeignText hides.
var errForeignKey = unsupported("a text sharding key with characters outside ASCII while client_encoding differs from the server's encoding (the key would be routed by the client's bytes, not the value the server stores); use client_encoding UTF8 for such keys")

// foreignKey reports whether a text key must not be hashed as it is (Args.ForeignText).
func (v *values) foreignKey(text string) bool {
	if !v.args.ForeignText {
		return false
	}
	for i := 0; i < len(text); i++ {
		if text[i] >= 0x80 {
			return true
		}
	}
	return false
}

func (a Args) format(i int) int16 {
	switch len(a.Formats) {
	case 0:
		return 0
	case 1:
		return a.Formats[0]
	}
	if i < len(a.Formats) {
		return a.Formats[i]
	}
	return 0
}

func (a Args) oid(i int) uint32 {
	if i < len(a.OIDs) {
		return a.OIDs[i]
	}
	return 0
}

// Type OIDs the binder decodes binary parameters of.
const (
	oidInt2    = 21
	oidInt4    = 23
	oidInt8    = 20
	oidText    = 25
	oidVarchar = 1043
	oidBpchar  = 1042
	oidName    = 19
	oidUnknown = 705
	oidUUID    = 2950
)

// values reads the values of one execution.
type values struct {
	sql  string
	lits []Literal
	args Args
}

// key reads a value as a sharding key; the rules convert it to the column's type.
func (v *values) key(r valueRef) (rules.Key, error) {
	var k rules.Key
	switch r.kind {
	case valueNull:
		return rules.NullKey(), nil
	case valueConst:
		if v.foreignKey(r.text) {
			return k, errForeignKey
		}
		k = rules.TextKey(r.text)
	case valueLiteral:
		if r.n < 1 || r.n > len(v.lits) {
			return k, fmt.Errorf("literal %d missing", r.n)
		}
		text := literalText(v.sql, v.lits[r.n-1])
		if v.foreignKey(text) {
			return k, errForeignKey
		}
		k = rules.TextKey(text)
	case valueKey:
		if r.n >= len(v.args.Keys) {
			return k, fmt.Errorf("key %d of %d drawn from the sequence missing", r.n+1, len(v.args.Keys))
		}
		k = rules.TextKey(v.args.Keys[r.n])
	case valueParam:
		i := r.n - 1
		if i < 0 || i >= len(v.args.Values) {
			return k, fmt.Errorf("parameter $%d missing", r.n)
		}
		raw := v.args.Values[i]
		if raw == nil {
			return rules.NullKey(), nil
		}
		if v.foreignKey(string(raw)) && (v.args.format(i) == 0 || binaryText(v.args.oid(i))) {
			return k, errForeignKey
		}
		if v.args.format(i) == 0 {
			k = rules.TextKey(string(raw))
			break
		}
		var err error
		if k, err = binaryKey(raw, v.args.oid(i)); err != nil {
			return k, fmt.Errorf("parameter $%d: %w", r.n, err)
		}
	}
	if r.negate {
		k = k.Negate()
	}
	return k, nil
}

// binaryText reports whether a binary parameter of type oid is text, in the client's
// encoding.
func binaryText(oid uint32) bool {
	return oid == oidText || oid == oidVarchar || oid == oidName || oid == oidUnknown || oid == oidBpchar
}

func binaryKey(raw []byte, oid uint32) (rules.Key, error) {
	switch {
	case oid == oidInt2 && len(raw) == 2:
		return rules.IntKey(int64(int16(binary.BigEndian.Uint16(raw)))), nil
	case oid == oidInt4 && len(raw) == 4:
		return rules.IntKey(int64(int32(binary.BigEndian.Uint32(raw)))), nil
	case oid == oidInt8 && len(raw) == 8:
		return rules.IntKey(int64(binary.BigEndian.Uint64(raw))), nil
	case oid == oidText || oid == oidVarchar || oid == oidName || oid == oidUnknown:
		return rules.TextKey(string(raw)), nil
	case oid == oidUUID && len(raw) == 16:
		return rules.UUIDKey([16]byte(raw)), nil
	}
	return rules.Key{}, fmt.Errorf("cannot read a binary value of type %d as a sharding key", oid)
}

// int64 reads a LIMIT or OFFSET value; ok is false for NULL (no limit).
func (v *values) int64(r valueRef) (int64, bool, error) {
	if r.kind == valueNull {
		return 0, false, nil
	}
	if r.kind == valueParam {
		i := r.n - 1
		if i < 0 || i >= len(v.args.Values) {
			return 0, false, fmt.Errorf("parameter $%d missing", r.n)
		}
		raw := v.args.Values[i]
		if raw == nil {
			return 0, false, nil
		}
		if v.args.format(i) == 1 {
			switch len(raw) {
			case 8:
				return int64(binary.BigEndian.Uint64(raw)), true, nil
			case 4:
				return int64(int32(binary.BigEndian.Uint32(raw))), true, nil
			case 2:
				return int64(int16(binary.BigEndian.Uint16(raw))), true, nil
			}
			return 0, false, fmt.Errorf("parameter $%d: a binary LIMIT of %d bytes", r.n, len(raw))
		}
	}
	k, err := v.key(r)
	if err != nil {
		return 0, false, err
	}
	if k.Null {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(k.String(), 10, 64)
	if err != nil {
		return 0, false, pgErr("22P02", "invalid input syntax for type bigint: %q", k.String())
	}
	return n, true, nil
}

// Bind fixes the parameter values of one extended-protocol execution.
func (pl *Plan) Bind(args Args) (*Bound, error) { return pl.bind(pl.SQL, nil, args) }

// BindSimple binds a plan from PlanSimple to the literals of the statement sql.
func (pl *Plan) BindSimple(sql string, lits []Literal) (*Bound, error) {
	return pl.bind(sql, lits, Args{})
}

// BindSimpleForeign is BindSimple for a statement whose text is in a client encoding
// other than the server's (see Args.ForeignText).
func (pl *Plan) BindSimpleForeign(sql string, lits []Literal) (*Bound, error) {
	return pl.bind(sql, lits, Args{ForeignText: true})
}

// BindSimpleArgs is BindSimple with what Args says beside parameter values: whether
// text is foreign (ForeignText) and the keys drawn for the rows (Keys).
func (pl *Plan) BindSimpleArgs(sql string, lits []Literal, args Args) (*Bound, error) {
	args.Values, args.Formats, args.OIDs = nil, nil, nil
	return pl.bind(sql, lits, args)
}

func (pl *Plan) bind(sql string, lits []Literal, args Args) (*Bound, error) {
	if pl.refuse != nil {
		return nil, pl.refuse
	}
	if !pl.normalized && len(args.Values) != pl.NumParams && (pl.NumParams > 0 || len(args.Values) > 0) {
		return nil, pgErr(CodeProtocolViolation, "bind message supplies %d parameters, but prepared statement requires %d", len(args.Values), pl.NumParams)
	}
	if pl.normalized && len(lits) != len(pl.litKinds) {
		return nil, pgErr(CodeInternalError, "shardlab: statement has %d literals, its plan %d", len(lits), len(pl.litKinds))
	}
	if pl.Keys != nil {
		if err := pl.Keys.check(args.Keys); err != nil {
			return nil, err
		}
	}
	v := &values{sql: sql, lits: lits, args: args}
	b := &Bound{Plan: pl, Limit: -1, Offset: -1, Keys: args.Keys, sql: sql, lits: lits}
	b.Targets = b.one[:0]
	if pl.Feed != nil {
		return b, nil // the caller runs the query, then the batches (see Feed)
	}
	switch pl.Kind {
	case KindSelect, KindUpdate, KindDelete:
		if err := pl.bindRouted(b, v); err != nil {
			if pl.coordinate && errors.Is(err, ErrUnsupported) {
				// Exact on one shard only, and the values span several: PostgreSQL
				// evaluates it on the coordinator.
				pl.bindCoordinator(b, v, err)
				return b, nil
			}
			return nil, err
		}
		if pl.Kind == KindUpdate {
			if err := pl.checkKeyUpdates(b, v); err != nil {
				return nil, err
			}
		}
		return b, nil
	case KindLock:
		return b, pl.bindDDL(b, v)
	case KindExplain:
		if err := pl.bindRouted(b, v); err != nil {
			if pl.coordinate && errors.Is(err, ErrUnsupported) {
				pl.bindCoordinator(b, v, err)
				return b, nil
			}
			return nil, err
		}
		if b.MultiTarget() {
			return nil, unsupported("EXPLAIN of a statement that spans %d shards; the route preview shows its plan", len(b.Targets))
		}
		return b, nil
	case KindInsert:
		return b, pl.bindInsert(b, v)
	case KindDDL:
		return b, pl.bindDDL(b, v)
	case KindShow:
		b.Targets = []Target{{DataSource: pl.rules.DefaultDataSource(), Shard: -1, SQL: sql}}
		b.Destination = routing.DestinationAny{}
		return b, nil
	case KindCoordinator:
		pl.bindCoordinator(b, v, pl.Refused)
		return b, nil
	case KindPassthrough:
		b.Targets = []Target{{DataSource: pl.rules.DefaultDataSource(), Shard: -1, SQL: sql}}
		b.Destination = routing.DestinationShard(pl.rules.DefaultDataSource())
		return b, nil
	case KindListen:
		// Channels are the default data source's: a NOTIFY meets every LISTEN there.
		b.Targets = []Target{{DataSource: pl.rules.DefaultDataSource(), Shard: -1, SQL: sql}}
		b.Destination = routing.DestinationShard(pl.rules.DefaultDataSource())
		return b, nil
	}
	return b, nil // session statements: the caller handles them
}

// placement says on which shard each group of sharded tables runs.
type placement []groupNode

type groupNode struct {
	g    *group
	node int
}

// names returns, for each table reference, its physical name under place (or its
// logical name when it is in no placed group).
func (pl *Plan) names(place placement) func(int) string {
	return func(ref int) string {
		r := pl.refs[ref]
		if r.sharded() {
			for _, p := range place {
				for _, gr := range p.g.refs {
					if gr == r {
						return nodeSQL(r.rule.Nodes[p.node])
					}
				}
			}
		}
		return quoteIdent(r.name)
	}
}

// render makes one target's SQL; with tmpl nil the client's text goes as it is.
func (pl *Plan) render(tmpl *template, v *values, place placement, b *Bound) (string, []int) {
	if tmpl == nil {
		return v.sql, nil
	}
	// A statement prepared once runs many times on few shards: its text for a shard
	// is made once (the returned parameter list is shared and must not be changed).
	var key renderKey
	cache := tmpl.static && len(place) <= 1
	if cache {
		key.node = -1
		if len(place) == 1 {
			key = renderKey{place[0].g, place[0].node}
		}
		if c, ok := tmpl.rendered.Load(key); ok {
			r := c.(*rendering)
			return r.sql, r.params
		}
	}
	r := &renderer{sql: v.sql, lits: v.lits, table: pl.names(place), slot: pl.slotFunc(b)}
	sql := r.render(tmpl)
	params := r.params
	switch {
	case identity(params, pl.NumParams):
		params = nil
	case params == nil:
		params = []int{}
	}
	if cache {
		tmpl.rendered.Store(key, &rendering{sql, params})
	}
	return sql, params
}

func identity(params []int, n int) bool {
	if len(params) != n {
		return false
	}
	for i, p := range params {
		if p != i {
			return false
		}
	}
	return true
}

// bindRouted finds the targets of a SELECT, UPDATE, DELETE or LOCK.
func (pl *Plan) bindRouted(b *Bound, v *values) error {
	rs := pl.route
	if !rs.sharded {
		return pl.bindUnsharded(b, v)
	}
	if len(rs.groups) == 1 && rs.groups[0].anchor {
		g := rs.groups[0]
		d := g.dest(v)
		var nodes []int
		if s, ok := d.(routing.DestinationShard); ok {
			nodes = b.oneNode[:1]
			nodes[0] = int(s)
		} else {
			nodes = routing.Resolve(d, g.nodes)
		}
		if len(nodes) == 0 {
			nodes = []int{0} // no shard can hold a match: any one answers, with no rows
		}
		b.Destination = d
		if len(nodes) > 1 {
			if err := pl.refuseMulti(len(nodes)); err != nil {
				return err
			}
		}
		if len(nodes) > 1 && pl.Kind == KindSelect {
			if err := pl.bindMerge(b, v); err != nil {
				return err
			}
		}
		for _, n := range nodes {
			ds := g.refs[0].rule.Nodes[n].DataSource
			if err := pl.checkDefaultRefs(ds); err != nil {
				return err
			}
			t := Target{DataSource: ds, Shard: n}
			tmpl := pl.tmpl
			if len(nodes) > 1 && pl.mergeTmpl != nil {
				tmpl = pl.mergeTmpl
			}
			t.SQL, t.Params = pl.render(tmpl, v, placement{{g, n}}, b)
			b.Targets = append(b.Targets, t)
		}
		return nil
	}
	dest := make(map[*group]routing.Destination, len(rs.groups))
	for _, g := range rs.groups {
		dest[g] = g.dest(v)
	}
	// Tables that are not joined on their keys: exact only when every one of them is
	// pinned to a single shard, all on one data source.
	var place placement
	ds := -1
	for _, g := range rs.groups {
		nodes := routing.Resolve(dest[g], g.nodes)
		if len(nodes) == 0 {
			nodes = []int{0}
		}
		if len(nodes) > 1 {
			return pl.spanError(g)
		}
		d := g.refs[0].rule.Nodes[nodes[0]].DataSource
		if ds >= 0 && d != ds {
			return pl.spanError(g)
		}
		ds = d
		place = append(place, groupNode{g, nodes[0]})
	}
	if err := pl.checkDefaultRefs(ds); err != nil {
		return err
	}
	t := Target{DataSource: ds, Shard: -1}
	if len(place) == 1 {
		t.Shard = place[0].node
	}
	t.SQL, t.Params = pl.render(pl.tmpl, v, place, b)
	b.Targets = []Target{t}
	b.Destination = routing.DestinationShard(t.Shard)
	return nil
}

// spanError refuses a statement whose tables are not joined on their sharding keys and
// whose values do not pin them all to one data source.
func (pl *Plan) spanError(g *group) error {
	if len(pl.singleOnly) > 0 {
		return unsupported("%s across shards", pl.singleOnly[0])
	}
	return unsupported("a statement over sharded tables %s that are not all joined on equal sharding keys (or not bound to the same placement), with values that do not pin them to one shard; the join or subquery spans shards", describeGroups(pl.route.groups))
}

func describeGroups(groups []*group) string {
	var refs []*tableRef
	for _, g := range groups {
		refs = append(refs, g.refs...)
	}
	return describeRefs(refs)
}

// refuseMulti refuses, for a statement spanning n shards, the first construct that is
// exact only on one.
func (pl *Plan) refuseMulti(n int) error {
	if len(pl.singleOnly) > 0 {
		return unsupported("%s across shards (this statement spans %d shards; a condition on the sharding key that pins one shard makes it exact)", pl.singleOnly[0], n)
	}
	if pl.Kind == KindSelect && pl.merge == nil {
		return unsupported("this SELECT across shards")
	}
	return nil
}

// checkDefaultRefs refuses tables of the default data source on a target elsewhere.
func (pl *Plan) checkDefaultRefs(ds int) error {
	for _, r := range pl.route.defaultRefs {
		if r.rule.Nodes[0].DataSource != ds {
			return unsupported("a statement joining sharded tables with %s, which lives only on the default data source, where these shards are not", r.name)
		}
	}
	return nil
}

// bindUnsharded routes statements over broadcast and default tables only.
func (pl *Plan) bindUnsharded(b *Bound, v *values) error {
	rs := pl.route
	def := pl.rules.DefaultDataSource()
	var dss []int
	switch {
	case pl.Write && len(pl.refs) > 0 && pl.refs[0].rule.Kind == rules.KindBroadcast:
		if len(rs.defaultRefs) > 0 {
			return unsupported("a write to broadcast table %s that reads %s, which lives only on the default data source", pl.refs[0].name, rs.defaultRefs[0].name)
		}
		for d := range pl.rules.NumDataSources() {
			dss = append(dss, d)
		}
		b.Broadcast = true
		b.Destination = routing.DestinationAll{}
	default:
		dss = []int{def}
		b.Destination = routing.DestinationShard(def)
		if len(rs.defaultRefs) == 0 {
			b.Destination = routing.DestinationAny{}
		}
	}
	for _, ds := range dss {
		t := Target{DataSource: ds, Shard: -1}
		t.SQL, t.Params = pl.render(pl.tmpl, v, nil, b)
		b.Targets = append(b.Targets, t)
	}
	return nil
}

// slotFunc returns the values of computed slots for b.
func (pl *Plan) slotFunc(b *Bound) func(int) string {
	return func(n int) string {
		if n >= slotKeys {
			if i := n - slotKeys; i < len(b.Keys) {
				return b.Keys[i]
			}
			return "NULL" // unreachable: Bind checked the keys against the plan's
		}
		if n == slotLimit && b.Limit >= 0 {
			if b.Offset > 0 {
				return strconv.FormatInt(b.Limit+b.Offset, 10)
			}
			return strconv.FormatInt(b.Limit, 10)
		}
		return "ALL"
	}
}

// bindMerge reads LIMIT and OFFSET for a merged SELECT, before its targets are
// rendered with the LIMIT pushed down to each.
func (pl *Plan) bindMerge(b *Bound, v *values) error {
	m := pl.merge
	b.Merge = m
	if m.limit != nil {
		n, ok, err := v.int64(*m.limit)
		if err != nil {
			return err
		}
		if ok {
			if n < 0 {
				return pgErr("2201W", "LIMIT must not be negative")
			}
			b.Limit = n
		}
	}
	if m.offset != nil {
		n, ok, err := v.int64(*m.offset)
		if err != nil {
			return err
		}
		if ok {
			if n < 0 {
				return pgErr("2201X", "OFFSET must not be negative")
			}
			b.Offset = n
		}
	}
	return nil
}

// DescribeSQL returns a data source and the statement to describe there, to learn the
// parameter types and result columns of an extended-protocol statement before its
// values are known (drivers Describe before they Bind). It is the statement as its first
// shard would run it, with the client's $n parameters as written; any shard, having
// the same schema, describes it the same way.
func (pl *Plan) DescribeSQL() (int, string) { return pl.describeSQL(pl.SQL, nil) }

// DescribeSQL is Plan.DescribeSQL for the statement b was bound from, its literals
// included: a simple-protocol statement's plan is shared by texts that differ in them,
// and its template has holes for them.
func (b *Bound) DescribeSQL() (int, string) {
	if !b.Plan.normalized {
		return b.Plan.DescribeSQL()
	}
	return b.Plan.describeSQL(b.sql, b.lits)
}

func (pl *Plan) describeSQL(sql string, lits []Literal) (int, string) {
	if pl.Kind == KindCoordinator {
		return CoordinatorSource(pl.rules), pl.SQL
	}
	if pl.refuse != nil && pl.Pre != nil {
		// Refused as it stands (its subqueries run first): no template to render.
		if pl.Pre.describe.ds < 0 {
			return CoordinatorSource(pl.rules), pl.SQL
		}
		return pl.Pre.describe.ds, pl.Pre.describe.sql
	}
	if pl.Feed != nil {
		if pl.Feed.describe.ds < 0 {
			return CoordinatorSource(pl.rules), pl.SQL
		}
		return pl.Feed.describe.ds, pl.Feed.describe.sql
	}
	ds := pl.rules.DefaultDataSource()
	var place placement
	if pl.route != nil {
		for _, g := range pl.route.groups {
			place = append(place, groupNode{g, 0})
		}
		if len(place) > 0 {
			ds = place[0].g.refs[0].rule.Nodes[0].DataSource
		}
	}
	if pl.insert != nil {
		ds = pl.insert.target.rule.Nodes[0].DataSource
		if pl.tmpl == nil && len(pl.insert.rows) > 0 {
			// A split INSERT has no single template: describe it whole on shard 0.
			r := &renderer{sql: sql, lits: lits, table: pl.names(placement{{pl.route.groups[0], 0}}), slot: describeSlot, keepParams: true}
			var sb strings.Builder
			sb.WriteString(r.render(pl.insert.prefix))
			for i, row := range pl.insert.rows {
				if i > 0 {
					sb.WriteString(", ")
				}
				sb.WriteString(r.render(row))
			}
			sb.WriteString(r.render(pl.insert.suffix))
			return ds, sb.String()
		}
	}
	if pl.tmpl == nil {
		return ds, sql
	}
	r := &renderer{sql: sql, lits: lits, table: pl.names(place), slot: describeSlot, keepParams: true}
	return ds, r.render(pl.tmpl)
}
