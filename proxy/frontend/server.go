// Package frontend is the proxy's client side: it speaks PostgreSQL's wire protocol
// (version 3.0, messages encoded and decoded by pgx's pgproto3) to each client
// connection: the startup packet, SSL negotiation, authentication (trust or
// SCRAM-SHA-256), ParameterStatus and BackendKeyData, then the simple and extended
// query protocols, COPY, cancel requests and Terminate. What a statement means and
// where it runs is the router's business (package router).
//
// A malformed or oversized message, a wrong protocol version, an unknown database or
// a bad password ends that one connection with a FATAL error; the proxy and its other
// clients go on.
package frontend

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/proxy/admin"
	"github.com/shardlab/shardlab/proxy/auth"
	"github.com/shardlab/shardlab/proxy/router"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// DefaultStartupTimeout bounds the startup phase (SSL, startup packet, authentication),
// as PostgreSQL's authentication_timeout does.
const DefaultStartupTimeout = 30 * time.Second

// Config says how to serve clients.
type Config struct {
	Router *router.Router
	// Database is the only database name clients may connect to; others get FATAL
	// 3D000.
	Database string
	// Users authenticates clients with SCRAM-SHA-256; nil trusts every client.
	Users *auth.Users
	// TLS, when set, is offered to clients that ask for SSL.
	TLS *tls.Config
	// MaxClients caps client connections (0: no cap); the next one gets FATAL 53300.
	MaxClients int
	// MaxMessage bounds one client message (DefaultMaxMessage when 0).
	MaxMessage int
	// StartupTimeout bounds the startup phase (DefaultStartupTimeout when 0).
	StartupTimeout time.Duration
	// AdminDatabase, when set with Admin, is a database name whose clients talk to the
	// proxy itself (SHOW POOLS, SHOW ROUTE ...), authenticated like the others.
	AdminDatabase string
	Admin         *admin.Admin
	// Logger receives connection events; nil discards them. Passwords never reach it.
	Logger *slog.Logger
}

// Server serves client connections. It is safe for concurrent use.
type Server struct {
	cfg Config
	log *slog.Logger

	ctx    context.Context // cancelled when Shutdown gives up waiting
	cancel context.CancelFunc
	wg     sync.WaitGroup

	nextPID atomic.Uint32
	// shuttingDown is set once Shutdown begins. It is not under mu: a client reads it
	// holding its own lock, and Shutdown takes the clients' locks holding mu.
	shuttingDown atomic.Bool
	mu           struct {
		sync.Mutex
		clients map[uint32]*client
	}
	stats struct {
		accepted, refused, authFailed, protocolErrors, cancels atomic.Int64
	}
}

// NewServer returns a server for cfg.
func NewServer(cfg Config) *Server {
	if cfg.StartupTimeout <= 0 {
		cfg.StartupTimeout = DefaultStartupTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.mu.clients = map[uint32]*client{}
	var b [4]byte
	rand.Read(b[:])
	s.nextPID.Store(binary.BigEndian.Uint32(b[:]) & 0x3fffffff)
	return s
}

// Context returns the context the server's statements run under: it ends when
// Shutdown gives up waiting for the clients.
func (s *Server) Context() context.Context { return s.ctx }

// Stats is a snapshot of the server's counters.
type Stats struct {
	Clients        int   // client sessions now
	Accepted       int64 // sessions that got past startup
	Refused        int64 // connections turned away (unknown database, too many clients, shutting down)
	AuthFailed     int64
	ProtocolErrors int64
	Cancels        int64 // cancel requests forwarded
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	n := len(s.mu.clients)
	s.mu.Unlock()
	return Stats{Clients: n, Accepted: s.stats.accepted.Load(), Refused: s.stats.refused.Load(),
		AuthFailed: s.stats.authFailed.Load(), ProtocolErrors: s.stats.protocolErrors.Load(), Cancels: s.stats.cancels.Load()}
}

// Serve serves one client connection until it ends, and closes it.
func (s *Server) Serve(nc net.Conn) {
	s.wg.Add(1)
	defer s.wg.Done()
	defer nc.Close()
	c := &client{srv: s, nc: nc, rd: NewReader(nc, s.cfg.MaxMessage), wr: NewWriter(nc)}
	c.serve()
}

// Shutdown stops serving: a client idle outside a transaction is disconnected at once
// (FATAL 57P01), one in a transaction when it ends. When ctx ends first, the remaining
// connections are closed and their transactions rolled back. It returns when every
// client is gone.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shuttingDown.Store(true)
	s.mu.Lock()
	for _, c := range s.mu.clients {
		c.interruptIfIdle()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		s.cancel()
		return nil
	case <-ctx.Done():
	}
	s.cancel()
	s.mu.Lock()
	for _, c := range s.mu.clients {
		c.nc.Close()
	}
	s.mu.Unlock()
	<-done
	return ctx.Err()
}

// closing reports whether Shutdown has begun.
func (s *Server) closing() bool { return s.shuttingDown.Load() }

// cancel forwards a cancel request to the session it names.
func (s *Server) cancelRequest(m *pgproto3.CancelRequest) {
	s.mu.Lock()
	c := s.mu.clients[m.ProcessID]
	s.mu.Unlock()
	if c == nil || c.sess == nil || subtle.ConstantTimeCompare(c.secret[:], m.SecretKey) != 1 {
		return
	}
	s.stats.cancels.Add(1)
	ctx, stop := context.WithTimeout(s.ctx, 10*time.Second)
	defer stop()
	c.sess.Cancel(ctx)
}

// client is one client connection.
type client struct {
	srv    *Server
	nc     net.Conn
	rd     *Reader
	wr     *Writer
	sess   *router.Session
	pid    uint32
	secret [4]byte
	user   string
	admin  bool                   // connected to the admin database
	rfq    pgproto3.ReadyForQuery // reused: the writer encodes it at once

	mu   sync.Mutex
	idle bool // waiting for a message after ReadyForQuery, outside a transaction
	// interrupted: Shutdown set a past read deadline while the client was idle.
	interrupted bool
}

// Send implements router.Client.
func (c *client) Send(msg pgproto3.BackendMessage) { c.wr.Send(msg) }

// Flush implements router.Client.
func (c *client) Flush() error { return c.wr.Flush() }

// Receive implements router.Client.
func (c *client) Receive() (pgproto3.FrontendMessage, error) { return c.rd.Receive() }

// interruptIfIdle ends the wait of a client idle outside a transaction (Shutdown):
// its Receive fails with a timeout, and it is told 57P01.
func (c *client) interruptIfIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idle {
		c.nc.SetReadDeadline(time.Unix(1, 0))
		c.interrupted = true
	}
}

// received notes that the client's wait for a message ended: it is no longer idle.
// A message may have arrived just before Shutdown interrupted the wait; the past
// deadline is then lifted, under the lock interruptIfIdle takes, so that it does not
// fail the client's next Receive: a client that sent BEGIN may finish the transaction
// it began, and one still outside a transaction ends once its message is answered
// (waitable).
func (c *client) received() {
	c.mu.Lock()
	c.idle = false
	if c.interrupted {
		c.interrupted = false
		c.nc.SetReadDeadline(time.Time{})
	}
	c.mu.Unlock()
}

// fatal sends a FATAL error and flushes; the caller then closes the connection.
func (c *client) fatal(code, format string, args ...any) {
	c.wr.Send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: code, Message: fmt.Sprintf(format, args...)})
	c.wr.Flush()
}

func (c *client) serve() {
	s := c.srv
	c.nc.SetDeadline(time.Now().Add(s.cfg.StartupTimeout))
	st, err := c.startup()
	if err != nil {
		var pe *ProtocolError
		if errors.As(err, &pe) {
			s.stats.protocolErrors.Add(1)
			c.fatal(pe.Code, "%s", pe.Message)
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, errCancelRequest) {
			s.log.Debug("client startup failed", "remote", c.nc.RemoteAddr().String(), "err", err)
		}
		return
	}
	if st == nil {
		return // answered already (refused or failed authentication)
	}
	defer c.leave()
	if !c.begin(st) {
		return
	}
	c.nc.SetDeadline(time.Time{})
	s.stats.accepted.Add(1)
	s.log.Debug("client connected", "pid", c.pid, "user", c.user, "remote", c.nc.RemoteAddr().String(), "admin", c.admin)
	if c.admin {
		c.adminLoop()
		return
	}
	c.loop()
}

var errCancelRequest = errors.New("cancel request")

// startup reads the startup packet (after SSL negotiation) and authenticates the
// client. It returns nil, nil when it has answered with an error itself.
func (c *client) startup() (*Startup, error) {
	s := c.srv
	tlsDone := false
	for {
		msg, err := c.rd.ReadStartup()
		if err != nil {
			return nil, err
		}
		switch m := msg.(type) {
		case *pgproto3.SSLRequest:
			if tlsDone {
				return nil, protocolErr("SSL negotiation was already done")
			}
			if c.rd.Buffered() > 0 {
				// Bytes after SSLRequest before the answer: a man in the middle could
				// have injected them (CVE-2021-23214).
				return nil, protocolErr("received unencrypted data after SSL request")
			}
			if s.cfg.TLS == nil {
				if _, err := c.nc.Write([]byte{'N'}); err != nil {
					return nil, err
				}
				continue
			}
			if _, err := c.nc.Write([]byte{'S'}); err != nil {
				return nil, err
			}
			tc := tls.Server(c.nc, s.cfg.TLS)
			if err := tc.Handshake(); err != nil {
				return nil, fmt.Errorf("TLS handshake: %w", err)
			}
			c.nc = tc
			c.rd.Reset(tc)
			c.wr = NewWriter(tc)
			tlsDone = true
		case *pgproto3.GSSEncRequest:
			if _, err := c.nc.Write([]byte{'N'}); err != nil {
				return nil, err
			}
		case *pgproto3.CancelRequest:
			s.cancelRequest(m)
			return nil, errCancelRequest
		case *Startup:
			return c.accept(m)
		}
	}
}

// accept checks a startup packet: the cap on clients, the database, the user's
// password.
func (c *client) accept(st *Startup) (*Startup, error) {
	s := c.srv
	if st.Minor > 0 || len(st.Unrecognized) > 0 {
		c.wr.Send(&pgproto3.NegotiateProtocolVersion{NewestMinorProtocol: 0, UnrecognizedOptions: st.Unrecognized})
	}
	user := st.Parameters["user"]
	if user == "" {
		c.fatal("28000", "no PostgreSQL user name specified in startup packet")
		return nil, nil
	}
	db := st.Parameters["database"]
	if db == "" {
		db = user
	}
	if s.closing() {
		s.stats.refused.Add(1)
		c.fatal("57P03", "the database system is shutting down")
		return nil, nil
	}
	c.admin = s.cfg.Admin != nil && s.cfg.AdminDatabase != "" && db == s.cfg.AdminDatabase
	if db != s.cfg.Database && !c.admin {
		s.stats.refused.Add(1)
		c.fatal("3D000", "database %q does not exist", db)
		return nil, nil
	}
	if s.cfg.Users != nil {
		ok, err := c.authenticate(user)
		if err != nil || !ok {
			return nil, err
		}
	}
	c.user = user
	return st, nil
}

// authenticate runs SCRAM-SHA-256; false means the client was told why it failed.
func (c *client) authenticate(user string) (bool, error) {
	s := c.srv
	c.wr.Send(&pgproto3.AuthenticationSASL{AuthMechanisms: []string{auth.Mechanism}})
	if err := c.wr.Flush(); err != nil {
		return false, err
	}
	msg, err := c.rd.ReceiveSASL(true)
	if err != nil {
		return false, err
	}
	first := msg.(*pgproto3.SASLInitialResponse)
	if first.AuthMechanism != auth.Mechanism {
		c.fatal("28000", "client selected an invalid SASL authentication mechanism")
		return false, nil
	}
	x := s.cfg.Users.NewExchange(user)
	serverFirst, err := x.ServerFirst(first.Data)
	if err != nil {
		c.fatal("08P01", "%v", err)
		return false, nil
	}
	c.wr.Send(&pgproto3.AuthenticationSASLContinue{Data: serverFirst})
	if err := c.wr.Flush(); err != nil {
		return false, err
	}
	msg, err = c.rd.ReceiveSASL(false)
	if err != nil {
		return false, err
	}
	serverFinal, err := x.ServerFinal(msg.(*pgproto3.SASLResponse).Data)
	if errors.Is(err, auth.ErrAuthFailed) {
		s.stats.authFailed.Add(1)
		s.log.Info("client authentication failed", "user", user, "remote", c.nc.RemoteAddr().String())
		c.fatal("28P01", "password authentication failed for user %q", user)
		return false, nil
	}
	if err != nil {
		c.fatal("08P01", "%v", err)
		return false, nil
	}
	c.wr.Send(&pgproto3.AuthenticationSASLFinal{Data: serverFinal})
	return true, nil
}

// begin registers the client, makes its session, and sends AuthenticationOk,
// ParameterStatus, BackendKeyData and ReadyForQuery.
func (c *client) begin(st *Startup) bool {
	s := c.srv
	s.mu.Lock()
	if s.cfg.MaxClients > 0 && len(s.mu.clients) >= s.cfg.MaxClients {
		s.mu.Unlock()
		s.stats.refused.Add(1)
		c.fatal("53300", "sorry, too many clients already")
		return false
	}
	for {
		c.pid = s.nextPID.Add(1) & 0x7fffffff
		if _, taken := s.mu.clients[c.pid]; !taken && c.pid != 0 {
			break
		}
	}
	rand.Read(c.secret[:])
	s.mu.clients[c.pid] = c
	s.mu.Unlock()

	if c.admin {
		c.wr.Send(&pgproto3.AuthenticationOk{})
		for _, p := range [][2]string{{"server_version", "15.0 (shardlab proxy admin)"}, {"client_encoding", "UTF8"},
			{"server_encoding", "UTF8"}, {"DateStyle", "ISO, MDY"}, {"integer_datetimes", "on"}, {"standard_conforming_strings", "on"}} {
			c.wr.Send(&pgproto3.ParameterStatus{Name: p[0], Value: p[1]})
		}
		c.wr.Send(&pgproto3.BackendKeyData{ProcessID: c.pid, SecretKey: c.secret[:]})
		c.wr.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		return c.wr.Flush() == nil
	}
	params := map[string]string{}
	for k, v := range st.Parameters {
		if k != "user" && k != "database" {
			params[k] = v
		}
	}
	// With a users file, a client runs on the data sources as the server login the file
	// gives it; without one, as the data sources' own user.
	var login router.Identity
	if s.cfg.Users != nil {
		l, _ := s.cfg.Users.ServerLogin(c.user)
		login = router.Identity{User: l.User, Password: l.Password}
	}
	sess, err := s.cfg.Router.NewSession(c, c.user, login, params)
	if err != nil {
		c.sendError(err, "FATAL")
		c.wr.Flush()
		return false
	}
	c.sess = sess
	ctx, stop := context.WithTimeout(s.ctx, s.cfg.StartupTimeout)
	reported, err := sess.Start(ctx)
	stop()
	if err != nil {
		c.sendError(err, "FATAL")
		c.wr.Flush()
		return false
	}
	c.wr.Send(&pgproto3.AuthenticationOk{})
	for _, k := range slices.Sorted(maps.Keys(reported)) {
		c.wr.Send(&pgproto3.ParameterStatus{Name: k, Value: reported[k]})
	}
	c.wr.Send(&pgproto3.BackendKeyData{ProcessID: c.pid, SecretKey: c.secret[:]})
	c.wr.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	return c.wr.Flush() == nil
}

// leave ends the session: its transaction rolls back and its server connections go
// back to their pools.
func (c *client) leave() {
	s := c.srv
	if c.sess != nil {
		ctx, stop := context.WithTimeout(context.WithoutCancel(s.ctx), 10*time.Second)
		c.sess.End(ctx)
		stop()
	}
	s.mu.Lock()
	if s.mu.clients[c.pid] == c {
		delete(s.mu.clients, c.pid)
	}
	s.mu.Unlock()
	s.log.Debug("client disconnected", "pid", c.pid, "user", c.user)
}

// loop serves messages until the client leaves.
func (c *client) loop() {
	s := c.srv
	ctx := s.ctx
	skipping := false // after an error in the extended protocol: discard until Sync
	if c.rd.Buffered() == 0 {
		// begin sent ReadyForQuery: a client that sends nothing is idle, and Shutdown
		// must not wait for it (as readyForQuery).
		c.setIdle(true)
	}
	for {
		if c.rd.Buffered() == 0 && c.wr.Pending() {
			if c.wr.Flush() != nil {
				return
			}
		}
		if !c.waitable() {
			c.fatal("57P01", "terminating connection due to administrator command")
			return
		}
		if c.rd.Buffered() == 0 && !c.wr.Pending() && c.sess.TxStatus() == 'I' {
			// Notifications of a LISTEN reach an idle client at once, as from
			// PostgreSQL; the watch ends before the client's message is handled.
			c.sess.WatchNotifications()
		}
		msg, err := c.rd.Receive()
		c.sess.StopWatching()
		c.received()
		if err != nil {
			var pe *ProtocolError
			var ne net.Error
			switch {
			case errors.As(err, &pe):
				s.stats.protocolErrors.Add(1)
				s.log.Info("client protocol error", "pid", c.pid, "err", pe.Message)
				c.fatal(pe.Code, "%s", pe.Message)
			case errors.As(err, &ne) && ne.Timeout() && s.closing():
				c.fatal("57P01", "terminating connection due to administrator command")
			}
			return
		}
		if skipping {
			switch msg.(type) {
			case *pgproto3.Sync:
				skipping = false
			case *pgproto3.Terminate:
				return
			default:
				continue
			}
		}
		var opErr error
		extended := true
		switch msg.(type) {
		case *pgproto3.Query, *pgproto3.Parse, *pgproto3.Bind, *pgproto3.Describe, *pgproto3.Execute, *pgproto3.Close, *pgproto3.FunctionCall:
			// The message starts the client's unit of work unless one is in progress:
			// it waits here while the proxy is paused, before it is planned.
			if err := c.sess.Hold(ctx); err != nil {
				c.sendError(err, "ERROR")
				switch msg.(type) {
				case *pgproto3.Query, *pgproto3.FunctionCall:
					c.readyForQuery()
				default:
					skipping = true
				}
				if c.wr.Err() != nil {
					return
				}
				continue
			}
		}
		switch m := msg.(type) {
		case *pgproto3.Query:
			extended = false
			if err := c.sess.Query(ctx, m.String); err != nil {
				c.sendError(err, "ERROR")
			}
			c.readyForQuery()
		case *pgproto3.Parse:
			opErr = c.sess.Parse(ctx, m.Name, m.Query, m.ParameterOIDs)
		case *pgproto3.Bind:
			opErr = c.sess.Bind(ctx, m)
		case *pgproto3.Describe:
			opErr = c.sess.Describe(ctx, m.ObjectType, m.Name)
		case *pgproto3.Execute:
			next, ok := c.rd.NextType()
			opErr = c.sess.Execute(ctx, m.Portal, m.MaxRows, ok && next == 'S')
		case *pgproto3.Close:
			opErr = c.sess.Close(m.ObjectType, m.Name)
		case *pgproto3.Sync:
			if err := c.sess.Sync(ctx); err != nil {
				c.sendError(err, "ERROR")
			}
			c.readyForQuery()
		case *pgproto3.Flush:
			if c.wr.Flush() != nil {
				return
			}
		case *pgproto3.Terminate:
			return
		case *pgproto3.CopyData, *pgproto3.CopyDone, *pgproto3.CopyFail:
			// Left over from a COPY that failed: PostgreSQL ignores them too.
		case *pgproto3.FunctionCall:
			extended = false
			if err := c.sess.FunctionCall(ctx, m); err != nil {
				c.sendError(err, "ERROR")
			}
			c.readyForQuery()
		}
		if opErr != nil && extended {
			c.sendError(opErr, "ERROR")
			skipping = true
		}
		if c.wr.Err() != nil {
			return
		}
	}
}

// adminLoop serves a client of the admin database: simple queries, answered by the
// proxy itself.
func (c *client) adminLoop() {
	s := c.srv
	for {
		c.setIdle(true)
		if !c.waitable() {
			c.fatal("57P01", "terminating connection due to administrator command")
			return
		}
		msg, err := c.rd.Receive()
		c.received()
		if err != nil {
			var pe *ProtocolError
			if errors.As(err, &pe) {
				c.fatal(pe.Code, "%s", pe.Message)
			}
			return
		}
		switch m := msg.(type) {
		case *pgproto3.Query:
			res, err := s.cfg.Admin.Answer(s.ctx, m.String)
			if err != nil {
				c.sendError(err, "ERROR")
			} else {
				fields := make([]pgproto3.FieldDescription, len(res.Columns))
				for i, name := range res.Columns {
					size := int16(-1)
					if res.Types[i] == admin.Bigint {
						size = 8
					}
					fields[i] = pgproto3.FieldDescription{Name: []byte(name), DataTypeOID: res.Types[i], DataTypeSize: size, TypeModifier: -1}
				}
				if len(fields) > 0 { // PAUSE and RESUME answer with their tag alone
					c.wr.Send(&pgproto3.RowDescription{Fields: fields})
				}
				for _, row := range res.Rows {
					vals := make([][]byte, len(row))
					for i, v := range row {
						vals[i] = []byte(v)
					}
					c.wr.Send(&pgproto3.DataRow{Values: vals})
				}
				c.wr.Send(&pgproto3.CommandComplete{CommandTag: []byte(res.Tag)})
			}
			c.wr.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		case *pgproto3.Sync:
			c.wr.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		case *pgproto3.Terminate:
			return
		case *pgproto3.Parse:
			c.sendError(sqlplan.Unsupported("the admin database speaks the simple query protocol only"), "ERROR")
		}
		if c.wr.Flush() != nil {
			return
		}
	}
}

// readyForQuery sends the notifications that arrived during the statement, then
// ReadyForQuery, and flushes.
func (c *client) readyForQuery() {
	c.sess.PendingNotifications()
	status := c.sess.TxStatus()
	c.rfq.TxStatus = status
	c.sess.Release()
	c.wr.Send(&c.rfq)
	if c.wr.Flush() == nil && status == 'I' && c.rd.Buffered() == 0 {
		c.setIdle(true)
	}
}

func (c *client) setIdle(idle bool) {
	c.mu.Lock()
	c.idle = idle
	c.mu.Unlock()
}

// waitable reports whether the client may wait for its next message: not when the
// proxy is shutting down and the client is idle outside a transaction.
func (c *client) waitable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !(c.idle && c.srv.closing())
}

// sendError sends err as an ErrorResponse (see ErrorResponse).
func (c *client) sendError(err error, severity string) {
	c.wr.Send(ErrorResponse(err, severity))
}

// ErrorResponse turns an error into the message a client gets: a server's error keeps
// every field and its SQLSTATE; a data source that cannot be reached is 08006, naming
// it; a cancelled statement 57014; anything else XX000. severity is used when the
// error carries none.
func ErrorResponse(err error, severity string) *pgproto3.ErrorResponse {
	var pe *pgconn.PgError
	var se *sqlexec.ShardError
	switch {
	case errors.As(err, &pe):
		// The severity is the proxy's: a server's FATAL ends a server connection, not
		// the client's.
		sev := severity
		if pe.Severity == "WARNING" || pe.Severity == "NOTICE" {
			sev = pe.Severity
		}
		return &pgproto3.ErrorResponse{
			Severity: sev, SeverityUnlocalized: sev, Code: pe.Code, Message: pe.Message,
			Detail: pe.Detail, Hint: pe.Hint, Position: pe.Position, InternalPosition: pe.InternalPosition,
			InternalQuery: pe.InternalQuery, Where: pe.Where, SchemaName: pe.SchemaName, TableName: pe.TableName,
			ColumnName: pe.ColumnName, DataTypeName: pe.DataTypeName, ConstraintName: pe.ConstraintName,
			File: pe.File, Line: pe.Line, Routine: pe.Routine,
		}
	case errors.As(err, &se):
		return &pgproto3.ErrorResponse{Severity: severity, SeverityUnlocalized: severity, Code: se.SQLState(),
			Message: fmt.Sprintf("shardlab: data source %s is unavailable: %v", se.Name, se.Err)}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return &pgproto3.ErrorResponse{Severity: severity, SeverityUnlocalized: severity, Code: "57014", Message: "canceling statement: " + err.Error()}
	}
	return &pgproto3.ErrorResponse{Severity: severity, SeverityUnlocalized: severity, Code: "XX000", Message: "shardlab: " + err.Error()}
}
