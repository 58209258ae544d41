package sqlplan

import (
	"math"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/shardlab/shardlab/routing"
	"github.com/shardlab/shardlab/rules"
)

// valueRef is where a value comes from at bind time: a constant of the statement, a
// client parameter, or (in a normalised simple-protocol plan) a literal of the text.
type valueRef struct {
	kind   valueKind
	n      int    // parameter or literal number, 1-based
	text   string // a constant's text
	negate bool   // unary minus in front
}

type valueKind uint8

const (
	valueConst valueKind = iota
	valueNull
	valueParam   // a client parameter $n (extended protocol)
	valueLiteral // literal n of a normalised simple-protocol statement
	valueKey     // key n (0-based) drawn from the sharding key's sequence (Plan.Keys)
)

func (v valueRef) String() string {
	neg := ""
	if v.negate {
		neg = "-"
	}
	switch v.kind {
	case valueNull:
		return "NULL"
	case valueParam:
		return neg + "$" + strconv.Itoa(v.n)
	case valueLiteral:
		return neg + "literal " + strconv.Itoa(v.n)
	case valueKey:
		return "key " + strconv.Itoa(v.n+1) + " from the sequence"
	}
	return neg + v.text
}

// valueOf reads a node as a value known at bind time, or returns ok false.
func (a *analyzer) valueOf(n *pg.Node) (valueRef, bool) {
	if n == nil {
		return valueRef{}, false
	}
	switch x := n.Node.(type) {
	case *pg.Node_AConst:
		c := x.AConst
		switch {
		case c.Isnull:
			return valueRef{kind: valueNull}, true
		case c.GetIval() != nil:
			return valueRef{kind: valueConst, text: strconv.FormatInt(int64(c.GetIval().Ival), 10)}, true
		case c.GetFval() != nil:
			return valueRef{kind: valueConst, text: c.GetFval().Fval}, true
		case c.GetSval() != nil:
			return valueRef{kind: valueConst, text: c.GetSval().Sval}, true
		}
		return valueRef{}, false
	case *pg.Node_ParamRef:
		num := int(x.ParamRef.Number)
		if num >= slotBase+slotKeys {
			return valueRef{kind: valueKey, n: num - slotBase - slotKeys}, true
		}
		if a.normalized {
			return valueRef{kind: valueLiteral, n: num}, true
		}
		return valueRef{kind: valueParam, n: num}, true
	case *pg.Node_TypeCast:
		return a.valueOf(x.TypeCast.Arg)
	case *pg.Node_AExpr:
		e := x.AExpr
		if e.Kind == pg.A_Expr_Kind_AEXPR_OP && e.Lexpr == nil && opName(e) == "-" {
			v, ok := a.valueOf(e.Rexpr)
			if ok && v.kind != valueNull {
				v.negate = !v.negate
				return v, true
			}
		}
	}
	return valueRef{}, false
}

func opName(e *pg.A_Expr) string {
	if len(e.Name) == 0 {
		return ""
	}
	return e.Name[len(e.Name)-1].GetString_().Sval
}

// cond is a routing condition on sharding keys.
type cond interface{ isCond() }

type condAnd []cond
type condOr []cond

// condKey: ref.col is one of values.
type condKey struct {
	ref    *tableRef
	col    string
	values []valueRef
}

// condRange: lo <= ref.col <= hi (either may be absent), or < and > when strict.
type condRange struct {
	ref                *tableRef
	col                string
	lo, hi             *valueRef
	loStrict, hiStrict bool
}

func (condAnd) isCond()   {}
func (condOr) isCond()    {}
func (condKey) isCond()   {}
func (condRange) isCond() {}

// toCond reads a WHERE conjunct of scope s as a routing condition on the tables of
// group, or nil when it says nothing that narrows them.
func (a *analyzer) toCond(n *pg.Node, s *scope, group map[*tableRef]bool) cond {
	switch x := n.Node.(type) {
	case *pg.Node_BoolExpr:
		b := x.BoolExpr
		switch b.Boolop {
		case pg.BoolExprType_AND_EXPR:
			var out condAnd
			for _, arg := range b.Args {
				if c := a.toCond(arg, s, group); c != nil {
					out = append(out, c)
				}
			}
			if len(out) == 0 {
				return nil
			}
			return out
		case pg.BoolExprType_OR_EXPR:
			var out condOr
			for _, arg := range b.Args {
				c := a.toCond(arg, s, group)
				if c == nil {
					return nil // one unconstrained branch frees the whole OR
				}
				out = append(out, c)
			}
			return out
		}
		return nil
	case *pg.Node_NullTest:
		nt := x.NullTest
		if nt.Nulltesttype != pg.NullTestType_IS_NULL {
			return nil
		}
		if ref, col := a.keyColumn(nt.Arg, s, group); ref != nil {
			return condKey{ref: ref, col: col, values: []valueRef{{kind: valueNull}}}
		}
		return nil
	case *pg.Node_AExpr:
		return a.exprCond(x.AExpr, s, group)
	}
	return nil
}

func (a *analyzer) exprCond(e *pg.A_Expr, s *scope, group map[*tableRef]bool) cond {
	op := opName(e)
	switch e.Kind {
	case pg.A_Expr_Kind_AEXPR_OP:
		ref, col, v, flipped := a.keyAndValue(e, s, group)
		if ref == nil {
			return nil
		}
		if flipped {
			op = map[string]string{"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "="}[op]
		}
		switch op {
		case "=":
			return condKey{ref: ref, col: col, values: []valueRef{v}}
		case "<", "<=":
			return condRange{ref: ref, col: col, hi: &v, hiStrict: op == "<"}
		case ">", ">=":
			return condRange{ref: ref, col: col, lo: &v, loStrict: op == ">"}
		}
	case pg.A_Expr_Kind_AEXPR_IN:
		if op != "=" {
			return nil
		}
		ref, col := a.keyColumn(e.Lexpr, s, group)
		list := e.Rexpr.GetList()
		if ref == nil || list == nil {
			return nil
		}
		c := condKey{ref: ref, col: col}
		for _, item := range list.Items {
			v, ok := a.valueOf(item)
			if !ok {
				return nil
			}
			c.values = append(c.values, v)
		}
		return c
	case pg.A_Expr_Kind_AEXPR_BETWEEN:
		ref, col := a.keyColumn(e.Lexpr, s, group)
		list := e.Rexpr.GetList()
		if ref == nil || list == nil || len(list.Items) != 2 {
			return nil
		}
		lo, ok1 := a.valueOf(list.Items[0])
		hi, ok2 := a.valueOf(list.Items[1])
		if !ok1 || !ok2 {
			return nil
		}
		return condRange{ref: ref, col: col, lo: &lo, hi: &hi}
	}
	return nil
}

// keyAndValue reads `key op value` or `value op key`.
func (a *analyzer) keyAndValue(e *pg.A_Expr, s *scope, group map[*tableRef]bool) (*tableRef, string, valueRef, bool) {
	if ref, col := a.keyColumn(e.Lexpr, s, group); ref != nil {
		if v, ok := a.valueOf(e.Rexpr); ok {
			return ref, col, v, false
		}
	}
	if ref, col := a.keyColumn(e.Rexpr, s, group); ref != nil {
		if v, ok := a.valueOf(e.Lexpr); ok {
			return ref, col, v, true
		}
	}
	return nil, "", valueRef{}, false
}

// keyColumn reads n as a sharding column of a table in group, seen from scope s.
func (a *analyzer) keyColumn(n *pg.Node, s *scope, group map[*tableRef]bool) (*tableRef, string) {
	if n == nil {
		return nil, ""
	}
	qual, col, ok := columnRef(n)
	if !ok {
		return nil, ""
	}
	for _, r := range resolveKeyColumn(s, qual, col) {
		if group[r] {
			return r, col
		}
	}
	return nil, ""
}

// routeSpec is how a plan finds its targets at bind time.
type routeSpec struct {
	groups []*group
	// sharded is false when no sharded table is involved; targets are then data sources.
	sharded bool
	// defaultRefs and broadcastRefs are the tables of the other two kinds.
	defaultRefs, broadcastRefs []*tableRef
}

// group is a set of sharded table references whose rows meet on one shard: tables of
// the same placement joined on their sharding keys.
type group struct {
	refs   []*tableRef
	anchor bool // holds tables of the statement's top level
	conds  []cond
	nodes  int // shard count of the group's layout
}

func (g *group) String() string {
	var names []string
	for _, r := range g.refs {
		names = append(names, r.name)
	}
	return strings.Join(names, "+")
}

// buildRoute groups the sharded tables and collects their routing conditions.
func (a *analyzer) buildRoute() error {
	rs := &routeSpec{}
	var sharded []*tableRef
	for _, r := range a.plan.refs {
		switch r.rule.Kind {
		case rules.KindSharded:
			sharded = append(sharded, r)
		case rules.KindBroadcast:
			rs.broadcastRefs = append(rs.broadcastRefs, r)
		default:
			rs.defaultRefs = append(rs.defaultRefs, r)
		}
	}
	a.plan.route = rs
	if len(sharded) == 0 {
		return nil
	}
	rs.sharded = true

	// Union-find over sharded references, joined where their keys are equal.
	parent := map[*tableRef]*tableRef{}
	var find func(r *tableRef) *tableRef
	find = func(r *tableRef) *tableRef {
		if parent[r] == nil || parent[r] == r {
			return r
		}
		root := find(parent[r])
		parent[r] = root
		return root
	}
	union := func(x, y *tableRef) {
		if !colocatable(x, y) {
			return
		}
		rx, ry := find(x), find(y)
		if rx != ry {
			parent[rx] = ry
		}
	}
	// Equal keys: pairs of (ref, ref) with the key columns each pair matched.
	matched := map[[2]*tableRef]map[string]bool{}
	note := func(x, y *tableRef, colX, colY string) {
		kx, ky := x.rule.KeyColumns(), y.rule.KeyColumns()
		ix, iy := indexOf(kx, colX), indexOf(ky, colY)
		if ix < 0 || ix != iy {
			return
		}
		k := [2]*tableRef{x, y}
		if matched[k] == nil {
			matched[k] = map[string]bool{}
		}
		matched[k][colX] = true
		if len(matched[k]) == len(kx) {
			union(x, y)
		}
	}
	var scopes []*scope
	seen := map[*scope]bool{}
	for _, r := range a.plan.refs {
		if r.scope != nil && !seen[r.scope] {
			seen[r.scope] = true
			scopes = append(scopes, r.scope)
		}
	}
	for _, s := range scopes {
		for _, eq := range s.equalities {
			e := eq.GetAExpr()
			if e == nil || e.Kind != pg.A_Expr_Kind_AEXPR_OP || opName(e) != "=" {
				continue
			}
			lq, lc, ok1 := columnRef(e.Lexpr)
			rq, rc, ok2 := columnRef(e.Rexpr)
			if !ok1 || !ok2 {
				continue
			}
			for _, x := range resolveKeyColumn(s, lq, lc) {
				for _, y := range resolveKeyColumn(s, rq, rc) {
					if x != y {
						note(x, y, lc, rc)
					}
				}
			}
		}
		for _, u := range s.using {
			for _, x := range u.left {
				for _, y := range u.right {
					if !x.sharded() || !y.sharded() {
						continue
					}
					cols := u.columns
					if cols == nil { // NATURAL: only the key columns matter here
						cols = x.rule.KeyColumns()
					}
					for _, c := range cols {
						if _, ok := x.keyTypes[c]; ok {
							if _, ok := y.keyTypes[c]; ok && u.columns != nil {
								note(x, y, c, c)
							}
						}
					}
				}
			}
		}
	}
	// Several unqualified references to the same key column (a USING join) are one.
	byRoot := map[*tableRef]*group{}
	for _, r := range sharded {
		root := find(r)
		g := byRoot[root]
		if g == nil {
			g = &group{nodes: r.rule.ShardCount()}
			byRoot[root] = g
			rs.groups = append(rs.groups, g)
		}
		g.refs = append(g.refs, r)
		if a.topLevel(r.scope) {
			g.anchor = true
		}
	}
	for _, g := range rs.groups {
		members := map[*tableRef]bool{}
		for _, r := range g.refs {
			members[r] = true
		}
		// An anchored group is narrowed by the conditions of the top level and of the
		// subqueries inlined into it; a group living in a subquery by that subquery's own.
		var scopes []*scope
		if g.anchor {
			seen := map[*scope]bool{}
			for _, r := range g.refs {
				for sc := r.scope; sc != nil && a.topLevel(sc) && !seen[sc]; sc = sc.parent {
					seen[sc] = true
					scopes = append(scopes, sc)
				}
			}
			if !seen[a.top] {
				scopes = append(scopes, a.top)
			}
		} else {
			scopes = []*scope{g.refs[0].scope}
		}
		for _, s := range scopes {
			for _, c := range s.narrowing {
				if cd := a.toCond(c, s, members); cd != nil {
					g.conds = append(g.conds, cd)
				}
			}
		}
	}
	return nil
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

// colocatable reports whether rows of x and y with equal keys live on the same shard.
func colocatable(x, y *tableRef) bool {
	if !rules.SamePlacement(x.rule, y.rule) {
		return false
	}
	for i, c := range x.rule.KeyColumns() {
		tx := x.keyTypes[c]
		ty := y.keyTypes[y.rule.KeyColumns()[i]]
		if tx != ty && !(tx.IsInteger() && ty.IsInteger()) {
			return false
		}
	}
	return true
}

// evalCond returns the shards of group g (by node index) that cond allows.
func evalCond(c cond, g *group, vals *values) routing.Destination {
	switch c := c.(type) {
	case condAnd:
		var d routing.Destination = routing.DestinationAll{}
		for _, x := range c {
			d = routing.Intersect(d, evalCond(x, g, vals), g.nodes)
		}
		return d
	case condOr:
		var d routing.Destination = routing.DestinationNone{}
		for _, x := range c {
			d = routing.Union(d, evalCond(x, g, vals), g.nodes)
		}
		return d
	case condKey:
		var d routing.Destination = routing.DestinationNone{}
		for _, v := range c.values {
			k, err := vals.key(v)
			if err != nil {
				return routing.DestinationAll{}
			}
			if s, ok, err := c.ref.rule.ShardOf(c.col, k, c.ref.keyTypes[c.col]); ok {
				if err != nil {
					return routing.DestinationAll{}
				}
				if len(c.values) == 1 {
					return routing.DestinationShard(s)
				}
				d = routing.Union(d, routing.DestinationShard(s), g.nodes)
				continue
			}
			shards, err := c.ref.rule.ShardsFor(map[string]rules.Key{c.col: k}, c.ref.keyTypes)
			if err != nil {
				// A value the column cannot hold matches nothing, but let every shard
				// say so (and raise the type error PostgreSQL would).
				return routing.DestinationAll{}
			}
			d = routing.Union(d, routing.NewShards(shards...), g.nodes)
		}
		return d
	case condRange:
		var lo, hi *int64
		for _, pair := range []struct {
			v      *valueRef
			dst    **int64
			strict int64 // for integer keys, x > v is x >= v+1 and x < v is x <= v-1
		}{{c.lo, &lo, b2i(c.loStrict)}, {c.hi, &hi, -b2i(c.hiStrict)}} {
			if pair.v == nil {
				continue
			}
			k, err := vals.key(*pair.v)
			if err != nil || k.Null {
				return routing.DestinationAll{}
			}
			iv, err := rules.ParseKey(rules.TypeInt8, k.String())
			if err != nil {
				return routing.DestinationAll{}
			}
			x := iv.Int
			if (pair.strict > 0 && x < math.MaxInt64) || (pair.strict < 0 && x > math.MinInt64) {
				x += pair.strict
			}
			*pair.dst = &x
		}
		if shards, ok := c.ref.rule.RangeShards(c.col, lo, hi); ok {
			return routing.NewShards(shards...)
		}
		return routing.DestinationAll{}
	}
	return routing.DestinationAll{}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func describeRefs(refs []*tableRef) string {
	var names []string
	for _, r := range refs {
		names = appendUnique(names, r.name)
	}
	return strings.Join(names, ", ")
}

// dest evaluates the group's conditions with the values of one execution.
func (g *group) dest(v *values) routing.Destination {
	var d routing.Destination = routing.DestinationAll{}
	for _, c := range g.conds {
		d = routing.Intersect(d, evalCond(c, g, v), g.nodes)
	}
	return d
}
