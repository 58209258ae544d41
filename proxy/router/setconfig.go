package router

import (
	"context"
	"fmt"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/sqlplan"
)

// set_config(name, value, is_local) changes a setting as SET does, from inside any
// statement. The proxy follows it as it follows SET: it reads which settings the
// statement's calls name, and after the statement ran, reads their values back from
// the server and adds them to the client's settings (or, for is_local, to the open
// transaction's), so that they follow the client to every data source. That costs one
// more round trip, for statements that call set_config only. A call whose name or
// is_local is not a constant or a parameter cannot be followed, and is refused before
// anything runs.

// setConfigCall is one call of set_config: which setting, and whether for the open
// transaction only.
type setConfigCall struct {
	name  string // as given; PostgreSQL folds it to lower case
	local bool
}

// setConfigCalls reads the set_config calls of one statement, sql as sent to the
// server, whose parameters $1, $2 ... have values (in formats, of types oids where
// known; nil is NULL). A call with a NULL name is left out (the server refuses it); a
// NULL is_local means false, as in PostgreSQL.
func setConfigCalls(sql string, values [][]byte, formats []int16, oids []uint32) ([]setConfigCall, error) {
	tree, err := pg.Parse(sql)
	if err != nil || len(tree.Stmts) != 1 {
		return nil, pgError("42601", "cannot read the statement that calls set_config")
	}
	var calls []setConfigCall
	var bad error
	walkMessages(tree.Stmts[0].Stmt, func(m proto.Message) {
		f, ok := m.(*pg.FuncCall)
		if !ok || bad != nil || !isSetConfig(f) {
			return
		}
		if len(f.Args) != 3 {
			return // no such function: the server says so
		}
		name, null, ok := constantArg(f.Args[0], values, formats, oids)
		if !ok {
			bad = sqlplan.Unsupported("set_config with a setting name that is neither a constant nor a parameter: the proxy must know which setting to carry to the client's other server connections")
			return
		}
		local, nullLocal, ok := constantArg(f.Args[2], values, formats, oids)
		if !ok {
			bad = sqlplan.Unsupported("set_config with an is_local argument that is neither a constant nor a parameter")
			return
		}
		if null {
			return
		}
		isLocal := false
		if !nullLocal {
			if isLocal, ok = parseBool(local); !ok {
				return // not a boolean: the server refuses it
			}
		}
		calls = append(calls, setConfigCall{name: name, local: isLocal})
	})
	return calls, bad
}

// setConfigCallsOf is setConfigCalls for a statement whose plan calls set_config, and
// nothing for any other (without a parse).
func setConfigCallsOf(plan *sqlplan.Plan, sql string, values [][]byte, formats []int16, oids []uint32) ([]setConfigCall, error) {
	if plan.Session&sqlplan.EffectSetConfig == 0 {
		return nil, nil
	}
	return setConfigCalls(sql, values, formats, oids)
}

// isSetConfig reports whether a call is PostgreSQL's set_config.
func isSetConfig(f *pg.FuncCall) bool {
	n := len(f.Funcname)
	if n == 0 || n > 2 || f.Funcname[n-1].GetString_().GetSval() != "set_config" {
		return false
	}
	return n == 1 || f.Funcname[0].GetString_().GetSval() == "pg_catalog"
}

// constantArg returns the text of an argument that is a constant or a parameter (with
// casts around it); null reports a NULL. A binary parameter of type boolean reads as
// "t" or "f", and any other binary value as its bytes (text's binary form).
func constantArg(n *pg.Node, values [][]byte, formats []int16, oids []uint32) (text string, null, ok bool) {
	for n.GetTypeCast() != nil {
		n = n.GetTypeCast().Arg
	}
	if c := n.GetAConst(); c != nil {
		switch {
		case c.Isnull:
			return "", true, true
		case c.GetSval() != nil:
			return c.GetSval().Sval, false, true
		case c.GetBoolval() != nil:
			if c.GetBoolval().Boolval {
				return "t", false, true
			}
			return "f", false, true
		case c.GetIval() != nil:
			return fmt.Sprint(c.GetIval().Ival), false, true
		}
		return "", false, false
	}
	if p := n.GetParamRef(); p != nil {
		i := int(p.Number) - 1
		if i < 0 || i >= len(values) {
			return "", false, false
		}
		v := values[i]
		if v == nil {
			return "", true, true
		}
		if format(formats, i) == 1 && i < len(oids) && oids[i] == boolOID {
			if len(v) == 1 && v[0] != 0 {
				return "t", false, true
			}
			return "f", false, true
		}
		return string(v), false, true
	}
	return "", false, false
}

// boolOID is the type OID of boolean.
const boolOID = 16

// parseBool reads a boolean as PostgreSQL's input function does (any unique prefix of
// true, false, yes, no, on, off; 1 or 0).
func parseBool(s string) (bool, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	switch {
	case s == "":
		return false, false
	case s == "1" || strings.HasPrefix("true", s) || strings.HasPrefix("yes", s) || s == "on":
		return true, true
	case s == "0" || strings.HasPrefix("false", s) || s == "no" || s == "n" || s == "off" || s == "of":
		return false, true
	}
	return false, false
}

// walkMessages visits every protobuf message under root.
func walkMessages(root proto.Message, fn func(proto.Message)) {
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if !m.IsValid() {
			return
		}
		fn(m.Interface())
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				l := v.List()
				for i := 0; i < l.Len(); i++ {
					visit(l.Get(i).Message())
				}
			case fd.Message() != nil && !fd.IsMap():
				visit(v.Message())
			}
			return true
		})
	}
	visit(root.ProtoReflect())
}

// setConfigSQL is the statement that replays a set_config call.
func setConfigSQL(name, value string, local bool) string {
	return fmt.Sprintf("SELECT pg_catalog.set_config(%s, %s, %t)", quoteLiteral(name), quoteLiteral(value), local)
}

// followSetConfig runs after a statement with set_config calls succeeded on connection
// c of data source ds: it reads the values the calls left and makes them the client's,
// as SET statements would.
func (s *Session) followSetConfig(ctx context.Context, c *backend.Conn, ds int, calls []setConfigCall) error {
	inTx := s.explicit || s.implicit
	var names []string
	for _, call := range calls {
		if call.local && !inTx {
			continue // it lasted for the statement only
		}
		names = append(names, call.name)
	}
	if len(names) == 0 {
		return nil
	}
	var q strings.Builder
	q.WriteString("SELECT ")
	for i, name := range names {
		if i > 0 {
			q.WriteString(", ")
		}
		// missing_ok: a call in a branch that did not run may have created nothing.
		q.WriteString("pg_catalog.current_setting(" + quoteLiteral(name) + ", true)")
	}
	values, err := c.QueryRow(ctx, q.String(), len(names))
	if err != nil {
		c.ForgetSettings()
		return err
	}
	k := 0
	for _, call := range calls {
		if call.local && !inTx {
			continue
		}
		value := values[k]
		k++
		if value == nil {
			continue // no such setting: the call did not run
		}
		sql := setConfigSQL(call.name, string(value), call.local)
		name := strings.ToLower(call.name)
		if inTx {
			// The other data sources of the transaction take it now, those that join
			// later when they join.
			if err := s.inTransaction(ctx, ds, func(c *backend.Conn, _ backend.Sink) error { return c.Query(ctx, sql, discard{}) }); err != nil {
				return err
			}
			if call.local {
				s.addLocal(sql)
			} else {
				s.changeTxSettings(setValue, name, sql)
			}
			continue
		}
		s.settings = applySet(s.settings, setValue, name, sql)
	}
	if !inTx {
		// The connection carried the client's settings; now it carries these too.
		s.settingsChanged()
		c.SetSettingsKey(s.key)
	}
	return nil
}
