package router

import (
	"context"
	"slices"
	"strings"

	"github.com/shardlab/shardlab/rules"

	"github.com/jackc/pgx/v5/pgproto3"
	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/shardlab/shardlab/proxy/backend"
)

// A client's settings are its own. The session keeps them as a list of statements
// (SET, or set_config calls) that, replayed in order on a reset server connection, give
// it the client's settings; a key identifies the list, and every connection the client
// uses is made to carry it (backend.Conn.ApplySettings resets a connection whose key
// differs). The list follows PostgreSQL's rules:
//   - SET name replaces an earlier SET of the same name; RESET name and SET name TO
//     DEFAULT drop it, back to the value the session started with;
//   - RESET ALL drops every setting but the role and the session authorization, which
//     it leaves alone;
//   - setting or resetting the session authorization resets the role too;
//   - SET LOCAL, SET TRANSACTION and set_config(..., true) last for the transaction;
//   - inside a transaction the list changes as the transaction goes, and is kept only
//     if it commits; ROLLBACK TO SAVEPOINT brings back the list of that savepoint.
//
// Outside a transaction a SET runs on the default data source (which checks it and
// answers, with the ParameterStatus a reported setting brings); inside one it runs on
// every data source the transaction has touched, and follows it to those that join.

// setKind classifies a SET or RESET statement.
type setKind int

const (
	setValue   setKind = iota // SET [SESSION] name ...: the parameter takes a value
	setDefault                // RESET name, SET name TO DEFAULT
	resetAll                  // RESET ALL
	setLocal                  // SET LOCAL, SET TRANSACTION: for the open transaction
)

// The identity parameters: RESET ALL leaves them alone, and a change of the session
// authorization resets the role.
const (
	paramRole                 = "role"
	paramSessionAuthorization = "session_authorization"
)

// classifySet reads which parameter a SET or RESET statement changes and how. SET
// statements are rare (a few per connection), so parsing each is cheap.
func classifySet(sql string) (setKind, string, error) {
	tree, err := pg.Parse(sql)
	if err != nil || len(tree.Stmts) != 1 {
		return 0, "", pgError("42601", "cannot read SET statement %q", sql)
	}
	v := tree.Stmts[0].Stmt.GetVariableSetStmt()
	if v == nil {
		return 0, "", pgError("42601", "not a SET statement: %q", sql)
	}
	name := strings.ToLower(v.Name)
	switch {
	case v.Kind == pg.VariableSetKind_VAR_RESET_ALL:
		return resetAll, "", nil
	case v.IsLocal || v.Name == "TRANSACTION" || strings.HasPrefix(v.Name, "TRANSACTION "):
		return setLocal, name, nil
	case v.Kind == pg.VariableSetKind_VAR_RESET || v.Kind == pg.VariableSetKind_VAR_SET_DEFAULT:
		return setDefault, name, nil
	}
	return setValue, name, nil
}

// effectiveSet returns the statement that replays a SET of parameter name that ran on
// c. A SET of DateStyle composes with the value before it (SET datestyle = 'MDY' keeps
// the output style), so it is replayed as the value the server reported after it;
// every other SET is replayed as written.
func effectiveSet(c *backend.Conn, name, sql string) string {
	if name != "datestyle" {
		return sql
	}
	if v := c.PgConn().ParameterStatus("DateStyle"); v != "" {
		return "SET datestyle = " + quoteLiteral(v)
	}
	return sql
}

// applySet returns a settings list after a statement of kind changed parameter name
// (sql is the statement, kept for replay). The list given is not modified.
func applySet(list []setting, kind setKind, name, sql string) []setting {
	drop := func(st setting) bool {
		switch kind {
		case resetAll:
			return st.name != paramRole && st.name != paramSessionAuthorization
		case setValue, setDefault:
			return st.name == name || name == paramSessionAuthorization && st.name == paramRole
		}
		return false
	}
	out := make([]setting, 0, len(list)+1)
	for _, st := range list {
		if !drop(st) {
			out = append(out, st)
		}
	}
	if kind == setValue {
		out = append(out, setting{name: name, sql: sql})
	}
	return out
}

// savedSettings is the settings list at a savepoint of the open transaction.
type savedSettings struct {
	name  string // the savepoint's name, quoted as an identifier
	list  []setting
	local int // len(txLocal) then
	sub   int // the subtransaction the savepoint began (see Session.subSeq)
}

// currentSettings returns the client's settings as they stand: inside a transaction
// that changed them, as they will be if it commits.
func (s *Session) currentSettings() []setting {
	if s.txChanged {
		return s.txSettings
	}
	return s.settings
}

// changeTxSettings applies a change to the open transaction's settings.
func (s *Session) changeTxSettings(kind setKind, name, sql string) {
	s.txSettings = applySet(s.currentSettings(), kind, name, sql)
	s.txChanged = true
	s.dirty = true
	s.settingsChanged()
}

// savepointSettings records the settings at a new savepoint.
func (s *Session) savepointSettings(name string) {
	s.subSeq++
	s.saved = append(s.saved, savedSettings{name: name, list: s.currentSettings(), local: len(s.txLocal), sub: s.subSeq})
}

// currentSub identifies the subtransaction statements run in now: the latest savepoint's
// (0: none). Numbers only grow, so one begun after another has a greater number.
func (s *Session) currentSub() int {
	if len(s.saved) == 0 {
		return 0
	}
	return s.saved[len(s.saved)-1].sub
}

// dropPortalsFrom drops the portals made in subtransaction sub or a later one, after a
// ROLLBACK TO SAVEPOINT to the savepoint that began sub, as PostgreSQL drops the
// portals made in the subtransactions it rolls back (a later number is a child of sub's
// while sub's savepoint stands).
func (s *Session) dropPortalsFrom(sub int) {
	for name, p := range s.portals {
		if p.sub >= sub {
			delete(s.portals, name) // a server's portal went with the subtransaction
		}
	}
}

// rollbackSettings brings back the settings of the latest savepoint named name, which
// stays; release drops it and the savepoints after it. After a rollback it reports
// whether the settings list changed.
func (s *Session) rollbackSettings(name string, release bool) bool {
	i := lastSaved(s.saved, name)
	if i < 0 {
		return false
	}
	if release {
		s.saved = s.saved[:i]
		return false
	}
	before := s.key
	s.txSettings, s.txChanged = s.saved[i].list, true
	s.txLocal = s.txLocal[:s.saved[i].local]
	s.saved = s.saved[:i+1]
	s.settingsChanged()
	return s.key != before
}

// restoreSettings makes every data source of the open transaction carry the client's
// settings as they stand, after a rollback to a savepoint changed them. PostgreSQL
// undoes a SET made after the savepoint by itself, but a data source that joined the
// transaction later was given the transaction's settings before its BEGIN, where the
// rollback cannot reach them.
func (s *Session) restoreSettings(ctx context.Context) error {
	stmts := append(slices.Clone(s.stmtsSQL), s.txLocal...)
	for _, ds := range s.tx.Touched() {
		if err := s.onDataSource(ctx, ds, func(c *backend.Conn) error { return c.ResetTo(ctx, stmts) }); err != nil {
			return err
		}
	}
	return nil
}

func lastSaved(saved []savedSettings, name string) int {
	for i := len(saved) - 1; i >= 0; i-- {
		if saved[i].name == name {
			return i
		}
	}
	return -1
}

// set runs a SET or RESET statement.
func (s *Session) set(ctx context.Context, sql string) error {
	kind, name, err := classifySet(sql)
	if err != nil {
		return err
	}
	if name == rules.LayoutSetting {
		return pgError("42501", "%s is the proxy's: it tells the servers which layout the proxy routes by (a resharding move's fence)", rules.LayoutSetting)
	}
	if name == "client_encoding" && (kind == setValue || kind == setLocal) {
		s.noteEncoding(setValueOf(sql))
	}
	if s.explicit || s.implicit {
		if err := s.inTransaction(ctx, -1, func(c *backend.Conn, sink backend.Sink) error {
			if kind != setDefault && kind != resetAll {
				err := c.Query(ctx, sql, sink)
				if err == nil && kind == setValue {
					sql = effectiveSet(c, name, sql)
				}
				return err
			}
			// A reset goes back to the server's defaults; the client's own are
			// those its startup packet gave, which run again after it. The client
			// hears of the values it ends with, not of those in between.
			if err := c.Query(ctx, sql, noParameterStatus{sink}); err != nil {
				return err
			}
			if again := s.startupStatements(name, kind == resetAll); again != "" {
				if _, err := c.Results(ctx, again); err != nil {
					return err
				}
			}
			if sink == s.client {
				s.reportParameters(c)
			}
			return nil
		}); err != nil {
			return err
		}
		if kind == setLocal {
			s.addLocal(sql)
		} else {
			s.changeTxSettings(kind, name, sql)
		}
		return nil
	}
	ds := s.r.rules.DefaultDataSource()
	old := s.settings
	if kind != setLocal {
		s.settings = applySet(s.settings, kind, name, sql)
	}
	if kind == setDefault || kind == resetAll {
		// A reset is given the new list at once: a setting it drops (a role since
		// dropped, say) can then no longer fail the connection's replay.
		s.settingsChanged()
	}
	err = s.onDataSource(ctx, ds, func(c *backend.Conn) error {
		var sink backend.Sink = s.client
		if kind == setDefault || kind == resetAll {
			sink = noParameterStatus{s.client} // reported once settled, below
		}
		if err := c.Query(ctx, sql, sink); err != nil {
			return err
		}
		switch kind {
		case setValue:
			if e := effectiveSet(c, name, sql); e != sql {
				s.settings = applySet(old, kind, name, e)
			}
			// The connection carried the old list (the key is computed after the
			// statement ran); with this SET it carries the new one, and the client got
			// the ParameterStatus a reported setting brings.
			s.settingsChanged()
			c.SetSettingsKey(s.key)
		case setDefault, resetAll:
			// The server went back to its own defaults, not to the client's startup
			// values: the next use resets the connection and replays the list. A
			// reset that may change a reported parameter replays it now, so that the
			// client hears of the values it ends with.
			c.ForgetSettings()
			if kind == resetAll || s.reported(name) {
				s.reportAfterReset(ctx, c)
			}
		}
		return nil
	})
	if err != nil {
		s.settings = old
	}
	s.settingsChanged()
	return err
}

// addLocal records a statement that sets a parameter for the open transaction: it ran
// on every data source the transaction has touched, and runs on those that join later.
func (s *Session) addLocal(sql string) {
	s.txLocal = append(s.txLocal, sql)
	s.conns.mu.Lock()
	for ds, st := range s.conns.state {
		st.local = true
		s.conns.state[ds] = st
	}
	s.conns.mu.Unlock()
}

// inTransaction runs a session statement of the open transaction (a SET, a DISCARD) on
// the default data source, joining it to the transaction, and on every other data
// source the transaction has touched, except skip (-1: none); the default data source's
// answer reaches the client, the others' are dropped.
func (s *Session) inTransaction(ctx context.Context, skip int, run func(c *backend.Conn, sink backend.Sink) error) error {
	ds := s.r.rules.DefaultDataSource()
	if ds != skip {
		if err := s.onDataSource(ctx, ds, func(c *backend.Conn) error { return run(c, s.client) }); err != nil {
			return err
		}
	}
	for _, other := range s.tx.Touched() {
		if other == ds || other == skip {
			continue
		}
		if err := s.onDataSource(ctx, other, func(c *backend.Conn) error { return run(c, discard{}) }); err != nil {
			return err
		}
	}
	return nil
}

// discard is a sink that drops messages.
type discard struct{}

func (discard) Send(pgproto3.BackendMessage) {}

// discardStatement runs DISCARD ALL, PLANS, SEQUENCES or TEMP for real: on the default
// data source and on every server connection the client holds (its transaction's) or
// keeps (session pooling, or state that lives on a connection). DISCARD ALL also
// forgets the client's settings, prepared statements and portals, and cannot run in a
// transaction block.
func (s *Session) discardStatement(ctx context.Context, sql string) error {
	tree, err := pg.Parse(sql)
	if err != nil || len(tree.Stmts) != 1 || tree.Stmts[0].Stmt.GetDiscardStmt() == nil {
		return pgError("42601", "cannot read DISCARD statement %q", sql)
	}
	all := tree.Stmts[0].Stmt.GetDiscardStmt().Target == pg.DiscardMode_DISCARD_ALL
	if all && (s.explicit || s.implicit) {
		return pgError("25001", "DISCARD ALL cannot run inside a transaction block")
	}
	dss := []int{s.r.rules.DefaultDataSource()}
	for _, ds := range append(s.leases.kept(), s.tx.Touched()...) {
		if !slices.Contains(dss, ds) {
			dss = append(dss, ds)
		}
	}
	for i, ds := range dss {
		var sink backend.Sink = discard{}
		if i == 0 {
			sink = s.client
		}
		err := s.onDataSource(ctx, ds, func(c *backend.Conn) error {
			// What lives on the connection may be gone: look again when it is released.
			s.leases.recheck(ds)
			if !all {
				return c.Query(ctx, sql, sink)
			}
			if err := c.Discard(ctx); err != nil {
				return err
			}
			sink.Send(&pgproto3.CommandComplete{CommandTag: []byte("DISCARD ALL")})
			return nil
		})
		if err != nil {
			return err
		}
	}
	if target := tree.Stmts[0].Stmt.GetDiscardStmt().Target; all || target == pg.DiscardMode_DISCARD_SEQUENCES {
		s.drewElsewhere = false // no sequence state left for currval or lastval to read
	}
	if all {
		s.settings = nil
		s.settingsChanged()
		if err := s.onDataSource(ctx, dss[0], func(c *backend.Conn) error { s.reportAfterReset(ctx, c); return nil }); err != nil {
			return err
		}
		clear(s.stmts)
		clear(s.portals)
	}
	return nil
}

// reportAfterReset gives c the client's settings as they now stand and tells the
// client of the reported parameters that changed (see Session.reportParameters). When
// the settings do not replay (a role since dropped), it tells nothing: the
// connection's settings stay unknown, and the client's next statement meets the error.
func (s *Session) reportAfterReset(ctx context.Context, c *backend.Conn) {
	c.ForgetSettings()
	if err := c.ApplySettings(ctx, s.key, s.stmtsSQL); err != nil {
		c.ForgetSettings()
		return
	}
	s.reportParameters(c)
}

// reported reports whether a reset of parameter name may change a parameter the
// server reports to the client (in a ParameterStatus message): the parameter itself,
// or is_superuser through the role.
func (s *Session) reported(name string) bool {
	if name == paramRole || name == paramSessionAuthorization {
		return true
	}
	for k := range s.told.told {
		if strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

// startupStatements returns the statements of the client's startup settings for
// parameter name (all of them with all), as one query string; "" for none.
func (s *Session) startupStatements(name string, all bool) string {
	var out []string
	for _, st := range s.startup {
		if all || st.name == name {
			out = append(out, st.sql)
		}
	}
	return strings.Join(out, "; ")
}

// noParameterStatus is a sink that drops ParameterStatus messages.
type noParameterStatus struct{ backend.Sink }

func (n noParameterStatus) Send(msg pgproto3.BackendMessage) {
	if _, ok := msg.(*pgproto3.ParameterStatus); !ok {
		n.Sink.Send(msg)
	}
}

// setValueOf returns the value a SET statement gives, as written ("" when it is not one
// constant).
func setValueOf(sql string) string {
	tree, err := pg.Parse(sql)
	if err != nil || len(tree.Stmts) != 1 {
		return ""
	}
	v := tree.Stmts[0].Stmt.GetVariableSetStmt()
	if v == nil || len(v.Args) != 1 {
		return ""
	}
	if c := v.Args[0].GetAConst(); c != nil && c.GetSval() != nil {
		return c.GetSval().Sval
	}
	return ""
}

// noteEncoding records a client_encoding the client set (by SET, SET LOCAL or at
// startup). The proxy cannot follow every way it comes and goes (a savepoint rolled
// back to, SET LOCAL ending with its transaction), so a session that ever chose
// another encoding than the server's is taken to use it from then on (foreignText).
func (s *Session) noteEncoding(value string) {
	v := strings.ToUpper(strings.NewReplacer("-", "", "_", "").Replace(value))
	if v == "UTF8" || v == "UNICODE" {
		return
	}
	if value == "" {
		value = "?"
	}
	s.encodings = append(s.encodings, strings.ToUpper(value))
}
