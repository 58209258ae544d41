package backend_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardlab/shardlab/proxy/backend"
)

// TestBanAfterFailedConnect: after a connection to a data source fails to be made, the
// next Acquire fails at once with ErrBanned, naming the first failure, until the ban
// time has passed; then a dial is tried again.
func TestBanAfterFailedConnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused
	const ban = 500 * time.Millisecond
	p, err := backend.NewPool("ds_x", fmt.Sprintf("postgres://postgres@%s/db?sslmode=disable", addr), backend.Options{Size: 2, BanTime: ban})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if _, err := p.Acquire(ctx); err == nil || errors.Is(err, backend.ErrBanned) {
		t.Fatalf("first Acquire: %v, want the connect error", err)
	}
	start := time.Now()
	_, err = p.Acquire(ctx)
	if !errors.Is(err, backend.ErrBanned) || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("Acquire while banned: %v after %v, want ErrBanned at once", err, time.Since(start))
	}
	time.Sleep(ban)
	if _, err := p.Acquire(ctx); err == nil || errors.Is(err, backend.ErrBanned) {
		t.Fatalf("Acquire after the ban: %v, want a new connect error", err)
	}
	if st := p.Stats(); st.Bans != 2 || st.InUse != 0 || st.Opened != 0 {
		t.Errorf("stats %+v, want 2 bans, nothing in use or opened", st)
	}
}

// TestNoBanAfterSlowLogin: a data source whose TCP connection is made but whose login
// outlasts the connect timeout (a healthy server busy forking backends) is reachable:
// the dial fails, and the next Acquire dials again instead of failing with ErrBanned.
func TestNoBanAfterSlowLogin(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accepts, and never answers the startup message
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	p, err := backend.NewPool("ds_x", fmt.Sprintf("postgres://postgres@%s/db?sslmode=disable", ln.Addr()),
		backend.Options{Size: 2, ConnectTimeout: 200 * time.Millisecond, BanTime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 2 {
		start := time.Now()
		_, err := p.Acquire(context.Background())
		if err == nil || errors.Is(err, backend.ErrBanned) || time.Since(start) < 150*time.Millisecond {
			t.Fatalf("Acquire %d: %v after %v, want the login's timeout after about 200ms", i, err, time.Since(start))
		}
	}
	if st := p.Stats(); st.Bans != 0 {
		t.Errorf("%d bans after logins that timed out on a live connection, want none", st.Bans)
	}
}

// TestBanAfterUnansweredSYN: a dial whose SYN goes unanswered until the connect
// timeout (a host cut off by the network) bans the data source, though pgconn reports
// it as the same context timeout as a slow login's.
func TestBanAfterUnansweredSYN(t *testing.T) {
	// A listener that never accepts, with a backlog of 0: one connection fills its
	// queue, and the kernel drops every SYN after it.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*unix.SockaddrInet4).Port)
	filler, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()
	if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		c.Close()
		t.Skip("the kernel answered a SYN to a full accept queue")
	}
	p, err := backend.NewPool("ds_x", fmt.Sprintf("postgres://postgres@%s/db?sslmode=disable", addr),
		backend.Options{Size: 2, ConnectTimeout: 200 * time.Millisecond, BanTime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Acquire(context.Background()); err == nil || errors.Is(err, backend.ErrBanned) {
		t.Fatalf("first Acquire: %v, want the connect timeout", err)
	}
	if _, err := p.Acquire(context.Background()); !errors.Is(err, backend.ErrBanned) {
		t.Fatalf("Acquire after an unanswered SYN: %v, want ErrBanned", err)
	}
}
