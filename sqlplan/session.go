package sqlplan

import (
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// SessionEffects says what a statement may do to the session of the server connection
// it runs on, beyond its answer. A pooler that lends one server connection to many
// clients needs to know: a setting must follow the client to its other connections, and
// state that lives on one connection alone (a temporary table, a session advisory lock)
// must keep the client on that connection and away from every other client.
//
// The analysis is conservative: a statement that may have an effect says so, and the
// pooler then asks the server what is really there. Functions of the user's own that
// take such actions inside their bodies cannot be seen from the statement.
type SessionEffects uint8

// Session effects.
const (
	// EffectSetConfig: the statement calls set_config, which changes a setting as SET
	// does.
	EffectSetConfig SessionEffects = 1 << iota
	// EffectBinds: the statement may leave state that lives on its server connection
	// alone: a temporary object, a session-level advisory lock, a LISTEN.
	EffectBinds
	// EffectUnbinds: the statement may release such state (DROP, an advisory unlock,
	// UNLISTEN).
	EffectUnbinds
	// EffectListens: the statement is a LISTEN: its connection may receive
	// notifications at any time from now on.
	EffectListens
	// EffectSequences: the statement calls nextval, setval, currval or lastval, the
	// functions of a session's sequence state.
	EffectSequences
	// EffectReadsSequences: the statement calls currval or lastval, which read what
	// the session's last nextval left: on a connection another client used last, that
	// client's.
	EffectReadsSequences
	// EffectOpaque: the statement runs code it does not show (DO, CALL), which may
	// change settings: the connection's settings are unknown afterwards.
	EffectOpaque
)

// sessionWords are the words without which a statement has no session effect: a cheap
// test that spares the walk over the parse tree for nearly every statement.
var sessionWords = []string{"set_config", "advisory", "temp", "drop", "listen", "val", "prepare", "deallocate", "declare", "close", "discard"}

// sessionEffects finds what a parsed statement may do to its connection's session
// (see SessionEffects); text is the statement's text.
func sessionEffects(text string, stmt *pg.Node) SessionEffects {
	var e SessionEffects
	switch stmt.Node.(type) {
	case *pg.Node_DoStmt, *pg.Node_CallStmt:
		// Code the statement does not show may make or drop state that lives on the
		// connection, and change settings, which are not followed.
		e |= EffectBinds | EffectUnbinds | EffectOpaque
	}
	if !containsAnyFold(text, sessionWords) {
		return e
	}
	walk(stmt, func(m proto.Message) bool {
		switch n := m.(type) {
		case *pg.FuncCall:
			schema, name := funcName(n)
			if schema != "" && schema != "pg_catalog" {
				return true
			}
			switch name {
			case "set_config":
				e |= EffectSetConfig
			case "pg_advisory_lock", "pg_advisory_lock_shared", "pg_try_advisory_lock", "pg_try_advisory_lock_shared":
				e |= EffectBinds
			case "pg_advisory_unlock", "pg_advisory_unlock_shared", "pg_advisory_unlock_all":
				e |= EffectUnbinds
			case "nextval", "setval":
				e |= EffectSequences
			case "currval", "lastval":
				e |= EffectSequences | EffectReadsSequences
			}
		case *pg.RangeVar:
			// CREATE TEMP TABLE, SELECT ... INTO TEMP, CREATE TEMP VIEW and SEQUENCE, and
			// anything named in the pg_temp schema (a use of one is a harmless extra).
			if n.Relpersistence == "t" || isTempSchema(n.Schemaname) {
				e |= EffectBinds
			}
		case *pg.String:
			if isTempSchema(n.Sval) {
				e |= EffectBinds // a qualified name such as pg_temp.f
			}
		case *pg.DropStmt, *pg.UnlistenStmt, *pg.DeallocateStmt, *pg.ClosePortalStmt:
			e |= EffectUnbinds
		case *pg.PrepareStmt:
			e |= EffectBinds // an SQL-level prepared statement lives on its connection
		case *pg.DeclareCursorStmt:
			e |= EffectBinds // WITH HOLD outlives its transaction, on its connection
		case *pg.ListenStmt:
			e |= EffectBinds | EffectListens
		}
		return true
	})
	return e
}

// isTempSchema reports whether a schema name is the session's temporary schema.
func isTempSchema(name string) bool {
	return name == "pg_temp" || strings.HasPrefix(name, "pg_temp_")
}

// containsAnyFold reports whether s contains one of the lower-case words, in any case.
func containsAnyFold(s string, words []string) bool {
	for i := range len(s) {
		c := s[i] | 0x20 // ASCII lower case; other bytes never match a word's first letter
		for _, w := range words {
			if c == w[0] && i+len(w) <= len(s) && strings.EqualFold(s[i:i+len(w)], w) {
				return true
			}
		}
	}
	return false
}
