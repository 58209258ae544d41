package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/proxy"
	"github.com/shardlab/shardlab/proxy/backend"
)

// The tests here cut the network between the proxy and a shard, or between a client and
// the proxy, for real: the far end lives in a Linux network namespace of the test's own,
// joined to this one by a veth pair, and nftables in that namespace drops packets without
// a reset, as a partitioned host does. They need root, iproute2 and nft; without them
// they skip (unless SHARDLAB_REQUIRE_PG is set, which CI does).

// quickTCP finds a dead peer within about 2 s of its last word.
var quickTCP = backend.TCP{KeepAliveIdle: time.Second, KeepAliveInterval: 500 * time.Millisecond, KeepAliveCount: 2, UserTimeout: 2 * time.Second}

// host is a network namespace with one address, 198.19.N.2, reached from the test's
// namespace, which has 198.19.N.1 on the other end of the link.
type host struct {
	t                testing.TB
	name             string
	addr, peer       string // the host's address, and the test namespace's end
	faulty           atomic.Bool
	relays           sync.WaitGroup
	mu               sync.Mutex
	closers          []io.Closer
	faultTable, link string
}

var hostSeq atomic.Int32

func newHost(t testing.TB) *host {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "network namespaces need root")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			skipOrFail(t, "%s not found: %v", tool, err)
		}
	}
	n := (os.Getpid() + int(hostSeq.Add(1))*7) % 250
	h := &host{t: t, name: fmt.Sprintf("slpx-%d-%d", os.Getpid(), n), addr: fmt.Sprintf("198.19.%d.2", n),
		peer: fmt.Sprintf("198.19.%d.1", n), link: fmt.Sprintf("slpx%d", n), faultTable: "slpx_fault"}
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", h.name)
	t.Cleanup(h.close)
	ip("link", "add", h.link, "type", "veth", "peer", "name", h.link+"n", "netns", h.name)
	ip("addr", "add", h.peer+"/30", "dev", h.link)
	ip("link", "set", h.link, "up")
	ip("-n", h.name, "addr", "add", h.addr+"/30", "dev", h.link+"n")
	ip("-n", h.name, "link", "set", h.link+"n", "up")
	ip("-n", h.name, "link", "set", "lo", "up")
	return h
}

func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("SHARDLAB_REQUIRE_PG") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

func (h *host) close() {
	h.mu.Lock()
	for _, c := range h.closers {
		c.Close()
	}
	h.mu.Unlock()
	h.relays.Wait()
	exec.Command("ip", "netns", "del", h.name).Run() // takes the link with it
	exec.Command("ip", "link", "del", h.link).Run()
}

func (h *host) track(c io.Closer) {
	h.mu.Lock()
	h.closers = append(h.closers, c)
	h.mu.Unlock()
}

// inside runs fn on an OS thread that entered the host's namespace; a socket made
// there stays in the namespace. The thread is thrown away afterwards.
func (h *host) inside(fn func()) {
	h.t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		f, err := os.Open("/run/netns/" + h.name)
		if err != nil {
			done <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("setns: %w", err)
			return
		}
		fn()
		done <- nil
	}()
	if err := <-done; err != nil {
		h.t.Fatal(err)
	}
}

// serve makes the host serve target (a TCP address in the test's namespace) on a port
// of its address, relaying bytes both ways, and returns that address: PostgreSQL seen
// from the other side of the host's link.
func (h *host) serve(target string) string {
	h.t.Helper()
	var ln net.Listener
	var err error
	h.inside(func() { ln, err = net.Listen("tcp", h.addr+":0") })
	if err != nil {
		h.t.Fatal(err)
	}
	h.track(ln)
	h.relays.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			h.track(in)
			h.track(out)
			h.relays.Go(func() { io.Copy(out, in); out.(*net.TCPConn).CloseWrite() })
			h.relays.Go(func() { io.Copy(in, out); in.(*net.TCPConn).CloseWrite() })
		}
	})
	return ln.Addr().String()
}

// dial connects from inside the host.
func (h *host) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	var err error
	h.inside(func() { c, err = (&net.Dialer{}).DialContext(ctx, network, addr) })
	if err == nil {
		h.track(c)
	}
	return c, err
}

// partition drops packets in the host's namespace: what it sends (out), what it is
// sent (in), or both; no reset is sent, as a partitioned host sends none.
func (h *host) partition(in, out bool) {
	h.t.Helper()
	rules := fmt.Sprintf("add table inet %s\n", h.faultTable)
	if in {
		rules += fmt.Sprintf("add chain inet %s in { type filter hook input priority 0; policy drop; }\n", h.faultTable)
	}
	if out {
		rules += fmt.Sprintf("add chain inet %s out { type filter hook output priority 0; policy drop; }\n", h.faultTable)
	}
	cmd := exec.Command("ip", "netns", "exec", h.name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		h.t.Fatalf("nft: %v\n%s", err, out)
	}
	h.faulty.Store(true)
}

func (h *host) heal() {
	h.t.Helper()
	if out, err := exec.Command("ip", "netns", "exec", h.name, "nft", "delete", "table", "inet", h.faultTable).CombinedOutput(); err != nil {
		h.t.Fatalf("nft: %v\n%s", err, out)
	}
	h.faulty.Store(false)
}

// behind returns dsn with its host and port replaced by addr.
func behind(t testing.TB, dsn, addr string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// partitionEnv is a proxy over two shards: ds_0 straight on the test's PostgreSQL, ds_1
// on the same server but behind a host that can be cut off; kv's keys on each.
type partitionEnv struct {
	*env
	host *host
	keys [2]int // a key on each data source
}

func startPartitionEnv(t *testing.T, pool backend.Options) *partitionEnv {
	t.Helper()
	h := newHost(t)
	s1 := pgtest.NewDatabase(t, "part_s1")
	u, _ := url.Parse(s1)
	dsns := []string{pgtest.NewDatabase(t, "part_s0"), behind(t, s1, h.serve(u.Host))}
	e := startProxyOn(t, shardedRules(dsns, []string{"kv=k"}, nil), func(c *proxy.Config) { c.Pool = pool })
	c := e.connect(t)
	exec1(t, c, "CREATE TABLE kv (k int PRIMARY KEY, v text)")
	pe := &partitionEnv{env: e, host: h, keys: [2]int{-1, -1}}
	for k := 1; pe.keys[0] < 0 || pe.keys[1] < 0; k++ {
		exec1(t, c, "INSERT INTO kv VALUES ($1, 'x')", k)
		for i := range 2 {
			if queryInt(t, e.shard(t, i), "SELECT count(*) FROM kv WHERE k = $1", k) == 1 && pe.keys[i] < 0 {
				pe.keys[i] = k
			}
		}
	}
	return pe
}

// wantUnavailable checks that err is 08006 naming ds_1 and came within bound.
func wantUnavailable(t *testing.T, what string, err error, took, bound time.Duration) {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "08006" || !strings.Contains(pe.Message, "ds_1") {
		t.Errorf("%s with ds_1 cut off: %v after %v, want 08006 naming ds_1", what, err, took)
	} else if took > bound {
		t.Errorf("%s with ds_1 cut off failed after %v, want within %v: %v", what, took, bound, err)
	} else {
		t.Logf("%s: %v after %v", what, err, took.Round(time.Millisecond))
	}
}

// healed waits until a read on ds_1 succeeds again, then checks that no pool lent out
// a connection it did not get back, or lost count of one.
func (pe *partitionEnv) healed(t *testing.T, c *pgx.Conn) {
	t.Helper()
	pe.host.heal()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var v string
		err := c.QueryRow(ctx, "SELECT v FROM kv WHERE k = $1", pe.keys[1]).Scan(&v)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ds_1 healed, but a read still fails: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM kv"); n < 2 {
		t.Errorf("count %d after healing", n)
	}
	for _, st := range pe.srv.Stats().Pools {
		if st.InUse != 0 || st.Opened-st.Closed != st.Idle {
			t.Errorf("data source %s after healing: %d in use, %d idle, %d opened, %d closed: connections leaked",
				st.DataSource, st.InUse, st.Idle, st.Opened, st.Closed)
		}
	}
}

// TestPartitionedShardFailsInBoundedTime: a shard host that drops every packet makes
// the statements that need it fail with 08006 naming it, a statement that was waiting
// for its answer within about the user timeout and later ones as soon as the dial
// fails (then at once, while the shard is banned), while the other shard serves; after
// the partition heals, the shard serves again and no connection leaked.
func TestPartitionedShardFailsInBoundedTime(t *testing.T) {
	pe := startPartitionEnv(t, backend.Options{Size: 4, CheckoutTimeout: 5 * time.Second,
		ConnectTimeout: 2 * time.Second, BanTime: 2 * time.Second, TCP: quickTCP})
	c, other := pe.connect(t), pe.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A statement in flight: its request was delivered and acknowledged, then the
	// host goes silent before it answers. Only keepalive can tell.
	start := time.Now()
	errc := make(chan error, 1)
	go func() {
		var v string
		errc <- c.QueryRow(ctx, "SELECT v FROM kv, pg_sleep(1) WHERE k = $1", pe.keys[1]).Scan(&v)
	}()
	time.Sleep(300 * time.Millisecond)
	pe.host.partition(true, true)
	// The other shard answers meanwhile.
	var v string
	if err := other.QueryRow(ctx, "SELECT v FROM kv WHERE k = $1", pe.keys[0]).Scan(&v); err != nil {
		t.Errorf("ds_0 while ds_1 is cut off: %v", err)
	}
	err := <-errc
	wantUnavailable(t, "statement in flight", err, time.Since(start), 3*quickTCP.UserTimeout+time.Second)

	// A new statement: its dial times out (2 s) and bans the shard.
	start = time.Now()
	_, err = other.Exec(ctx, "SELECT v FROM kv WHERE k = $1", pe.keys[1])
	wantUnavailable(t, "new statement", err, time.Since(start), 3*2*time.Second)
	start = time.Now()
	_, err = other.Exec(ctx, "SELECT count(*) FROM kv")
	wantUnavailable(t, "cross-shard statement while banned", err, time.Since(start), 500*time.Millisecond)
	if err := other.QueryRow(ctx, "SELECT v FROM kv WHERE k = $1", pe.keys[0]).Scan(&v); err != nil {
		t.Errorf("ds_0 while ds_1 is banned: %v", err)
	}
	for _, st := range pe.srv.Stats().Pools {
		if st.DataSource == "ds_1" && st.Bans == 0 {
			t.Errorf("ds_1's stats count no ban: %+v", st)
		}
	}
	pe.healed(t, other)
}

// TestOneWayPartitionUserTimeout: a shard host that hears but is not heard (what it
// sends is dropped, so nothing the proxy sends is acknowledged) fails a statement sent
// to it within about TCP_USER_TIMEOUT; keepalive sends no probe while data is
// unacknowledged, so without the user timeout the statement would wait for TCP's
// retransmissions to give up, about 15 minutes.
func TestOneWayPartitionUserTimeout(t *testing.T) {
	pe := startPartitionEnv(t, backend.Options{Size: 4, CheckoutTimeout: 5 * time.Second,
		ConnectTimeout: 2 * time.Second, IdleCheck: -1, TCP: backend.TCP{KeepAliveIdle: time.Hour, UserTimeout: quickTCP.UserTimeout}})
	c := pe.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var v string
	if err := c.QueryRow(ctx, "SELECT v FROM kv WHERE k = $1", pe.keys[1]).Scan(&v); err != nil {
		t.Fatal(err) // a server connection to ds_1 is idle in the pool now
	}
	pe.host.partition(false, true)
	start := time.Now()
	err := c.QueryRow(ctx, "SELECT v FROM kv WHERE k = $1", pe.keys[1]).Scan(&v)
	wantUnavailable(t, "statement sent into the void", err, time.Since(start), 3*quickTCP.UserTimeout)
	if err := c.QueryRow(ctx, "SELECT v FROM kv WHERE k = $1", pe.keys[0]).Scan(&v); err != nil {
		t.Errorf("ds_0 while ds_1 is cut off: %v", err)
	}
	pe.healed(t, c)
}

// TestVanishedClientReleasesItsTransaction: a client whose host vanishes in the middle
// of a transaction that holds a row lock loses its session within about the client
// side's bound, so its transaction rolls back and the next client gets the row; the
// server connection goes back to the pool. With a client user timeout, and with
// keepalive alone (the default): the client vanishes idle in its transaction, once the
// proxy's answer is acknowledged. (Data still unacknowledged when a host vanishes is
// retransmitted, and keepalive probes nothing until TCP gives up, about 15 minutes
// later; a client user timeout bounds that case.)
func TestVanishedClientReleasesItsTransaction(t *testing.T) {
	keepalive := backend.TCP{KeepAliveIdle: time.Second, KeepAliveInterval: 500 * time.Millisecond, KeepAliveCount: 2}
	for _, tc := range []struct {
		name  string
		tcp   backend.TCP
		bound time.Duration
	}{
		{"user timeout", quickTCP, 3*quickTCP.UserTimeout + time.Second},
		{"keepalive alone", keepalive, 2*(keepalive.KeepAliveIdle+time.Duration(keepalive.KeepAliveCount)*keepalive.KeepAliveInterval) + time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			e := startProxy(t, 1, []string{"kv=k"}, nil, func(c *proxy.Config) { c.ClientTCP = tc.tcp })
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
			for _, sql := range []string{"BEGIN", "UPDATE kv SET v = 'far' WHERE k = 1"} {
				if _, err := far.Exec(ctx, sql).ReadAll(); err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
			}
			time.Sleep(500 * time.Millisecond) // the answer acknowledged
			h.partition(true, true)
			start := time.Now()
			tag, err := c.Exec(ctx, "UPDATE kv SET v = 'near' WHERE k = 1")
			took := time.Since(start)
			if err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("update of the row the vanished client locked: %v, %v after %v", tag, err, took)
			}
			if took > tc.bound {
				t.Errorf("the vanished client's lock was freed after %v, want within %v", took, tc.bound)
			}
			t.Logf("the vanished client's lock was freed after %v", took.Round(time.Millisecond))
			far.Close(context.Background()) // its socket is dead: only frees it
			for _, st := range e.srv.Stats().Pools {
				if st.InUse != 0 {
					t.Errorf("data source %s: %d connections still lent out after the client vanished", st.DataSource, st.InUse)
				}
			}
		})
	}
}
