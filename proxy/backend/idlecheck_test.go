package backend_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/proxy/backend"
)

// The idle check pings a connection idle longer than Options.IdleCheck before it is
// handed out. These tests hold what a failed check may take with it: the connections
// idle as long when the server was not heard from, nothing when the server answered
// or when the caller gave up.

// TestIdleCheckAnsweredFailureKeepsTheOthers: a connection whose server process was
// ended on its own (idle_session_timeout, pg_terminate_backend: the server says FATAL)
// is replaced, and the pool's other idle connections, alive, stay.
func TestIdleCheckAnsweredFailureKeepsTheOthers(t *testing.T) {
	dsn := pgtest.NewDatabase(t, "idlecheck")
	p, err := backend.NewPool("ds_0", dsn, backend.Options{Size: 3, IdleCheck: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	a, b := acquire(t, p), acquire(t, p)
	p.Release(b, true)
	p.Release(a, true) // last in: checked first
	time.Sleep(200 * time.Millisecond)
	admin, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	r := admin.ExecParams(ctx, "SELECT pg_terminate_backend($1, 5000)", [][]byte{[]byte(itoa(a.PgConn().PID()))}, nil, nil, nil).Read()
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(c, true)
	if c != b {
		t.Error("the live idle connection was not handed out after another failed its check")
	}
	if st := p.Stats(); st.IdleDropped != 0 || st.Opened != 2 {
		t.Errorf("stats %+v: want nothing dropped unchecked, 2 opened", st)
	}
}

// TestIdleCheckFlushSparesFreshConnections: a connection whose check times out (the
// network went silent) takes the connections idle as long with it, unchecked, but not
// one given back while the check waited: that one was fine a moment ago.
func TestIdleCheckFlushSparesFreshConnections(t *testing.T) {
	r := newRelay(t, pgtest.NewDatabase(t, "idlecheck"))
	const idleCheck = time.Second
	p, err := backend.NewPool("ds_0", r.dsn, backend.Options{Size: 4, IdleCheck: idleCheck, ConnectTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a, b, old := acquire(t, p), acquire(t, p), acquire(t, p)
	p.Release(old, true)
	p.Release(a, true) // last in: checked first
	time.Sleep(idleCheck + 100*time.Millisecond)
	r.freeze()
	go func() {
		time.Sleep(100 * time.Millisecond) // while a's check waits
		p.Release(b, true)
	}()
	c, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(c, false)
	if c != b {
		t.Error("a connection given back during another's failed check was closed")
	}
	if st := p.Stats(); st.IdleDropped != 1 || st.Opened != 3 || st.Closed != 2 || st.Idle != 0 {
		t.Errorf("stats %+v: want the one checked and the one idle as long closed, 3 opened", st)
	}
}

// TestIdleCheckWithDoneContextKeepsConnections: an Acquire whose context has ended
// fails with the context's error and leaves the idle connections, which its check
// could not tell anything about, in the pool.
func TestIdleCheckWithDoneContextKeepsConnections(t *testing.T) {
	p := newPool(t, backend.Options{Size: 3, IdleCheck: 50 * time.Millisecond})
	a, b := acquire(t, p), acquire(t, p)
	p.Release(a, true)
	p.Release(b, true)
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire under a cancelled context: %v, want context.Canceled", err)
	}
	if st := p.Stats(); st.Idle != 2 || st.Closed != 0 || st.InUse != 0 {
		t.Errorf("stats %+v: want both connections idle, none closed", st)
	}
	c := acquire(t, p)
	p.Release(c, true)
	if c != a && c != b {
		t.Error("a new connection was opened while two idle ones were alive")
	}
}

func acquire(t *testing.T, p *backend.Pool) *backend.Conn {
	t.Helper()
	c, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

// relay forwards TCP connections to a PostgreSQL server; freeze makes the ones open
// so far go silent, as a host cut off by the network: what is sent is acknowledged
// (by the relay's kernel) and never answered.
type relay struct {
	dsn   string
	ln    net.Listener
	mu    sync.Mutex
	conns []*relayed
}

type relayed struct {
	client, server net.Conn
	frozen         atomic.Bool
}

func newRelay(t *testing.T, dsn string) *relay {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.Host = ln.Addr().String()
	r := &relay{dsn: u.String(), ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			c.client.Close()
			c.server.Close()
		}
		r.mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			c := &relayed{client: client, server: server}
			r.mu.Lock()
			r.conns = append(r.conns, c)
			r.mu.Unlock()
			wg.Go(func() { c.copy(server, client) })
			wg.Go(func() { c.copy(client, server) })
		}
	})
	return r
}

func (c *relayed) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			dst.Close()
			return
		}
		if c.frozen.Load() {
			continue // dropped
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			src.Close()
			return
		}
	}
}

func (r *relay) freeze() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.frozen.Store(true)
	}
}
