package sqlplan

import (
	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// deparse prints a statement back as SQL for PostgreSQL to run, and refuses it when
// the text would not read as the statement: pg_query's deparser drops parentheses
// PostgreSQL needs in places, and `(NOT a) IS NULL` printed as `NOT a IS NULL` is
// another condition. The text is parsed again and must give the same tree.
func deparse(version int32, stmt *pg.Node) (string, error) {
	text, err := pg.Deparse(&pg.ParseResult{Version: version, Stmts: []*pg.RawStmt{{Stmt: stmt}}})
	if err != nil {
		return "", unsupported("a statement the rewriter cannot print back as SQL: %v", err)
	}
	again, err := pg.Parse(text)
	if err != nil || len(again.Stmts) != 1 || !sameTree(stmt, again.Stmts[0].Stmt) {
		what := "a statement"
		walk(stmt, func(m proto.Message) bool {
			var arg *pg.Node
			switch n := m.(type) {
			case *pg.NullTest:
				arg = n.Arg
			case *pg.BooleanTest:
				arg = n.Arg
			}
			if arg.GetBoolExpr() != nil {
				what = "IS [NOT] NULL (or IS TRUE, IS UNKNOWN...) over NOT, AND or OR"
			}
			return true
		})
		return "", unsupported("%s the rewriter cannot print back as SQL that reads the same (pg_query's deparser prints it otherwise)", what)
	}
	return text, nil
}

// sameTree reports whether two parse trees are one, wherever their nodes stand in the
// text.
func sameTree(a, b proto.Message) bool {
	a, b = proto.Clone(a), proto.Clone(b)
	clearLocations(a.ProtoReflect())
	clearLocations(b.ProtoReflect())
	return proto.Equal(a, b)
}

func clearLocations(m protoreflect.Message) {
	var positions []protoreflect.FieldDescriptor
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Name() == "location" || fd.Name() == "stmt_location" || fd.Name() == "stmt_len":
			positions = append(positions, fd)
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len(); i++ {
				clearLocations(v.List().Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			clearLocations(v.Message())
		}
		return true
	})
	for _, fd := range positions {
		m.Clear(fd)
	}
}
