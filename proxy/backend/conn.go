package backend

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/sqlexec"
)

// MaxPreparedPerConn bounds the statements the proxy keeps prepared on one server
// connection; past it, one is closed for each new one.
const MaxPreparedPerConn = 512

// statementPrefix starts the names of the statements the proxy prepares on servers.
const statementPrefix = "shardlab_proxy_"

// Conn is one server connection lent by a Pool. It is used by one goroutine at a time.
type Conn struct {
	pool     *Pool
	pg       *pgconn.PgConn
	lastUsed time.Time
	broken   bool

	// settings identifies the SET statements applied since the connection's last
	// RESET ALL ("" for none); unknownSettings is the key of a connection whose
	// settings are not known (a transaction that set some rolled back, or a function
	// changed them).
	settings string

	// user is the session that last took the connection; foreignSequences says that
	// one before it may have left sequence state, ran that user ran statements on it
	// since (see Lend).
	user             uint64
	foreignSequences bool
	ran              bool

	// notes queues the notifications the server sent (LISTEN/NOTIFY), whoever read
	// them off the connection, until the client's session takes them.
	notes struct {
		sync.Mutex
		q []*pgproto3.NotificationResponse
	}

	// noticeTo receives the notices that pgconn reads off the connection (those of
	// statements run through pgconn, such as the core's COMMIT; the relay passes its
	// own on in order) while a session holds the connection (SetNoticeSink).
	noticeTo atomic.Pointer[func(*pgconn.Notice)]
	// relaying is set while a relay reads a message: a notice among them goes to the
	// relay's sink, in order, not to noticeTo.
	relaying bool

	stmts   map[stmtKey]string // prepared statement text and types -> server name
	stmtSeq int
	evict   []string // names to close with the next round trip

	// portalSeq numbers the portals the proxy names on the connection (NewPortal), so
	// that no name comes twice in its life; closing lists the ones to close with the
	// next round trip (ClosePortal).
	portalSeq int
	closing   []string

	// base is the pool's interrupt context when the connection was made (see
	// Pool.InterruptOn), and stopBase ends the watch on it (nil: none); the watch
	// interrupts the connection only while it is lent (lent), so that idle ones close
	// cleanly.
	base     context.Context
	stopBase func() bool
	lent     atomic.Bool

	// msg holds the messages an exchange sends, reused: the frontend encodes each at
	// once, so none outlives its Send.
	msg struct {
		parse    pgproto3.Parse
		bind     pgproto3.Bind
		describe pgproto3.Describe
		execute  pgproto3.Execute
		sync     pgproto3.Sync
		query    pgproto3.Query
		close    pgproto3.Close
	}
}

const unknownSettings = "\x00unknown"

type stmtKey struct {
	sql  string
	oids string
}

func newConn(p *Pool, pg *pgconn.PgConn, base context.Context) *Conn {
	c := &Conn{pool: p, pg: pg, lastUsed: time.Now(), stmts: map[stmtKey]string{}, base: base}
	p.byServer.Store(pg, c)
	if base != nil {
		c.stopBase = context.AfterFunc(base, func() {
			if c.lent.Load() {
				c.interrupt()
			}
		})
	}
	return c
}

// PgConn returns the server connection, for code that runs its own statements on it
// (package sqlexec). Whatever it prepares must not start with the proxy's statement
// prefix.
func (c *Conn) PgConn() *pgconn.PgConn { return c.pg }

// DataSource returns the name of the data source the connection belongs to.
func (c *Conn) DataSource() string { return c.pool.name }

// MarkBroken makes Release close the connection instead of pooling it.
func (c *Conn) MarkBroken() { c.broken = true }

// Sink receives the messages of a relayed answer, in order.
type Sink interface {
	Send(msg pgproto3.BackendMessage)
}

// resetSettings undoes every setting a client may have changed: the session
// authorization and the role (which RESET ALL leaves alone; resetting the session
// authorization resets the role too), then every other setting. Startup parameters of
// the connection's DSN survive it.
const resetSettings = "SET SESSION AUTHORIZATION DEFAULT;RESET ALL;"

// ApplySettings makes the connection carry exactly the settings identified by key:
// when it carries others, it resets them (resetSettings) and then runs statements
// (each a SET or a set_config call), in one round trip.
func (c *Conn) ApplySettings(ctx context.Context, key string, statements []string) error {
	if c.settings == key {
		return nil
	}
	var b strings.Builder
	if c.settings != "" {
		b.WriteString(resetSettings)
		c.pool.stats.resets.Add(1)
	}
	for _, s := range statements {
		b.WriteString(s)
		b.WriteByte(';')
	}
	c.settings = unknownSettings
	if b.Len() > 0 {
		if err := c.exec(ctx, b.String()); err != nil {
			return err
		}
	}
	c.settings = key
	return nil
}

// ResetTo resets the connection's settings (resetSettings) and runs statements, in
// one round trip, inside the transaction it may be in: a transaction that rolled back
// to a savepoint takes the settings of the savepoint this way. The connection's
// settings are unknown afterwards, as those of a transaction are.
func (c *Conn) ResetTo(ctx context.Context, statements []string) error {
	c.settings = unknownSettings
	return c.exec(ctx, resetSettings+strings.Join(statements, ";"))
}

// SetSettingsKey records that the connection now carries the settings identified by
// key (the caller ran a SET on it that its key accounts for).
func (c *Conn) SetSettingsKey(key string) { c.settings = key }

// ForgetSettings records that the connection's settings are unknown: the next
// ApplySettings resets it.
func (c *Conn) ForgetSettings() { c.settings = unknownSettings }

// Discard resets the connection as a new session would find it (DISCARD ALL: settings,
// prepared statements, temporary tables, advisory locks), for a connection a client
// kept for its whole session.
func (c *Conn) Discard(ctx context.Context) error {
	err := c.exec(ctx, "DISCARD ALL")
	c.TakeNotifications() // DISCARD ALL ends every LISTEN
	if err == nil {
		c.user, c.foreignSequences, c.ran = 0, false, false // and its sequence state
	}
	sqlexec.ForgetStatements(c.pg) // the core's statements went with DISCARD ALL too
	clear(c.stmts)
	c.evict = nil
	c.settings = ""
	if err != nil {
		c.settings = unknownSettings
	}
	return err
}

// sessionStateQuery asks whether a server session holds state that lives on its
// connection alone and that no reset short of DISCARD ALL undoes: a session advisory
// lock, a temporary object, a LISTEN, an SQL-level prepared statement, a cursor WITH
// HOLD. The proxy's own prepared statements (protocol-level) do not count. It runs in a
// transaction of its own with no time limits and pg_catalog alone on the search path,
// whatever the client set: a client's lock_timeout cannot make it fail, nor an
// operator of the client's make it answer wrong.
const sessionStateQuery = `BEGIN;SET LOCAL statement_timeout = 0;SET LOCAL lock_timeout = 0;SET LOCAL search_path = pg_catalog;
SELECT EXISTS (SELECT FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid())
 OR EXISTS (SELECT FROM pg_catalog.pg_class WHERE relnamespace = pg_catalog.pg_my_temp_schema())
 OR EXISTS (SELECT FROM pg_catalog.pg_type WHERE typnamespace = pg_catalog.pg_my_temp_schema())
 OR EXISTS (SELECT FROM pg_catalog.pg_proc WHERE pronamespace = pg_catalog.pg_my_temp_schema())
 OR EXISTS (SELECT FROM pg_catalog.pg_listening_channels())
 OR EXISTS (SELECT FROM pg_catalog.pg_prepared_statements WHERE from_sql)
 OR EXISTS (SELECT FROM pg_catalog.pg_cursors WHERE is_holdable);
COMMIT`

// HoldsSessionState asks the server whether the connection's session holds state that
// lives on it alone (see sessionStateQuery): a client that made such state must keep
// the connection, and no other client may have it, until the state is gone. It is one
// round trip, for connections whose client ran a statement that may make or drop such
// state (sqlplan.SessionEffects). The connection must be idle outside a transaction.
func (c *Conn) HoldsSessionState(ctx context.Context) (bool, error) {
	c.pool.stats.stateChecks.Add(1)
	results, err := c.readAll(ctx, sessionStateQuery)
	if err != nil {
		if c.pg.TxStatus() == 'E' {
			c.exec(ctx, "ROLLBACK") // its own transaction failed
		}
		return false, err
	}
	for _, r := range results {
		if len(r.Rows) == 1 && len(r.Rows[0]) == 1 {
			return string(r.Rows[0][0]) == "t", nil
		}
	}
	return false, fmt.Errorf("backend: %s: no answer to the session state query", c.pool.name)
}

// QueryRow runs a query of the proxy's own that returns one row of n columns, and
// returns its values as text (nil for NULL). Its answer is not relayed to anyone.
func (c *Conn) QueryRow(ctx context.Context, sql string, n int) ([][]byte, error) {
	results, err := c.readAll(ctx, sql)
	if err != nil {
		return nil, err
	}
	if len(results) != 1 || len(results[0].Rows) != 1 || len(results[0].Rows[0]) != n {
		return nil, fmt.Errorf("backend: %s: %q did not return one row of %d columns", c.pool.name, sql, n)
	}
	out := make([][]byte, n)
	for i, v := range results[0].Rows[0] {
		if v != nil {
			out[i] = append([]byte{}, v...)
		}
	}
	return out, nil
}

// Results runs statements of the proxy's own with the simple protocol and returns
// their results, whole: for answers of bounded size. Notices go to the connection's
// notice sink.
func (c *Conn) Results(ctx context.Context, sql string) ([]*pgconn.Result, error) {
	return c.readAll(ctx, sql)
}

// EachRow runs a query of the proxy's own with the extended protocol, its results in
// formats (per column, as the protocol's Bind takes them), and calls fn with each row;
// the values are valid only during the call. An error from fn stops the rows and is
// returned.
func (c *Conn) EachRow(ctx context.Context, sql string, formats []int16, fn func(values [][]byte) error) error {
	rr := c.pg.ExecParams(ctx, sql, nil, nil, nil, formats)
	var fnErr error
	for fnErr == nil && rr.NextRow() {
		fnErr = fn(rr.Values())
	}
	_, err := rr.Close()
	if err != nil {
		if c.pg.IsClosed() || !isServerError(err) {
			return c.brokenErr(err)
		}
		return err
	}
	return fnErr
}

// readAll runs statements of the proxy's own with the simple protocol and returns
// their results.
func (c *Conn) readAll(ctx context.Context, sql string) ([]*pgconn.Result, error) {
	results, err := c.pg.Exec(ctx, sql).ReadAll()
	if err != nil {
		if c.pg.IsClosed() || !isServerError(err) {
			return nil, c.brokenErr(err)
		}
		return nil, err
	}
	return results, nil
}

// noteNotification queues a notification the server sent on the connection.
func (c *Conn) noteNotification(n *pgconn.Notification) {
	c.notes.Lock()
	defer c.notes.Unlock()
	if len(c.notes.q) >= maxQueuedNotifications {
		c.notes.q = c.notes.q[1:] // a client that never reads them must not fill memory
	}
	c.notes.q = append(c.notes.q, &pgproto3.NotificationResponse{PID: n.PID, Channel: n.Channel, Payload: n.Payload})
}

// SetNoticeSink makes *fn receive the notices pgconn reads off the connection from
// now on (nil: drop them). It runs on the goroutine that reads the connection. A
// pointer, so that lending a connection allocates nothing.
func (c *Conn) SetNoticeSink(fn *func(*pgconn.Notice)) { c.noticeTo.Store(fn) }

// receive reads the next message for a relay.
func (c *Conn) receive(ctx context.Context) (pgproto3.BackendMessage, error) {
	c.relaying = true
	defer func() { c.relaying = false }()
	return c.pg.ReceiveMessage(ctx)
}

func (c *Conn) noteNotice(n *pgconn.Notice) {
	if c.relaying {
		return // the relay passes it on
	}
	if fn := c.noticeTo.Load(); fn != nil {
		(*fn)(n)
	}
}

// maxQueuedNotifications bounds the notifications queued on one connection; PostgreSQL
// itself queues up to 8 GB for a listener that does not read, which a proxy serving
// many clients cannot afford.
const maxQueuedNotifications = 10000

// TakeNotifications returns the notifications queued on the connection, and forgets
// them.
func (c *Conn) TakeNotifications() []*pgproto3.NotificationResponse {
	c.notes.Lock()
	defer c.notes.Unlock()
	q := c.notes.q
	c.notes.q = nil
	return q
}

// WaitNotification waits until the server sends a notification (queued, see
// TakeNotifications) or a notice (returned, for the client) or ctx ends, reading the
// connection while its client is idle. A connection that sends anything else is out of
// step with the proxy, and broken.
func (c *Conn) WaitNotification(ctx context.Context) (*pgproto3.NoticeResponse, error) {
	for {
		msg, err := c.receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err() // the wait was ended: the connection is fine
			}
			return nil, c.brokenErr(err)
		}
		switch m := msg.(type) {
		case *pgproto3.NotificationResponse:
			return nil, nil
		case *pgproto3.NoticeResponse:
			n := *m // the message is the connection's, reused by the next read
			return &n, nil
		case *pgproto3.ParameterStatus:
		default:
			return nil, c.brokenErr(fmt.Errorf("unexpected %T from an idle server", msg))
		}
	}
}

// Healthy reports whether the connection can go on serving its client: not broken,
// and idle outside a transaction.
func (c *Conn) Healthy() bool {
	return !c.broken && !c.pg.IsClosed() && c.pg.TxStatus() == 'I'
}

// Lend records that session id uses the connection from now on. A connection
// another session used may carry that session's sequence state (what currval and
// lastval answer): see Sequences.
func (c *Conn) Lend(id uint64) {
	if c.user != id {
		c.foreignSequences = c.user != 0
		c.user = id
		c.ran = false
	}
}

// Ran records that the connection's user ran a statement on it, which may have set
// sequence state of its own (nextval, a serial column's default).
func (c *Conn) Ran() { c.ran = true }

// Unran records that the connection's sequence state is to be discarded before the
// user's next statement, as if the user had run none yet.
func (c *Conn) Unran() { c.ran = false }

// Sequences reports what the connection's sequence state may hold: another session's
// (foreign), and the current user's own too (ran).
func (c *Conn) Sequences() (foreign, ran bool) { return c.foreignSequences, c.ran }

// SequencesDiscarded records that DISCARD SEQUENCES ran: the connection carries no
// sequence state.
func (c *Conn) SequencesDiscarded() { c.foreignSequences = false }

// exec runs statements with the simple protocol and discards their results.
func (c *Conn) exec(ctx context.Context, sql string) error {
	err := c.pg.Exec(ctx, sql).Close()
	if err != nil && (c.pg.IsClosed() || !isServerError(err)) {
		return c.brokenErr(err)
	}
	return err
}

// isServerError reports whether err is the server's answer to a statement (an ERROR),
// after which the connection goes on; a FATAL one ends the server's session.
func isServerError(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Severity != "FATAL" && pe.Severity != "PANIC"
}

// BrokenError is a failure of a server connection itself: the network, or the server
// ending the session (a FATAL error such as a shutdown's 57P01). It is not the server's
// answer to the statement, so it carries no SQLSTATE of its own: a client sees it as
// the data source being unavailable (08006).
type BrokenError struct {
	DataSource string
	Err        error
}

func (e *BrokenError) Error() string {
	return fmt.Sprintf("connection to data source %s failed: %v", e.DataSource, e.Err)
}

// brokenErr marks the connection broken and describes why.
func (c *Conn) brokenErr(err error) error {
	c.broken = true
	var be *BrokenError
	if errors.As(err, &be) {
		return err
	}
	return &BrokenError{DataSource: c.pool.name, Err: errors.New(err.Error())}
}

// Statement is one execution with the extended protocol.
type Statement struct {
	SQL           string
	ParamOIDs     []uint32 // declared parameter types; 0 or missing: the server infers
	Values        [][]byte // nil is NULL
	ParamFormats  []int16
	ResultFormats []int16
	// Prepare keeps the statement prepared on this connection, under a name of the
	// proxy's, for the next execution of the same text; else it goes as the unnamed
	// statement.
	Prepare bool
	// Describe asks for the portal's RowDescription, relayed before the rows.
	Describe bool
	// Portal names the server portal the statement is bound to ("": the unnamed one),
	// and MaxRows > 0 stops its Execute after that many rows: the server then answers
	// PortalSuspended (relayed), and the portal keeps the rest until the transaction
	// ends (see NewPortal).
	Portal  string
	MaxRows uint32
	// Resume executes Portal again, as an earlier Statement bound it: no Parse, no
	// Bind, and SQL and the values are not used.
	Resume bool
}

// portalPrefix starts the names of the portals the proxy opens on servers.
const portalPrefix = "shardlab_portal_"

// NewPortal returns a portal name not used before on the connection. A portal lives on
// the server until its transaction ends (outside a transaction block, until the
// exchange's Sync), or until ClosePortal.
func (c *Conn) NewPortal() string {
	c.portalSeq++
	return portalPrefix + strconv.Itoa(c.portalSeq)
}

// ClosePortal closes a portal of the connection's with its next round trip. A portal
// that ended already (with its transaction) is no error: PostgreSQL closes a name it
// does not know without complaint, and NewPortal never gives a name twice.
func (c *Conn) ClosePortal(name string) { c.closing = append(c.closing, name) }

// Exec runs st and relays its answer (rows, command tag, notices) to sink, ending with
// the server's ReadyForQuery, which is not relayed. A server error is returned as
// *pgconn.PgError after the server is ready again; any other error leaves the
// connection broken. Cancelling ctx interrupts the exchange and breaks the connection.
func (c *Conn) Exec(ctx context.Context, st *Statement, sink Sink) error {
	_, err := c.ExecAfter(ctx, nil, st, sink)
	return err
}

// ExecAfter is Exec with statements run first (a transaction's BEGIN): they go in the
// same round trip and Sync block, so that their failure keeps st from running, and
// their command tags are not relayed. ran reports whether they all ran.
func (c *Conn) ExecAfter(ctx context.Context, prefix []string, st *Statement, sink Sink) (ran bool, err error) {
	for attempt := 0; ; attempt++ {
		var sent bool
		sent, ran, err = c.execOnce(ctx, prefix, st, sink)
		if err != nil && st.Prepare && stale(err) {
			// The server lost or outdated the prepared statement (DDL changed its
			// result, or someone deallocated it): the next use prepares it again, and
			// this one does at once when nothing else ran in a transaction.
			key := stmtKey{st.SQL, oidKey(st.ParamOIDs)}
			if old, ok := c.stmts[key]; ok {
				// An outdated plan (0A000) is still on the server: close it with the
				// next round trip. Closing one the server lost does no harm.
				c.evict = append(c.evict, old)
				delete(c.stmts, key)
			}
			if attempt == 0 && !sent && len(prefix) == 0 && c.pg.TxStatus() == 'I' {
				continue
			}
		}
		return ran, err
	}
}

// stale reports whether a server error means a prepared statement must be prepared
// again (sqlexec.StalePlan).
func stale(err error) bool { return sqlexec.StalePlan(err) }

func oidKey(oids []uint32) string {
	if len(oids) == 0 {
		return ""
	}
	b := make([]byte, 4*len(oids))
	for i, o := range oids {
		binary.BigEndian.PutUint32(b[4*i:], o)
	}
	return string(b)
}

func (c *Conn) execOnce(ctx context.Context, prefix []string, st *Statement, sink Sink) (sent, ran bool, err error) {
	fe := c.pg.Frontend()
	name := ""
	parsed := false
	if st.Prepare && !st.Resume {
		key := stmtKey{st.SQL, oidKey(st.ParamOIDs)}
		if n, ok := c.stmts[key]; ok {
			name = n
		} else {
			c.stmtSeq++
			name = statementPrefix + strconv.Itoa(c.stmtSeq)
			if len(c.stmts) >= MaxPreparedPerConn {
				for k, old := range c.stmts {
					delete(c.stmts, k)
					c.evict = append(c.evict, old)
					break
				}
			}
			c.stmts[key] = name
			parsed = true
		}
	}
	m := &c.msg
	for _, old := range c.evict {
		m.close = pgproto3.Close{ObjectType: 'S', Name: old}
		fe.Send(&m.close)
	}
	c.evict = c.evict[:0]
	for _, name := range c.closing {
		m.close = pgproto3.Close{ObjectType: 'P', Name: name}
		fe.Send(&m.close)
	}
	c.closing = c.closing[:0]
	for _, q := range prefix {
		m.parse = pgproto3.Parse{Query: q}
		fe.Send(&m.parse)
		m.bind = pgproto3.Bind{}
		fe.Send(&m.bind)
		m.execute = pgproto3.Execute{}
		fe.Send(&m.execute)
	}
	if !st.Resume {
		if name == "" || parsed {
			m.parse = pgproto3.Parse{Name: name, Query: st.SQL, ParameterOIDs: st.ParamOIDs}
			fe.Send(&m.parse)
		}
		m.bind = pgproto3.Bind{DestinationPortal: st.Portal, PreparedStatement: name, ParameterFormatCodes: st.ParamFormats,
			Parameters: st.Values, ResultFormatCodes: st.ResultFormats}
		fe.Send(&m.bind)
		if st.Describe {
			m.describe = pgproto3.Describe{ObjectType: 'P', Name: st.Portal}
			fe.Send(&m.describe)
		}
	}
	m.execute = pgproto3.Execute{Portal: st.Portal, MaxRows: st.MaxRows}
	fe.Send(&m.execute)
	fe.Send(&m.sync)
	m.parse, m.bind = pgproto3.Parse{}, pgproto3.Bind{} // keep no client's data
	stop := c.watch(ctx)
	defer c.unwatch(stop)
	if err := fe.Flush(); err != nil {
		return false, false, c.brokenErr(err)
	}
	var serverErr error
	pending := len(prefix) // the prefix's command tags still to come
	// parses counts ParseComplete messages: the prefix's come first, then st's own.
	parses := 0
	for {
		msg, err := c.receive(context.Background())
		if err != nil {
			return sent, pending == 0, c.brokenErr(err)
		}
		switch m := msg.(type) {
		case *pgproto3.ReadyForQuery:
			if serverErr != nil && parsed && parses <= len(prefix) {
				// The Parse failed or never ran: forget the name so the next use parses
				// again. A statement whose Parse completed stays known even when its
				// Bind or Execute failed, since the server keeps it.
				delete(c.stmts, stmtKey{st.SQL, oidKey(st.ParamOIDs)})
			}
			return sent, pending == 0, serverErr
		case *pgproto3.ErrorResponse:
			serverErr = pgconn.ErrorResponseToPgError(m)
		case *pgproto3.ParseComplete:
			parses++
		case *pgproto3.BindComplete, *pgproto3.NoData, *pgproto3.CloseComplete:
		case *pgproto3.DataRow, *pgproto3.RowDescription:
			sent = true
			sink.Send(msg)
		case *pgproto3.CommandComplete:
			if pending > 0 {
				pending-- // the prefix's
				continue
			}
			sink.Send(msg)
		case *pgproto3.EmptyQueryResponse, *pgproto3.NoticeResponse, *pgproto3.PortalSuspended:
			sink.Send(msg)
		case *pgproto3.NotificationResponse:
			// Queued by the pool's handler; the session sends them before ReadyForQuery.
		case *pgproto3.ParameterStatus:
			// A function changed a reported setting (set_config): the connection's
			// settings are no longer the ones its key names.
			c.settings = unknownSettings
			sink.Send(msg)
		case *pgproto3.CopyInResponse:
			fe.Send(&pgproto3.CopyFail{Message: "COPY through the extended protocol is not supported by the proxy"})
			if err := fe.Flush(); err != nil {
				return sent, pending == 0, c.brokenErr(err)
			}
		default:
			// CopyOut data and anything else unexpected: not for this client.
		}
	}
}

// watch makes cancelling ctx interrupt the connection's reads and writes; unwatch
// undoes it and marks the connection broken when ctx did interrupt it. The pool's
// interrupt context is watched for the connection's whole life (see Pool.InterruptOn),
// so an exchange under it costs nothing here.
func (c *Conn) watch(ctx context.Context) func() bool {
	if ctx.Done() == nil {
		return nil
	}
	if c.stopBase != nil && ctx == c.base {
		if ctx.Err() != nil {
			c.interrupt() // it ended before the connection was lent
		}
		return nil
	}
	return context.AfterFunc(ctx, c.interrupt)
}

// interrupt makes the connection's reads and writes in progress, and the next ones,
// fail at once.
func (c *Conn) interrupt() { c.pg.Conn().SetDeadline(time.Unix(1, 0)) }

func (c *Conn) unwatch(stop func() bool) {
	if stop != nil && !stop() {
		c.broken = true // the deadline was set: the connection is mid-message
	}
	if c.stopBase != nil && c.base.Err() != nil {
		c.broken = true // the pool's interrupt context ended: its deadline is set
	}
}

// Query runs sql with the simple protocol and relays every message of its answer to
// sink except the final ReadyForQuery: row descriptions, rows, command tags, notices,
// parameter changes, and COPY TO data. A server error is returned as *pgconn.PgError.
// COPY FROM is refused here (see StartCopy).
func (c *Conn) Query(ctx context.Context, sql string, sink Sink) error {
	_, err := c.QueryAfter(ctx, nil, sql, sink)
	return err
}

// QueryAfter is Query with statements run first (a transaction's BEGIN), in the same
// query string: the server parses the whole string before it runs any of it and stops
// at the first error, so their failure keeps sql from running, and their command tags
// are not relayed. ran reports whether they all ran. sql must be one statement.
func (c *Conn) QueryAfter(ctx context.Context, prefix []string, sql string, sink Sink) (ran bool, err error) {
	fe := c.pg.Frontend()
	q := sql
	if len(prefix) > 0 {
		// A newline ends each: a client's BEGIN may end in a -- comment.
		q = strings.Join(prefix, "\n;") + "\n;" + sql
	}
	c.msg.query.String = q
	fe.Send(&c.msg.query)
	c.msg.query.String = ""
	stop := c.watch(ctx)
	defer c.unwatch(stop)
	if err := fe.Flush(); err != nil {
		return false, c.brokenErr(err)
	}
	var serverErr error
	pending := len(prefix) // the prefix's command tags still to come
	for {
		msg, err := c.receive(context.Background())
		if err != nil {
			return pending == 0, c.brokenErr(err)
		}
		switch m := msg.(type) {
		case *pgproto3.ReadyForQuery:
			return pending == 0, serverErr
		case *pgproto3.ErrorResponse:
			if serverErr == nil {
				pe := pgconn.ErrorResponseToPgError(m)
				if n := int32(utf8.RuneCountInString(q) - utf8.RuneCountInString(sql)); pe.Position > n {
					pe.Position -= n // where in sql, not in the prefixed string
				} else if pe.Position > 0 {
					pe.Position = 0 // in the prefix, which the client did not send as such
				}
				serverErr = pe
			}
		case *pgproto3.CopyInResponse:
			fe.Send(&pgproto3.CopyFail{Message: "unexpected COPY FROM"})
			if err := fe.Flush(); err != nil {
				return pending == 0, c.brokenErr(err)
			}
		case *pgproto3.ParameterStatus:
			c.settings = unknownSettings
			sink.Send(msg)
		case *pgproto3.CommandComplete:
			if pending > 0 {
				pending-- // the prefix's
				continue
			}
			sink.Send(msg)
		case *pgproto3.NotificationResponse:
			// Queued by the pool's handler; the session sends them before ReadyForQuery.
		default:
			sink.Send(msg)
		}
	}
}

// FunctionCall runs a call of the protocol's function call message (libpq's fastpath,
// which its large-object functions use) and relays the answer to sink: the
// FunctionCallResponse, and any notice, ending with the server's ReadyForQuery, which
// is not relayed. A server error is returned as *pgconn.PgError.
func (c *Conn) FunctionCall(ctx context.Context, call *pgproto3.FunctionCall, sink Sink) error {
	fe := c.pg.Frontend()
	fe.Send(call)
	stop := c.watch(ctx)
	defer c.unwatch(stop)
	if err := fe.Flush(); err != nil {
		return c.brokenErr(err)
	}
	var serverErr error
	for {
		msg, err := c.receive(context.Background())
		if err != nil {
			return c.brokenErr(err)
		}
		switch m := msg.(type) {
		case *pgproto3.ReadyForQuery:
			return serverErr
		case *pgproto3.ErrorResponse:
			serverErr = pgconn.ErrorResponseToPgError(m)
		case *pgproto3.FunctionCallResponse, *pgproto3.NoticeResponse:
			sink.Send(msg)
		case *pgproto3.ParameterStatus:
			c.settings = unknownSettings
			sink.Send(msg)
		case *pgproto3.NotificationResponse:
			// Queued by the pool's handler; the session sends them before ReadyForQuery.
		}
	}
}

// Describe prepares sql as the unnamed statement and returns its parameter types and
// result columns (nil fields: the statement returns no rows).
func (c *Conn) Describe(ctx context.Context, sql string, oids []uint32) (params []uint32, fields []pgproto3.FieldDescription, err error) {
	fe := c.pg.Frontend()
	fe.Send(&pgproto3.Parse{Query: sql, ParameterOIDs: oids})
	fe.Send(&pgproto3.Describe{ObjectType: 'S'})
	fe.Send(&pgproto3.Sync{})
	stop := c.watch(ctx)
	defer c.unwatch(stop)
	if err := fe.Flush(); err != nil {
		return nil, nil, c.brokenErr(err)
	}
	var serverErr error
	for {
		msg, err := c.receive(context.Background())
		if err != nil {
			return nil, nil, c.brokenErr(err)
		}
		switch m := msg.(type) {
		case *pgproto3.ReadyForQuery:
			return params, fields, serverErr
		case *pgproto3.ErrorResponse:
			serverErr = pgconn.ErrorResponseToPgError(m)
		case *pgproto3.ParameterDescription:
			params = append([]uint32{}, m.ParameterOIDs...)
		case *pgproto3.RowDescription:
			fields = make([]pgproto3.FieldDescription, len(m.Fields))
			for i, f := range m.Fields {
				fields[i] = f
				fields[i].Name = append([]byte(nil), f.Name...)
			}
		}
	}
}

// Copy is a COPY FROM STDIN in progress on one connection.
type Copy struct {
	c       *Conn
	buf     []byte
	notices Sink
}

// copyFlushSize is how much COPY data is gathered before it is sent.
const copyFlushSize = 64 << 10

// StartCopy sends a COPY ... FROM STDIN statement and waits until the server is ready
// for the data. The context bounds the whole COPY until Finish. The notices the server
// raises meanwhile (a trigger's RAISE NOTICE, say) are relayed to notices.
func (c *Conn) StartCopy(ctx context.Context, sql string, notices Sink) (*Copy, *pgproto3.CopyInResponse, error) {
	fe := c.pg.Frontend()
	fe.Send(&pgproto3.Query{String: sql})
	if err := fe.Flush(); err != nil {
		return nil, nil, c.brokenErr(err)
	}
	var serverErr error
	for {
		msg, err := c.receive(ctx)
		if err != nil {
			return nil, nil, c.brokenErr(err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyInResponse:
			resp := &pgproto3.CopyInResponse{OverallFormat: m.OverallFormat, ColumnFormatCodes: append([]uint16{}, m.ColumnFormatCodes...)}
			return &Copy{c: c, notices: notices}, resp, nil
		case *pgproto3.ErrorResponse:
			serverErr = pgconn.ErrorResponseToPgError(m)
		case *pgproto3.NoticeResponse:
			notices.Send(msg)
		case *pgproto3.ReadyForQuery:
			if serverErr == nil {
				serverErr = fmt.Errorf("backend: %s did not start COPY", c.pool.name)
			}
			return nil, nil, serverErr
		}
	}
}

// Write queues data (whole rows) for the server, sending when enough has gathered.
func (cp *Copy) Write(data []byte) error {
	cp.buf = append(cp.buf, data...)
	if len(cp.buf) >= copyFlushSize {
		return cp.flush()
	}
	return nil
}

func (cp *Copy) flush() error {
	if len(cp.buf) == 0 {
		return nil
	}
	fe := cp.c.pg.Frontend()
	fe.Send(&pgproto3.CopyData{Data: cp.buf})
	cp.buf = cp.buf[:0]
	if err := fe.Flush(); err != nil {
		return cp.c.brokenErr(err)
	}
	return nil
}

// Finish ends the COPY: with failure "" it sends the rest of the data and CopyDone and
// returns the server's command tag; otherwise it sends CopyFail with that message.
func (cp *Copy) Finish(ctx context.Context, failure string) (pgconn.CommandTag, error) {
	fe := cp.c.pg.Frontend()
	if failure == "" {
		if err := cp.flush(); err != nil {
			return pgconn.CommandTag{}, err
		}
		fe.Send(&pgproto3.CopyDone{})
	} else {
		cp.buf = cp.buf[:0]
		fe.Send(&pgproto3.CopyFail{Message: failure})
	}
	if err := fe.Flush(); err != nil {
		return pgconn.CommandTag{}, cp.c.brokenErr(err)
	}
	var tag pgconn.CommandTag
	var serverErr error
	for {
		msg, err := cp.c.receive(ctx)
		if err != nil {
			return tag, cp.c.brokenErr(err)
		}
		switch m := msg.(type) {
		case *pgproto3.CommandComplete:
			tag = pgconn.NewCommandTag(string(m.CommandTag))
		case *pgproto3.ErrorResponse:
			if serverErr == nil {
				serverErr = pgconn.ErrorResponseToPgError(m)
			}
		case *pgproto3.NoticeResponse:
			cp.notices.Send(msg)
		case *pgproto3.ReadyForQuery:
			return tag, serverErr
		}
	}
}
