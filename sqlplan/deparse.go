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
	return sameMessage(a.ProtoReflect(), b.ProtoReflect())
}

// sameMessage compares two messages field by field, positions aside.
func sameMessage(a, b protoreflect.Message) bool {
	if a.IsValid() != b.IsValid() || a.Descriptor() != b.Descriptor() {
		return false
	}
	same, fields := true, 0
	a.Range(func(fd protoreflect.FieldDescriptor, va protoreflect.Value) bool {
		if textPosition(fd) {
			return true
		}
		fields++
		if !b.Has(fd) {
			same = false
			return false
		}
		vb := b.Get(fd)
		switch {
		case fd.IsList():
			la, lb := va.List(), vb.List()
			same = la.Len() == lb.Len()
			for i := 0; same && i < la.Len(); i++ {
				if fd.Message() != nil {
					same = sameMessage(la.Get(i).Message(), lb.Get(i).Message())
				} else {
					same = la.Get(i).Equal(lb.Get(i))
				}
			}
		case fd.Message() != nil && !fd.IsMap():
			same = sameMessage(va.Message(), vb.Message())
		default:
			same = va.Equal(vb)
		}
		return same
	})
	if !same {
		return false
	}
	b.Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if !textPosition(fd) {
			fields--
		}
		return true
	})
	return fields == 0
}

// textPosition reports whether a field of pg_query's tree says where a node stands in the
// text.
func textPosition(fd protoreflect.FieldDescriptor) bool {
	if fd.Kind() != protoreflect.Int32Kind || fd.IsList() {
		return false // (CREATE TABLESPACE's location is a directory)
	}
	switch fd.Name() {
	case "location", "stmt_location", "stmt_len", "arg_location", "name_location", "payload_location", "conninfo_location":
		return true
	}
	return false
}
