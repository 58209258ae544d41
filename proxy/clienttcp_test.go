package proxy_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardlab/shardlab/proxy"
	"github.com/shardlab/shardlab/proxy/backend"
)

// TestClientTCPDefaultsKeepaliveOnly: a client connection gets keepalive with
// backend.TCP's defaults and no TCP_USER_TIMEOUT unless ClientTCP asks for one: a
// user timeout would also cut a live client that keeps its receive window closed
// (one that stops reading a large answer, a LISTEN client reading nothing).
func TestClientTCPDefaultsKeepaliveOnly(t *testing.T) {
	for _, tc := range []struct {
		name          string
		tcp           backend.TCP
		userTimeoutMs int
	}{
		{"defaults", backend.TCP{}, 0},
		{"user timeout asked for", backend.TCP{UserTimeout: 1500 * time.Millisecond}, 1500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startProxy(t, 1, nil, nil, func(c *proxy.Config) { c.ClientTCP = tc.tcp })
			c := e.pgconnect(t)
			if _, err := c.Exec(context.Background(), "SELECT 1").ReadAll(); err != nil {
				t.Fatal(err) // the proxy has set up the connection by now
			}
			fd := acceptedSocket(t, c.Conn())
			get := func(level, opt int) int {
				v, err := unix.GetsockoptInt(fd, level, opt)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			ka, idle, intvl, cnt := get(unix.SOL_SOCKET, unix.SO_KEEPALIVE), get(unix.IPPROTO_TCP, unix.TCP_KEEPIDLE),
				get(unix.IPPROTO_TCP, unix.TCP_KEEPINTVL), get(unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
			if ka != 1 || idle != 5 || intvl != 5 || cnt != 5 {
				t.Errorf("keepalive %d idle %d interval %d count %d, want 1 5 5 5", ka, idle, intvl, cnt)
			}
			if ut := get(unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT); ut != tc.userTimeoutMs {
				t.Errorf("TCP_USER_TIMEOUT %d ms, want %d", ut, tc.userTimeoutMs)
			}
		})
	}
}

// acceptedSocket finds, among this process's file descriptors, the proxy's end of the
// client connection nc.
func acceptedSocket(t *testing.T, nc net.Conn) int {
	t.Helper()
	local, remote := nc.LocalAddr().String(), nc.RemoteAddr().String()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	for _, ent := range entries {
		fd, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			continue
		}
		pa, err := unix.Getpeername(fd)
		if err != nil {
			continue
		}
		if sockaddr(sa) == remote && sockaddr(pa) == local {
			return fd
		}
	}
	t.Fatalf("no socket of this process connects %s to %s", remote, local)
	return -1
}

func sockaddr(sa unix.Sockaddr) string {
	if in, ok := sa.(*unix.SockaddrInet4); ok {
		return net.JoinHostPort(net.IP(in.Addr[:]).String(), strconv.Itoa(in.Port))
	}
	return ""
}
