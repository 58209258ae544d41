// Package router is the part of the proxy between a client's protocol session
// (package frontend) and the servers (package backend): it plans each statement with
// the SQL core (package sqlplan), runs it on the data sources it needs, and writes the
// answer back in the client's protocol.
//
// A statement that runs on one data source takes the fast path: the proxy prepares it
// on the server connection (once per connection and statement text), binds the client's
// values and relays the server's answer message by message. A statement that spans data
// sources goes through the SQL core's engine (package sqlexec), which runs the parts
// and merges them exactly as one database would answer, or refuses.
//
// Everything a client session holds lives in one Session value: its prepared
// statements and portals, its transaction, and its settings (SET), which follow it to
// whichever server connection serves it and never reach another client.
package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/coordinator"
	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// PoolMode says how long a client keeps a server connection.
type PoolMode int

// Pool modes.
const (
	// PoolTransaction lends a client a server connection for one transaction (or one
	// statement outside a transaction).
	PoolTransaction PoolMode = iota
	// PoolSession lends a client its server connections until it disconnects.
	PoolSession
)

func (m PoolMode) String() string {
	if m == PoolSession {
		return "session"
	}
	return "transaction"
}

// Config is what a Router needs.
type Config struct {
	Rules *rules.Compiled
	// MaxHeld bounds the bytes of rows one statement holds when its answer is read
	// whole (sqlexec.Engine.SetMaxHeld; 0: its default).
	MaxHeld int64
	// Pools has one pool per data source of Rules, in order.
	Pools []*backend.Pool
	Mode  PoolMode
	// TwoPhase commits transactions that span data sources with two-phase commit.
	TwoPhase bool
	// SettleInterval is how often, with TwoPhase, transactions left in doubt are
	// looked for and settled (0: sqlexec.DefaultSettleInterval; negative: only at
	// StartSettler). See sqlexec.Settler.
	SettleInterval time.Duration
	// SettleDial, with TwoPhase, opens the settler's and the committer's own
	// connections to the data sources (see sqlexec.SettlerConfig.Dial); nil: pgconn's.
	SettleDial pgconn.DialFunc
	// LockWaitTimeout bounds the lock waits of a transaction that spans several data
	// sources (0: unbounded, the default). Such a transaction may be half of a deadlock
	// across shards, which no server can see; the deadlock detector (DeadlockInterval)
	// finds those cycles, and this bound is a coarser backstop: when it runs out the
	// transaction ends as a deadlock victim (SQLSTATE 40P01), which clients retry, even
	// when it only waited behind a slow transaction. A transaction on one data source
	// is left to its server, which detects its deadlocks itself.
	LockWaitTimeout time.Duration
	// DeadlockInterval is how often transactions that span data sources are checked for
	// deadlocks across shards, from the servers' wait-for graphs (0:
	// sqlexec.DefaultDeadlockInterval; negative: never). The youngest transaction of a
	// cycle is ended with 40P01.
	DeadlockInterval time.Duration
	// CrossPoolWait bounds how long a transaction that holds server connections of
	// other data sources waits for a connection of one more (0:
	// DefaultCrossPoolWait). Transactions that each hold one pool's connections and
	// wait for another's can wait on each other with no server seeing it; when the
	// bound runs out the transaction ends as a deadlock victim (40P01), which clients
	// retry, freeing what it holds. A client that holds no connection cannot be part of
	// such a cycle and waits up to the pool's checkout timeout.
	CrossPoolWait time.Duration
	// MaxTransactions, when positive, bounds how many clients hold server connections
	// at once in transaction pooling, each for a transaction or for a statement outside
	// one; the others wait their turn, up to CheckoutTimeout. A client holds at most one
	// connection of each pool, so with MaxTransactions below the smallest pool's size no
	// pool is ever exhausted by clients: transactions that span pools never wait on
	// each other's, which without the bound can stall a heavy load of them (each holds
	// one pool's connections and waits, in vain, for another's), and a connection of
	// each pool stays for the router's own statements (the catalog, the deadlock
	// detector). New refuses a bound that leaves none. AutoMaxTransactions picks one
	// less than the smallest pool's size when there are several pools in transaction
	// pooling, and no bound otherwise.
	MaxTransactions int
	// CheckoutTimeout bounds a client's wait for its turn under MaxTransactions (0:
	// backend.DefaultCheckoutTimeout).
	CheckoutTimeout time.Duration
	// PoolFor makes the pool of a server login other than the data sources' own for
	// data source ds, the first time a client of that login needs one (see Identity);
	// nil makes every client run as the data sources' own user.
	PoolFor func(id Identity, ds int) (*backend.Pool, error)
	// Coordinator, when set, answers the SELECTs the merge cannot answer exactly over
	// several shards (sqlplan.Options.Coordinate), through CoordinatorPool, a pool of
	// connections to its database as the data sources' own user. Clients that run as
	// another server login are refused them.
	Coordinator     *coordinator.Coordinator
	CoordinatorPool *backend.Pool
	// CoordinatorMaxMoved bounds the bytes of rows one coordinator statement reads from
	// the shards, counted while it runs by the coordinator's relay (which Close
	// stops); past it the statement fails with 54000. It bounds as well the rows an
	// INSERT ... SELECT into a sharded table holds (sqlplan.Feed). 0: no bound.
	CoordinatorMaxMoved int64
	// Logger receives the router's log lines; nil discards them.
	Logger *slog.Logger
}

// DefaultCrossPoolWait is the usual Config.CrossPoolWait.
const DefaultCrossPoolWait = 5 * time.Second

// DefaultLockWaitTimeout is the proxy's usual LockWaitTimeout: none, since the
// deadlock detector ends cross-shard deadlocks without failing slow lock waits.
const DefaultLockWaitTimeout = 0

// ErrConfig is wrapped by New's errors about a bad Config.
var ErrConfig = errors.New("router: bad config")

// Identity is who a client's statements run as on the data sources: a server user
// and its password. The zero Identity is the data sources' own user, the one in their
// DSNs, which the router's own statements (the catalog, the deadlock detector,
// two-phase recovery) run as too.
type Identity struct {
	User     string
	Password string
}

// Router holds what every client session shares: the rules, the planner and its plan
// cache, the engine, the catalog, and the pools. It is safe for concurrent use.
type Router struct {
	rules *rules.Compiled
	pools []*backend.Pool // the data sources' own user's
	// coord answers what the merge cannot (Config.Coordinator); ownPools are pools
	// followed by coordPool, the data sources' own user's sessions' pools, where the
	// coordinator is data source sqlplan.CoordinatorSource.
	coord      *coordinator.Coordinator
	coordPool  *backend.Pool
	ownPools   []*backend.Pool
	coordBound int64
	coordStats struct {
		statements, rows, bytes, cut, lastRows, lastBytes atomic.Int64
	}
	poolFor func(Identity, int) (*backend.Pool, error)
	// logins holds, by server user, the pools its clients use, one per data source, as
	// pgbouncer and PgDog keep them: made on first use, or the data source's own pool
	// where its DSN names that user.
	logins struct {
		sync.Mutex
		pools map[string][]*backend.Pool
	}
	mode      PoolMode
	catalog   *sqlexec.Catalog
	planner   *sqlplan.Planner
	engine    *sqlexec.Engine
	committer *sqlexec.Committer
	settler   *sqlexec.Settler // with TwoPhase
	detector  *sqlexec.DeadlockDetector
	log       *slog.Logger

	lockWait    time.Duration
	lockWaitSQL string
	poolWait    time.Duration // Config.CrossPoolWait
	// turns holds a token per client holding server connections (Config.MaxTransactions);
	// nil without a bound.
	turns       chan struct{}
	turnTimeout time.Duration
	// pause holds new units of work during the admin console's PAUSE.
	pause pauseGate

	// generation counts schema changes made through the proxy: a client's prepared
	// statement planned in an older generation is planned again before it runs.
	generation atomic.Uint64
	// sessions numbers the sessions; a router that takes another's place (Supersede)
	// shares its counter, so that sessions keep unique numbers across a switch.
	sessions *atomic.Uint64
	// successor is the router that took this one's place (Supersede): sessions move
	// to it at the start of their next unit of work.
	successor atomic.Pointer[Router]
	// warmedAt is the generation of the router whose plans and descriptions Warm
	// copied (Supersede forgets them if DDL ran since).
	warmedAt atomic.Uint64

	describes describeCache

	params struct {
		sync.Mutex
		values map[string]string // ParameterStatus values of the default data source
	}

	// lastWarned is, per data source, when the log last said it is unavailable (unix
	// nanoseconds): once every few seconds is enough, however many clients fail.
	lastWarned []atomic.Int64
}

// warnEvery bounds how often the log repeats that a data source is unavailable.
const warnEvery = 5 * time.Second

// noteUnavailable logs that a data source could not serve a statement, at most once
// every warnEvery per data source.
func (r *Router) noteUnavailable(err error) {
	var se *sqlexec.ShardError
	if !errors.As(err, &se) || se.DataSource < 0 || se.DataSource >= len(r.lastWarned) {
		return
	}
	var pe *pgconn.PgError
	if errors.As(se.Err, &pe) && pe.Severity != "FATAL" && pe.Severity != "PANIC" {
		return // the server's answer to a statement, not a failure of the data source
	}
	now := time.Now().UnixNano()
	last := &r.lastWarned[se.DataSource]
	if prev := last.Load(); now-prev < int64(warnEvery) || !last.CompareAndSwap(prev, now) {
		return
	}
	r.log.Warn("data source unavailable", "data_source", se.Name, "err", se.Err)
}

// New returns a router. It makes no connection.
func New(cfg Config) (*Router, error) {
	if cfg.Rules == nil {
		return nil, errors.Join(ErrConfig, errors.New("no rules"))
	}
	if len(cfg.Pools) != cfg.Rules.NumDataSources() {
		return nil, errors.Join(ErrConfig, errors.New("one pool per data source is needed"))
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Router{rules: cfg.Rules, pools: cfg.Pools, poolFor: cfg.PoolFor, mode: cfg.Mode, log: log, lockWait: cfg.LockWaitTimeout, poolWait: cfg.CrossPoolWait}
	r.logins.pools = map[string][]*backend.Pool{}
	r.sessions = new(atomic.Uint64)
	if r.poolWait <= 0 {
		r.poolWait = DefaultCrossPoolWait
	}
	if cfg.MaxTransactions == AutoMaxTransactions {
		cfg.MaxTransactions = autoMaxTransactions(cfg.Pools, cfg.Mode)
	}
	for _, p := range cfg.Pools {
		if size := p.Stats().Size; cfg.MaxTransactions > 0 && cfg.MaxTransactions >= size {
			return nil, errors.Join(ErrConfig, fmt.Errorf("max transactions %d must be below the pool size %d of %s: a connection of each pool stays for the deadlock detector and the catalog", cfg.MaxTransactions, size, p.Name()))
		}
	}
	if cfg.MaxTransactions > 0 && cfg.Mode == PoolTransaction {
		r.turns = make(chan struct{}, cfg.MaxTransactions)
		r.turnTimeout = cfg.CheckoutTimeout
		if r.turnTimeout <= 0 {
			r.turnTimeout = backend.DefaultCheckoutTimeout
		}
	}
	if r.lockWait > 0 {
		r.lockWaitSQL = fmt.Sprintf("SET LOCAL lock_timeout = %d", max(r.lockWait.Milliseconds(), 1))
	}
	r.catalog = sqlexec.NewCatalog(cfg.Rules, serverPool{r})
	r.ownPools = r.pools
	r.coordBound = cfg.CoordinatorMaxMoved
	if cfg.Coordinator != nil {
		if cfg.CoordinatorPool == nil {
			return nil, errors.Join(ErrConfig, errors.New("a coordinator needs its pool"))
		}
		r.coord, r.coordPool = cfg.Coordinator, cfg.CoordinatorPool
		r.ownPools = append(slices.Clone(r.pools), r.coordPool)
	}
	r.planner = sqlplan.New(cfg.Rules, r.catalog, sqlplan.Options{Coordinate: r.coord != nil, ShardAggregates: r.coord != nil})
	r.committer = sqlexec.NewCommitter(cfg.Rules, cfg.TwoPhase)
	r.engine = sqlexec.NewEngine(cfg.Rules, r.catalog, r.committer)
	r.engine.SetMaxHeld(cfg.MaxHeld)
	if cfg.TwoPhase {
		settler, err := sqlexec.NewSettler(r.committer, sqlexec.SettlerConfig{Interval: cfg.SettleInterval, Dial: cfg.SettleDial, Logger: log})
		if err != nil {
			return nil, errors.Join(ErrConfig, err)
		}
		r.settler = settler
	}
	if cfg.DeadlockInterval >= 0 {
		r.detector = sqlexec.NewDeadlockDetector(cfg.Rules, serverPool{r}, cfg.DeadlockInterval)
		r.detector.Start()
	}
	r.describes.entries = map[describeKey]*description{}
	r.lastWarned = make([]atomic.Int64, cfg.Rules.NumDataSources())
	return r, nil
}

// AutoMaxTransactions, as Config.MaxTransactions, lets New choose the bound.
const AutoMaxTransactions = -1

// autoMaxTransactions is the bound AutoMaxTransactions stands for: with several pools in
// transaction pooling, one less than the smallest pool's size, so that a transaction
// spanning pools never waits for another's pool; with one pool, which bounds its
// clients itself, or in session pooling, none.
func autoMaxTransactions(pools []*backend.Pool, mode PoolMode) int {
	if len(pools) < 2 || mode != PoolTransaction {
		return 0
	}
	smallest := pools[0].Stats().Size
	for _, p := range pools[1:] {
		smallest = min(smallest, p.Stats().Size)
	}
	return max(smallest-1, 0)
}

// MaxTransactions returns the bound on clients holding server connections at once (0:
// none).
func (r *Router) MaxTransactions() int { return cap(r.turns) }

// Rules returns the router's rules.
func (r *Router) Rules() *rules.Compiled { return r.rules }

// Current returns the router in force: r, or the one that took its place (Supersede),
// or the one that took that one's place, and so on.
func (r *Router) Current() *Router {
	for {
		n := r.successor.Load()
		if n == nil {
			return r
		}
		r = n
	}
}

// ErrNotDrained is wrapped by Supersede when the router is not paused with every unit
// of work ended.
var ErrNotDrained = errors.New("router: not paused, or clients are inside a unit of work")

// Supersede puts n in r's place, as a layout switch does: new sessions start on n, and
// each session of r moves to n at the start of its next unit of work (Session.Hold),
// its prepared statements planned again there. r must be paused (Pause) with no unit
// of work in progress, so that no client holds a connection of r's pools or a plan of
// r's layout, but the units that passed a pause of some tables (PauseTables), which
// touch none of them on r (Session.pass); its held clients go on once it is resumed
// (Resume), on n. n must be new
// (no session yet). r's pools, settler and deadlock detector are the caller's to close.
func (r *Router) Supersede(n *Router) error {
	g := &r.pause
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.paused || g.active > 0 {
		return fmt.Errorf("%w (paused %v, %d inside)", ErrNotDrained, g.paused, g.active)
	}
	if r.successor.Load() != nil {
		return errors.New("router: superseded already")
	}
	n.sessions = r.sessions
	if n.warmedAt.Load() != r.generation.Load() {
		// DDL ran through r since n was warmed from it (Warm), or n was not warmed:
		// n keeps nothing of r's.
		n.schemaChanged()
	}
	// Every statement prepared on r is planned again on n, by n's rules.
	n.generation.Store(r.generation.Load() + 1)
	r.successor.Store(n)
	return nil
}

// Close stops the router's settler and deadlock detector. Sessions must have ended.
func (r *Router) Close() {
	if r.coord != nil {
		r.coord.Close()
	}
	if r.settler != nil {
		r.settler.Close()
	}
	if r.detector != nil {
		r.detector.Close()
	}
}

// CoordinatorStats counts the statements the coordinator database answered and what
// they read from the shards (see coordinator.Movement).
type CoordinatorStats struct {
	Statements int64
	// Rows and Bytes are what the shards sent the coordinator, over every statement;
	// LastRows and LastBytes the last statement's.
	Rows, Bytes, LastRows, LastBytes int64
	// Cut counts the statements stopped past MaxMoved bytes (0: no bound).
	Cut, MaxMoved int64
}

// CoordinatorStats returns the coordinator's counters; ok is false without one.
func (r *Router) CoordinatorStats() (st CoordinatorStats, ok bool) {
	if r.coord == nil {
		return st, false
	}
	c := &r.coordStats
	return CoordinatorStats{Statements: c.statements.Load(), Rows: c.rows.Load(), Bytes: c.bytes.Load(),
		LastRows: c.lastRows.Load(), LastBytes: c.lastBytes.Load(), Cut: c.cut.Load(), MaxMoved: r.coordBound}, true
}

// DeadlockVictims returns how many transactions the deadlock detector ended.
func (r *Router) DeadlockVictims() int64 {
	if r.detector == nil {
		return 0
	}
	return r.detector.Victims()
}

// Pools returns the data sources' own user's pools, one per data source.
func (r *Router) Pools() []*backend.Pool { return r.pools }

// AllPools returns every pool once: the data sources' own user's, then those made for
// other server users, by user.
func (r *Router) AllPools() []*backend.Pool {
	r.logins.Lock()
	defer r.logins.Unlock()
	out := slices.Clone(r.ownPools)
	for _, user := range slices.Sorted(maps.Keys(r.logins.pools)) {
		for _, p := range r.logins.pools[user] {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// poolsOf returns the pools a client that runs as id uses, one per data source,
// making them the first time a client of its server user arrives. Clients of one
// server user share its pools (those made log in with the first one's password); where
// a data source's DSN names that user, its own pool serves them.
func (r *Router) poolsOf(id Identity) ([]*backend.Pool, error) {
	if id.User == "" || r.poolFor == nil {
		return r.ownPools, nil
	}
	r.logins.Lock()
	defer r.logins.Unlock()
	if pools, ok := r.logins.pools[id.User]; ok {
		return pools, nil
	}
	pools := make([]*backend.Pool, len(r.pools))
	own := true
	for _, p := range r.pools {
		own = own && p.User() == id.User
	}
	if r.coordPool != nil && own {
		// Every data source's own user (each foreign server maps to its data source's
		// DSN user): its sessions reach the coordinator too.
		pools = append(pools, r.coordPool)
	}
	for ds, own := range r.pools {
		if own.User() == id.User {
			pools[ds] = own
			continue
		}
		p, err := r.poolFor(id, ds)
		if err != nil {
			for _, q := range pools[:ds] {
				if !slices.Contains(r.pools, q) {
					q.Close()
				}
			}
			return nil, err
		}
		pools[ds] = p
	}
	r.logins.pools[id.User] = pools
	return pools, nil
}

// Mode returns the pool mode.
func (r *Router) Mode() PoolMode { return r.mode }

// StartSettler starts the settler of two-phase transactions in doubt (with TwoPhase;
// otherwise it does nothing): a first pass, which needs every data source and finishes
// what a crash left behind, then one every SettleInterval until Close. Call it before
// serving clients. See sqlexec.Settler.
func (r *Router) StartSettler(ctx context.Context) error {
	if r.settler == nil {
		return nil
	}
	return r.settler.Start(ctx)
}

// Settler returns the settler of two-phase transactions in doubt; nil without
// TwoPhase.
func (r *Router) Settler() *sqlexec.Settler { return r.settler }

// Committer returns the router's committer (for tests that stop a commit between its
// phases: Committer.SetPhaseHook).
func (r *Router) Committer() *sqlexec.Committer { return r.committer }

// serverPool lends the router's own connections (for the catalog and the deadlock
// detector): connections with no client's settings.
type serverPool struct{ r *Router }

var _ sqlexec.Pool = serverPool{}

// Acquire implements sqlexec.Pool.
func (p serverPool) Acquire(ctx context.Context, ds int) (sqlexec.Lease, error) {
	pool := p.r.pools[ds]
	// The router's own statements (the catalog, the deadlock detector) may be waited
	// for by a client that holds connections of this pool: they wait no longer than a
	// client holding other pools would.
	wait := min(p.r.poolWait, pool.CheckoutTimeout())
	c, err := pool.AcquireWithin(ctx, wait, nil)
	if errors.Is(err, backend.ErrWaitElapsed) {
		pool.CountTimeout()
		return nil, pool.TimeoutError(wait)
	}
	if err != nil {
		return nil, err
	}
	if err := c.ApplySettings(ctx, "", nil); err != nil {
		pool.Release(c, reusable(err))
		return nil, err
	}
	return serverLease{pool: pool, c: c}, nil
}

type serverLease struct {
	pool *backend.Pool
	c    *backend.Conn
}

func (l serverLease) Run(_ context.Context, fn func(*pgconn.PgConn) error) error {
	return fn(l.c.PgConn())
}
func (l serverLease) Release(reuse bool) { l.pool.Release(l.c, reuse) }

// reusable reports whether a connection that saw err may serve someone else
// (sqlexec.Reusable).
func reusable(err error) bool { return sqlexec.Reusable(err) }

// schemaChanged forgets what DDL may have made stale: plans, catalog answers and
// statement descriptions.
func (r *Router) schemaChanged() {
	r.generation.Add(1)
	r.planner.Invalidate()
	r.catalog.Invalidate()
	r.describes.reset()
}

// description is what Describe answers for a statement: its parameter types and the
// columns it returns (nil: none, NoData).
type description struct {
	params []uint32
	fields []pgproto3.FieldDescription
}

type describeKey struct {
	sql, oids, settings string
	user                string // the server user: what it may describe is its own
}

// describeCache keeps statement descriptions by text, parameter types and settings,
// so that a driver that describes every statement it runs (libpq, pgx) costs a server
// round trip once per statement text, not once per execution.
type describeCache struct {
	mu      sync.Mutex
	entries map[describeKey]*description
}

const maxDescriptions = 8192

func (c *describeCache) get(k describeKey) *description {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[k]
}

func (c *describeCache) put(k describeKey, d *description) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= maxDescriptions {
		clear(c.entries)
	}
	c.entries[k] = d
}

func (c *describeCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.entries)
}

// reportedParameters are the settings PostgreSQL reports to clients with
// ParameterStatus.
var reportedParameters = []string{
	"application_name", "client_encoding", "DateStyle", "default_transaction_read_only",
	"in_hot_standby", "integer_datetimes", "IntervalStyle", "is_superuser", "server_encoding",
	"server_version", "session_authorization", "standard_conforming_strings", "TimeZone",
}

// fallbackParameters answer when the default data source cannot be reached.
var fallbackParameters = map[string]string{
	"application_name": "", "client_encoding": "UTF8", "DateStyle": "ISO, MDY",
	"default_transaction_read_only": "off", "in_hot_standby": "off", "integer_datetimes": "on",
	"IntervalStyle": "postgres", "is_superuser": "off", "server_encoding": "UTF8",
	"server_version": "15.0", "standard_conforming_strings": "on", "TimeZone": "UTC",
}

// readParameters reads the reported settings of a server connection.
func readParameters(pg *pgconn.PgConn) map[string]string {
	out := map[string]string{}
	for _, name := range reportedParameters {
		if v := pg.ParameterStatus(name); v != "" || name == "application_name" {
			out[name] = v
		}
	}
	return out
}

// serverParameters returns the default data source's reported settings, read once.
func (r *Router) serverParameters(ctx context.Context) map[string]string {
	r.params.Lock()
	defer r.params.Unlock()
	if r.params.values != nil {
		return r.params.values
	}
	l, err := serverPool{r}.Acquire(ctx, r.rules.DefaultDataSource())
	if err != nil {
		return fallbackParameters
	}
	l.Run(ctx, func(pg *pgconn.PgConn) error {
		r.params.values = readParameters(pg)
		return nil
	})
	l.Release(true)
	return r.params.values
}

// clientError turns an error into what the client should see: a server connection
// that failed, or a server that ended its session (a FATAL error, say at shutdown), is
// the data source being unavailable (08006), never a FATAL for the client's own
// connection; a lock wait the proxy bounded is a deadlock (40P01).
func (s *Session) clientError(err error) error {
	s.r.noteUnavailable(err)
	err = sqlexec.LogicalNames(err, s.r.rules)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Severity == "FATAL" || pe.Severity == "PANIC") {
		name := "?"
		var se *sqlexec.ShardError
		if errors.As(err, &se) {
			name = se.Name
		}
		return &pgconn.PgError{Severity: "ERROR", Code: "08006",
			Message: fmt.Sprintf("shardlab: data source %s is unavailable: %s (SQLSTATE %s)", name, pe.Message, pe.Code)}
	}
	return s.deadlockVictim(err)
}

// deadlockVictim turns a lock timeout of a transaction that spans data sources, which
// the proxy's own bound caused, into the deadlock error clients know how to retry.
func (s *Session) deadlockVictim(err error) error {
	var pe *pgconn.PgError
	if s.r.lockWait == 0 || !errors.As(err, &pe) || pe.Code != "55P03" || !strings.Contains(pe.Message, "lock timeout") || !s.conns.spans() {
		return err
	}
	return &pgconn.PgError{Severity: "ERROR", Code: "40P01",
		Message: "deadlock detected",
		Detail: fmt.Sprintf("shardlab: a lock wait of this transaction, which spans several data sources, lasted over %v: "+
			"it may be half of a deadlock across shards, which no single server can detect, and was ended as its victim", s.r.lockWait),
		Hint: "Retry the transaction.",
	}
}

// Route explains where a simple-protocol statement (values inline) would run, without
// running it: the routing answer, each target's data source, shard and rewritten SQL,
// and the merge. A statement the sharding layer refuses returns its refusal.
func (r *Router) Route(ctx context.Context, sql string) (string, error) {
	stmts := sqlplan.SplitStatements(sql)
	if len(stmts) != 1 {
		return "", pgError("42601", "route preview takes one statement, got %d", len(stmts))
	}
	plan, lits, err := r.planner.PlanSimple(ctx, stmts[0])
	if err != nil {
		return "", err
	}
	switch plan.Kind {
	case sqlplan.KindEmpty, sqlplan.KindTransaction, sqlplan.KindSet, sqlplan.KindDiscard:
		return fmt.Sprintf("%s: the proxy handles it in the client's session (settings and transactions follow the client to every data source it uses)\n", plan.Kind), nil
	case sqlplan.KindCopy:
		var b strings.Builder
		fmt.Fprintf(&b, "copy of %s (%s table)\n", plan.Copy.Table.Name, plan.Copy.Table.Kind)
		for i, n := range plan.Copy.Table.Nodes {
			fmt.Fprintf(&b, "  %s shard %d: %s\n", r.rules.DataSources()[n.DataSource].Name, i, plan.Copy.SQL[i])
		}
		return b.String(), nil
	}
	if plan.Keys != nil {
		return plan.ExplainKeys(), nil // previewing draws no keys
	}
	if plan.Feed != nil {
		// The query's route; its rows, not known before it runs, are routed one by one.
		q, qlits, err := r.planner.PlanSimple(ctx, plan.Feed.Query)
		if err != nil {
			return "", err
		}
		qb, err := q.BindSimple(plan.Feed.Query, qlits)
		if err != nil {
			return "", err
		}
		return plan.Feed.Explain() + "  query route: " + strings.ReplaceAll(strings.TrimSuffix(qb.Explain(), "\n"), "\n", "\n  ") + "\n", nil
	}
	b, err := plan.BindSimple(stmts[0], lits)
	if err != nil && plan.Pre != nil && errors.Is(err, sqlplan.ErrUnsupported) {
		own, perr := r.planner.Prepare(ctx, stmts[0]) // the subqueries with their literals
		if perr == nil && own.Pre != nil {
			return own.Pre.Explain(plan.Kind, err), nil
		}
	}
	if err != nil {
		return "", err
	}
	return b.Explain(), nil
}
