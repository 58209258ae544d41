package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlplan"
)

// ErrPaused and ErrNotPaused are wrapped by Pause and Resume when the router is
// already in the state asked for.
var (
	ErrPaused    = errors.New("router: paused already")
	ErrNotPaused = errors.New("router: not paused")
)

// pauseGate holds new units of work while the router is paused, as pgbouncer's PAUSE
// does: a unit is a client's hold on server connections, from its first connection
// (a transaction's, or an autocommit statement's) to the release of its last. Clients
// inside a unit go on, so that their transactions can finish; Pause returns once none
// is left.
//
// A pause of some tables (PauseTables: a resharding cutover's hold) lets a new unit in
// as a passing one: it goes on while its statements touch none of those tables, and
// the pause does not wait for it. Its first statement that touches one waits for the
// pause to end (Session.pass). When the pause ends, the passing units become ordinary
// ones: the next pause waits for them.
type pauseGate struct {
	mu     sync.Mutex
	paused bool
	// moving names the tables the pause holds; nil while paused: every table.
	moving  func(table string) bool
	gen     uint64        // counts pauses: a PAUSE that gives up lifts its own only
	resumed chan struct{} // closed by Resume
	active  int           // clients inside an ordinary unit
	drained chan struct{} // closed when active reaches 0 while paused
	passing int           // clients inside a unit passing the pause in force
	// ended is closed when no unit of either kind is left (see unitsEnded).
	ended chan struct{}
}

// enter starts a client's unit of work, waiting while the router is paused: until
// Resume, a cancel request (intr), ctx, or bound, which ends the wait with 53300.
// With mayPass set, a pause of some tables lets the unit in as a passing one: enter
// then returns the tables it must not touch, and the pause's number, for leave.
func (g *pauseGate) enter(ctx context.Context, intr <-chan struct{}, bound time.Duration, mayPass bool) (moving func(string) bool, passGen uint64, err error) {
	var timer *time.Timer
	for {
		g.mu.Lock()
		if moving, passGen, ok := g.admit(mayPass); ok {
			g.mu.Unlock()
			return moving, passGen, nil
		}
		resumed := g.resumed
		g.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(bound)
			defer timer.Stop()
		}
		if err := waitResumed(ctx, resumed, timer, bound, intr); err != nil {
			return nil, 0, err
		}
	}
}

// waitResumed waits for resumed to close, or for the timer, intr or ctx.
func waitResumed(ctx context.Context, resumed <-chan struct{}, timer *time.Timer, bound time.Duration, intr <-chan struct{}) error {
	select {
	case <-resumed:
		return nil
	case <-timer.C:
		return &pgconn.PgError{Severity: "ERROR", Code: "53300", Message: fmt.Sprintf(
			"shardlab proxy: paused (the admin console's PAUSE, or a resharding cutover's hold) for longer than %v; RESUME ends the pause", bound)}
	case <-intr:
		return userCancel()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// admit counts a unit in if the gate lets it in now (see enter); g.mu is held.
func (g *pauseGate) admit(mayPass bool) (moving func(string) bool, passGen uint64, ok bool) {
	switch {
	case !g.paused:
		g.active++
		return nil, 0, true
	case mayPass && g.moving != nil:
		g.passing++
		return g.moving, g.gen, true
	}
	return nil, 0, false
}

// tryEnter starts a client's unit of work if the gate lets it in without a wait (see
// enter).
func (g *pauseGate) tryEnter(mayPass bool) (moving func(string) bool, passGen uint64, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.admit(mayPass)
}

// leave ends a client's unit of work; passGen is what enter returned for it.
func (g *pauseGate) leave(passGen uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.passes(passGen) {
		g.passing--
	} else {
		g.active--
		if g.active == 0 && g.drained != nil {
			close(g.drained)
			g.drained = nil
		}
	}
	if g.active == 0 && g.passing == 0 && g.ended != nil {
		close(g.ended)
		g.ended = nil
	}
}

// passes reports whether a unit let in as passing pause passGen passes it still (the
// pause goes on); g.mu is held.
func (g *pauseGate) passes(passGen uint64) bool {
	return passGen != 0 && g.paused && g.gen == passGen
}

// stillPasses is passes for a caller that does not hold g.mu.
func (g *pauseGate) stillPasses(passGen uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.passes(passGen)
}

// lift ends the pause in force; g.mu is held. The units passing it become ordinary.
func (g *pauseGate) lift() {
	g.paused, g.moving = false, nil
	close(g.resumed)
	g.active += g.passing
	g.passing = 0
}

// waitLifted waits until pause passGen ends (see enter for the other ends of the
// wait).
func (g *pauseGate) waitLifted(ctx context.Context, passGen uint64, intr <-chan struct{}, bound time.Duration) error {
	g.mu.Lock()
	if !g.passes(passGen) {
		g.mu.Unlock()
		return nil
	}
	resumed := g.resumed
	g.mu.Unlock()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	return waitResumed(ctx, resumed, timer, bound, intr)
}

// unitsEnded returns a channel closed once no unit of work is in progress.
func (g *pauseGate) unitsEnded() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.active == 0 && g.passing == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	if g.ended == nil {
		g.ended = make(chan struct{})
	}
	return g.ended
}

// touches reports whether plan may touch a table that moving names, or otherwise
// depend on the layout the pause is there to change. Only statements that read or
// write tables the planner names (SELECT, INSERT, UPDATE, DELETE) and touch none of
// those, and statements of the session alone (SET, SHOW, BEGIN, COMMIT), do not.
// Everything else counts as touching: DDL (one that names no table runs on every data
// source of the layout), COPY and LOCK, a passthrough statement, code the statement
// does not show (DO, CALL), and a statement that may keep the client on its server
// connection (a temporary table, an advisory lock, LISTEN, a cursor, PREPARE) or
// prepare a transaction: a unit that keeps a connection of the old layout could never
// move to the new one.
func touches(moving func(string) bool, plan *sqlplan.Plan) bool {
	if plan.Unparsed || plan.OwnText || plan.Session&(sqlplan.EffectBinds|sqlplan.EffectListens|sqlplan.EffectOpaque) != 0 {
		return true
	}
	switch plan.Kind {
	case sqlplan.KindEmpty, sqlplan.KindSet, sqlplan.KindShow, sqlplan.KindDiscard:
		return false
	case sqlplan.KindTransaction:
		switch plan.Tx {
		case sqlplan.TxPrepare, sqlplan.TxCommitPrepared, sqlplan.TxRollbackPrepare:
			return true
		}
		return false
	case sqlplan.KindSelect, sqlplan.KindInsert, sqlplan.KindUpdate, sqlplan.KindDelete, sqlplan.KindCoordinator:
		return slices.ContainsFunc(plan.Tables, moving)
	}
	return true
}

// Pause holds every new unit of work (a client's next transaction, or statement
// outside one) and waits until the units in progress end: then no client holds a
// server connection. A client that keeps one between transactions (a temporary table,
// session pooling) is inside a unit until it lets the connection go or leaves. If the
// units do not end within ctx, the pause is lifted and Pause returns the error: the
// proxy serves as before. A Resume meanwhile ends the pause, and Pause returns
// ErrNotPaused. The held clients wait until Resume (each for at most the pool's
// checkout timeout).
func (r *Router) Pause(ctx context.Context) error { return r.PauseTables(ctx, nil) }

// PauseTables is Pause for the units of work that touch the tables moving names (all
// when moving is nil): a new unit starts, and its statements run, until one touches
// such a table (or may: a passthrough statement); that one waits for the pause to end,
// and runs on the router in force then, or, if the unit holds server connections
// already and another router took this one's place meanwhile, fails with 40001. The
// pause waits for the units in progress when it began, whatever they touch.
func (r *Router) PauseTables(ctx context.Context, moving func(table string) bool) error {
	g := &r.pause
	g.mu.Lock()
	if g.paused {
		g.mu.Unlock()
		return ErrPaused
	}
	g.gen++
	gen := g.gen
	g.paused, g.resumed, g.moving = true, make(chan struct{}), moving
	var drained chan struct{}
	if g.active > 0 {
		g.drained = make(chan struct{})
		drained = g.drained
	}
	active := g.active
	g.mu.Unlock()
	if drained == nil {
		return nil
	}
	select {
	case <-drained:
		g.mu.Lock()
		defer g.mu.Unlock()
		if !g.paused || g.gen != gen {
			return ErrNotPaused // a Resume came first
		}
		return nil
	case <-ctx.Done():
		g.mu.Lock()
		defer g.mu.Unlock()
		if !g.paused || g.gen != gen {
			return ErrNotPaused
		}
		if g.active == 0 {
			return nil // the last unit ended as the bound came: paused
		}
		left := g.active
		g.lift()
		g.drained = nil
		return fmt.Errorf("router: %d of the %d clients in a transaction (or holding server connections) when the pause began still were when it gave up: %w; not paused", left, active, ctx.Err())
	}
}

// Resume ends a pause: the held clients go on.
func (r *Router) Resume() error {
	g := &r.pause
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.paused {
		return ErrNotPaused
	}
	g.lift()
	if g.drained != nil {
		close(g.drained) // wakes the PAUSE that waits: it ends with ErrNotPaused
		g.drained = nil
	}
	return nil
}

// Paused reports whether the router is paused, and how many clients are inside a
// unit of work the pause waits for.
func (r *Router) Paused() (paused bool, active int) {
	g := &r.pause
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.paused, g.active
}

// UnitsEnded returns a channel closed once no client is inside a unit of work on r:
// a router another took the place of (Supersede) closes after it.
func (r *Router) UnitsEnded() <-chan struct{} { return r.pause.unitsEnded() }
