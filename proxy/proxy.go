// Package proxy is shardlab's PostgreSQL wire-protocol sharding proxy: unmodified
// PostgreSQL clients (psql, pgbench, sysbench, any driver) connect to it as to one
// database, and it runs their SQL on the shards the rules name.
//
// The proxy follows the protocol stack, one package per side:
//
//	frontend  client connections: startup, SSL, SCRAM, the simple and extended protocols
//	router    the client's session: plans each statement (sqlplan), runs it on one data
//	          source (relaying the answer) or several (through sqlexec's engine)
//	backend   one pool of server connections per data source, transaction or session pooling
//	auth      the users file and SCRAM-SHA-256
//	admin     the admin database (SHOW POOLS, SHOW ROUTE) and /metrics
//	copyin    COPY FROM STDIN data split into rows and routed by key
//
// This package puts them together: Server listens, hands each connection to the
// frontend, and shuts down gracefully.
package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardlab/shardlab/coordinator"
	"github.com/shardlab/shardlab/proxy/admin"
	"github.com/shardlab/shardlab/proxy/auth"
	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/proxy/frontend"
	"github.com/shardlab/shardlab/proxy/rawio"
	"github.com/shardlab/shardlab/proxy/router"
	"github.com/shardlab/shardlab/rules"
)

// Config is a proxy's configuration. Rules and Database are required.
type Config struct {
	Rules *rules.Compiled
	// Database is the database name clients connect to.
	Database string
	// PoolMode is transaction (the default) or session pooling.
	PoolMode router.PoolMode
	// Pool sizes and times each data source's pool (backend.Options defaults).
	Pool backend.Options
	// MaxClients caps client connections; 0 means DefaultMaxClients.
	MaxClients int
	// Users authenticates clients with SCRAM-SHA-256; nil trusts every client.
	Users *auth.Users
	// TLS is offered to clients that ask for SSL; nil answers 'N'.
	TLS *tls.Config
	// Coordinate answers the SELECTs the merge cannot answer exactly over several
	// shards in a coordinator database (package coordinator) on the default data
	// source's server, named CoordinatorDatabase (coordinator.DefaultDatabase when
	// empty); without it they are refused with 0A000.
	Coordinate          bool
	CoordinatorDatabase string
	// CoordinatorPoolSize bounds the connections to the coordinator database
	// (DefaultCoordinatorPoolSize when 0): each runs one statement at a time, with a
	// connection to every shard it reads while it runs.
	CoordinatorPoolSize int
	// CoordinatorMaxMoved bounds the bytes of rows one coordinator statement reads from
	// the shards, counted while it runs, and the rows an INSERT ... SELECT into a
	// sharded table reads before it writes them (DefaultCoordinatorMaxMoved when 0;
	// negative: no bound). CoordinatorRelayHost is the address the coordinator's relay listens
	// on, which the default data source's server must reach (empty: the proxy's own
	// address toward that server).
	CoordinatorMaxMoved  int64
	CoordinatorRelayHost string
	// TwoPhase commits transactions that span data sources with two-phase commit
	// (every data source needs max_prepared_transactions > 0).
	TwoPhase bool
	// SettleInterval is how often, with TwoPhase, transactions left in doubt are
	// looked for and settled (0: sqlexec.DefaultSettleInterval; negative: only at start).
	SettleInterval time.Duration
	// MaxMessage bounds one client message (frontend.DefaultMaxMessage when 0).
	MaxMessage int
	// MaxHeld bounds the bytes of rows one statement holds when its answer is read
	// whole (sqlexec.DefaultMaxHeld when 0; see sqlexec.Engine.SetMaxHeld).
	MaxHeld int64
	// LockWaitTimeout bounds lock waits of transactions that span data sources, whose
	// deadlocks no server can see (see router.Config); 0 leaves them unbounded. Callers
	// usually want router.DefaultLockWaitTimeout.
	LockWaitTimeout time.Duration
	// DeadlockInterval is how often transactions that span data sources are checked
	// for deadlocks across shards (see router.Config): 0 is the default interval,
	// negative never.
	DeadlockInterval time.Duration
	// CrossPoolWait bounds how long a transaction that holds server connections of
	// other data sources waits for one more before it ends as a deadlock victim
	// (40P01; see router.Config); 0 is router.DefaultCrossPoolWait.
	CrossPoolWait time.Duration
	// MaxTransactions, when positive, bounds the clients holding server connections at
	// once in transaction pooling (see router.Config); below the pool size, it keeps
	// transactions that span pools from waiting on each other's.
	// router.AutoMaxTransactions chooses one less than the pool size when there are
	// several pools, and no bound otherwise.
	MaxTransactions int
	// AdminDatabase, when set, is the database name of the admin console: SHOW POOLS,
	// SHOW DATABASES, SHOW CLIENTS, SHOW ROUTE <statement>, SHOW HELP.
	AdminDatabase string
	// StatsInterval, when positive, logs every pool's connections in use and idle at
	// that interval.
	StatsInterval time.Duration
	// Aggregate makes data sources that are schemas of one database share one pool and
	// one server connection per transaction (see AggregateSchemas): however many shards
	// there are, the connections to that database stay within Pool.Size.
	Aggregate bool
	// ClientTCP sets keepalive, and TCP_USER_TIMEOUT when UserTimeout is positive, on
	// every client connection (other zero fields: backend.TCP's defaults). Keepalive
	// finds a client whose host vanished while idle in a transaction, by default about
	// 30 s after it last spoke, and its transaction is rolled back, its server
	// connection and locks freed. A zero UserTimeout means none, unlike a server
	// connection's: a user timeout also ends the connection of a live client that keeps
	// its receive window closed that long (one that stops reading a large answer, a
	// LISTEN client that reads nothing; Linux 5.11 and later).
	ClientTCP backend.TCP
	// Logger receives the proxy's log; nil discards it.
	Logger *slog.Logger
	// CheckLayout reads, at New, the layout a resharding move recorded on the data
	// sources (reshard.InForce): New fails if they record another layout than Rules,
	// and between a move's cutover and its finish the proxy reads through the move's
	// views.
	CheckLayout bool
	// ReshardDrain and ReshardCatchUp bound the steps of the admin console's RESHARD
	// CUTOVER (0: reshard's defaults; see reshard.CutoverOptions).
	ReshardDrain, ReshardCatchUp time.Duration
}

// DefaultMaxClients is the cap on client connections unless Config says otherwise.
const DefaultMaxClients = 1000

// ErrConfig is wrapped by New's errors about a bad Config.
var ErrConfig = errors.New("proxy: bad config")

// Server is a running proxy: pools, router and frontend. Serve it on a listener;
// Shutdown stops it.
type Server struct {
	cfg Config
	log *slog.Logger
	// layout is the rules the proxy routes by, as given (before Aggregate merges
	// them), the views of a move between its cutover and its finish included.
	layout atomic.Pointer[rules.Compiled]
	// reshardMu lets one RESHARD command run at a time; resharding is set meanwhile.
	reshardMu  sync.Mutex
	resharding atomic.Bool
	// cutFrom is the layout this proxy routed by before its last RESHARD CUTOVER:
	// how RESHARD FINISH and REVERT reach the data sources the new layout no longer
	// names (the record on the data sources keeps no DSNs). Guarded by reshardMu.
	cutFrom *rules.Compiled
	// router is the router the proxy started with; Router().Current() is the one in
	// force after layout switches.
	router   *router.Router
	frontend *frontend.Server
	admin    *admin.Admin

	mu struct {
		sync.Mutex
		listeners map[net.Listener]bool
		closed    bool
	}
	conns   chan struct{} // bounds the connections being served, startup included
	serving sync.WaitGroup
	once    sync.Once
	stop    chan struct{} // closed by Shutdown: ends the stats logger
	logger  sync.WaitGroup
}

// New builds a proxy from cfg. It makes no connection to serve clients: a data source
// that is down fails only the statements that need it. With TwoPhase it starts the
// settler of transactions in doubt (sqlexec.Settler), which keeps a connection of its
// own to every data source; its first pass finishes prepared transactions a crash left
// behind and needs every data source up.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Rules == nil {
		return nil, fmt.Errorf("%w: no rules", ErrConfig)
	}
	if cfg.Database == "" {
		return nil, fmt.Errorf("%w: no database name for clients", ErrConfig)
	}
	if cfg.MaxClients <= 0 {
		cfg.MaxClients = DefaultMaxClients
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.CheckLayout {
		l, err := checkLayout(ctx, cfg.Rules)
		if err != nil {
			return nil, err
		}
		cfg.Rules = l
	}
	given := cfg.Rules
	if cfg.Aggregate {
		merged, groups, err := AggregateSchemas(cfg.Rules)
		if err != nil {
			return nil, fmt.Errorf("%w: aggregate: %v", ErrConfig, err)
		}
		for _, g := range groups {
			log.Info("aggregate: data sources that are schemas of one database share one pool", "data_sources", strings.Join(g, ","))
		}
		if len(groups) == 0 {
			log.Warn("aggregate: no two data sources are schemas of one database (a --shard DSN with search_path=NAME); nothing merged")
		}
		cfg.Rules = merged
	}
	if cfg.ClientTCP.UserTimeout == 0 {
		cfg.ClientTCP.UserTimeout = -1 // none: see ClientTCP
	}
	cfg.ClientTCP = cfg.ClientTCP.WithDefaults()
	s := &Server{cfg: cfg, log: log}
	s.layout.Store(given)
	r, err := s.newRouter(cfg.Rules)
	if err != nil {
		return nil, err
	}
	s.router = r
	if cfg.AdminDatabase == cfg.Database {
		r.Close()
		s.closePools()
		return nil, fmt.Errorf("%w: the admin database cannot be the database clients use (%q)", ErrConfig, cfg.Database)
	}
	s.admin = admin.New(r, func() int { return s.frontend.Stats().Clients })
	s.admin.SetReshard(s.reshardCommand, s.resharding.Load)
	s.frontend = frontend.NewServer(frontend.Config{Router: r, Database: cfg.Database, Users: cfg.Users, TLS: cfg.TLS,
		MaxClients: cfg.MaxClients, MaxMessage: cfg.MaxMessage, AdminDatabase: cfg.AdminDatabase, Admin: s.admin, Logger: log})
	// Statements run under the frontend's context, which ends when a shutdown gives up
	// waiting: the pools watch it once per connection rather than once per statement.
	for _, p := range r.Pools() {
		p.InterruptOn(s.frontend.Context())
	}
	// The settler's first pass finishes what a crash left in doubt before any client
	// commits; then it settles what failures leave while the proxy runs.
	if err := r.StartSettler(ctx); err != nil {
		r.Close()
		s.closePools()
		return nil, err
	}
	// Connections past the cap still get their FATAL answer from the frontend; beyond
	// a margin they are closed unanswered, so that a flood cannot make goroutines
	// without bound.
	s.conns = make(chan struct{}, cfg.MaxClients+cfg.MaxClients/4+16)
	s.mu.listeners = map[net.Listener]bool{}
	s.stop = make(chan struct{})
	if cfg.StatsInterval > 0 {
		s.logger.Go(func() {
			t := time.NewTicker(cfg.StatsInterval)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					s.logPools("pool")
				case <-s.stop:
					return
				}
			}
		})
	}
	return s, nil
}

// DefaultCoordinatorPoolSize is the usual Config.CoordinatorPoolSize: a few analytic
// statements at once, each holding a connection to every shard while it runs.
const DefaultCoordinatorPoolSize = 4

// DefaultCoordinatorMaxMoved is the usual Config.CoordinatorMaxMoved: 1 GB, as Citus's
// max_intermediate_result_size.
const DefaultCoordinatorMaxMoved = 1 << 30

// newRouter makes the pools of layout l's data sources and a router over them, as the
// proxy starts and at a layout switch (SwitchLayout). Every server connection tells
// its server which layout it routes by (rules.Compiled.Digest, as the setting
// shardlab.layout), so that a resharding move's fence can refuse the writes of a
// process that routes by another.
func (s *Server) newRouter(l *rules.Compiled) (*router.Router, error) {
	cfg := s.cfg
	opts := cfg.Pool
	opts.RuntimeParams = map[string]string{rules.LayoutSetting: l.Digest()}
	var pools []*backend.Pool
	closeAll := func() {
		for _, p := range pools {
			p.Close()
		}
	}
	for _, ds := range l.DataSources() {
		p, err := backend.NewPool(ds.Name, ds.DSN, opts)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		if s.frontend != nil {
			p.InterruptOn(s.frontend.Context())
		}
		pools = append(pools, p)
	}
	// poolFor makes the pool of a server login other than the data sources' own for
	// data source i: as its DSN says, but for the user and password (router.PoolFor).
	poolFor := func(id router.Identity, i int) (*backend.Pool, error) {
		o := opts
		o.User, o.Password = id.User, id.Password
		ds := l.DataSources()[i]
		p, err := backend.NewPool(ds.Name, ds.DSN, o)
		if err != nil {
			return nil, err
		}
		p.InterruptOn(s.frontend.Context())
		s.log.Info("pool made for a server login", "data_source", ds.Name, "user", id.User)
		return p, nil
	}
	var coord *coordinator.Coordinator
	var coordPool *backend.Pool
	if cfg.Coordinate {
		var err error
		if coord, err = coordinator.New(l, cfg.CoordinatorDatabase); err != nil {
			closeAll()
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		o := opts
		o.Size = cfg.CoordinatorPoolSize
		if o.Size <= 0 {
			o.Size = DefaultCoordinatorPoolSize
		}
		if coordPool, err = backend.NewPool("coordinator", coord.DSN(), o); err != nil {
			closeAll()
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		if s.frontend != nil {
			coordPool.InterruptOn(s.frontend.Context())
		}
		host := cfg.CoordinatorRelayHost
		if host == "" {
			host, err = coordinator.RelayHost(coord.DSN())
		}
		if err == nil {
			err = coord.StartRelay(host)
		}
		if err != nil {
			closeAll()
			coordPool.Close()
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
	}
	maxMoved := cfg.CoordinatorMaxMoved
	switch {
	case maxMoved == 0:
		maxMoved = DefaultCoordinatorMaxMoved
	case maxMoved < 0:
		maxMoved = 0
	}
	if coord != nil && maxMoved > 0 {
		// What moved may be sorted or hashed into temporary files there: as much.
		coord.SetTempFileLimit(maxMoved)
	}
	r, err := router.New(router.Config{Rules: l, Pools: pools, Mode: cfg.PoolMode, TwoPhase: cfg.TwoPhase, SettleInterval: cfg.SettleInterval,
		SettleDial: cfg.Pool.TCP.WithDefaults().Dial(), LockWaitTimeout: cfg.LockWaitTimeout, DeadlockInterval: cfg.DeadlockInterval, CrossPoolWait: cfg.CrossPoolWait,
		MaxTransactions: cfg.MaxTransactions, CheckoutTimeout: cfg.Pool.CheckoutTimeout, PoolFor: poolFor, Logger: s.log,
		MaxHeld: cfg.MaxHeld, Coordinator: coord, CoordinatorPool: coordPool, CoordinatorMaxMoved: maxMoved})
	if err != nil {
		closeAll()
		if coordPool != nil {
			coordPool.Close()
			coord.Close()
		}
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return r, nil
}

// allPools returns every pool: the data sources' own user's, and those made for other
// server logins.
func (s *Server) allPools() []*backend.Pool {
	if s.router == nil {
		return nil
	}
	return s.router.Current().AllPools()
}

func (s *Server) closePools() {
	for _, p := range s.allPools() {
		p.Close()
	}
}

// Router returns the proxy's router in force (a layout switch replaces it).
func (s *Server) Router() *router.Router { return s.router.Current() }

// MetricsHandler serves the proxy's metrics (per pool: connections in use, idle,
// waiting; clients) in Prometheus's text format, for /metrics.
func (s *Server) MetricsHandler() http.Handler { return s.admin.MetricsHandler() }

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("proxy: server closed")

// Serve accepts connections on ln until Shutdown; it closes ln. It returns
// ErrServerClosed after Shutdown, else the listener's error.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.mu.listeners[ln] = true
	s.serving.Add(1)
	s.mu.Unlock()
	defer s.serving.Done()
	defer ln.Close()
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.mu.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Too many open files and the like: wait a little, as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		select {
		case s.conns <- struct{}{}:
		default:
			nc.Close()
			continue
		}
		s.serving.Go(func() {
			defer func() { <-s.conns }()
			if tc, ok := nc.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
				if err := s.cfg.ClientTCP.Apply(tc); err != nil {
					s.log.Warn("client connection: keepalive settings", "err", err)
				}
			}
			s.frontend.Serve(rawio.Wrap(nc))
		})
	}
}

// ListenAndServe listens on the TCP address addr and serves; ready, when not nil, is
// called with the bound address (addr may have port 0) once the proxy accepts
// connections.
func (s *Server) ListenAndServe(addr string, ready func(net.Addr)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	s.log.Info("shard-proxy listening", "addr", ln.Addr().String(), "database", s.cfg.Database,
		"data_sources", len(s.Router().Pools()), "pool_mode", s.cfg.PoolMode.String(), "max_transactions", s.Router().MaxTransactions(),
		"procs", runtime.GOMAXPROCS(0))
	if ready != nil {
		ready(ln.Addr())
	}
	return s.Serve(ln)
}

// Shutdown stops accepting connections, lets the clients finish their transactions
// (idle ones are disconnected at once), and closes the pools. When ctx ends first, the
// remaining clients are disconnected and their transactions rolled back. It is
// idempotent; it returns ctx's error when it had to cut clients off.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		s.mu.Lock()
		s.mu.closed = true
		for ln := range s.mu.listeners {
			ln.Close()
		}
		s.mu.Unlock()
		err = s.frontend.Shutdown(ctx)
		s.serving.Wait()
		close(s.stop)
		s.logger.Wait()
		s.Router().Close()
		s.closePools()
		s.logPools("pools at shutdown")
	})
	return err
}

// Close shuts down without waiting for clients.
func (s *Server) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Shutdown(ctx)
	return nil
}

// Stats is a snapshot of the proxy: its clients and, per data source and server user,
// its pool (the data sources' own user's first, in data source order).
type Stats struct {
	Frontend frontend.Stats
	Pools    []backend.Stats
}

// Stats returns the proxy's counters.
func (s *Server) Stats() Stats {
	st := Stats{Frontend: s.frontend.Stats()}
	for _, p := range s.allPools() {
		st.Pools = append(st.Pools, p.Stats())
	}
	return st
}

func (s *Server) logPools(msg string) {
	for _, p := range s.allPools() {
		st := p.Stats()
		s.log.Info(msg, "data_source", st.DataSource, "user", st.User, "in_use", st.InUse, "idle", st.Idle, "waiting", st.Waiting, "waiting_turn", st.TurnWaiting,
			"opened", st.Opened, "closed", st.Closed, "checkout_timeouts", st.Timeouts, "clients", s.frontend.Stats().Clients)
	}
}
