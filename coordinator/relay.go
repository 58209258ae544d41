package coordinator

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The relay stands between the coordinator database and the shards: the coordinator's
// foreign servers point at it, and it passes each postgres_fdw connection on to its
// shard, reading the protocol as it goes. It counts the rows and bytes each coordinator
// statement reads from the shards while the statement runs, and cuts the statement's
// connections when they pass its bound, so that no statement moves more than its
// caller allows (Citus's max_intermediate_result_size, enforced on the wire rather than
// from an estimate).
//
// A coordinator statement is known by its coordinator backend's process id: the foreign
// servers' application_name carries it (postgres_fdw's %p), and a caller Tracks the
// backend that runs its statement.

// Movement is what one coordinator statement read from the shards.
type Movement struct {
	rows, bytes atomic.Int64
	limit       int64
	exceeded    atomic.Bool
	mu          sync.Mutex
	conns       []net.Conn // to cut when the bound is passed
}

// Rows returns the rows the shards sent for the statement's foreign scans.
func (m *Movement) Rows() int64 { return m.rows.Load() }

// Bytes returns the bytes of those rows as the shards sent them.
func (m *Movement) Bytes() int64 { return m.bytes.Load() }

// Exceeded reports whether the statement passed its bound and was cut off.
func (m *Movement) Exceeded() bool { return m.exceeded.Load() }

// add counts one row of n bytes, and reports whether the bound still holds.
func (m *Movement) add(n int) bool {
	m.rows.Add(1)
	if b := m.bytes.Add(int64(n)); m.limit > 0 && b > m.limit {
		if !m.exceeded.Swap(true) {
			m.mu.Lock()
			for _, c := range m.conns {
				c.Close()
			}
			m.mu.Unlock()
		}
		return false
	}
	return true
}

func (m *Movement) attach(c net.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.exceeded.Load() {
		return false
	}
	m.conns = append(m.conns, c)
	return true
}

func (m *Movement) detach(c net.Conn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, x := range m.conns {
		if x == c {
			m.conns = append(m.conns[:i], m.conns[i+1:]...)
			return
		}
	}
}

// relay listens once per data source.
type relay struct {
	listeners   []net.Listener
	targets     []string
	dialTimeout time.Duration
	// peers are the addresses a connection may come from: the coordinator database's
	// server (and loopback). Anyone else would reach the shards as the proxy does.
	peers []net.IP

	mu struct {
		sync.Mutex
		tracked map[uint32]*Movement
		conns   map[net.Conn]struct{}
		closed  bool
	}
	wg sync.WaitGroup
}

// appNamePrefix starts the application_name of the coordinator's connections to the
// shards; postgres_fdw puts the coordinator backend's process id after it.
const appNamePrefix = "shardlab_coordinator "

func startRelay(host string, targets []string, peers []net.IP) (*relay, error) {
	r := &relay{targets: targets, dialTimeout: 10 * time.Second, peers: peers}
	r.mu.tracked = map[uint32]*Movement{}
	r.mu.conns = map[net.Conn]struct{}{}
	for range targets {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			r.close()
			return nil, fmt.Errorf("coordinator relay: %w", err)
		}
		r.listeners = append(r.listeners, ln)
	}
	for i, ln := range r.listeners {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.serve(ln, i)
		}()
	}
	return r, nil
}

// addr returns where data source ds's foreign server connects.
func (r *relay) addr(ds int) (host string, port int) {
	a := r.listeners[ds].Addr().(*net.TCPAddr)
	return a.IP.String(), a.Port
}

func (r *relay) track(pid uint32, limit int64) *Movement {
	m := &Movement{limit: limit}
	r.mu.Lock()
	r.mu.tracked[pid] = m
	r.mu.Unlock()
	return m
}

func (r *relay) untrack(pid uint32) {
	r.mu.Lock()
	delete(r.mu.tracked, pid)
	r.mu.Unlock()
}

func (r *relay) movementOf(appName string) *Movement {
	rest, ok := strings.CutPrefix(appName, appNamePrefix)
	if !ok {
		return nil
	}
	pid, err := strconv.ParseUint(strings.TrimSpace(rest), 10, 32)
	if err != nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.tracked[uint32(pid)]
}

// close stops listening, cuts every relayed connection and waits for them.
func (r *relay) close() {
	r.mu.Lock()
	r.mu.closed = true
	for c := range r.mu.conns {
		c.Close()
	}
	r.mu.Unlock()
	for _, ln := range r.listeners {
		ln.Close()
	}
	r.wg.Wait()
}

// keep registers a connection to cut at close; false when the relay is closing.
func (r *relay) keep(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.closed {
		return false
	}
	r.mu.conns[c] = struct{}{}
	return true
}

func (r *relay) drop(c net.Conn) {
	r.mu.Lock()
	delete(r.mu.conns, c)
	r.mu.Unlock()
	c.Close()
}

func (r *relay) serve(ln net.Listener, ds int) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if !r.fromPeer(c) {
			c.Close()
			continue
		}
		if !r.keep(c) {
			c.Close()
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer r.drop(c)
			r.relayConn(c, r.targets[ds])
		}()
	}
}

// fromPeer reports whether a connection comes from the coordinator's server.
func (r *relay) fromPeer(c net.Conn) bool {
	a, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return false
	}
	if a.IP.IsLoopback() {
		return true
	}
	for _, p := range r.peers {
		if p.Equal(a.IP) {
			return true
		}
	}
	return false
}

// maxMessage bounds one protocol message the relay reads: PostgreSQL's own bound on
// a field, and some.
const maxMessage = 1<<30 + 1<<20

// Protocol codes of the first message a client sends.
const (
	codeSSLRequest    = 80877103
	codeGSSENCRequest = 80877104
	codeCancelRequest = 80877102
	maxStartup        = 10000
)

// relayConn passes one coordinator connection on to its shard.
func (r *relay) relayConn(client net.Conn, target string) {
	cr := bufio.NewReader(client)
	var startup []byte
	for {
		msg, err := readStartup(cr)
		if err != nil {
			return
		}
		code := binary.BigEndian.Uint32(msg[4:8])
		if code == codeSSLRequest || code == codeGSSENCRequest {
			// The relay speaks plain TCP to the coordinator (it reads the protocol).
			if _, err := client.Write([]byte{'N'}); err != nil {
				return
			}
			continue
		}
		startup = msg
		break
	}
	network := "tcp"
	if strings.HasPrefix(target, "/") {
		network = "unix"
	}
	server, err := net.DialTimeout(network, target, r.dialTimeout)
	if err != nil {
		return
	}
	if !r.keep(server) {
		server.Close()
		return
	}
	defer r.drop(server)
	if _, err := server.Write(startup); err != nil {
		return
	}
	if binary.BigEndian.Uint32(startup[4:8]) == codeCancelRequest {
		io.Copy(io.Discard, server) // the server closes it
		return
	}
	appName := startupParams(startup)["application_name"]
	// The statement a FETCH serves: postgres_fdw keeps its connections across the
	// statements of a coordinator session, so it is looked up at each FETCH.
	var current atomic.Pointer[Movement]
	var attached *Movement
	defer func() {
		if attached != nil {
			attached.detach(client)
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Coordinator to shard: note whether the last query is a cursor's FETCH, and
		// for which statement.
		readMessages(cr, server, nil, func(typ byte, body []byte) bool {
			switch typ {
			case 'Q':
				if len(body) >= 5 && strings.EqualFold(string(body[:5]), "FETCH") {
					m := r.movementOf(appName)
					if m == nil {
						// A statement nobody counts (its backend is not tracked, or it
						// names another's): not passed on.
						return false
					}
					if m != attached {
						if attached != nil {
							attached.detach(client)
						}
						if !m.attach(client) {
							return false
						}
						attached = m
					}
					current.Store(m)
				} else {
					current.Store(nil)
				}
			case 'P':
				current.Store(nil)
			}
			return true
		})
		server.Close()
	}()
	// Shard to coordinator: count the rows of FETCH answers, each before it is read.
	readMessages(bufio.NewReader(server), client, func(typ byte, n int) bool {
		if m := current.Load(); typ == 'D' && m != nil {
			return m.add(n + 1)
		}
		return true
	}, nil)
	client.Close()
	<-done
}

// readStartup reads a startup-phase message: a length, then a code and the rest.
func readStartup(r *bufio.Reader) ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n < 8 || n > maxStartup {
		return nil, errors.New("coordinator relay: bad startup message")
	}
	msg := make([]byte, n)
	copy(msg, head[:])
	if _, err := io.ReadFull(r, msg[4:]); err != nil {
		return nil, err
	}
	return msg, nil
}

// startupParams reads a StartupMessage's parameters.
func startupParams(msg []byte) map[string]string {
	out := map[string]string{}
	if len(msg) < 8 {
		return out
	}
	parts := strings.Split(string(msg[8:]), "\x00")
	for i := 0; i+1 < len(parts); i += 2 {
		if parts[i] == "" {
			break
		}
		out[parts[i]] = parts[i+1]
	}
	return out
}

// readMessages copies typed protocol messages from r to out. ahead, if set, hears of
// each message's type and length before its body is read; seen, if set, sees it
// whole. A false answer from either ends the copy. What is read at once is written at
// once.
func readMessages(r *bufio.Reader, out io.Writer, ahead func(typ byte, n int) bool, seen func(typ byte, body []byte) bool) {
	var head [5]byte
	buf := make([]byte, 32<<10)
	w := bufio.NewWriterSize(out, 32<<10)
	for {
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(head[1:]))
		if n < 4 || n > maxMessage {
			return
		}
		if ahead != nil && !ahead(head[0], n) {
			return
		}
		if _, err := w.Write(head[:]); err != nil {
			return
		}
		if seen == nil {
			// Streamed through in pieces: a large row holds no more than buf.
			if _, err := io.CopyBuffer(w, io.LimitReader(r, int64(n-4)), buf); err != nil {
				return
			}
			continue
		}
		body := buf
		if n-4 > len(buf) {
			body = make([]byte, n-4) // the coordinator's messages: queries, small
		}
		body = body[:n-4]
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		if !seen(head[0], body) {
			return
		}
		if _, err := w.Write(body); err != nil {
			return
		}
	}
}
