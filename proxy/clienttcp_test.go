package proxy_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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

// TestVanishedClientFoundByKeepaliveAlone: without a client user timeout (the
// default), keepalive alone ends the session of a client whose host vanished while
// its transaction held a row lock, so the next client gets the row within about the
// keepalive's bound (idle + interval x count).
func TestVanishedClientFoundByKeepaliveAlone(t *testing.T) {
	h := newHost(t)
	keepalive := backend.TCP{KeepAliveIdle: time.Second, KeepAliveInterval: 500 * time.Millisecond, KeepAliveCount: 2}
	e := startProxy(t, 1, []string{"kv=k"}, nil, func(c *proxy.Config) { c.ClientTCP = keepalive })
	ln, err := net.Listen("tcp", h.peer+":0")
	if err != nil {
		t.Fatal(err)
	}
	go e.srv.Serve(ln) // ends at the proxy's shutdown
	c := e.connect(t)
	exec1(t, c, "CREATE TABLE kv (k int PRIMARY KEY, v text)")
	exec1(t, c, "INSERT INTO kv VALUES (1, 'x')")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", ln.Addr(), testDatabase))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialFunc = h.dial
	far, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer far.Close(context.Background()) // its socket is dead: only frees it
	for _, sql := range []string{"BEGIN", "UPDATE kv SET v = 'far' WHERE k = 1"} {
		if _, err := far.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// Vanished while idle in its transaction: once the proxy's answer is acknowledged.
	// (Data still unacknowledged when a host vanishes is retransmitted, and keepalive
	// probes nothing until TCP gives up, about 15 minutes later; a client user timeout
	// bounds that case.)
	time.Sleep(500 * time.Millisecond)
	h.partition(true, true)
	start := time.Now()
	tag, err := c.Exec(ctx, "UPDATE kv SET v = 'near' WHERE k = 1")
	took := time.Since(start)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("update of the row the vanished client locked: %v, %v after %v", tag, err, took)
	}
	bound := keepalive.KeepAliveIdle + time.Duration(keepalive.KeepAliveCount)*keepalive.KeepAliveInterval
	if took > 2*bound+time.Second {
		t.Errorf("the vanished client's lock was freed after %v, want within about %v", took, bound)
	}
	t.Logf("the vanished client's lock was freed after %v", took.Round(time.Millisecond))
}
