package backend

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// dialStep is what one dial of a scriptedDial does: wait for hold to close (when
// set), then connect to the data source, or to an address that refuses.
type dialStep struct {
	hold   chan struct{}
	refuse bool
}

// scriptedDial replaces a pool's dial function with steps taken one per dial, in the
// order the dials start; started receives each step's index as its dial begins.
func scriptedDial(t *testing.T, p *Pool, steps []dialStep) (started chan int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := ln.Addr().String()
	ln.Close()
	real := p.cfg.DialFunc
	started = make(chan int, len(steps))
	var mu sync.Mutex
	next := 0
	p.cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		i := next
		next++
		mu.Unlock()
		if i >= len(steps) {
			t.Errorf("dial %d: the script has %d steps", i, len(steps))
			return nil, errors.New("unscripted dial")
		}
		started <- i
		if steps[i].hold != nil {
			<-steps[i].hold
		}
		if steps[i].refuse {
			addr = refused
		}
		return real(ctx, network, addr)
	}
	return started
}

// TestBanFollowsTheLatestDial: of dials that overlap, the one that ends last must not
// decide alone. A dial that succeeds lifts a ban that an earlier failure set, and a
// dial that fails after one that started later succeeded bans nothing: the data
// source was reachable after it began. Either way the next Acquire dials.
func TestBanFollowsTheLatestDial(t *testing.T) {
	dsn := pgtest.NewDatabase(t, "ban")
	for _, tc := range []struct {
		name string
		// The held dial starts first; the other fails or succeeds while it waits;
		// then the held one ends.
		heldRefuses bool
	}{
		{"success after a failure lifts the ban", false},
		{"failure of an older dial after a success", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPool("ds_0", dsn, Options{Size: 3, BanTime: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			hold := make(chan struct{})
			started := scriptedDial(t, p, []dialStep{
				{hold: hold, refuse: tc.heldRefuses},
				{refuse: !tc.heldRefuses},
				{}, // the Acquire after both: must be tried
			})
			ctx := context.Background()
			type acquired struct {
				c   *Conn
				err error
			}
			held := make(chan acquired, 1)
			go func() {
				c, err := p.Acquire(ctx)
				held <- acquired{c, err}
			}()
			<-started // the held dial began
			c, err := p.Acquire(ctx)
			if tc.heldRefuses {
				if err != nil {
					t.Fatalf("the later dial: %v", err)
				}
				defer p.Release(c, true)
			} else {
				if err == nil || errors.Is(err, ErrBanned) {
					t.Fatalf("the later dial: %v, want its refusal", err)
				}
				if _, err := p.Acquire(ctx); !errors.Is(err, ErrBanned) {
					t.Fatalf("Acquire after the refusal: %v, want ErrBanned", err)
				}
			}
			close(hold)
			h := <-held
			if (h.err != nil) != tc.heldRefuses {
				t.Fatalf("the held dial: %v", h.err)
			}
			if h.c != nil {
				defer p.Release(h.c, true) // kept until the end: nothing is idle
			}
			c, err = p.Acquire(ctx) // a dial, unless banned
			if err != nil {
				t.Fatalf("Acquire after a successful dial: %v, want a new connection", err)
			}
			p.Release(c, true)
		})
	}
}
