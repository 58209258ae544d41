package backend

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardlab/shardlab/proxy/rawio"
)

// TCP is how a TCP connection finds out that its peer is gone when the network says
// nothing: a host that is partitioned away drops packets and sends no reset, so without
// these a read waits forever and unacknowledged data is retransmitted for about 15
// minutes (Linux's tcp_retries2) before the connection fails.
//
// Both only ever end connections whose peer's kernel stopped answering: a server that
// runs a long query still acknowledges the probes and the data. One exception, on Linux
// 5.11 and later: a peer that keeps its receive window closed (it reads nothing) for
// longer than UserTimeout while this side has data to send counts as gone too.
type TCP struct {
	// KeepAliveIdle is how long a connection is silent before the first keepalive
	// probe; KeepAliveInterval the time between probes, and KeepAliveCount how many go
	// unanswered before the connection fails. A negative KeepAliveIdle turns probes
	// off.
	KeepAliveIdle     time.Duration
	KeepAliveInterval time.Duration
	KeepAliveCount    int
	// UserTimeout is TCP_USER_TIMEOUT (Linux): data sent and unacknowledged for this
	// long fails the connection, and, with keepalive, probes unanswered for this long
	// do. Negative leaves the system's behaviour.
	UserTimeout time.Duration
}

// Defaults for zero TCP fields: pgcat's keepalive (5 s idle, 5 s apart, 5 probes), and
// a user timeout that matches it (idle + interval x count, as libpq's documentation
// advises), so that a dead peer is found about 30 s after it last spoke whether or not
// a statement is in flight.
const (
	DefaultKeepAliveIdle     = 5 * time.Second
	DefaultKeepAliveInterval = 5 * time.Second
	DefaultKeepAliveCount    = 5
	DefaultUserTimeout       = 30 * time.Second
)

// WithDefaults returns t with its zero fields set to the defaults.
func (t TCP) WithDefaults() TCP {
	if t.KeepAliveIdle == 0 {
		t.KeepAliveIdle = DefaultKeepAliveIdle
	}
	if t.KeepAliveInterval <= 0 {
		t.KeepAliveInterval = DefaultKeepAliveInterval
	}
	if t.KeepAliveCount <= 0 {
		t.KeepAliveCount = DefaultKeepAliveCount
	}
	if t.UserTimeout == 0 {
		t.UserTimeout = DefaultUserTimeout
	}
	return t
}

func (t TCP) keepAlive() net.KeepAliveConfig {
	if t.KeepAliveIdle < 0 {
		return net.KeepAliveConfig{Enable: false}
	}
	return net.KeepAliveConfig{Enable: true, Idle: t.KeepAliveIdle, Interval: t.KeepAliveInterval, Count: t.KeepAliveCount}
}

// Apply sets t on a connection that is already made (one a listener accepted). t
// must have its defaults (WithDefaults).
func (t TCP) Apply(c *net.TCPConn) error {
	ka := t.keepAlive()
	if ka.Enable {
		if err := c.SetKeepAliveConfig(ka); err != nil {
			return fmt.Errorf("set keepalive: %w", err)
		}
	} else if err := c.SetKeepAlive(false); err != nil {
		return fmt.Errorf("set keepalive: %w", err)
	}
	if t.UserTimeout <= 0 {
		return nil
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	return t.setUserTimeout(rc)
}

func (t TCP) setUserTimeout(rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(t.UserTimeout.Milliseconds()))
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("set TCP_USER_TIMEOUT: %w", err)
	}
	return nil
}

// Dial returns a dial function whose TCP connections have t set on their socket
// before it connects, and are wrapped for raw system calls (rawio.Wrapping). t must
// have its defaults (WithDefaults).
func (t TCP) Dial() rawio.DialFunc {
	d := &net.Dialer{KeepAliveConfig: t.keepAlive()}
	if !d.KeepAliveConfig.Enable {
		d.KeepAlive = -1
	}
	if t.UserTimeout > 0 {
		d.ControlContext = func(_ context.Context, network, _ string, rc syscall.RawConn) error {
			if network != "tcp" && network != "tcp4" && network != "tcp6" {
				return nil // a Unix socket has no such thing
			}
			return t.setUserTimeout(rc)
		}
	}
	return rawio.Wrapping(d.DialContext)
}
