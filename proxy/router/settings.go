package router

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/shardlab/shardlab/proxy/backend"
)

// A client's SET is its own. Outside a transaction it runs on the default data source
// (which checks it and answers, with the ParameterStatus a reported setting brings)
// and joins the client's settings, which every connection the client uses afterwards
// carries: a connection whose settings differ is reset (RESET ALL) and given the
// client's before it serves the client. Inside a transaction it runs on every data
// source the transaction has touched and the ones that join later, and it stays only
// if the transaction commits. SET LOCAL and SET TRANSACTION last for the transaction.

// setKind classifies a SET or RESET statement.
type setKind int

const (
	setSession     setKind = iota // SET [SESSION] name ..., RESET name
	setTransaction                // SET LOCAL, SET TRANSACTION: for the open transaction
	resetAll                      // RESET ALL
)

// classifySet reads which parameter a SET or RESET statement changes and for how
// long. SET statements are rare (a few per connection), so parsing each is cheap.
func classifySet(sql string) (setKind, string, error) {
	tree, err := pg.Parse(sql)
	if err != nil || len(tree.Stmts) != 1 {
		return 0, "", pgError("42601", "cannot read SET statement %q", sql)
	}
	v := tree.Stmts[0].Stmt.GetVariableSetStmt()
	if v == nil {
		return 0, "", pgError("42601", "not a SET statement: %q", sql)
	}
	switch {
	case v.Kind == pg.VariableSetKind_VAR_RESET_ALL:
		return resetAll, "", nil
	case v.IsLocal || v.Name == "TRANSACTION":
		return setTransaction, strings.ToLower(v.Name), nil
	}
	return setSession, strings.ToLower(v.Name), nil
}

// setSetting adds st to a settings list, replacing an earlier SET of the same
// parameter (the later one wins anyway; this keeps the list short).
func setSetting(list []setting, st setting) []setting {
	out := list[:0:0]
	for _, x := range list {
		if x.name != st.name {
			out = append(out, x)
		}
	}
	return append(out, st)
}

// set runs a SET or RESET statement.
func (s *Session) set(ctx context.Context, sql string) error {
	kind, name, err := classifySet(sql)
	if err != nil {
		return err
	}
	inTx := s.explicit || s.implicit
	if inTx {
		if err := s.setInTransaction(ctx, sql); err != nil {
			return err
		}
		switch kind {
		case setTransaction:
			s.txLocal = append(s.txLocal, sql)
			// The data sources in the transaction ran it just now.
			s.conns.mu.Lock()
			for ds, st := range s.conns.state {
				st.local = true
				s.conns.state[ds] = st
			}
			s.conns.mu.Unlock()
		case resetAll:
			s.dirty = true
			// RESET ALL undoes the session's SETs unless the transaction rolls back;
			// keep it simple: it takes effect at once for what follows.
			s.settings, s.pending = nil, nil
			s.settingsChanged()
		default:
			s.dirty = true
			s.pending = setSetting(s.pending, setting{name: name, sql: sql})
			s.settingsChanged()
		}
		return nil
	}
	ds := s.r.rules.DefaultDataSource()
	old := s.settings
	switch kind {
	case resetAll:
		s.settings = nil
	case setSession:
		if strings.HasPrefix(strings.ToUpper(firstWord(sql)), "RESET") {
			// RESET brings back the startup value, which the replayed startup
			// settings already give; drop the session's own SET of the parameter.
			var kept []setting
			for _, x := range s.settings {
				if x.name != name {
					kept = append(kept, x)
				}
			}
			s.settings = kept
		} else {
			s.settings = setSetting(s.settings, setting{name: name, sql: sql})
		}
	}
	err = s.onDataSource(ctx, ds, func(c *backend.Conn) error {
		// The connection carries the old settings; after this statement it carries the
		// new ones, except after RESET (which returns to the server's defaults, not the
		// client's startup values) and SET LOCAL outside a transaction (no effect).
		if err := c.Query(ctx, sql, s.client); err != nil {
			return err
		}
		if kind == setSession && !strings.HasPrefix(strings.ToUpper(firstWord(sql)), "RESET") {
			s.settingsChanged()
			c.SetSettingsKey(s.key)
		} else {
			c.ForgetSettings()
		}
		return nil
	})
	if err != nil {
		s.settings = old
	}
	s.settingsChanged()
	return err
}

// setInTransaction runs a SET on the default data source (joining it to the
// transaction, to check the statement and answer) and on every other data source the
// transaction has touched; only the first answer reaches the client.
func (s *Session) setInTransaction(ctx context.Context, sql string) error {
	ds := s.r.rules.DefaultDataSource()
	if err := s.onDataSource(ctx, ds, func(c *backend.Conn) error { return c.Query(ctx, sql, s.client) }); err != nil {
		return err
	}
	for _, other := range s.tx.Touched() {
		if other == ds {
			continue
		}
		if err := s.onDataSource(ctx, other, func(c *backend.Conn) error { return c.Query(ctx, sql, discard{}) }); err != nil {
			return err
		}
	}
	return nil
}

// discard is a sink that drops messages.
type discard struct{}

func (discard) Send(pgproto3.BackendMessage) {}

// discard runs DISCARD: DISCARD ALL forgets the client's settings, prepared statements
// and portals (server connections are reset when they next serve the client); the
// other forms have nothing to forget in the proxy, since the client holds no server
// connection between transactions.
func (s *Session) discard(sql string) error {
	words := strings.Fields(strings.ToUpper(sql))
	what := "ALL"
	if len(words) > 1 {
		what = strings.TrimSuffix(words[1], ";")
	}
	if what == "ALL" {
		if s.explicit || s.implicit {
			return pgError("25001", "DISCARD ALL cannot run inside a transaction block")
		}
		s.settings, s.pending = nil, nil
		s.settingsChanged()
		clear(s.stmts)
		clear(s.portals)
	}
	s.client.Send(&pgproto3.CommandComplete{CommandTag: []byte("DISCARD " + what)})
	return nil
}
