package router

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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
type pauseGate struct {
	mu      sync.Mutex
	paused  bool
	gen     uint64        // counts pauses: a PAUSE that gives up lifts its own only
	resumed chan struct{} // closed by Resume
	active  int           // clients inside a unit
	drained chan struct{} // closed when active reaches 0 while paused
}

// enter starts a client's unit of work, waiting while the router is paused: until
// Resume, a cancel request (intr), ctx, or bound, which ends the wait with 53300.
func (g *pauseGate) enter(ctx context.Context, intr <-chan struct{}, bound time.Duration) error {
	var timer *time.Timer
	for {
		g.mu.Lock()
		if !g.paused {
			g.active++
			g.mu.Unlock()
			return nil
		}
		resumed := g.resumed
		g.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(bound)
			defer timer.Stop()
		}
		select {
		case <-resumed:
		case <-timer.C:
			return &pgconn.PgError{Severity: "ERROR", Code: "53300", Message: fmt.Sprintf(
				"shardlab proxy: paused (the admin console's PAUSE) for longer than %v; RESUME ends the pause", bound)}
		case <-intr:
			return userCancel()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// tryEnter starts a client's unit of work if the router is not paused.
func (g *pauseGate) tryEnter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused {
		return false
	}
	g.active++
	return true
}

// leave ends a client's unit of work.
func (g *pauseGate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active--
	if g.active == 0 && g.drained != nil {
		close(g.drained)
		g.drained = nil
	}
}

// Pause holds every new unit of work (a client's next transaction, or statement
// outside one) and waits until the units in progress end: then no client holds a
// server connection. A client that keeps one between transactions (a temporary table,
// session pooling) is inside a unit until it lets the connection go or leaves. If the
// units do not end within ctx, the pause is lifted and Pause returns the error: the
// proxy serves as before. A Resume meanwhile ends the pause, and Pause returns
// ErrNotPaused. The held clients wait until Resume (each for at most the pool's
// checkout timeout).
func (r *Router) Pause(ctx context.Context) error {
	g := &r.pause
	g.mu.Lock()
	if g.paused {
		g.mu.Unlock()
		return ErrPaused
	}
	g.gen++
	gen := g.gen
	g.paused, g.resumed = true, make(chan struct{})
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
		g.paused = false
		close(g.resumed)
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
	g.paused = false
	close(g.resumed)
	if g.drained != nil {
		close(g.drained) // wakes the PAUSE that waits: it ends with ErrNotPaused
		g.drained = nil
	}
	return nil
}

// Paused reports whether the router is paused, and how many clients are inside a
// unit of work.
func (r *Router) Paused() (paused bool, active int) {
	g := &r.pause
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.paused, g.active
}
