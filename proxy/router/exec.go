package router

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// single reports whether a bound statement runs on one data source as it is: the
// fast path relays the server's answer.
func single(b *sqlplan.Bound) bool {
	return len(b.Targets) == 1 && b.Merge == nil
}

// prepareOnServer reports whether a statement is worth keeping prepared on server
// connections: the data statements a client runs again and again.
func prepareOnServer(p *sqlplan.Plan) bool {
	switch p.Kind {
	case sqlplan.KindSelect, sqlplan.KindInsert, sqlplan.KindUpdate, sqlplan.KindDelete:
		return len(p.SQL) <= 16<<10
	}
	return false
}

// execute runs a portal (extended protocol). maxRows > 0 sends at most that many rows
// and suspends the portal.
func (s *Session) execute(ctx context.Context, p *portal, maxRows uint32) error {
	if p.started {
		if p.server != "" {
			return s.resume(ctx, p, maxRows)
		}
		if p.rows != nil {
			defer s.multiTarget(p.bound)()
			return s.sendRows(p, maxRows)
		}
		return s.sendRest(p, maxRows)
	}
	b := p.bound
	plan := p.stmt.plan
	defer s.afterStatement(plan)
	s.running = true
	defer func() { s.running = false }()
	if err := s.noteEffects(plan, b, maxRows == 0); err != nil {
		return err
	}
	if plan.Feed != nil || p.preRefused != nil {
		// Statements of several steps: INSERT ... SELECT into a sharded table, and
		// UPDATE or DELETE whose subqueries run first. They need the parameters'
		// types as the statement was described.
		if err := severalStepsAllowed(plan); err != nil {
			return err
		}
		var described []uint32
		if plan.NumParams > 0 {
			d, err := s.describe(ctx, p.stmt)
			if err != nil {
				return err
			}
			described = d.params
		}
		var res *sqlexec.Result
		var err error
		if plan.Feed != nil {
			res, err = s.insertSelect(ctx, plan, p.args, described, p.resultFormats)
		} else {
			res, err = s.runPre(ctx, plan, p.stmt.sql, p.preRefused, p.args, described, p.resultFormats)
		}
		if err != nil {
			return err
		}
		p.started = true
		p.rest, p.tag = res.Rows, res.Tag
		return s.sendRest(p, maxRows)
	}
	if b.Coordinated() {
		p.finished = true
		t := b.Targets[0]
		values, oids, formats := sqlexec.TargetParams(t, p.args)
		st := backend.Statement{SQL: t.SQL, ParamOIDs: oids, Values: values, ParamFormats: formats, ResultFormats: p.resultFormats}
		return s.runCoordinated(ctx, b, p.stmt.oids, maxRows > 0, func(c *backend.Conn) error {
			_, err := c.ExecAfter(ctx, nil, &st, s.client)
			return err
		})
	}
	if single(b) && (maxRows == 0 || p.sub == s.currentSub()) {
		// Relayed: the server's answer goes to the client as it comes. With a row
		// limit, the server's own portal keeps the rest, suspended as the client's is,
		// so the proxy holds none of it (see resume). Not when a savepoint began after
		// the client's Bind: the server's portal would be the savepoint's, and a
		// ROLLBACK TO it would drop what PostgreSQL keeps.
		p.finished = true
		t := b.Targets[0]
		values, oids, formats := sqlexec.TargetParams(t, p.args)
		st := backend.Statement{SQL: t.SQL, ParamOIDs: oids, Values: values, ParamFormats: formats,
			ResultFormats: p.resultFormats, Prepare: prepareOnServer(plan), MaxRows: maxRows}
		calls, err := setConfigCallsOf(plan, t.SQL, values, formats, oids)
		if err != nil {
			return err
		}
		sink := backend.Sink(s.client)
		var w *suspensions
		if maxRows > 0 {
			w = &suspensions{Sink: s.client}
			sink = w
		}
		// A transaction's BEGIN on this data source, if it is the first statement
		// there, goes in the same round trip.
		return s.onDataSourceJoining(ctx, t.DataSource, func(c *backend.Conn, join []string) (bool, error) {
			prefix, discarded, err := s.sequencePrefix(plan, c, join)
			if err != nil {
				return false, err
			}
			if maxRows > 0 {
				st.Portal = c.NewPortal()
			}
			ran, err := c.ExecAfter(ctx, prefix, &st, sink)
			sequencesRan(c, discarded, ran)
			if err == nil && calls != nil {
				err = s.followSetConfig(ctx, c, t.DataSource, calls)
			}
			if err == nil && w != nil && w.suspended {
				p.started, p.finished = true, false
				p.server, p.ds = st.Portal, t.DataSource
				if s.tx.InTransaction() {
					// Else the server's portal ended with the exchange, as the
					// client's does at its Sync, which comes next (Execute's
					// lastInBatch); the connection went back to its pool.
					p.conn = c
				}
			}
			return ran, err
		})
	}
	if plan.Kind == sqlplan.KindSelect && maxRows == 0 {
		// The whole answer at once: its rows go to the client as they arrive.
		p.started, p.finished = true, true
		return s.relayRows(ctx, b, p.args, p.resultFormats, false)
	}
	if plan.Kind == sqlplan.KindSelect && p.sub == s.currentSub() {
		// A row limit on several targets in a transaction: each shard's part is a
		// portal there, fetched in batches as the merge needs them
		// (sqlexec.Engine.QueryInParts); the rest waits in the servers. Not when a
		// savepoint began after the client's Bind (see above).
		defer s.multiTarget(b)()
		rows, err := s.r.engine.QueryInParts(ctx, b, p.args, p.resultFormats, &s.conns)
		if err != nil {
			return err
		}
		p.started, p.rows = true, rows
		return s.sendRows(p, maxRows)
	}
	if plan.Kind == sqlplan.KindSelect {
		// A row limit on several targets, in a savepoint begun after the client's
		// Bind: the answer is read whole now, within the engine's bound on held
		// memory, and handed out maxRows rows per Execute.
		res, err := s.engineExecute(ctx, b, p.args, p.resultFormats)
		if err != nil {
			return err
		}
		p.started, p.rows = true, sqlexec.RowsOf(res)
		return s.sendRows(p, maxRows)
	}
	res, err := s.engineExecute(ctx, b, p.args, p.resultFormats)
	if err != nil {
		return err
	}
	p.started = true
	p.rest, p.tag = res.Rows, res.Tag
	return s.sendRest(p, maxRows)
}

// resume executes a portal whose rest the server keeps suspended (see execute): the
// server's portal runs on, on the transaction's connection, and its rows go to the
// client as they come.
func (s *Session) resume(ctx context.Context, p *portal, maxRows uint32) error {
	s.running = true
	defer func() { s.running = false }()
	st := backend.Statement{Portal: p.server, MaxRows: maxRows, Resume: true}
	w := &suspensions{Sink: s.client}
	gone := pgError("34000", "portal %q does not exist", p.name)
	err := error(gone)
	if p.conn != nil {
		err = s.onDataSourceJoining(ctx, p.ds, func(c *backend.Conn, join []string) (bool, error) {
			if c != p.conn || len(join) > 0 {
				// Not the connection the portal lives on: the transaction it lived in
				// ended (endTx drops such portals; this is the guard).
				return false, gone
			}
			_, err := c.ExecAfter(ctx, nil, &st, w)
			return true, err
		})
	}
	if !w.suspended {
		p.finished, p.server, p.conn = true, "", nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "34000" {
		return gone // the server's names its own portal, not the client's
	}
	return err
}

// suspensions relays an answer and notes whether the server suspended its portal.
type suspensions struct {
	backend.Sink
	suspended bool
}

func (w *suspensions) Send(msg pgproto3.BackendMessage) {
	if _, ok := msg.(*pgproto3.PortalSuspended); ok {
		w.suspended = true
	}
	w.Sink.Send(msg)
}

// dropPortal forgets a client's portal; one whose rest a server keeps is closed there
// with the connection's next round trip.
func (s *Session) dropPortal(name string) {
	p, ok := s.portals[name]
	if !ok {
		return
	}
	delete(s.portals, name)
	if p.conn != nil {
		p.conn.ClosePortal(p.server)
	}
	if p.rows != nil && s.tx.InTransaction() {
		p.rows.Close() // closes the shards' portals of an answer read in parts
	}
}

// engineExecute runs a statement through the SQL core's engine (merges, writes to
// several data sources).
func (s *Session) engineExecute(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, formats []int16) (*sqlexec.Result, error) {
	defer s.multiTarget(b)()
	return s.r.engine.Execute(ctx, b, args, formats, &s.conns)
}

// relayRows runs a SELECT through the SQL core's engine and sends its rows to the
// client as they come (sqlexec.Engine.Query), then its command tag; describe sends
// the row description first (the simple protocol). A client that went away stops the
// shards' work.
func (s *Session) relayRows(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, formats []int16, describe bool) error {
	defer s.multiTarget(b)()
	rows, err := s.r.engine.Query(ctx, b, args, formats, &s.conns)
	if err != nil {
		return err
	}
	defer rows.Close()
	return s.relay(rows, describe)
}

// multiTarget marks, while a statement with several targets runs, that its data
// sources may join the transaction concurrently, so that each is bounded at once (see
// conns); the returned function ends the mark.
func (s *Session) multiTarget(b *sqlplan.Bound) func() {
	if !b.MultiTarget() {
		return func() {}
	}
	s.conns.mu.Lock()
	s.conns.multi = true
	s.conns.mu.Unlock()
	return func() {
		s.conns.mu.Lock()
		s.conns.multi = false
		s.conns.mu.Unlock()
	}
}

// sendRows sends at most maxRows rows (0: all) of a portal's answer, then
// PortalSuspended when it sent maxRows (as PostgreSQL, which suspends even when no
// row is left), or the command tag when the answer ended.
func (s *Session) sendRows(p *portal, maxRows uint32) error {
	p.rows.FetchHint(maxRows)
	for n := uint32(0); maxRows == 0 || n < maxRows; n++ {
		if !p.rows.Next() {
			_, err := p.rows.Close()
			p.rows, p.finished = nil, true
			if err != nil {
				return err
			}
			// As PostgreSQL's, the tag counts the rows of this Execute.
			p.tag = pgconn.NewCommandTag("SELECT " + strconv.FormatUint(uint64(n), 10))
			s.client.Send(&pgproto3.CommandComplete{CommandTag: []byte(p.tag.String())})
			return nil
		}
		s.client.Send(&pgproto3.DataRow{Values: p.rows.Values()})
	}
	s.client.Send(&pgproto3.PortalSuspended{})
	return nil
}

// relay sends a streamed answer's rows to the client as they come, then its command
// tag; describe sends the row description first.
func (s *Session) relay(rows *sqlexec.Rows, describe bool) error {
	if describe {
		s.client.Send(&pgproto3.RowDescription{Fields: fieldsOf(rows.Fields())})
	}
	for n := 1; rows.Next(); n++ {
		s.client.Send(&pgproto3.DataRow{Values: rows.Values()})
		if n%relayCheck == 0 && s.client.Flush() != nil {
			rows.Abort() // the client is gone: stop the shards
			return nil
		}
	}
	tag, err := rows.Close()
	if err != nil {
		return err
	}
	s.client.Send(&pgproto3.CommandComplete{CommandTag: []byte(tag.String())})
	return nil
}

// relayCheck is how many rows relayRows sends between checks that the client is
// still there.
const relayCheck = 1024

// sendRest sends a portal's remaining rows, at most maxRows of them (0: all).
func (s *Session) sendRest(p *portal, maxRows uint32) error {
	rows := p.rest
	if maxRows > 0 && uint32(len(rows)) > maxRows {
		rows = rows[:maxRows]
	}
	for _, row := range rows {
		s.client.Send(&pgproto3.DataRow{Values: row})
	}
	p.rest = p.rest[len(rows):]
	if maxRows > 0 && len(rows) == int(maxRows) {
		// As PostgreSQL, which suspends even when no row is left.
		s.client.Send(&pgproto3.PortalSuspended{})
		return nil
	}
	p.finished = true
	tag := p.tag
	if returnsRows(p.stmt.plan) == yes {
		tag = sqlexec.CommandTag(p.stmt.plan.Kind, int64(len(rows)), tag) // this Execute's rows, as PostgreSQL counts
	}
	s.client.Send(&pgproto3.CommandComplete{CommandTag: []byte(tag.String())})
	return nil
}

// afterStatement follows up on a statement that ran (or failed) on data sources: DDL
// makes plans and descriptions stale; a function that changes settings (set_config)
// leaves the connections it ran on with settings the proxy does not know.
func (s *Session) afterStatement(plan *sqlplan.Plan) {
	if plan.Kind == sqlplan.KindDDL {
		s.r.schemaChanged()
		if s.explicit || s.implicit {
			s.txDDL = true
		}
	}
}

// planContext is the context a statement is planned under: in a transaction that ran
// DDL, the catalog's lookups go through the transaction's own connections, which see
// the schema it has not committed (sqlexec.WithCatalogPool).
func (s *Session) planContext(ctx context.Context) context.Context {
	if !s.txDDL {
		return ctx
	}
	return sqlexec.WithCatalogPool(ctx, sqlexec.TransactionPool(&s.conns))
}

// drawKeys draws the keys an INSERT leaves to its key's sequence (sqlplan.Plan.Keys)
// on the client's connection to the sequence's data source. nextval sets that
// session's sequence state as the client's own statement would.
func (s *Session) drawKeys(ctx context.Context, k *sqlplan.KeySource) ([]string, error) {
	running := s.running
	s.running = true
	defer func() { s.running = running }()
	keys, err := sqlexec.DrawKeys(ctx, &s.conns, k)
	if errors.Is(err, sqlexec.ErrKeyDefaultChanged) {
		// Plans and catalog answers go (not the coordinator's tables, which hold no
		// defaults).
		s.r.planner.Invalidate()
		s.r.catalog.Invalidate()
		s.r.describes.reset()
		return nil, sqlplan.UnsupportedHint("Run it again.", "the default of sharding key %s.%s changed beside the proxy since the statement was planned", k.Table, k.Column)
	}
	if err == nil && k.DataSource != s.r.rules.DefaultDataSource() {
		// currval and lastval run on the default data source, which did not draw.
		s.drewElsewhere = true
	}
	return keys, s.shardErr(k.DataSource, err)
}

// runSimple runs one bound simple-protocol statement, sending the whole answer:
// columns, rows and command tag.
func (s *Session) runSimple(ctx context.Context, b *sqlplan.Bound) error {
	plan := b.Plan
	defer s.afterStatement(plan)
	s.running = true
	defer func() { s.running = false }()
	if err := s.noteEffects(plan, b, true); err != nil {
		return err
	}
	if b.Coordinated() {
		return s.runCoordinated(ctx, b, nil, false, func(c *backend.Conn) error {
			_, err := c.QueryAfter(ctx, nil, b.Targets[0].SQL, s.client)
			return err
		})
	}
	if single(b) && plan.OwnText {
		// Alone on the wire: what the transaction owes the data source goes first.
		t := b.Targets[0]
		return s.onDataSource(ctx, t.DataSource, func(c *backend.Conn) error {
			_, err := c.QueryAfter(ctx, nil, t.SQL, s.client)
			return err
		})
	}
	if single(b) {
		t := b.Targets[0]
		calls, err := setConfigCallsOf(plan, t.SQL, nil, nil, nil)
		if err != nil {
			return err
		}
		return s.onDataSourceJoining(ctx, t.DataSource, func(c *backend.Conn, join []string) (bool, error) {
			prefix, discarded, err := s.sequencePrefix(plan, c, join)
			if err != nil {
				return false, err
			}
			ran, err := c.QueryAfter(ctx, prefix, t.SQL, s.client)
			sequencesRan(c, discarded, ran)
			if err == nil && calls != nil {
				err = s.followSetConfig(ctx, c, t.DataSource, calls)
			}
			return ran, err
		})
	}
	if plan.Kind == sqlplan.KindSelect {
		return s.relayRows(ctx, b, sqlplan.Args{}, nil, true)
	}
	res, err := s.engineExecute(ctx, b, sqlplan.Args{}, nil)
	if err != nil {
		return err
	}
	s.sendResult(res)
	return nil
}

// sendResult sends a whole answer of the simple protocol: columns, rows, command tag.
func (s *Session) sendResult(res *sqlexec.Result) {
	if len(res.Fields) > 0 {
		// Only a statement that returns rows describes them (a write's RETURNING; a
		// write without one has no columns and sends no description).
		s.client.Send(&pgproto3.RowDescription{Fields: fieldsOf(res.Fields)})
	}
	for _, row := range res.Rows {
		s.client.Send(&pgproto3.DataRow{Values: row})
	}
	s.client.Send(&pgproto3.CommandComplete{CommandTag: []byte(res.Tag.String())})
}

// noteEffects prepares for what a statement may do to its server connections'
// sessions (sqlplan.SessionEffects) before it runs: a statement that may make or drop
// state that lives on a connection alone marks its data sources, so that the release
// asks the server whether the client must keep the connection. set_config is followed
// on the fast path only (one data source, the whole answer at once), where the proxy
// holds the connection it ran on; elsewhere it is refused before anything runs.
func (s *Session) noteEffects(plan *sqlplan.Plan, b *sqlplan.Bound, fastPath bool) error {
	e := plan.Session
	if e == 0 && !(s.tempPath && plan.Kind == sqlplan.KindDDL) {
		return nil
	}
	if e&sqlplan.EffectBinds != 0 || s.tempPath {
		s.madeState = true // the coordinator's sessions would not see it (coordinatorAllowed)
	}
	if e&sqlplan.EffectSetConfig != 0 && !(single(b) && fastPath) {
		return sqlplan.Unsupported("set_config in a statement that runs on several data sources, or that is fetched in parts: the proxy follows set_config only in a statement that runs on one data source")
	}
	if e&sqlplan.EffectReadsSequences != 0 && s.drewElsewhere {
		return sqlplan.UnsupportedHint("Use INSERT ... RETURNING.", "currval or lastval after an INSERT whose sharding key was drawn from a sequence on another data source than the default one, where they run")
	}
	if e&sqlplan.EffectReadsSequences != 0 && !(single(b) && fastPath) {
		return sqlplan.Unsupported("currval or lastval in a statement that runs on several data sources, or that is fetched in parts: a sequence's session state is followed only in a statement that runs on one data source")
	}
	for _, t := range b.Targets {
		if e&sqlplan.EffectListens != 0 {
			s.leases.listen(t.DataSource)
		}
		if e&sqlplan.EffectOpaque != 0 {
			s.leases.forgetSettings(t.DataSource)
		}
		if e&sqlplan.EffectBinds != 0 || e&sqlplan.EffectUnbinds != 0 && s.leases.isPinned(t.DataSource) ||
			s.tempPath && plan.Kind == sqlplan.KindDDL {
			s.leases.recheck(t.DataSource)
		}
	}
	return nil
}

// sequencePrefix keeps another client's sequence state (what currval and lastval
// answer) away from this one. A connection that served another client last may carry
// it; before a statement of a client that uses sequence functions, or one that reads
// that state, the connection gets DISCARD SEQUENCES in the same round trip, so that
// currval answers as in a session that called no nextval (55000), never with another
// client's value. When this client has run statements on the connection already
// (which may have set sequence state of its own, through a serial column's default),
// the two cannot be told apart, and a statement that reads the state is refused; the
// client's next statement on the connection then starts clean. It reports whether it
// added the DISCARD: the connection is clean only if that ran (sequencesRan).
func (s *Session) sequencePrefix(plan *sqlplan.Plan, c *backend.Conn, join []string) ([]string, bool, error) {
	if plan.Session&sqlplan.EffectSequences != 0 {
		s.usesSequences = true
	}
	if !s.usesSequences {
		return join, false, nil
	}
	foreign, ran := c.Sequences()
	switch {
	case !foreign:
		return join, false, nil
	case !ran:
		return append(join[:len(join):len(join)], "DISCARD SEQUENCES"), true, nil
	case plan.Session&sqlplan.EffectReadsSequences != 0:
		c.Unran() // the next statement discards what may be either client's
		return nil, false, sqlplan.UnsupportedHint("Use INSERT ... RETURNING, or call nextval in the same statement. The client's next statement on the connection starts clean.", "currval or lastval on a server connection that another client used before this client's statements on it: the sequence state there may be either's")
	}
	return join, false, nil
}

// sequencesRan records that the DISCARD SEQUENCES sequencePrefix added ran (ran: the
// statements ahead of the client's all ran).
func sequencesRan(c *backend.Conn, discarded, ran bool) {
	if discarded && ran {
		c.SequencesDiscarded()
	}
}

// fieldsOf converts the engine's column descriptions to the protocol's.
func fieldsOf(fields []pgconn.FieldDescription) []pgproto3.FieldDescription {
	out := make([]pgproto3.FieldDescription, len(fields))
	for i, f := range fields {
		out[i] = pgproto3.FieldDescription{
			Name: []byte(f.Name), TableOID: f.TableOID, TableAttributeNumber: f.TableAttributeNumber,
			DataTypeOID: f.DataTypeOID, DataTypeSize: f.DataTypeSize, TypeModifier: f.TypeModifier, Format: f.Format,
		}
	}
	return out
}
