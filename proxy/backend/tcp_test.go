package backend_test

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardlab/shardlab/proxy/backend"
)

// sockopts reads the keepalive settings and TCP_USER_TIMEOUT of a TCP connection's
// socket (a rawio-wrapped one too).
func sockopts(t *testing.T, c net.Conn) (keepAlive, idle, interval, count, userTimeoutMs int) {
	t.Helper()
	sc, ok := c.(syscall.Conn)
	if !ok {
		t.Fatalf("%T has no socket", c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	get := func(fd, level, opt int) int {
		v, err := unix.GetsockoptInt(fd, level, opt)
		errs = append(errs, err)
		return v
	}
	rc.Control(func(fd uintptr) {
		keepAlive = get(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		idle = get(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
		interval = get(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)
		count = get(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
		userTimeoutMs = get(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return
}

// TestTCPSettingsReachTheSocket: the dial function of server connections and Apply
// (client connections) set keepalive and TCP_USER_TIMEOUT on the socket, the defaults
// when the fields are zero, and leave the user timeout alone when it is negative.
func TestTCPSettingsReachTheSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	for _, tc := range []struct {
		name                        string
		tcp                         backend.TCP
		keepAlive, idle, intvl, cnt int
		userTimeoutMs               int
	}{
		{"defaults", backend.TCP{}, 1, 5, 5, 5, 30000},
		{"set", backend.TCP{KeepAliveIdle: 7 * time.Second, KeepAliveInterval: 3 * time.Second, KeepAliveCount: 4, UserTimeout: 1500 * time.Millisecond}, 1, 7, 3, 4, 1500},
		{"no user timeout", backend.TCP{UserTimeout: -1}, 1, 5, 5, 5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tcp := tc.tcp.WithDefaults()
			c, err := tcp.Dial()(context.Background(), "tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ka, idle, intvl, cnt, ut := sockopts(t, c)
			if ka != tc.keepAlive || idle != tc.idle || intvl != tc.intvl || cnt != tc.cnt || ut != tc.userTimeoutMs {
				t.Errorf("dialled: keepalive %d idle %d interval %d count %d user timeout %d ms, want %d %d %d %d %d",
					ka, idle, intvl, cnt, ut, tc.keepAlive, tc.idle, tc.intvl, tc.cnt, tc.userTimeoutMs)
			}
			plain, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer plain.Close()
			if err := tcp.Apply(plain.(*net.TCPConn)); err != nil {
				t.Fatal(err)
			}
			ka, idle, intvl, cnt, ut = sockopts(t, plain)
			if ka != tc.keepAlive || idle != tc.idle || intvl != tc.intvl || cnt != tc.cnt || ut != tc.userTimeoutMs {
				t.Errorf("applied: keepalive %d idle %d interval %d count %d user timeout %d ms, want %d %d %d %d %d",
					ka, idle, intvl, cnt, ut, tc.keepAlive, tc.idle, tc.intvl, tc.cnt, tc.userTimeoutMs)
			}
		})
	}
}
