package sqlplan

import (
	"time"

	"google.golang.org/protobuf/proto"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// The clock. On one database now(), CURRENT_TIMESTAMP, CURRENT_DATE, CURRENT_TIME,
// LOCALTIME and LOCALTIMESTAMP read one value for a whole transaction: the time it
// started. Across shards each data source's transaction starts at a time of its own, so
// a statement over two shards would write two values where one database writes one.
// With Options.Clock the statements sent to the data sources read the clock from the
// caller instead (Args.Clock, one reading per client transaction): every clock read of
// a SELECT, INSERT, UPDATE or DELETE becomes a computed slot, rendered as that value, a
// parameter of its own where the statement has parameters (so that its text, and the
// shards' prepared statements, stay the same from one execution to the next), or as
// pg_catalog.now() where the caller gave none (as before). CURRENT_DATE and the others
// are casts of that timestamptz, which PostgreSQL computes as they do (in the session's
// TimeZone, rounded to the precision asked for). What the shards evaluate for
// themselves (a column's DEFAULT now(), 'now' as a literal) still reads their own clock,
// and so does the coordinator database: inside a transaction block a statement it
// answers that reads the clock is refused (Plan.ReadsClock).

// ClockText writes a clock reading as Args.Clock takes it: a timestamptz in UTC, to the
// microsecond, which PostgreSQL reads alike under any DateStyle.
func ClockText(t time.Time) string {
	return t.UTC().Format("2006-01-02 15:04:05.000000") + "+00"
}

// clockCast is the type a clock read of each kind is cast to from the transaction's
// timestamptz, and whether it takes the read's precision; "" for CURRENT_TIMESTAMP.
var clockCast = map[pg.SQLValueFunctionOp]struct {
	typ       string
	precision bool
}{
	pg.SQLValueFunctionOp_SVFOP_CURRENT_TIMESTAMP:   {"", false},
	pg.SQLValueFunctionOp_SVFOP_CURRENT_TIMESTAMP_N: {"timestamptz", true},
	pg.SQLValueFunctionOp_SVFOP_CURRENT_DATE:        {"date", false},
	pg.SQLValueFunctionOp_SVFOP_CURRENT_TIME:        {"timetz", false},
	pg.SQLValueFunctionOp_SVFOP_CURRENT_TIME_N:      {"timetz", true},
	pg.SQLValueFunctionOp_SVFOP_LOCALTIME:           {"time", false},
	pg.SQLValueFunctionOp_SVFOP_LOCALTIME_N:         {"time", true},
	pg.SQLValueFunctionOp_SVFOP_LOCALTIMESTAMP:      {"timestamp", false},
	pg.SQLValueFunctionOp_SVFOP_LOCALTIMESTAMP_N:    {"timestamp", true},
}

// clockColumn is the column name PostgreSQL gives each clock read in a select list.
var clockColumn = map[pg.SQLValueFunctionOp]string{
	pg.SQLValueFunctionOp_SVFOP_CURRENT_TIMESTAMP:   "current_timestamp",
	pg.SQLValueFunctionOp_SVFOP_CURRENT_TIMESTAMP_N: "current_timestamp",
	pg.SQLValueFunctionOp_SVFOP_CURRENT_DATE:        "current_date",
	pg.SQLValueFunctionOp_SVFOP_CURRENT_TIME:        "current_time",
	pg.SQLValueFunctionOp_SVFOP_CURRENT_TIME_N:      "current_time",
	pg.SQLValueFunctionOp_SVFOP_LOCALTIME:           "localtime",
	pg.SQLValueFunctionOp_SVFOP_LOCALTIME_N:         "localtime",
	pg.SQLValueFunctionOp_SVFOP_LOCALTIMESTAMP:      "localtimestamp",
	pg.SQLValueFunctionOp_SVFOP_LOCALTIMESTAMP_N:    "localtimestamp",
}

// clockRead returns the column name PostgreSQL gives a clock read (now(),
// transaction_timestamp(), CURRENT_DATE ...), or "" when n is none.
func clockRead(n *pg.Node) string {
	switch x := n.Node.(type) {
	case *pg.Node_SqlvalueFunction:
		return clockColumn[x.SqlvalueFunction.Op]
	case *pg.Node_FuncCall:
		f := x.FuncCall
		schema, name := funcName(f)
		if (schema == "" || schema == "pg_catalog") && len(f.Funcname) <= 2 && (name == "now" || name == "transaction_timestamp") &&
			len(f.Args) == 0 && !f.AggStar && !f.AggDistinct && !f.FuncVariadic && f.Over == nil && f.AggFilter == nil && len(f.AggOrder) == 0 {
			return name
		}
	}
	return ""
}

// readsClock reports whether a statement reads the clock anywhere.
func readsClock(root proto.Message) bool {
	found := false
	walk(root, func(m proto.Message) bool {
		if n, ok := m.(*pg.Node); ok && clockRead(n) != "" {
			found = true
		}
		return !found
	})
	return found
}

// rewritesClock reports whether stmt's clock reads become the caller's value.
func (a *analyzer) rewritesClock(stmt *pg.Node) bool {
	if !a.p.clock || a.p.rules.OneShard() {
		return false
	}
	switch stmt.Node.(type) {
	case *pg.Node_SelectStmt, *pg.Node_InsertStmt, *pg.Node_UpdateStmt, *pg.Node_DeleteStmt:
		return readsClock(stmt)
	}
	return false
}

// clocked returns stmt with its clock reads replaced by the clock slot (a copy; stmt
// itself when it has none or Options.Clock is off). A select list's clock read keeps the
// name PostgreSQL gives it as an alias, since a slot would be named after its type.
func (a *analyzer) clocked(stmt *pg.Node) *pg.Node {
	if !a.rewritesClock(stmt) {
		return stmt
	}
	a.plan.clock = true
	stmt = proto.Clone(stmt).(*pg.Node)
	walk(stmt, func(m proto.Message) bool {
		if rt, ok := m.(*pg.ResTarget); ok && rt.Name == "" && rt.Val != nil {
			v := rt.Val
			for v.GetTypeCast() != nil {
				v = v.GetTypeCast().Arg
			}
			rt.Name = clockRead(v)
		}
		return true
	})
	walk(stmt, func(m proto.Message) bool {
		n, ok := m.(*pg.Node)
		if !ok || clockRead(n) == "" {
			return true
		}
		slot := pg.MakeParamRefNode(slotBase+slotClock, -1)
		if f := n.GetSqlvalueFunction(); f != nil {
			if c := clockCast[f.Op]; c.typ != "" {
				tn := &pg.TypeName{Names: []*pg.Node{pg.MakeStrNode("pg_catalog"), pg.MakeStrNode(c.typ)}, Typemod: -1, Location: -1}
				if c.precision {
					tn.Typmods = []*pg.Node{pg.MakeAConstIntNode(int64(f.Typmod), -1)}
				}
				slot = &pg.Node{Node: &pg.Node_TypeCast{TypeCast: &pg.TypeCast{Arg: slot, TypeName: tn, Location: -1}}}
			}
		}
		n.Node = slot.Node
		return false
	})
	return stmt
}

// clockSlot renders the clock slot as a constant: the caller's reading, or the data
// source's own transaction start where the caller gave none.
func clockSlot(clock string) string {
	if clock == "" {
		return "(pg_catalog.now())"
	}
	return "('" + clock + "'::pg_catalog.timestamptz)"
}
