package sqlplan

import (
	"fmt"
	"slices"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/shardlab/shardlab/rules"
)

// Pre is how an UPDATE or DELETE whose subqueries over sharded tables span shards can
// still be answered: each such subquery, when it is not correlated with the statement,
// is evaluated first, as a statement of its own (one shard, the merge or the
// coordinator database answers it), and its answer takes its place as a parameter; the
// statement then runs as one without them. Citus plans such subqueries the same way
// (recursive planning: a subquery becomes an intermediate result).
//
// A subquery that names no column of the statement around it means the same alone: a
// column reference resolves in the innermost scope that has it. Whether it is
// correlated is therefore decided by running it alone: one that names the statement's
// columns fails there (42P01, 42703), and the statement is refused.
type Pre struct {
	// Subqueries are the subqueries, in the order of their parameters.
	Subqueries []Subquery
	// SQL is the statement with each subquery replaced by its parameter ($Params+1 ...).
	SQL string
	// Params is the number of the client's parameters.
	Params int
	// AsWritten is false on a plan made from a simple-protocol statement's normalised
	// text, whose subqueries hold placeholders for its literals: plan the statement's
	// own text (Planner.Prepare of Plan.SQL) for the Pre to run.
	AsWritten bool

	describe describeAt // where the statement, refused as it stands, is described
}

// SubqueryKind says what a subquery's answer becomes.
type SubqueryKind int

// Subquery kinds.
const (
	SubqueryExists SubqueryKind = iota // EXISTS (...): a boolean, whether it has a row
	SubqueryScalar                     // (SELECT ...): its one value, NULL without a row; more than one row is an error (21000)
	SubqueryArray                      // x op ANY (...), x IN (...), x op ALL (...), ARRAY(...): an array of its values, in order
	// SubqueryColumns is the first step of a correlated subquery: the columns of its
	// tables that it reads, each an array of its values (a parameter per column, in
	// the order of the rows), which the statement's subquery reads through unnest.
	SubqueryColumns
)

// Subquery is one subquery of a Pre.
type Subquery struct {
	Kind SubqueryKind
	SQL  string
	// Params is how many parameters its answer fills: one, or one per column
	// (SubqueryColumns).
	Params int
	// Summed are the columns (SubqueryColumns) that the statement adds with sum or avg,
	// and Picked those min or max picks a value of, an aggregate's DISTINCT keeps one
	// of each equal value of, ORDER BY with a limit keeps, sorted by and selected
	// (min in another form), or GROUP BY keeps of a group, selected: refused unless of a type whose sum is exact in any
	// order (not a float), and whose equal values are alike (not numeric: max of 1.0
	// and 1.00 is whichever comes last, and one database reads the rows in another order).
	Summed, Picked []int
	// Bounded are the summed columns whose sum may not overflow (a numeric's does
	// past 1e131072), where the rewrite changes whether or when the error would come:
	// a grouped subquery's (its groups finished in another order), one in WHERE
	// (evaluated for other rows). Refused when numeric.
	Bounded []int
	// Collates is set when the subquery names a collation (COLLATE): its column may
	// carry one, which the parameter would not.
	Collates bool
	// Joined is set on the rows of an UPDATE ... FROM's other tables that its SET
	// list reads (SubqueryColumns): the statement joins them in its FROM.
	Joined bool
}

// buildPre makes the Pre of an UPDATE or DELETE (a clone: the analysis renames its
// tables), or returns nil when it has no subquery over sharded tables that can be
// evaluated first.
func (a *analyzer) buildPre(stmt *pg.Node, with *pg.WithClause, joined bool) *Pre {
	if with != nil {
		return nil // a subquery could name the statement's WITH queries
	}
	clone := proto.Clone(stmt).(*pg.Node)
	target := clone.GetUpdateStmt().GetRelation()
	if target == nil {
		target = clone.GetDeleteStmt().GetRelation()
	}
	described, err := a.describeAnywhere(clone, target)
	if err != nil {
		return nil
	}
	stmt = proto.Clone(stmt).(*pg.Node)
	pre := &Pre{Params: a.maxParam, AsWritten: !a.normalized, describe: described}
	// A correlated subquery reads the changed table alone as the statement's scope: a
	// statement with FROM (USING) has others.
	var changed *pg.RangeVar
	var returning []*pg.Node
	var where *pg.Node
	if u := stmt.GetUpdateStmt(); u != nil {
		returning, where = u.ReturningList, u.WhereClause
		if len(u.FromClause) == 0 {
			changed = u.Relation
		}
	} else if d := stmt.GetDeleteStmt(); d != nil {
		returning, where = d.ReturningList, d.WhereClause
		if len(d.UsingClause) == 0 {
			changed = d.Relation
		}
	}
	// A scalar subquery in WHERE that raises 21000 (two rows) is evaluated, or not, as
	// the conditions beside it are ordered by cost, and its cost is not the written
	// one's (an OR of many arms may come before it on one database and after it here):
	// it is not rewritten there. In the SET list it is evaluated for every row changed.
	var whereSubs []*pg.SubLink
	if where != nil {
		walk(where, func(m proto.Message) bool {
			if x, is := m.(*pg.SubLink); is {
				whereSubs = append(whereSubs, x)
				return false
			}
			return true
		})
	}
	scalarInWhere := func(sl *pg.SubLink) bool {
		return sl.SubLinkType == pg.SubLinkType_EXPR_SUBLINK && slices.Contains(whereSubs, sl)
	}
	collates := func(subselect *pg.Node) bool {
		return names(subselect, func(m proto.Message) bool { _, is := m.(*pg.CollateClause); return is })
	}
	// A subquery's value that RETURNING answers keeps its column's type modifier
	// (numeric(12,2)) on one database; read through an array it has none.
	answered := map[*pg.SubLink]bool{}
	for _, r := range returning {
		walk(r, func(m proto.Message) bool {
			if sl, is := m.(*pg.SubLink); is {
				answered[sl] = true
			}
			return true
		})
	}
	next := pre.Params // the last parameter given a number
	if joined {
		// The other tables of an UPDATE ... FROM, as rows read first (joinedRows).
		for _, f := range stmt.GetUpdateStmt().GetFromClause() {
			rs := f.GetRangeSubselect()
			if rs == nil || rs.Alias.GetAliasname() != preAlias {
				continue
			}
			text, err := deparse(a.tree.Version, rs.Subquery)
			if err != nil {
				return nil
			}
			n := len(rs.Alias.Colnames)
			rows, err := unnestFrom(next, n)
			if err != nil {
				return nil
			}
			pre.Subqueries = append(pre.Subqueries, Subquery{Kind: SubqueryColumns, SQL: text, Params: n,
				Collates: collates(rs.Subquery), Joined: true})
			next += n
			f.Node = rows.Node
		}
	}
	ok := true
	walk(stmt, func(m proto.Message) bool {
		n, isNode := m.(*pg.Node)
		if !ok || !isNode || n.GetSubLink() == nil {
			return ok
		}
		sl := n.GetSubLink()
		if !a.readsSharded(sl.Subselect) {
			return true
		}
		// A scalar subquery in WHERE, or one RETURNING answers, is not rewritten in two
		// steps: evaluated alone, or refused.
		if !answered[sl] && !scalarInWhere(sl) {
			if cs := a.correlatedSub(changed, sl, next, slices.Contains(whereSubs, sl)); cs != nil {
				text, err := deparse(a.tree.Version, cs.first)
				if err != nil {
					ok = false
					return false
				}
				pre.Subqueries = append(pre.Subqueries, Subquery{Kind: SubqueryColumns, SQL: text, Params: cs.cols, Summed: cs.summed, Picked: cs.picked,
					Bounded: cs.bounded, Collates: collates(sl.Subselect)})
				next += cs.cols
				sl.Subselect = cs.sub
				return false
			}
		}
		if sl.SubLinkType != pg.SubLinkType_EXISTS_SUBLINK && names(sl.Subselect, castToUserType) {
			// A domain's value arrives as its base type's, and as a parameter would be
			// checked against the domain again where assigned.
			ok = false
			return false
		}
		subselect := sl.Subselect
		if sel := subselect.GetSelectStmt(); sl.SubLinkType == pg.SubLinkType_EXISTS_SUBLINK && sel != nil && sel.LimitCount == nil && sel.LimitOffset == nil {
			// Whether it has a row: one row per shard tells.
			subselect = proto.Clone(subselect).(*pg.Node)
			subselect.GetSelectStmt().LimitCount = &pg.Node{Node: &pg.Node_AConst{AConst: &pg.A_Const{Val: &pg.A_Const_Ival{Ival: &pg.Integer{Ival: 1}}}}}
			subselect.GetSelectStmt().LimitOption = pg.LimitOption_LIMIT_OPTION_COUNT
		}
		text, err := deparse(a.tree.Version, subselect)
		if err != nil {
			ok = false
			return false
		}
		next++
		param := &pg.Node{Node: &pg.Node_ParamRef{ParamRef: &pg.ParamRef{Number: int32(next)}}}
		sub := Subquery{SQL: text, Params: 1, Collates: collates(sl.Subselect)}
		switch sl.SubLinkType {
		case pg.SubLinkType_EXISTS_SUBLINK:
			sub.Kind = SubqueryExists
			n.Node = param.Node
		case pg.SubLinkType_EXPR_SUBLINK:
			sub.Kind = SubqueryScalar
			n.Node = param.Node
		case pg.SubLinkType_ARRAY_SUBLINK:
			sub.Kind = SubqueryArray
			n.Node = param.Node
		case pg.SubLinkType_ANY_SUBLINK, pg.SubLinkType_ALL_SUBLINK:
			if !plainOperand(sl.Testexpr) || len(sl.OperName) > 1 {
				// A row compared, a qualified operator, or an operand that would need
				// parentheses the SQL printer does not add before ANY.
				ok = false
				return false
			}
			sub.Kind = SubqueryArray
			kind := pg.A_Expr_Kind_AEXPR_OP_ANY
			if sl.SubLinkType == pg.SubLinkType_ALL_SUBLINK {
				kind = pg.A_Expr_Kind_AEXPR_OP_ALL
			}
			op := sl.OperName
			if len(op) == 0 { // IN
				op = []*pg.Node{{Node: &pg.Node_String_{String_: &pg.String{Sval: "="}}}}
			}
			n.Node = &pg.Node_AExpr{AExpr: &pg.A_Expr{Kind: kind, Name: op, Lexpr: sl.Testexpr, Rexpr: param, Location: sl.Location}}
		default:
			ok = false // a row comparison, a multiple assignment
			return false
		}
		pre.Subqueries = append(pre.Subqueries, sub)
		return false
	})
	if !ok || len(pre.Subqueries) == 0 {
		return nil
	}
	if names(stmt, func(m proto.Message) bool { _, is := m.(*pg.CommonTableExpr); return is }) {
		// A WITH query outside the subqueries (in a derived table) could be what a
		// subquery names: alone, it would read the table of that name.
		return nil
	}
	text, err := deparse(a.tree.Version, stmt)
	if err != nil {
		return nil
	}
	pre.SQL = text
	return pre
}

// builtinNames are the types PostgreSQL's grammar names without pg_catalog that are
// built in (int, varchar, numeric... it qualifies itself).
var builtinNames = map[string]bool{"text": true, "date": true, "uuid": true, "json": true, "jsonb": true, "bytea": true,
	"inet": true, "cidr": true, "macaddr": true, "money": true, "oid": true, "name": true, "xml": true, "bool": true}

// castToUserType reports whether m casts to a type that may be the user's (a domain).
func castToUserType(m proto.Message) bool {
	tc, ok := m.(*pg.TypeCast)
	if !ok || tc.TypeName == nil || len(tc.TypeName.Names) == 0 {
		return false
	}
	names := tc.TypeName.Names
	if len(names) == 2 && names[0].GetString_().GetSval() == "pg_catalog" {
		return false
	}
	return len(names) != 1 || !builtinNames[names[0].GetString_().GetSval()]
}

// names reports whether any message under root satisfies is.
func names(root proto.Message, is func(proto.Message) bool) bool {
	found := false
	walk(root, func(m proto.Message) bool {
		if is(m) {
			found = true
		}
		return !found
	})
	return found
}

// plainOperand reports whether an expression compared with ANY or ALL prints back
// without parentheses of its own: a column, a parameter, a constant, a function call,
// or a cast of one.
func plainOperand(n *pg.Node) bool {
	switch x := n.Node.(type) {
	case *pg.Node_ColumnRef, *pg.Node_ParamRef, *pg.Node_AConst, *pg.Node_FuncCall:
		return true
	case *pg.Node_TypeCast:
		return x.TypeCast.Arg != nil && plainOperand(x.TypeCast.Arg) && x.TypeCast.Arg.GetTypeCast() == nil
	}
	return false
}

// hasSublink reports whether a statement has a subquery in an expression.
func hasSublink(root proto.Message) bool {
	found := false
	walk(root, func(m proto.Message) bool {
		if _, ok := m.(*pg.SubLink); ok {
			found = true
		}
		return !found
	})
	return found
}

// readsSharded reports whether a subquery names a sharded table.
func (a *analyzer) readsSharded(sub *pg.Node) bool {
	found := false
	walk(sub, func(m proto.Message) bool {
		if rv, ok := m.(*pg.RangeVar); ok {
			if r := a.p.rules.Lookup(rv.Relname); r != nil && r.Kind == rules.KindSharded {
				found = true
			}
		}
		return !found
	})
	return found
}

// paramCount is a plan's NumParams: a normalised plan's parameters are its literals,
// bound from the text.
func paramCount(max int, normalized bool) int {
	if normalized {
		return 0
	}
	return max
}

// Explain describes a Pre without running it; why is Bind's refusal of the statement as
// it stands.
func (p *Pre) Explain(kind Kind, why error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s in steps: subqueries over sharded tables evaluated first (as it stands: %s)\n", kind, refusalText(why))
	next := p.Params
	for _, s := range p.Subqueries {
		kind := subqueryKinds[s.Kind]
		if s.Joined {
			kind = "arrays of the columns of the rows the statement joins"
		}
		if s.Params > 1 {
			fmt.Fprintf(&b, "  $%d ... $%d (%s): %s\n", next+1, next+s.Params, kind, s.SQL)
		} else {
			fmt.Fprintf(&b, "  $%d (%s): %s\n", next+1, kind, s.SQL)
		}
		next += s.Params
	}
	fmt.Fprintf(&b, "  then: %s\n", p.SQL)
	return b.String()
}

var subqueryKinds = [...]string{"exists", "one value", "array of values", "arrays of the columns a correlated subquery reads"}
