package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// statement is a client's prepared statement (named, or the unnamed one).
type statement struct {
	name string
	sql  string
	oids []uint32 // the types Parse declared; 0 where left to the server
	plan *sqlplan.Plan
	gen  uint64 // the router's schema generation the plan belongs to
	desc *description
}

// portal is a bound statement, ready to execute.
type portal struct {
	name          string
	stmt          *statement
	bound         *sqlplan.Bound // nil for statements the session handles itself
	args          sqlplan.Args
	resultFormats []int16
	// rows not yet sent, after an Execute with a row limit suspended the portal: a
	// SELECT's (rows), or another statement's (rest).
	rows     *sqlexec.Rows
	rest     [][][]byte
	tag      pgconn.CommandTag
	started  bool
	finished bool
	// preRefused is Bind's refusal of a statement whose subqueries Execute evaluates
	// first (sqlplan.Pre); bound then has no targets.
	preRefused error
	// server names the portal that keeps the rest of a one-target answer suspended
	// on conn, the transaction's connection to data source ds (see resume); "" when
	// none does.
	server string
	conn   *backend.Conn
	ds     int
	// sub is the subtransaction the portal was made in (Session.currentSub): a
	// ROLLBACK TO SAVEPOINT drops it with its subtransaction.
	sub int
	// failed: an Execute of it failed; PostgreSQL runs such a portal no more.
	failed bool
}

func pgError(code, format string, args ...any) *pgconn.PgError {
	return &pgconn.PgError{Severity: "ERROR", Code: code, Message: fmt.Sprintf(format, args...)}
}

// failedTx is PostgreSQL's answer to anything but the end of a failed transaction.
func failedTx() error {
	return pgError("25P02", "current transaction is aborted, commands ignored until end of transaction block")
}

// exitStatement reports whether a plan may run in a failed transaction: COMMIT,
// ROLLBACK, ROLLBACK TO SAVEPOINT, PREPARE TRANSACTION (which rolls it back), and an
// empty statement, which PostgreSQL answers there too (in a query string, and as a
// portal bound before; a Bind of one fails, see Bind).
func exitStatement(p *sqlplan.Plan) bool {
	return p.Kind == sqlplan.KindEmpty || p.Kind == sqlplan.KindTransaction && (p.Tx == sqlplan.TxCommit || p.Tx == sqlplan.TxRollback || p.Tx == sqlplan.TxRollbackTo || p.Tx == sqlplan.TxPrepare)
}

// fail records an error of the current batch (and of the explicit transaction), and
// returns it as the client should see it.
func (s *Session) fail(err error) error {
	if err == nil {
		return nil
	}
	s.batchFailed = true
	if s.explicit {
		s.failed = true
	}
	return s.clientError(err)
}

// Parse handles a Parse message: it plans the statement (cached by text) and keeps it
// under its name.
func (s *Session) Parse(ctx context.Context, name, sql string, oids []uint32) error {
	if name != "" {
		if _, ok := s.stmts[name]; ok {
			return s.fail(pgError("42P05", "prepared statement %q already exists", name))
		}
	} else {
		// PostgreSQL drops the unnamed statement before it parses the next one, so a
		// Parse that fails leaves none (a Describe or Bind of it gets 26000).
		delete(s.stmts, "")
	}
	gen := s.r.generation.Load()
	plan, err := s.r.planner.Prepare(s.planContext(ctx), sql)
	if err != nil {
		return s.fail(err)
	}
	if s.isFailed() && !exitStatement(plan) {
		return s.fail(failedTx())
	}
	if plan.Unparsed {
		// The server parses it now, as it would at this Parse: its error, or its
		// grammar's yes.
		err := s.onDataSource(ctx, s.r.rules.DefaultDataSource(), func(c *backend.Conn) error {
			_, err := c.PgConn().Prepare(ctx, "", sql, oids)
			return err
		})
		if err != nil {
			return s.fail(err)
		}
	}
	if plan.Kind == sqlplan.KindCopy {
		return s.fail(sqlplan.Unsupported("COPY through the extended protocol; send it as a simple query"))
	}
	st := &statement{name: name, sql: sql, plan: plan, gen: gen}
	if len(oids) > 0 {
		st.oids = append([]uint32(nil), oids...)
	}
	if !plan.Unparsed {
		if err := s.analyse(ctx, st); err != nil {
			return s.fail(err)
		}
	}
	if plan.Kind != sqlplan.KindEmpty && (!routed(plan) || plan.Kind == sqlplan.KindDDL) {
		// PostgreSQL's analysis leaves the type of a parameter that nothing references
		// undetermined, and a Parse that declared none for it fails (an empty query
		// is not analysed). A routed statement's description says so (analyse).
		for i, oid := range oids {
			if oid == 0 && i >= plan.NumParams {
				return s.fail(pgError("42P18", "could not determine data type of parameter $%d", i+1))
			}
		}
	}
	s.stmts[name] = st
	s.client.Send(&pgproto3.ParseComplete{})
	return nil
}

// analyse gives, at Parse, the error PostgreSQL's analysis of the statement gives
// there: a column, table or function that does not exist, a parameter whose type it
// cannot infer (42P18), a constant its type cannot read (22P02). The statement is
// described on a data source now rather than at the client's Describe, which needs the
// description too (once per text: the router keeps it). Any other failure of the
// description (a refusal, a data source out of reach) is no error of PostgreSQL's Parse:
// the Describe or Execute that needs the description reports it. So is a table that
// does not exist (42P01) where it was described, unless that data source holds every
// table the statement names (Plan.HoldsEveryTable): a statement may name tables that
// no one data source holds (a default data source's table beside shards elsewhere),
// which a refusal or the coordinator answers later. Any other error of the analysis comes
// before it would reach a missing table, so one database, holding every table, gives
// it too.
//
// Inside a transaction (the client's, or a batch's implicit one) the statement is not
// described at Parse: a description fails the server's transaction with any error, the
// ones Parse lets pass included, and would join data sources to it that the statement
// may never run on. There the Describe or Execute reports the analysis, as before.
func (s *Session) analyse(ctx context.Context, st *statement) error {
	if !routed(st.plan) || st.plan.Kind == sqlplan.KindDDL {
		return nil // PostgreSQL analyses utility statements when they run
	}
	if s.explicit || s.implicit || s.tx.InTransaction() {
		return nil
	}
	_, err := s.describe(ctx, st)
	return sqlexec.AnalysisError(err)
}

// statementNamed finds a prepared statement, planning it again if DDL ran since.
func (s *Session) statementNamed(ctx context.Context, name string) (*statement, error) {
	st, ok := s.stmts[name]
	if !ok {
		if name == "" {
			return nil, pgError("26000", "unnamed prepared statement does not exist")
		}
		return nil, pgError("26000", "prepared statement %q does not exist", name)
	}
	if gen := s.r.generation.Load(); st.gen != gen {
		plan, err := s.r.planner.Prepare(s.planContext(ctx), st.sql)
		if err != nil {
			return nil, err
		}
		st.plan, st.gen, st.desc = plan, gen, nil
	}
	return st, nil
}

// passStatement lets prepared statement st be bound or described in a unit that
// passes a pause of some tables (see Session.pass): it returns st planned again if the
// session moved to another router meanwhile.
func (s *Session) passStatement(ctx context.Context, st *statement, unnamedGoes bool) (*statement, error) {
	moved, err := s.pass(ctx, st.plan, unnamedGoes)
	if err != nil || !moved {
		return st, err
	}
	return s.statementNamed(ctx, st.name)
}

// Bind handles a Bind message: it fixes the parameter values, which decide the data
// sources the statement runs on.
func (s *Session) Bind(ctx context.Context, m *pgproto3.Bind) error {
	st, err := s.statementNamed(ctx, m.PreparedStatement)
	if err != nil {
		return s.fail(err)
	}
	if st, err = s.passStatement(ctx, st, m.DestinationPortal == ""); err != nil {
		return s.fail(err)
	}
	if s.isFailed() && (!exitStatement(st.plan) || st.plan.Kind == sqlplan.KindEmpty) {
		// An empty statement is answered in a failed transaction (a query string, an
		// Execute of a portal bound before), but not bound: it ends nothing.
		return s.fail(failedTx())
	}
	if m.DestinationPortal != "" {
		if _, ok := s.portals[m.DestinationPortal]; ok {
			return s.fail(pgError("42P03", "cursor %q already exists", m.DestinationPortal))
		}
	}
	n := len(m.Parameters)
	if f := len(m.ParameterFormatCodes); f > 1 && f != n {
		return s.fail(pgError("08P01", "bind message has %d parameter formats but %d parameters", f, n))
	}
	if want := st.numParams(); want != n {
		return s.fail(pgError("08P01", "bind message supplies %d parameters, but prepared statement %q requires %d", n, st.name, want))
	}
	p := &portal{stmt: st, name: m.DestinationPortal, sub: s.currentSub()}
	p.args.Values = copyValues(m.Parameters)
	if len(m.ParameterFormatCodes) > 0 {
		p.args.Formats = append([]int16(nil), m.ParameterFormatCodes...)
	}
	if n > st.plan.NumParams {
		if err := s.checkUnreferenced(ctx, st, p.args); err != nil {
			return s.fail(err)
		}
		p.args.Values = p.args.Values[:st.plan.NumParams]
		if len(p.args.Formats) > 1 {
			p.args.Formats = p.args.Formats[:st.plan.NumParams]
		}
	}
	if len(m.ResultFormatCodes) > 0 {
		p.resultFormats = append([]int16(nil), m.ResultFormatCodes...)
	}
	p.args.ForeignText = s.foreignText()
	if routed(st.plan) {
		oids, err := s.paramTypes(ctx, st, p.args)
		if err != nil {
			return s.fail(err)
		}
		p.args.OIDs = oids
		if st.plan.Keys != nil {
			if p.args.Keys, err = s.drawKeys(ctx, st.plan.Keys); err != nil {
				return s.fail(err)
			}
		}
		if p.bound, err = st.plan.Bind(p.args); err != nil {
			if st.plan.Pre == nil || !errors.Is(err, sqlplan.ErrUnsupported) {
				return s.fail(err)
			}
			p.bound, p.preRefused = &sqlplan.Bound{Plan: st.plan}, err
		}
	}
	s.dropPortal(m.DestinationPortal) // the unnamed portal, which Bind replaces
	s.portals[m.DestinationPortal] = p
	s.client.Send(&pgproto3.BindComplete{})
	return nil
}

// numParams is the number of values a Bind of the statement supplies: as PostgreSQL
// counts them, the parameters Parse declared types for, or the highest $n the text
// references, whichever is more.
func (st *statement) numParams() int { return max(len(st.oids), st.plan.NumParams) }

// checkUnreferenced gives the error PostgreSQL's Bind gives for the values of a
// statement that declared more parameter types than its text references: the server
// reads every value by its type (a declared int4 "x" is 22P02), and the first value it
// cannot read fails the Bind. The statement's shards never see the values it does not
// reference, so the default data source reads them all, in order, in a statement that
// takes them and does nothing (one round trip, for such statements only).
func (s *Session) checkUnreferenced(ctx context.Context, st *statement, args sqlplan.Args) error {
	d, err := s.describe(ctx, st)
	if err != nil {
		return err
	}
	if len(d.params) != len(args.Values) {
		return pgError("XX000", "shardlab: statement described with %d parameters, bound with %d", len(d.params), len(args.Values))
	}
	params, values, formats := d.params, args.Values, args.Formats
	var undetermined error
	if i := slices.Index(params, 0); i >= 0 {
		// A type left undetermined reaches Bind only in an empty query, which
		// PostgreSQL does not analyse: its Bind reads the values before that one, then
		// fails looking the type up.
		params, values = params[:i], values[:i]
		if len(formats) > 1 {
			formats = formats[:i]
		}
		undetermined = pgError("XX000", "cache lookup failed for type 0")
	}
	if len(params) > 0 {
		err = s.onDataSource(ctx, s.r.rules.DefaultDataSource(), func(c *backend.Conn) error {
			return c.PgConn().ExecParams(ctx, "SELECT", values, params, formats, nil).Read().Err
		})
		if err != nil {
			return err
		}
	}
	return undetermined
}

// routed reports whether a plan runs on data sources (rather than in the session).
func routed(p *sqlplan.Plan) bool {
	switch p.Kind {
	case sqlplan.KindEmpty, sqlplan.KindTransaction, sqlplan.KindSet, sqlplan.KindDiscard, sqlplan.KindCopy:
		return false
	}
	return true
}

// copyValues copies Bind's parameter values (which point into the reader's buffer)
// into one allocation.
func copyValues(src [][]byte) [][]byte {
	if len(src) == 0 {
		return nil
	}
	size := 0
	for _, v := range src {
		size += len(v)
	}
	buf := make([]byte, 0, size)
	out := make([][]byte, len(src))
	for i, v := range src {
		if v == nil {
			continue
		}
		start := len(buf)
		buf = append(buf, v...)
		out[i] = buf[start:len(buf):len(buf)]
	}
	return out
}

// paramTypes returns the parameter types the binder needs: the declared ones, and when
// a parameter comes in binary without a declared type, the types the server infers.
func (s *Session) paramTypes(ctx context.Context, st *statement, args sqlplan.Args) ([]uint32, error) {
	n := len(args.Values)
	need := false
	for i := range n {
		if format(args.Formats, i) == 1 && (i >= len(st.oids) || st.oids[i] == 0) {
			need = true
			break
		}
	}
	if !need {
		if len(st.oids) >= n {
			return st.oids[:n], nil
		}
		return nil, nil
	}
	d, err := s.describe(ctx, st)
	if err != nil {
		return nil, err
	}
	return d.params[:n], nil
}

func format(formats []int16, i int) int16 { return sqlexec.ParamFormat(formats, i) }

// Describe handles a Describe message: 'S' for a statement (its parameter types and
// columns), 'P' for a portal (its columns, in the formats Bind asked for). A statement
// is described on a data source before any value is known; any data source, having the
// same schema, describes it alike.
func (s *Session) Describe(ctx context.Context, kind byte, name string) error {
	switch kind {
	case 'S':
		st, err := s.statementNamed(ctx, name)
		if err != nil {
			return s.fail(err)
		}
		// A description may join the client's transaction on a server: before that,
		// the statement waits for a pause of the tables it touches.
		if st, err = s.passStatement(ctx, st, false); err != nil {
			return s.fail(err)
		}
		d, err := s.describe(ctx, st)
		if err != nil {
			return s.fail(err)
		}
		s.client.Send(&pgproto3.ParameterDescription{ParameterOIDs: d.params})
		s.sendRowDescription(d.fields, nil)
		return nil
	case 'P':
		p, ok := s.portals[name]
		if !ok {
			return s.fail(pgError("34000", "portal %q does not exist", name))
		}
		d, err := s.describe(ctx, p.stmt)
		if err != nil {
			return s.fail(err)
		}
		s.sendRowDescription(d.fields, p.resultFormats)
		return nil
	}
	return s.fail(pgError("08P01", "invalid DESCRIBE message subtype %d", kind))
}

// sendRowDescription sends the columns with the given result formats, or NoData.
func (s *Session) sendRowDescription(fields []pgproto3.FieldDescription, formats []int16) {
	if fields == nil {
		s.client.Send(&pgproto3.NoData{})
		return
	}
	out := make([]pgproto3.FieldDescription, len(fields))
	copy(out, fields)
	for i := range out {
		out[i].Format = format(formats, i)
	}
	s.client.Send(&pgproto3.RowDescription{Fields: out})
}

// describe returns a statement's description, asking a data source once per statement
// text (the router caches it).
func (s *Session) describe(ctx context.Context, st *statement) (*description, error) {
	if st.desc != nil {
		return st.desc, nil
	}
	if !routed(st.plan) || st.plan.Kind == sqlplan.KindDDL {
		// Session statements and DDL return no rows.
		params := make([]uint32, st.numParams())
		copy(params, st.oids)
		st.desc = &description{params: params}
		return st.desc, nil
	}
	key := describeKey{sql: st.sql, oids: oidString(st.oids), settings: s.key, user: s.login.User}
	if d := s.r.describes.get(key); d != nil {
		st.desc = d
		return d, nil
	}
	ds, sql := st.plan.DescribeSQL()
	var d description
	var described string // the text the last description sent
	describeOn := func(ds int, sql string) error {
		described = sql
		if ds == s.coordinatorIndex() {
			if err := s.readyCoordinator(ctx, st.plan.Refused, false); err != nil {
				return err
			}
		}
		err := s.onDataSource(ctx, ds, func(c *backend.Conn) error {
			var err error
			d.params, d.fields, err = c.Describe(ctx, sql, st.oids)
			return err
		})
		if err != nil && ds == s.coordinatorIndex() {
			return s.coordinatorFailure(ctx, st.plan.Refused, st.plan, nil, sql, st.oids, err)
		}
		return err
	}
	inTx := s.tx.InTransaction()
	if inTx && ds != s.coordinatorIndex() && st.plan.MayCoordinate() && !st.plan.HoldsEveryTable(ds) {
		// A statement the coordinator may answer can name tables that no one data
		// source holds (a default data source's table beside shards elsewhere). In a
		// transaction a description that fails fails the server's transaction, so it
		// is made where every table is.
		ds, sql = s.coordinatorIndex(), st.plan.SQL
	}
	err := describeOn(ds, sql)
	var genuine, notHeld bool // the error is one database's; a table the statement names is elsewhere
	if err != nil && ds != s.coordinatorIndex() {
		genuine, notHeld = sqlexec.JudgeDescription(ctx, st.plan, s.r.rules, ds, err, func(ds int, fn func(*pgconn.PgConn) error) error {
			return s.onDataSource(ctx, ds, func(c *backend.Conn) error { return fn(c.PgConn()) })
		})
	}
	var pe *pgconn.PgError
	if err != nil && !genuine && !inTx && ds != s.coordinatorIndex() && st.plan.MayCoordinate() && errors.As(err, &pe) && strings.HasPrefix(pe.Code, "42") {
		// Likewise outside one, where the failure is harmless (inside one, the
		// failure is the client's: its transaction has failed with it).
		ds = s.coordinatorIndex()
		err = describeOn(ds, st.plan.SQL)
	}
	if err != nil && notHeld && ds != s.coordinatorIndex() {
		return nil, sqlexec.NotHeld(s.r.rules, ds, err)
	}
	if err != nil {
		return nil, sqlexec.AtClient(err, st.sql, []string{described})
	}
	s.r.describes.put(key, &d)
	st.desc = &d
	return &d, nil
}

func oidString(oids []uint32) string {
	b := make([]byte, 0, 4*len(oids))
	for _, o := range oids {
		b = append(b, byte(o>>24), byte(o>>16), byte(o>>8), byte(o))
	}
	return string(b)
}

// Execute handles an Execute message. lastInBatch says whether the client's next
// message, already here, is Sync: a statement alone in its batch runs on its own
// (autocommit); several in one batch share an implicit transaction, as PostgreSQL
// runs them.
func (s *Session) Execute(ctx context.Context, name string, maxRows uint32, lastInBatch bool) error {
	p, ok := s.portals[name]
	if !ok {
		return s.fail(pgError("34000", "portal %q does not exist", name))
	}
	plan := p.stmt.plan
	if s.isFailed() && !exitStatement(plan) {
		return s.fail(failedTx())
	}
	if p.failed {
		return s.fail(pgError("55000", "portal %q cannot be run", name))
	}
	if p.finished {
		if returnsRows(plan) == no {
			// PostgreSQL marks the portal of a statement that answers no rows done.
			return s.fail(pgError("55000", "portal %q cannot be run", name))
		}
		// And answers one that answers rows with none.
		s.client.Send(&pgproto3.CommandComplete{CommandTag: []byte(emptyTag(plan, p.tag))})
		return nil
	}
	var err error
	switch plan.Kind {
	case sqlplan.KindEmpty:
		s.client.Send(&pgproto3.EmptyQueryResponse{})
	case sqlplan.KindTransaction:
		err = s.transaction(ctx, plan)
		p.finished = true
	case sqlplan.KindSet:
		err = s.set(ctx, plan.SQL)
		p.finished = true
	case sqlplan.KindDiscard:
		err = s.discardStatement(ctx, plan.SQL)
		p.finished = true
	default:
		// A row-limited SELECT over several shards alone in its batch outside a
		// transaction runs in an implicit one all the same: its shards' portals
		// (fetched in parts) end at the Sync that comes next, with nothing more read.
		switch {
		case !lastInBatch:
			s.beginImplicit()
		case maxRows > 0 && plan.Kind == sqlplan.KindSelect && !plan.Write && p.bound != nil && p.preRefused == nil &&
			plan.Feed == nil && !single(p.bound) && !p.bound.Coordinated() && !s.explicit && !s.implicit:
			s.beginImplicit()
			s.reading = true
		}
		started := p.started
		if err = s.execute(ctx, p, maxRows); err != nil && (started || ranOnServer(err)) {
			// PostgreSQL runs a portal that failed no more; an error the proxy
			// raised before the portal ran (a refusal) is met again instead.
			p.failed = true
		}
		if err != nil {
			var sent []string
			if plan.Feed == nil && p.preRefused == nil {
				sent = sqlexec.SentTexts(p.bound, err) // else its steps are statements of their own
			}
			err = sqlexec.AtClient(err, p.stmt.sql, sent)
		}
	}
	return s.fail(err)
}

// ranOnServer reports whether err is a server's answer to a statement that ran, not
// the proxy's refusal or bound.
func ranOnServer(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || errors.Is(err, sqlplan.ErrUnsupported) {
		return false
	}
	switch pe.Code {
	case "54000", "53300", "0A000":
		return false
	}
	return true
}

// answers tells what returnsRows knows.
type answers int

const (
	unknown answers = iota
	no
	yes
)

// returnsRows tells whether a statement answers rows (a SELECT, SHOW, EXPLAIN, a write
// with RETURNING) or not (other writes, DDL, LOCK, transaction statements, SET).
func returnsRows(plan *sqlplan.Plan) answers {
	switch plan.Kind {
	case sqlplan.KindSelect, sqlplan.KindShow, sqlplan.KindExplain, sqlplan.KindCoordinator:
		return yes
	case sqlplan.KindInsert, sqlplan.KindUpdate, sqlplan.KindDelete:
		if plan.Returning {
			return yes
		}
		return no
	case sqlplan.KindDDL, sqlplan.KindLock, sqlplan.KindTransaction, sqlplan.KindSet, sqlplan.KindDiscard, sqlplan.KindListen:
		return no
	}
	return unknown
}

// emptyTag is the tag of a finished portal that answers rows, executed again: the
// command with no rows.
func emptyTag(plan *sqlplan.Plan, t pgconn.CommandTag) string {
	switch plan.Kind {
	case sqlplan.KindShow:
		return "SHOW"
	case sqlplan.KindExplain:
		return "EXPLAIN"
	}
	return sqlexec.CommandTag(plan.Kind, 0, t).String()
}

// Close handles a Close message.
func (s *Session) Close(kind byte, name string) error {
	switch kind {
	case 'S':
		delete(s.stmts, name)
	case 'P':
		s.dropPortal(name)
	default:
		return s.fail(pgError("08P01", "invalid CLOSE message subtype %d", kind))
	}
	s.client.Send(&pgproto3.CloseComplete{})
	return nil
}

// Sync handles a Sync message: it ends the batch, committing its implicit transaction
// (or rolling it back after an error). Outside a transaction block, portals end here.
func (s *Session) Sync(ctx context.Context) error {
	failed := s.batchFailed
	s.batchFailed = false
	err := s.endImplicit(ctx, !failed)
	if !s.explicit {
		clear(s.portals)
	}
	return err
}
