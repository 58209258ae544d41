package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shardlab/shardlab/rules"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// Client is what a Session needs of its client connection: somewhere to send messages,
// and, for COPY FROM STDIN, the client's next message.
type Client interface {
	backend.Sink
	// Flush sends what Send queued.
	Flush() error
	// Receive reads the client's next message (CopyData, CopyDone, CopyFail ...).
	Receive() (pgproto3.FrontendMessage, error)
}

// Session is one client's session: all the state a client holds, in one place.
// Its methods are called from one goroutine, the client's; Cancel may be called from
// any.
type Session struct {
	r    *Router
	told *toldClient // client, with the parameter values it was told of
	// encodings are the client encodings other than UTF-8 the client ever set.
	encodings []string
	id        uint64 // unique among the router's sessions
	client    Client
	user      string
	// login is who the client runs as on the data sources, and pools are that login's
	// pools, one per data source.
	login Identity
	pools []*backend.Pool

	// Protocol objects.
	stmts   map[string]*statement
	portals map[string]*portal

	// Settings (see settings.go): the startup packet's, then the session's own. Inside a
	// transaction that changed them, txSettings are the session's settings as they will
	// be if it commits, and saved those at each savepoint. key identifies the whole
	// list, which every server connection the client uses carries.
	startup    []setting
	settings   []setting
	txSettings []setting
	txChanged  bool
	saved      []savedSettings
	subSeq     int // numbers the subtransactions (savepoints) of the session
	key        string
	stmtsSQL   []string
	// tempPath: the search path names pg_temp, so that DDL without the word TEMP may
	// make temporary objects.
	tempPath bool
	// madeState: a statement of the client's may have made state that lives on its
	// server connections (a temporary table, say), which a coordinated statement,
	// running in a session of its own, would not see.
	madeState bool
	// txLocal are SET LOCAL and SET TRANSACTION statements of the open transaction,
	// run on each data source when it joins the transaction.
	txLocal []string
	// noticeSink is queueNotice, made once: connections lent to the session point at it.
	noticeSink func(*pgconn.Notice)
	// notices are the notices queued for the client (queueNotice).
	notices struct {
		sync.Mutex
		q []*pgproto3.NoticeResponse
	}
	// dirty: a SET ran inside the open transaction; the connections it used carry
	// settings a rollback may undo, so they are marked unknown when released.
	dirty bool

	// Transaction state. explicit: the client said BEGIN; implicit: the proxy opened a
	// transaction for several statements sent together (a multi-statement query, or an
	// extended-protocol batch of several executions), as PostgreSQL does.
	tx       *sqlexec.Session
	explicit bool
	implicit bool
	// reading: the implicit transaction holds one SELECT alone in its batch, fetched
	// in parts (see Execute); it commits as autocommit would have, each data source on
	// its own.
	reading bool
	failed  bool // a statement of the explicit transaction failed in the proxy itself
	// batchFailed: an error happened since the last Sync; the implicit transaction of
	// the batch rolls back.
	batchFailed bool

	leases *leases
	conns  conns
	// watch relays notifications while the client is idle (see WatchNotifications).
	watch *watch
	// running is set while a statement of the client's that may set sequence state runs
	// (see Conn.Ran): not the proxy's own statements, SET or a description.
	running bool
	// usesSequences: the client called nextval, setval, currval or lastval.
	usesSequences bool
	// drewElsewhere: an INSERT drew sharding keys from a sequence on a data source
	// other than the default one (currval and lastval would not see them).
	drewElsewhere bool
	// txDDL: the open transaction ran DDL: its statements are planned on its own
	// connections' view of the schema (planContext), and the plans and descriptions
	// made meanwhile are forgotten when it ends.
	txDDL bool
	// inUnit: the client is inside a unit of work (Hold), counted by its router's
	// pause gate. moving and passGen are set for a unit that passes a pause of some
	// tables (Router.PauseTables): the tables, and the pause's number.
	inUnit  bool
	moving  func(table string) bool
	passGen uint64
}

// setting is one SET statement and the parameter it sets (lower case).
type setting struct {
	name string
	sql  string
}

// NewSession starts the session of a client that logged in as user and runs on the
// data sources as login; startup holds the startup packet's parameters (user and
// database are left out). Call Start before serving statements.
func (r *Router) NewSession(client Client, user string, login Identity, startup map[string]string) (*Session, error) {
	r = r.Current()
	pools, err := r.poolsOf(login)
	if err != nil {
		return nil, err
	}
	told := &toldClient{Client: client, told: map[string]string{}}
	s := &Session{r: r, id: r.sessions.Add(1), client: told, told: told, user: user, login: login, pools: pools, stmts: map[string]*statement{}, portals: map[string]*portal{}}
	s.leases = &leases{s: s, held: map[int]*lease{}, pinned: map[int]*backend.Conn{}, check: map[int]bool{}, forget: map[int]bool{}, listens: map[int]bool{},
		turnMu: make(chan struct{}, 1)}
	s.noticeSink = s.queueNotice
	s.tx = transactionsOn(s.leases, r)
	s.conns = conns{s: s, state: map[int]joinState{}}
	for _, name := range slices.Sorted(maps.Keys(startup)) {
		if strings.EqualFold(name, "client_encoding") {
			s.noteEncoding(startup[name])
		}
		stmts, err := startupSettings(name, startup[name])
		if err != nil {
			return nil, err
		}
		for _, sql := range stmts {
			s.startup = append(s.startup, setting{name: strings.ToLower(name), sql: sql})
		}
	}
	s.settingsChanged()
	return s, nil
}

// gucName is what a setting's name may look like (custom settings have a dot).
var gucName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?$`)

// startupSettings turns one startup parameter into SET statements; "options" holds
// command-line style settings ("-c name=value" or "--name=value").
func startupSettings(name, value string) ([]string, error) {
	if name == "options" {
		var out []string
		fields := strings.Fields(value)
		for i := 0; i < len(fields); i++ {
			f := fields[i]
			var kv string
			switch {
			case f == "-c" && i+1 < len(fields):
				i++
				kv = fields[i]
			case strings.HasPrefix(f, "-c"):
				kv = f[2:]
			case strings.HasPrefix(f, "--"):
				kv = f[2:]
			default:
				return nil, &pgconn.PgError{Severity: "FATAL", Code: "42704", Message: fmt.Sprintf("invalid command-line argument for server process: %s", f)}
			}
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, &pgconn.PgError{Severity: "FATAL", Code: "42601", Message: fmt.Sprintf("-c %s requires a value", kv)}
			}
			stmts, err := startupSettings(strings.ReplaceAll(k, "-", "_"), v)
			if err != nil {
				return nil, err
			}
			out = append(out, stmts...)
		}
		return out, nil
	}
	switch name {
	case rules.LayoutSetting:
		return nil, &pgconn.PgError{Severity: "FATAL", Code: "42501", Message: rules.LayoutSetting + " is the proxy's: it tells the servers which layout the proxy routes by"}
	case "replication":
		return nil, &pgconn.PgError{Severity: "FATAL", Code: "0A000", Message: "the shardlab proxy does not support replication connections"}
	}
	if !gucName.MatchString(name) {
		return nil, &pgconn.PgError{Severity: "FATAL", Code: "42704", Message: fmt.Sprintf("unrecognized configuration parameter %q", name)}
	}
	return []string{"SET " + quoteIdent(name) + " = " + quoteLiteral(value)}, nil
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func quoteLiteral(s string) string {
	if strings.ContainsRune(s, '\\') {
		return "E'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", "''") + "'"
	}
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// settingsChanged recomputes the key and statement list of the client's settings.
func (s *Session) settingsChanged() {
	s.stmtsSQL = s.stmtsSQL[:0]
	s.tempPath = false
	for _, list := range [][]setting{s.startup, s.currentSettings()} {
		for _, st := range list {
			s.stmtsSQL = append(s.stmtsSQL, st.sql)
			if st.name == "search_path" && strings.Contains(strings.ToLower(st.sql), "pg_temp") {
				s.tempPath = true
			}
		}
	}
	s.key = strings.Join(s.stmtsSQL, ";")
}

// Start checks the client's startup settings on the default data source and returns
// the values to report with ParameterStatus. A setting the server refuses is returned
// as an error for a FATAL answer; a default data source that cannot be reached is not
// an error (other data sources may serve the client), and the values then come from
// what the proxy last saw.
func (s *Session) Start(ctx context.Context) (map[string]string, error) {
	base := s.r.serverParameters(ctx)
	out := maps.Clone(base)
	out["session_authorization"] = s.user
	var params map[string]string
	// With every connection or turn taken, the login does not wait long for one: the
	// client's settings are then checked at its first statement.
	s.leases.waitBound = s.r.poolWait
	defer func() { s.leases.waitBound = 0 }()
	if err := s.Hold(ctx); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "53300" {
			return out, nil // paused: the client's settings wait for its first statement
		}
		return nil, err
	}
	defer s.Release()
	ds := s.r.rules.DefaultDataSource() // after Hold, which may move the session to another router
	err := s.onDataSource(ctx, ds, func(c *backend.Conn) error {
		params = readParameters(c.PgConn())
		return nil
	})
	if err != nil {
		var se *sqlexec.ShardError
		var pe *pgconn.PgError
		switch {
		case s.login.User != "" && errors.As(err, &pe) && strings.HasPrefix(pe.Code, "28"):
			// The server refused the client's own login: tell the client now, as
			// PostgreSQL would.
			ds := s.r.rules.DataSources()[ds].Name
			return nil, &pgconn.PgError{Severity: "FATAL", Code: pe.Code,
				Message: fmt.Sprintf("shardlab: data source %s refused the login of server user %q: %s", ds, s.login.User, pe.Message)}
		case errors.As(err, &se):
			return out, nil // unreachable: other data sources may serve the client
		case errors.As(err, &pe) && pe.Code == "53300":
			return out, nil // every connection busy: the client's settings wait for its first statement
		case errors.As(err, &pe):
			pe.Severity = "FATAL"
			return nil, pe
		}
		return nil, err
	}
	// The client's own connection tells who it runs as (session_authorization).
	maps.Copy(out, params)
	maps.Copy(s.told.told, out)
	return out, nil
}

// toldClient is the client, remembering the value of each parameter it was last told
// of in a ParameterStatus message.
type toldClient struct {
	Client
	told map[string]string
}

// Send implements backend.Sink.
func (c *toldClient) Send(msg pgproto3.BackendMessage) {
	if m, ok := msg.(*pgproto3.ParameterStatus); ok {
		c.told[m.Name] = m.Value
	}
	c.Client.Send(msg)
}

// foreignText reports whether the client's text arrives in an encoding other than
// the server's (sqlplan.Args.ForeignText): the server converts it, the proxy does not.
func (s *Session) foreignText() bool {
	client, server := s.told.told["client_encoding"], s.told.told["server_encoding"]
	if server == "SQL_ASCII" {
		return false // the server converts nothing
	}
	// Unknown (the login did not reach a server), set to another at some point, or
	// not the server's: the client's bytes may not be the server's.
	if client == "" || server == "" || !strings.EqualFold(client, server) {
		return true
	}
	for _, e := range s.encodings {
		if !sameEncoding(e, server) {
			return true
		}
	}
	return false
}

// sameEncoding reports whether two encoding names name one encoding, as PostgreSQL
// reads them (case, dashes and underscores aside).
func sameEncoding(a, b string) bool {
	i, j := 0, 0
	for {
		for i < len(a) && (a[i] == '-' || a[i] == '_') {
			i++
		}
		for j < len(b) && (b[j] == '-' || b[j] == '_') {
			j++
		}
		if i == len(a) || j == len(b) {
			return i == len(a) && j == len(b)
		}
		x, y := a[i], b[j]
		if 'a' <= x && x <= 'z' {
			x -= 'a' - 'A'
		}
		if 'a' <= y && y <= 'z' {
			y -= 'a' - 'A'
		}
		if x != y {
			return false
		}
		i, j = i+1, j+1
	}
}

// embedsASCIIText reports whether the client's text may be in an encoding whose
// multibyte characters hold bytes that read as ASCII (a backslash, a delimiter), which
// splitting COPY data by bytes would misread.
func (s *Session) embedsASCIIText() bool {
	for _, e := range append([]string{strings.ToUpper(s.told.told["client_encoding"])}, s.encodings...) {
		if embedsASCII[strings.NewReplacer("-", "_").Replace(e)] || e == "?" {
			return true
		}
	}
	return false
}

// reportParameters tells the client of every reported parameter whose value on c
// differs from what it was last told, as PostgreSQL reports a change. A reset (RESET,
// RESET ALL, DISCARD ALL) needs it: the connection was reset to the client's new list
// of settings before the statement ran, where the server's reports went to the proxy.
func (s *Session) reportParameters(c *backend.Conn) {
	for _, name := range slices.Sorted(maps.Keys(s.told.told)) {
		if v := c.PgConn().ParameterStatus(name); v != "" && v != s.told.told[name] {
			s.client.Send(&pgproto3.ParameterStatus{Name: name, Value: v})
		}
	}
}

// End ends the session when the client leaves: an open transaction rolls back, and
// every server connection goes back to its pool, reset. It is idempotent.
func (s *Session) End(ctx context.Context) error {
	err := s.tx.Close(ctx)
	s.explicit, s.implicit = false, false
	s.leases.closeAll(ctx)
	s.leaveUnit()
	return err
}

// Hold starts the client's unit of work, if it is not inside one: call it before
// handling each message of the client's. A unit runs from the first message after the
// client was idle (outside a transaction, keeping no server connection) to the next
// ReadyForQuery that finds it idle again (Release). While the router is paused
// (Router.Pause) a new unit waits, up to the pool's checkout timeout, a cancel request,
// or ctx; units in progress go on, so that their transactions can finish. A unit
// starts before its statements are planned: a session whose router a layout switch
// replaced (Router.Supersede) moves to the new router first, so that no plan of the
// old layout runs after the switch. While some tables are paused
// (Router.PauseTables), a new unit starts at once, and pass holds its first statement
// that touches one of them.
func (s *Session) Hold(ctx context.Context) error {
	if s.inUnit {
		return nil
	}
	mayPass := s.r.mode != PoolSession
	if moving, passGen, ok := s.r.pause.tryEnter(mayPass); ok {
		// Not paused (or passing a pause of some tables): no bound or cancel channel
		// to set up. Supersede needs the router paused with no ordinary unit inside,
		// and a passing unit checks again before it touches a table that moves
		// (pass), so once this unit is in, a successor seen now is the last word.
		if s.r.successor.Load() == nil {
			s.inUnit, s.moving, s.passGen = true, moving, passGen
			return nil
		}
		s.r.pause.leave(passGen)
	}
	return s.enterCurrent(ctx, true)
}

// enterCurrent starts the client's unit of work on the router in force, waiting while
// it is paused (see Hold; mayPass as for pauseGate.enter: never in session pooling,
// where a client keeps its server connections, and so could never move to another
// router), and moving the session to the router that took its router's place, if one
// did.
func (s *Session) enterCurrent(ctx context.Context, mayPass bool) error {
	for {
		r := s.r
		bound := s.leases.bound(s.pools[r.rules.DefaultDataSource()].CheckoutTimeout())
		moving, passGen, err := r.pause.enter(ctx, s.leases.interrupter(), bound, mayPass && r.mode != PoolSession)
		if err != nil {
			return err
		}
		n := r.successor.Load()
		if n == nil {
			s.inUnit, s.moving, s.passGen = true, moving, passGen
			return nil
		}
		r.pause.leave(passGen)
		if err := s.moveTo(n); err != nil {
			return err
		}
	}
}

// Release ends the client's unit of work if the client is idle: outside a
// transaction, keeping no server connection (session pooling, a temporary table, a
// LISTEN). Call it when ReadyForQuery is sent.
func (s *Session) Release() {
	if !s.inUnit || s.TxStatus() != 'I' || s.leases.keeps() {
		return
	}
	s.leaveUnit()
}

// leaveUnit ends the client's unit of work, if it is inside one.
func (s *Session) leaveUnit() {
	if s.inUnit {
		s.r.pause.leave(s.passGen)
		s.inUnit, s.moving, s.passGen = false, nil, 0
	}
}

// errTablesMoved is the error of a statement that touches tables a layout switch moved
// while its transaction, which began during the switch's pause, held server
// connections of the old layout.
var errTablesMoved = &pgconn.PgError{Severity: "ERROR", Code: "40001",
	Message: "shardlab proxy: the tables this statement touches moved to a new layout (a resharding cutover) while its transaction was open on the old one",
	Hint:    "Run the transaction again: it runs on the new layout."}

// pass lets a statement of a unit that passes a pause of some tables run (see Hold).
// One that touches none of them runs at once. One that touches one waits for the
// pause's end, and then runs on the router in force: moved reports that the session
// moved to another router, where the statement is to be planned again. A unit that
// holds server connections (or whose transaction has begun on a data source) cannot
// move: if another router took its router's place meanwhile, the statement fails with
// errTablesMoved. unnamedGoes says that the statement replaces the unnamed portal (a
// Bind of it, or a Query), which therefore does not keep the session where it is.
func (s *Session) pass(ctx context.Context, plan *sqlplan.Plan, unnamedGoes bool) (moved bool, err error) {
	if s.moving == nil || s.isFailed() || !touches(s.moving, plan) {
		// In a failed transaction the statement is refused (or ends the transaction,
		// which touches no table).
		return false, nil
	}
	r := s.r
	passing := r.pause.stillPasses(s.passGen)
	if !passing && r.successor.Load() == nil {
		// The pause ended, the layout stayed: the unit is an ordinary one now.
		s.moving = nil
		return false, nil
	}
	bound := s.leases.bound(s.pools[r.rules.DefaultDataSource()].CheckoutTimeout())
	if !s.movable(unnamedGoes) {
		if err := r.pause.waitLifted(ctx, s.passGen, s.leases.interrupter(), bound); err != nil {
			return false, err
		}
		if r.successor.Load() != nil {
			return false, errTablesMoved
		}
		s.moving = nil
		return false, nil
	}
	s.leaveUnit()
	if unnamedGoes {
		s.dropPortal("")
	}
	if err := s.enterCurrent(ctx, false); err != nil {
		return false, err
	}
	return s.r != r, nil
}

// movable reports whether the session may move to another router now: it holds no
// server connection, its transaction (if one is open) has begun on no data source,
// and it keeps no portal bound by the old router's rules (but the unnamed one, if
// unnamedGoes; a portal of a statement that goes to no data source, such as BEGIN or
// SET, is bound by no rules).
func (s *Session) movable(unnamedGoes bool) bool {
	if s.leases.holding() || len(s.tx.Touched()) > 0 {
		return false
	}
	for name, p := range s.portals {
		if p.bound != nil && (name != "" || !unnamedGoes) {
			return false
		}
	}
	return true
}

// moveTo moves a session to the router n that took its router's place: n's pools of
// the client's login, a transaction state of n's engine (which carries on the open
// transaction, if one is open and has begun on no data source), and its prepared
// statements planned again (n's generation is ahead of the old router's).
func (s *Session) moveTo(n *Router) error {
	n = n.Current()
	pools, err := n.poolsOf(s.login)
	if err != nil {
		return err
	}
	tx := transactionsOn(s.leases, n)
	if !tx.Carry(s.tx) {
		return errTablesMoved // the callers see that it cannot happen (Hold, movable)
	}
	s.r, s.pools, s.tx = n, pools, tx
	return nil
}

// transactionsOn returns a transaction state of r's engine over a client's leases.
// The coordinator database stays out of the client's transactions: it reads committed
// rows, in transactions of its own (see readsCommitted).
func transactionsOn(l *leases, r *Router) *sqlexec.Session {
	tx := sqlexec.NewSession(l, r.committer)
	tx.SetOutside(sqlplan.CoordinatorSource(r.rules))
	if r.detector != nil {
		tx.SetDeadlockDetector(r.detector)
	}
	return tx
}

// Cancel asks the servers running the client's current statement to cancel it
// (PostgreSQL's CancelRequest, forwarded to every server connection the client holds).
func (s *Session) Cancel(ctx context.Context) {
	s.leases.cancel(ctx)
}

// TxStatus is the transaction status for ReadyForQuery: 'I' idle, 'T' in a
// transaction, 'E' in a failed transaction.
func (s *Session) TxStatus() byte {
	switch {
	case !s.explicit:
		return 'I'
	case s.isFailed():
		return 'E'
	}
	return 'T'
}

func (s *Session) isFailed() bool { return s.failed || s.tx.Failed() }

// leases is the client's view of the pools: it implements sqlexec.Pool for the
// client's sqlexec.Session, applies the client's settings to every connection it lends,
// keeps connections for the whole session in session pooling, and remembers which
// connections the client holds so that a cancel request reaches them.
//
// In transaction pooling a connection goes back to its pool after each transaction,
// unless its session holds state that lives on it alone (a temporary table, a session
// advisory lock): the client then keeps it, pinned, until that state is gone or the
// client leaves, and no other client gets it meanwhile. A statement that may make or
// drop such state (sqlplan.SessionEffects) marks its data source for a check, and the
// release asks the server (backend.Conn.HoldsSessionState); other statements cost
// nothing.
type leases struct {
	s    *Session
	mu   sync.Mutex
	held map[int]*lease
	// pinned are the connections the client keeps between transactions: all it uses
	// in session pooling, those holding state that lives on them in transaction pooling.
	pinned map[int]*backend.Conn
	// check marks the data sources whose connection is to be asked, when released,
	// whether it holds such state.
	check map[int]bool
	// forget marks the data sources whose connection's settings are unknown when
	// released (see forgetSettings).
	forget map[int]bool
	// lost is set when a kept connection broke with the client's state on it (see
	// drop): every statement gets it from then on.
	lost error
	// listens marks the data sources where the client ran LISTEN.
	listens map[int]bool
	// turn: the client holds one of the router's turns (Config.MaxTransactions), for
	// turnUsers connections held or being acquired; the last to go gives it back.
	// turnMu serialises taking the turn among concurrent Acquires (of one statement
	// over several shards): a channel, so that a cancel request or the context ends
	// the wait of those behind the one that waits for a turn or a pause.
	turnMu    chan struct{}
	turn      bool
	turnUsers int
	// waitBound, when set, shortens the waits for a turn and for a connection (the
	// login's check of the client's settings, which may as well wait for the first
	// statement).
	waitBound time.Duration
	// intr is closed by a cancel request, ending the client's waits for a turn or a
	// connection in progress; the next wait makes a new one (under mu).
	intr chan struct{}
}

// interrupter returns the channel a cancel request closes to end the client's waits
// in progress (see leases.cancel).
func (l *leases) interrupter() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.intr == nil {
		l.intr = make(chan struct{})
	}
	return l.intr
}

// interrupted reports whether a cancel request closed intr.
func interrupted(intr <-chan struct{}) bool {
	select {
	case <-intr:
		return true
	default:
		return false
	}
}

// userCancel returns PostgreSQL's error for a statement its client cancelled.
func userCancel() error {
	return &pgconn.PgError{Severity: "ERROR", Code: "57014", Message: "canceling statement due to user request",
		Detail: "shardlab: the cancel request ended the statement's wait for a server connection"}
}

// bound returns d, shortened to the leases' waitBound if one is set.
func (l *leases) bound(d time.Duration) time.Duration {
	if l.waitBound > 0 {
		return min(d, l.waitBound)
	}
	return d
}

var _ sqlexec.Pool = (*leases)(nil)

type lease struct {
	l  *leases
	ds int
	c  *backend.Conn
}

// Acquire implements sqlexec.Pool.
func (l *leases) Acquire(ctx context.Context, ds int) (sqlexec.Lease, error) {
	if ds >= l.s.r.rules.NumDataSources() {
		// The coordinator database: only through runCoordinated's checks, which every
		// path to it must pass; this one did not (a guard, not a route).
		if err := l.s.coordinatorAllowed(false); err != nil || ds >= len(l.s.pools) {
			return nil, cmp.Or(err, sqlplan.Unsupported("a statement for the coordinator database on a path that does not reach it"))
		}
	}
	pool := l.s.pools[ds]
	l.mu.Lock()
	c := l.pinned[ds]
	lost := l.lost
	l.mu.Unlock()
	if lost != nil {
		return nil, lost
	}
	// A cancel request ends the waits for a turn and a connection; one that comes
	// later, until the connection is held (and the request reaches its server), ends
	// the statement before it runs.
	intr := l.interrupter()
	fresh := c == nil
	if fresh {
		var err error
		if c, err = l.take(ctx, intr, ds, pool); err != nil {
			return nil, err
		}
	}
	// The settings run under ctx: cancelling a statement in progress would break the
	// connection.
	if err := c.ApplySettings(ctx, l.s.key, l.s.stmtsSQL); err != nil {
		if !fresh && c.Healthy() {
			// A connection the client keeps holds its state: it stays the client's.
			return nil, err
		}
		if !fresh {
			l.drop(ds, c)
		}
		pool.Release(c, reusable(err) && fresh)
		l.giveTurn()
		return nil, err
	}
	x := &lease{l: l, ds: ds, c: c}
	c.Lend(l.s.id)
	c.SetNoticeSink(&l.s.noticeSink)
	l.mu.Lock()
	cancelled := interrupted(intr)
	if !cancelled {
		l.held[ds] = x
		if l.s.r.mode == PoolSession && ds < l.s.r.rules.NumDataSources() {
			// Not the coordinator's few connections: each serves one statement.
			l.pinned[ds] = c
		}
	}
	l.mu.Unlock()
	if cancelled {
		if fresh {
			pool.Release(c, true)
			l.giveTurn()
		}
		return nil, userCancel()
	}
	return x, nil
}

// take takes a turn, if turns are counted, and a connection of pool ds for the client.
// A cancel request from the client (closing intr, see interrupter) ends either wait
// with 57014.
func (l *leases) take(ctx context.Context, intr <-chan struct{}, ds int, pool *backend.Pool) (*backend.Conn, error) {
	err := l.takeTurn(ctx, intr, pool)
	var c *backend.Conn
	if err == nil {
		if c, err = l.wait(ctx, intr, ds, pool); err != nil {
			l.giveTurn()
		}
	}
	if err != nil && interrupted(intr) {
		err = userCancel()
	}
	return c, err
}

// wait takes a connection of pool ds for the client. It waits in slices of the
// cross-pool wait (Config.CrossPoolWait): a client that holds connections of other data
// sources by then (in a transaction, or in a statement over several shards whose other
// connections arrived meanwhile) may be waiting on a client that waits for one of those,
// a cycle no server sees, so it ends as a deadlock victim (40P01), which frees what it
// holds; clients retry 40P01, where a 53300 would leave the transaction open. A client
// that holds nothing cannot be part of such a cycle and waits up to the pool's checkout
// timeout, then gets 53300.
//
// interrupt ends the wait for a free connection (with backend.ErrWaitInterrupted), not a
// dial or an idle connection's check, which run under ctx.
func (l *leases) wait(ctx context.Context, interrupt <-chan struct{}, ds int, pool *backend.Pool) (*backend.Conn, error) {
	checkout := l.bound(pool.CheckoutTimeout())
	start := time.Now()
	for {
		slice := max(min(l.s.r.poolWait, checkout-time.Since(start)), 0)
		c, err := pool.AcquireWithin(ctx, slice, interrupt)
		if !errors.Is(err, backend.ErrWaitElapsed) {
			return c, err
		}
		waited := time.Since(start)
		// The coordinator database's connections are held one statement each and wait
		// for none: no cycle goes through them.
		if others := l.othersHeld(ds); others > 0 && ds != l.s.coordinatorIndex() {
			return nil, &pgconn.PgError{Severity: "ERROR", Code: "40P01", Message: "deadlock detected",
				Detail: fmt.Sprintf("shardlab: this client holds server connections of %d other data sources and waited %v in vain for one of %s (pool size %d, all in use)",
					others, waited.Round(time.Millisecond), pool.Name(), pool.Stats().Size),
				Hint: "Retry the transaction. --max-transactions below --pool-size, a larger --pool-size, or --aggregate for shards that are schemas of one database avoids it."}
		}
		if waited >= checkout {
			pool.CountTimeout()
			return nil, pool.TimeoutError(checkout)
		}
	}
}

// othersHeld counts the data sources other than ds the client holds connections of.
func (l *leases) othersHeld(ds int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for d := range l.held {
		if d != ds {
			n++
		}
	}
	return n
}

// conn returns the connection the client holds on data source ds.
func (l *leases) conn(ds int) *backend.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if x := l.held[ds]; x != nil {
		return x.c
	}
	return nil
}

// Run implements sqlexec.Lease.
func (x *lease) Run(_ context.Context, fn func(*pgconn.PgConn) error) error {
	err := fn(x.c.PgConn())
	if x.l.s.running {
		x.c.Ran()
	}
	return err
}

// Release implements sqlexec.Lease.
func (x *lease) Release(reuse bool) {
	l := x.l
	x.c.SetNoticeSink(nil)
	pool := l.s.pools[x.ds]
	l.mu.Lock()
	delete(l.held, x.ds)
	wasPinned := l.pinned[x.ds] == x.c
	check := l.check[x.ds]
	delete(l.check, x.ds)
	forget := l.forget[x.ds]
	delete(l.forget, x.ds)
	l.mu.Unlock()
	if l.s.dirty || forget {
		x.c.ForgetSettings()
	}
	// A connection the client keeps stays its own after a cancelled statement: a late
	// cancel request could reach only this client's next statement, as on PostgreSQL
	// itself.
	healthy := x.c.Healthy()
	keep := wasPinned && (reuse || healthy)
	if l.s.r.mode == PoolTransaction && check && healthy {
		ctx, cancel := context.WithTimeout(context.Background(), stateCheckTimeout)
		held, err := x.c.HoldsSessionState(ctx)
		cancel()
		switch {
		case err == nil:
			keep = held
		case x.c.Healthy():
			keep = true // no answer: keep what may hold the client's state
		default:
			keep, reuse = false, false
		}
	}
	if !keep && wasPinned {
		l.drop(x.ds, x.c)
	} else if keep && !wasPinned && l.s.r.mode == PoolTransaction {
		pool.AddPinned(1)
	}
	l.mu.Lock()
	if keep {
		l.pinned[x.ds] = x.c
	}
	l.mu.Unlock()
	if !keep {
		pool.Release(x.c, reuse)
		l.giveTurn()
	}
}

// drop stops keeping connection c of data source ds. A kept connection may hold state
// of the client's that lives on it alone (in transaction pooling it does; in session
// pooling it may): if it broke, that state is gone, and the client's statements fail
// from now on, as its session would have ended on PostgreSQL itself.
func (l *leases) drop(ds int, c *backend.Conn) {
	l.mu.Lock()
	delete(l.pinned, ds)
	l.mu.Unlock()
	if l.s.r.mode == PoolTransaction {
		l.s.pools[ds].AddPinned(-1)
	}
	if !c.Healthy() {
		l.mu.Lock()
		l.lost = &pgconn.PgError{Severity: "ERROR", Code: "08006",
			Message: fmt.Sprintf("shardlab: the server connection to data source %s that held this session's temporary objects, session locks or listened channels was lost, and they with it", l.s.pools[ds].Name()),
			Hint:    "Reconnect."}
		l.mu.Unlock()
	}
}

// stateCheckTimeout bounds the question whether a released connection holds state that
// lives on it alone (a shutdown interrupts it sooner, as any exchange of a lent
// connection).
const stateCheckTimeout = 30 * time.Second

// recheck marks data source ds: when the client's connection there is next released,
// ask whether it holds state that lives on it alone (transaction pooling).
func (l *leases) recheck(ds int) {
	if l.s.r.mode != PoolTransaction {
		return
	}
	l.mu.Lock()
	l.check[ds] = true
	l.mu.Unlock()
}

// forgetSettings marks data source ds: when the client's connection there is next
// released, its settings are unknown (a DO or CALL ran code that may have changed
// them), so that the next statement on it, the client's or another's, resets them
// (transaction pooling; in session pooling the connection is the client's alone).
func (l *leases) forgetSettings(ds int) {
	if l.s.r.mode != PoolTransaction {
		return
	}
	l.mu.Lock()
	l.forget[ds] = true
	l.mu.Unlock()
}

// isPinned reports whether the client keeps a connection of data source ds between
// transactions.
func (l *leases) isPinned(ds int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pinned[ds] != nil
}

// keeps reports whether the client keeps a connection between transactions.
func (l *leases) keeps() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pinned) > 0
}

// holding reports whether the client holds server connections now.
func (l *leases) holding() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held) > 0 || len(l.pinned) > 0
}

// kept returns the data sources whose connections the client keeps between
// transactions, in order.
func (l *leases) kept() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(maps.Keys(l.pinned))
}

// takeTurn makes the client hold one of the router's turns (Config.MaxTransactions)
// for one more connection, waiting for one if it holds none (until intr closes); pool
// counts the wait among its waiting clients.
func (l *leases) takeTurn(ctx context.Context, intr <-chan struct{}, pool *backend.Pool) error {
	if l.s.r.turns == nil {
		return nil // turns are not counted: one pool, or --max-transactions 0
	}
	select {
	case l.turnMu <- struct{}{}:
	case <-intr:
		return userCancel()
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-l.turnMu }()
	l.mu.Lock()
	if l.turn {
		l.turnUsers++
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	if err := l.waitTurn(ctx, intr, pool); err != nil {
		return err
	}
	l.mu.Lock()
	l.turn, l.turnUsers = true, 1
	l.mu.Unlock()
	return nil
}

// waitTurn takes one of the router's turns (Config.MaxTransactions), if they are
// counted.
func (l *leases) waitTurn(ctx context.Context, intr <-chan struct{}, pool *backend.Pool) error {
	r := l.s.r
	if r.turns == nil {
		return nil
	}
	select {
	case r.turns <- struct{}{}:
	default:
		pool.AddTurnWaiting(1)
		defer pool.AddTurnWaiting(-1)
		t := time.NewTimer(l.bound(r.turnTimeout))
		defer t.Stop()
		select {
		case r.turns <- struct{}{}:
		case <-t.C:
			return &pgconn.PgError{Severity: "ERROR", Code: "53300", Message: fmt.Sprintf(
				"shardlab proxy: no turn among the %d clients allowed to hold server connections at once (--max-transactions) became free within %v",
				cap(r.turns), l.bound(r.turnTimeout))}
		case <-intr:
			return userCancel()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// giveTurn ends one use of the client's turn; the last gives the turn back.
func (l *leases) giveTurn() {
	l.mu.Lock()
	if !l.turn {
		l.mu.Unlock()
		return
	}
	l.turnUsers--
	last := l.turnUsers == 0
	if last {
		l.turn = false
	}
	l.mu.Unlock()
	if last {
		if l.s.r.turns != nil {
			<-l.s.r.turns
		}
	}
}

// closeAll gives back the connections kept for the session (session pooling), reset
// with DISCARD ALL as a new session would find them.
func (l *leases) closeAll(ctx context.Context) {
	l.mu.Lock()
	pinned := l.pinned
	l.pinned = map[int]*backend.Conn{}
	l.mu.Unlock()
	for ds, c := range pinned {
		if l.s.r.mode == PoolTransaction {
			l.s.pools[ds].AddPinned(-1)
		}
		err := c.Discard(ctx)
		l.s.pools[ds].Release(c, err == nil)
		l.giveTurn()
	}
}

// cancel ends the client's waits for a turn or a connection and forwards a cancel
// request to every connection the client holds. The lock is held meanwhile, so that no
// connection goes back to its pool (and to another client) while its cancel request is
// on the way.
func (l *leases) cancel(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.intr != nil {
		close(l.intr)
		l.intr = nil
	}
	ctx, stop := context.WithTimeout(ctx, 5*time.Second)
	defer stop()
	for _, x := range l.held {
		x.c.PgConn().CancelRequest(ctx)
	}
}

// conns is the sqlexec.Conns the client's statements run through: the client's
// sqlexec.Session, plus what a data source needs the first time it serves the open
// transaction: the transaction's SET LOCAL statements, and once the transaction spans
// several data sources, a bound on lock waits (see Config.LockWaitTimeout).
type conns struct {
	s     *Session
	mu    sync.Mutex
	state map[int]joinState // data sources in the open transaction
	// multi is set while a statement with several targets runs: its data sources may
	// join concurrently, so each is bounded at once.
	multi bool
}

// joinState records what a data source of the open transaction has run.
type joinState struct {
	local   bool // the transaction's SET LOCAL statements
	bounded bool // SET LOCAL lock_timeout
}

var _ sqlexec.Conns = (*conns)(nil)

// Run implements sqlexec.Conns.
func (c *conns) Run(ctx context.Context, ds int, fn func(*pgconn.PgConn) error) error {
	s := c.s
	if !s.tx.InTransaction() || ds == s.coordinatorIndex() {
		// The coordinator database is never part of the client's transaction.
		return s.tx.Run(ctx, ds, fn)
	}
	return s.tx.Run(ctx, ds, func(pg *pgconn.PgConn) error {
		if err := c.join(ctx, ds, pg); err != nil {
			return err
		}
		return fn(pg)
	})
}

// runJoining is Run for a statement that sends what its data source owes the open
// transaction ahead of itself, in one round trip (see sqlexec.Session.RunJoining): fn
// gets those statements in join. When the data source also owes the proxy's own
// statements (SET LOCAL, a lock wait bound), they all run first, one by one, and fn
// gets none.
func (c *conns) runJoining(ctx context.Context, ds int, fn func(pg *pgconn.PgConn, join []string) (bool, error)) error {
	s := c.s
	if !s.tx.InTransaction() || ds == s.coordinatorIndex() {
		return s.tx.RunJoining(ctx, ds, fn)
	}
	return s.tx.RunJoining(ctx, ds, func(pg *pgconn.PgConn, join []string) (joined bool, err error) {
		st, spans, fresh := c.register(ds)
		if fresh {
			defer func() {
				if !joined {
					c.forget(ds) // it did not join: the transaction does not span it
				}
			}()
		}
		local, bound := c.owed(st, spans)
		if !local && !bound {
			return fn(pg, join)
		}
		for _, q := range join {
			if err := pg.Exec(ctx, q).Close(); err != nil {
				return false, err
			}
		}
		if err := c.pay(ctx, ds, pg, st, local, bound); err != nil {
			return true, err
		}
		_, err = fn(pg, nil)
		return true, err
	})
}

// join runs what data source ds owes the open transaction before a statement.
func (c *conns) join(ctx context.Context, ds int, pg *pgconn.PgConn) error {
	st, spans, _ := c.register(ds)
	local, bound := c.owed(st, spans)
	return c.pay(ctx, ds, pg, st, local, bound)
}

// register records data source ds in the open transaction and returns what it has run,
// whether the transaction spans several data sources, and whether ds is new to it.
func (c *conns) register(ds int) (st joinState, spans, fresh bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, seen := c.state[ds]
	if !seen {
		c.state[ds] = st
	}
	return st, len(c.state) > 1 || c.multi, !seen
}

// forget takes data source ds out of the open transaction (its BEGIN failed).
func (c *conns) forget(ds int) {
	c.mu.Lock()
	delete(c.state, ds)
	c.mu.Unlock()
}

// owed says which of the proxy's statements a data source in state st still owes the
// open transaction: its SET LOCAL statements, and a bound on lock waits.
func (c *conns) owed(st joinState, spans bool) (local, bound bool) {
	s := c.s
	return !st.local && len(s.txLocal) > 0, !st.bounded && spans && s.r.lockWait > 0
}

// pay runs the statements owed (see owed) on data source ds.
func (c *conns) pay(ctx context.Context, ds int, pg *pgconn.PgConn, st joinState, local, bound bool) error {
	s := c.s
	if !local && !bound {
		return nil
	}
	if local {
		for _, q := range s.txLocal {
			if err := pg.Exec(ctx, q).Close(); err != nil {
				return err
			}
		}
		st.local = true
	}
	if bound {
		if err := pg.Exec(ctx, s.r.lockWaitSQL).Close(); err != nil {
			return err
		}
		st.bounded = true
	}
	c.mu.Lock()
	c.state[ds] = st
	c.mu.Unlock()
	return nil
}

// spans reports whether the open transaction has touched several data sources.
func (c *conns) spans() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.state) > 1
}

// Release implements sqlexec.Conns.
func (c *conns) Release(ds int, err error) { c.s.tx.Release(ds, err) }

// InTransaction implements sqlexec.Conns.
func (c *conns) InTransaction() bool { return c.s.tx.InTransaction() }

// onDataSource runs fn with the client's connection to data source ds (joining the open
// transaction, if any), then releases it outside a transaction. Errors other than the
// server's own name the data source.
func (s *Session) onDataSource(ctx context.Context, ds int, fn func(*backend.Conn) error) error {
	err := s.conns.Run(ctx, ds, func(*pgconn.PgConn) error {
		c := s.leases.conn(ds)
		if c == nil {
			return errors.New("router: no connection held")
		}
		return fn(c)
	})
	s.conns.Release(ds, err)
	return s.shardErr(ds, err)
}

// onDataSourceJoining is onDataSource for a statement that sends what the data source
// owes the open transaction (join: BEGIN, savepoints) ahead of itself, in the same
// round trip; fn reports whether those ran.
func (s *Session) onDataSourceJoining(ctx context.Context, ds int, fn func(c *backend.Conn, join []string) (bool, error)) error {
	err := s.conns.runJoining(ctx, ds, func(_ *pgconn.PgConn, join []string) (bool, error) {
		c := s.leases.conn(ds)
		if c == nil {
			return false, errors.New("router: no connection held")
		}
		return fn(c, join)
	})
	s.conns.Release(ds, err)
	return s.shardErr(ds, err)
}

// shardErr names the data source of an error that is not the server's answer.
func (s *Session) shardErr(ds int, err error) error {
	if err == nil {
		return nil
	}
	var se *sqlexec.ShardError
	if errors.As(err, &se) {
		return err
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Severity != "FATAL" && pe.Severity != "PANIC" {
		return err // the server's answer to the statement
	}
	name := "coordinator"
	if ds < s.r.rules.NumDataSources() {
		name = s.r.rules.DataSources()[ds].Name
	}
	return &sqlexec.ShardError{DataSource: ds, Name: name, Err: err}
}
