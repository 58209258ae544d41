// Package backend is the proxy's server side: one pool of PostgreSQL connections per
// data source, and the connection type that runs a client's statements on a server,
// relaying the answer message by message.
//
// A Conn remembers what it carries from one user to the next, so that nothing leaks
// between clients and nothing is done twice: the statements prepared on it (named by
// the proxy, found by their text) and the settings (SET, set_config, the role) applied
// to it, identified by a key. A client that takes a connection whose settings differ
// from its own resets it (the session authorization, the role, RESET ALL) and applies
// its own; a connection that is not idle in a transaction, or that saw an error that
// may have broken it, is closed rather than pooled. State that no such reset undoes (a
// temporary table, a session advisory lock) keeps its client on the connection: see
// Conn.HoldsSessionState.
package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/postgresdb"
)

// Defaults for zero Options fields.
const (
	DefaultSize = 20
	// DefaultCheckoutTimeout is pgbouncer's query_wait_timeout. A client that holds no
	// server connection cannot be part of a wait cycle (one that holds another pool's
	// connection gets 40P01 instead, see Session), so a long wait is safe; a short one
	// failed whole sysbench runs at 256 threads with 53300 while the queue drained.
	DefaultCheckoutTimeout = 120 * time.Second
	// DefaultConnectTimeout is pgbouncer's server_connect_timeout: a server that is up
	// but busy forking dozens of backends at once (a pool filling under load) can take
	// seconds to finish a login, and a client whose statement waits for it should not
	// fail for that (the sweep saw 5 s exceeded once on this 2-core machine).
	DefaultConnectTimeout = 15 * time.Second
	// DefaultIdleCheck is how long a connection may sit idle before it is checked for
	// life before reuse (a server restart leaves dead connections in the pool).
	DefaultIdleCheck = time.Second
	// DefaultBanTime is how long new connections to a data source are not tried after
	// one failed to connect (pgcat's ban_time, shortened: a shard has no replica to
	// send its statements to instead, so the ban only spares them the wait for a
	// connect timeout each, and a healed shard should serve again soon).
	DefaultBanTime = 5 * time.Second
)

// Options tunes a Pool. The zero value is usable.
type Options struct {
	// Size bounds the connections open to the data source, in use or idle.
	Size int
	// CheckoutTimeout bounds how long Acquire waits for a connection when all of them
	// are in use.
	CheckoutTimeout time.Duration
	// ConnectTimeout bounds dialling, TLS and authentication of a new connection.
	ConnectTimeout time.Duration
	// IdleCheck: a connection idle for longer is pinged before it is handed out.
	// Negative turns the check off.
	IdleCheck time.Duration
	// TCP sets keepalive and TCP_USER_TIMEOUT on every server connection (zero fields:
	// the defaults, see TCP): a statement in flight on a server that the network cut off
	// fails after about TCP.UserTimeout, naming the data source, instead of waiting for
	// an answer that never comes.
	TCP TCP
	// BanTime: after the TCP connection to the data source cannot be made (refused, no
	// route, no answer before the connect timeout), Acquire fails at once for this long
	// instead of trying again, unless an idle connection is at hand. A failure once the
	// TCP connection is up (the server's refusal, a slow login) bans nothing: the data
	// source is reachable. A dial that succeeds lifts the ban. Negative turns it off.
	BanTime time.Duration
	// User and Password, when User is set, log in as that user instead of the DSN's
	// (a pool per server user; Password "" for a login that needs none).
	User     string
	Password string
	// RuntimeParams are sent in every connection's startup packet, as settings the
	// connection starts with (and returns to on RESET ALL or DISCARD ALL).
	RuntimeParams map[string]string
}

func (o Options) withDefaults() Options {
	if o.Size <= 0 {
		o.Size = DefaultSize
	}
	if o.CheckoutTimeout <= 0 {
		o.CheckoutTimeout = DefaultCheckoutTimeout
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.IdleCheck == 0 {
		o.IdleCheck = DefaultIdleCheck
	}
	if o.BanTime == 0 {
		o.BanTime = DefaultBanTime
	}
	o.TCP = o.TCP.WithDefaults()
	return o
}

// ErrPoolClosed is returned by Acquire after Close.
var ErrPoolClosed = errors.New("backend: pool closed")

// ErrBanned is wrapped by Acquire's error while the data source is banned (see
// Options.BanTime).
var ErrBanned = errors.New("backend: banned after a failed connect")

// Pool is a bounded pool of connections to one data source. Connections are made on
// demand, so a data source that is down fails only the statements that need it.
type Pool struct {
	name string
	cfg  *pgconn.Config
	opts Options

	// tokens holds one token per connection in use or being dialled; idle connections
	// hold none, and one is dialled only when none is idle, so at most Size are open.
	tokens chan struct{}

	mu struct {
		sync.Mutex
		idle   []*Conn // most recently used last
		closed bool
		// base, when set (InterruptOn), ends every exchange of the pool's connections
		// when it ends.
		base context.Context
		// bannedUntil: no connection is dialled before then (Options.BanTime), since
		// the last dial failed with banErr.
		bannedUntil time.Time
		banErr      error
		// connected is when a dial last succeeded: a dial that started before then and
		// fails later bans nothing, since the data source was reachable after it began.
		connected time.Time
	}
	dialing sync.WaitGroup
	// byServer finds a Conn by its server connection, for the notification handler.
	byServer sync.Map // *pgconn.PgConn -> *Conn

	stats struct {
		inUse, waiting, turnWaiting atomic.Int64
		pinned, resets, stateChecks atomic.Int64
		opened, closed, timeouts    atomic.Int64
		acquires, waitedNanoseconds atomic.Int64
		bans, deadIdle              atomic.Int64
	}
}

// NewPool returns a pool for the data source named name at dsn. It only parses the DSN;
// no connection is made until Acquire.
func NewPool(name, dsn string, o Options) (*Pool, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("backend: data source %s (%s): %w", name, postgresdb.RedactDSN(dsn), err)
	}
	o = o.withDefaults()
	if o.User != "" {
		cfg.User, cfg.Password = o.User, o.Password
	}
	maps.Copy(cfg.RuntimeParams, o.RuntimeParams)
	dial := o.TCP.Dial()
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if n, ok := ctx.Value(dialNoteKey{}).(*dialNote); ok && err == nil {
			n.connected.Store(true)
		}
		return nc, err
	}
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > o.ConnectTimeout {
		cfg.ConnectTimeout = o.ConnectTimeout
	}
	p := &Pool{name: name, cfg: cfg, opts: o, tokens: make(chan struct{}, o.Size)}
	cfg.OnNotification = func(pg *pgconn.PgConn, n *pgconn.Notification) {
		if c, ok := p.byServer.Load(pg); ok {
			c.(*Conn).noteNotification(n)
		}
	}
	cfg.OnNotice = func(pg *pgconn.PgConn, n *pgconn.Notice) {
		if c, ok := p.byServer.Load(pg); ok {
			c.(*Conn).noteNotice(n)
		}
	}
	return p, nil
}

// InterruptOn makes the end of ctx interrupt every exchange of the pool's connections
// (and break them), as if each exchange had been made under ctx; an exchange made
// under ctx itself then needs no watch of its own, which spares an allocation and a
// lock on ctx per statement. A server passes the context it cancels when a shutdown
// gives up waiting for its clients. Call it before the first Acquire.
func (p *Pool) InterruptOn(ctx context.Context) {
	p.mu.Lock()
	p.mu.base = ctx
	p.mu.Unlock()
}

// Name returns the data source's name.
func (p *Pool) Name() string { return p.name }

// User returns the server user the pool's connections log in as.
func (p *Pool) User() string { return p.cfg.User }

// Size returns the pool's bound.
func (p *Pool) Size() int { return p.opts.Size }

// Acquire returns a connection for the caller's exclusive use until Release. It waits
// at most the checkout timeout for one to become free, then fails with a
// *pgconn.PgError of SQLSTATE 53300 (too_many_connections) naming the data source; and
// cancelling ctx stops the wait and any dial in progress.
func (p *Pool) Acquire(ctx context.Context) (*Conn, error) {
	c, err := p.AcquireWithin(ctx, p.opts.CheckoutTimeout, nil)
	if errors.Is(err, ErrWaitElapsed) {
		p.stats.timeouts.Add(1)
		return nil, p.TimeoutError(p.opts.CheckoutTimeout)
	}
	return c, err
}

// ErrWaitElapsed is returned by AcquireWithin when no connection became free in time.
var ErrWaitElapsed = errors.New("backend: no connection became free in time")

// ErrWaitInterrupted is returned by AcquireWithin when its interrupt ended the wait.
var ErrWaitInterrupted = errors.New("backend: the wait for a connection was interrupted")

// TimeoutError is the error a client gets after waiting d in vain for a connection:
// SQLSTATE 53300, naming the data source.
func (p *Pool) TimeoutError(d time.Duration) error {
	return &pgconn.PgError{Severity: "ERROR", Code: "53300", Message: fmt.Sprintf(
		"shardlab proxy: no server connection to data source %s became free within %v (pool size %d, all in use)",
		p.name, d, p.opts.Size)}
}

// CountTimeout records a client's wait that ended with TimeoutError, for Stats.
func (p *Pool) CountTimeout() { p.stats.timeouts.Add(1) }

// AddTurnWaiting counts n more (or, negative, fewer) clients waiting for a turn to
// take one of the pool's connections (Stats.TurnWaiting).
func (p *Pool) AddTurnWaiting(n int64) { p.stats.turnWaiting.Add(n) }

// AddPinned counts n more (or, negative, fewer) clients kept on one of the pool's
// connections by state that lives there (Stats.Pinned).
func (p *Pool) AddPinned(n int64) { p.stats.pinned.Add(n) }

// CheckoutTimeout returns the pool's bound on waiting for a connection.
func (p *Pool) CheckoutTimeout() time.Duration { return p.opts.CheckoutTimeout }

// AcquireWithin is Acquire with its own bound on the wait for a free connection: past
// wait it returns ErrWaitElapsed. The bound covers the wait only, not connecting a new
// connection or checking an idle one, which ctx and the connect timeout bound. A value
// on interrupt (a client's cancel request) ends the wait too, with ErrWaitInterrupted,
// but not a dial or check in progress, which would waste a healthy connection.
func (p *Pool) AcquireWithin(ctx context.Context, wait time.Duration, interrupt <-chan struct{}) (*Conn, error) {
	p.stats.acquires.Add(1)
	select {
	case p.tokens <- struct{}{}:
	default:
		p.stats.waiting.Add(1)
		start := time.Now()
		t := time.NewTimer(wait)
		select {
		case p.tokens <- struct{}{}:
			t.Stop()
			p.stats.waiting.Add(-1)
			p.stats.waitedNanoseconds.Add(int64(time.Since(start)))
		case <-t.C:
			p.stats.waiting.Add(-1)
			return nil, ErrWaitElapsed
		case <-interrupt:
			t.Stop()
			p.stats.waiting.Add(-1)
			return nil, ErrWaitInterrupted
		case <-ctx.Done():
			t.Stop()
			p.stats.waiting.Add(-1)
			return nil, ctx.Err()
		}
	}
	// Holding a token: reuse an idle connection or dial a new one.
	var base context.Context
	for {
		p.mu.Lock()
		if p.mu.closed {
			p.mu.Unlock()
			<-p.tokens
			return nil, ErrPoolClosed
		}
		var c *Conn
		if n := len(p.mu.idle); n > 0 {
			c = p.mu.idle[n-1]
			p.mu.idle = p.mu.idle[:n-1]
		}
		if c == nil {
			if now := time.Now(); now.Before(p.mu.bannedUntil) {
				err := fmt.Errorf("%w %v ago (ban time %v): %w", ErrBanned,
					(p.opts.BanTime - p.mu.bannedUntil.Sub(now)).Round(time.Millisecond), p.opts.BanTime, p.mu.banErr)
				p.mu.Unlock()
				<-p.tokens
				return nil, err
			}
			p.dialing.Add(1)
		}
		base = p.mu.base
		p.mu.Unlock()
		if c == nil {
			break
		}
		if p.opts.IdleCheck > 0 && time.Since(c.lastUsed) > p.opts.IdleCheck {
			checked := time.Now()
			if err := p.check(ctx, c); err != nil {
				if ctx.Err() != nil {
					// The caller gave up, which says nothing about the connection: it
					// stays pooled, unless the interrupted check broke it.
					p.putIdle(c)
					<-p.tokens
					return nil, ctx.Err()
				}
				p.discard(c)
				if unheard(err) {
					// The network or the server's host failed (a timeout, a reset): the
					// connections idle as long are most likely gone too, and checking
					// them one by one would make this statement wait for each. Those
					// used since IdleCheck before the check began were fine a moment
					// before the silence and stay.
					p.discardIdleSince(checked.Add(-p.opts.IdleCheck))
				}
				continue
			}
		}
		p.stats.inUse.Add(1)
		c.lent.Store(true)
		return c, nil
	}
	defer p.dialing.Done()
	note := &dialNote{started: time.Now()}
	pg, err := pgconn.ConnectConfig(context.WithValue(ctx, dialNoteKey{}, note), p.cfg)
	if err != nil {
		p.noteDialFailure(ctx, note, err)
		<-p.tokens
		return nil, err
	}
	p.noteDialSuccess()
	p.stats.opened.Add(1)
	p.stats.inUse.Add(1)
	c := newConn(p, pg, base)
	c.lent.Store(true)
	return c, nil
}

// check pings a connection that sat idle: a server restart or a network cut leaves
// dead connections in a pool, and a statement should not be the one to find out.
func (p *Pool) check(ctx context.Context, c *Conn) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.ConnectTimeout)
	defer cancel()
	return c.pg.Ping(ctx)
}

// unheard reports whether a failed exchange heard nothing from the server: a
// timeout, a reset, the connection ended without a word. A server that answered (a
// FATAL error: its idle_session_timeout, an administrator's pg_terminate_backend)
// ended that one connection and is alive.
func unheard(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// noteDialSuccess lifts a ban: the data source is reachable.
func (p *Pool) noteDialSuccess() {
	p.mu.Lock()
	p.mu.connected = time.Now()
	p.mu.bannedUntil, p.mu.banErr = time.Time{}, nil
	p.mu.Unlock()
}

// dialNote is what a dial learns beside its error, which does not always say whether
// a TCP connection was made: pgconn replaces an error that is a timeout with its
// context's, the same for a SYN unanswered and a login too slow.
type dialNote struct {
	started   time.Time
	connected atomic.Bool // a TCP connection was made to one of the addresses tried
}

// dialNoteKey carries a *dialNote in the context of a dial, to the pool's dial function.
type dialNoteKey struct{}

// noteDialFailure bans the data source (Options.BanTime) after a dial that made no TCP
// connection (refused, no route, no answer to its SYN before the connect timeout);
// not after a failure once a connection was up (the server's refusal, a login slower
// than the connect timeout on a busy server), nor a dial its caller gave up, nor one
// that started before a dial that has since succeeded.
func (p *Pool) noteDialFailure(ctx context.Context, note *dialNote, err error) {
	if p.opts.BanTime < 0 || ctx.Err() != nil || note.connected.Load() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !note.started.After(p.mu.connected) {
		return
	}
	p.stats.bans.Add(1)
	p.mu.bannedUntil = time.Now().Add(p.opts.BanTime)
	p.mu.banErr = err
}

// discardIdleSince closes the idle connections last used before t.
func (p *Pool) discardIdleSince(t time.Time) {
	p.mu.Lock()
	var stale []*Conn
	kept := p.mu.idle[:0]
	for _, c := range p.mu.idle {
		if c.lastUsed.Before(t) {
			stale = append(stale, c)
		} else {
			kept = append(kept, c)
		}
	}
	clear(p.mu.idle[len(kept):])
	p.mu.idle = kept
	p.mu.Unlock()
	for _, c := range stale {
		p.stats.deadIdle.Add(1)
		p.discard(c)
	}
}

// Release gives a connection back. With reuse false, or when the connection is not
// idle outside a transaction (a client left in the middle of one), it is closed
// instead of pooled, so no transaction or half-read answer reaches another client.
func (p *Pool) Release(c *Conn, reuse bool) {
	p.stats.inUse.Add(-1)
	c.lent.Store(false)
	// After lent is cleared, a connection whose interrupt context ended may have been
	// interrupted since its last exchange: it is not pooled.
	interrupted := c.stopBase != nil && c.base.Err() != nil
	if !reuse || interrupted || c.pg.IsClosed() || c.pg.TxStatus() != 'I' || c.broken {
		p.discard(c)
		<-p.tokens
		return
	}
	c.lastUsed = time.Now()
	c.TakeNotifications() // a client's, never the next one's
	p.putIdle(c)
	<-p.tokens
}

// putIdle pools a connection that is not lent out, or closes it when it is closed
// already or the pool is. Whoever holds its token gives it back.
func (p *Pool) putIdle(c *Conn) {
	p.mu.Lock()
	if p.mu.closed || c.pg.IsClosed() {
		p.mu.Unlock()
		p.discard(c)
		return
	}
	p.mu.idle = append(p.mu.idle, c)
	p.mu.Unlock()
}

// discard closes a connection. Whoever holds its token gives it back.
func (p *Pool) discard(c *Conn) {
	p.byServer.Delete(c.pg)
	if c.stopBase != nil {
		c.stopBase()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	c.pg.Close(ctx)
	cancel()
	p.stats.closed.Add(1)
}

// Close closes the idle connections and makes Acquire fail; connections in use are
// closed when they are released. It waits for dials in progress. It is idempotent.
func (p *Pool) Close() {
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		return
	}
	p.mu.closed = true
	idle := p.mu.idle
	p.mu.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		p.discard(c)
	}
	p.dialing.Wait()
}

// Stats is a snapshot of a pool's counters.
type Stats struct {
	DataSource string
	User       string // the server user
	Size       int
	InUse      int64 // connections lent out
	Idle       int64 // connections open and free
	Waiting    int64 // Acquire calls waiting for a connection now
	// TurnWaiting counts the clients waiting, before they may wait for one of this
	// pool's connections, for a turn to hold server connections at all (the router's
	// --max-transactions): they wait for this pool all the same.
	TurnWaiting int64
	// Pinned counts the clients that, in transaction pooling, keep one of the pool's
	// connections between transactions because their session holds state that lives
	// there (a temporary table, a session advisory lock); their connections are in
	// InUse.
	Pinned int64
	// Resets counts connections reset for a client whose settings differ from those
	// the connection carried (Conn.ApplySettings), and StateChecks the questions
	// whether a connection holds state that lives on it alone
	// (Conn.HoldsSessionState): the costs of keeping clients apart, paid only for
	// clients that changed their session.
	Resets      int64
	StateChecks int64
	Opened      int64 // connections ever opened
	Closed      int64 // connections ever closed
	Timeouts    int64 // Acquire calls that gave up after the checkout timeout
	Acquires    int64
	// Bans counts the failed dials that banned the data source (Options.BanTime), and
	// IdleDropped the idle connections closed unchecked because another one, idle as
	// long, failed its check without a word from the server.
	Bans        int64
	IdleDropped int64
	// WaitTime is the total time Acquire calls waited for a free connection.
	WaitTime time.Duration
}

// Stats returns the pool's counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	idle := int64(len(p.mu.idle))
	p.mu.Unlock()
	return Stats{
		DataSource: p.name, User: p.cfg.User, Size: p.opts.Size,
		InUse: p.stats.inUse.Load(), Idle: idle, Waiting: p.stats.waiting.Load(), TurnWaiting: p.stats.turnWaiting.Load(), Pinned: p.stats.pinned.Load(),
		Resets: p.stats.resets.Load(), StateChecks: p.stats.stateChecks.Load(),
		Opened: p.stats.opened.Load(), Closed: p.stats.closed.Load(), Timeouts: p.stats.timeouts.Load(),
		Acquires: p.stats.acquires.Load(), Bans: p.stats.bans.Load(), IdleDropped: p.stats.deadIdle.Load(), WaitTime: time.Duration(p.stats.waitedNanoseconds.Load()),
	}
}
