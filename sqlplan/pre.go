package sqlplan

import (
	"fmt"
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
)

// Subquery is one subquery of a Pre.
type Subquery struct {
	Kind SubqueryKind
	SQL  string
	// Collates is set when the subquery names a collation (COLLATE): its column may
	// carry one, which the parameter would not.
	Collates bool
}

// buildPre makes the Pre of an UPDATE or DELETE (a clone: the analysis renames its
// tables), or returns nil when it has no subquery over sharded tables that can be
// evaluated first.
func (a *analyzer) buildPre(stmt *pg.Node, with *pg.WithClause) *Pre {
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
		param := &pg.Node{Node: &pg.Node_ParamRef{ParamRef: &pg.ParamRef{Number: int32(pre.Params + len(pre.Subqueries) + 1)}}}
		sub := Subquery{SQL: text, Collates: names(sl.Subselect, func(m proto.Message) bool { _, is := m.(*pg.CollateClause); return is })}
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
	for i, s := range p.Subqueries {
		fmt.Fprintf(&b, "  $%d (%s): %s\n", p.Params+i+1, subqueryKinds[s.Kind], s.SQL)
	}
	fmt.Fprintf(&b, "  then: %s\n", p.SQL)
	return b.String()
}

var subqueryKinds = [...]string{"exists", "one value", "array of values"}
