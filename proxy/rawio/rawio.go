// Package rawio reads and writes the proxy's TCP connections with raw system calls.
//
// A Go program that makes a system call tells the scheduler first, so that the
// scheduler's monitor thread can hand the processor to another thread if the call
// blocks. The proxy makes four such calls per forwarded transaction, on non-blocking
// sockets where none of them can block; yet on a loopback connection a write does the
// receiver's TCP work as well and takes long enough that the monitor often hands the
// processor over anyway, and wakes every 20 µs while it sees calls in progress. Each
// hand-over and each wake-up is a thread switch, which on a virtual machine costs
// several microseconds. Conn makes the call without telling the scheduler, and waits
// for readiness through the runtime's network poller as net.Conn does, so deadlines
// and closing work as before.
package rawio

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// Conn is a TCP connection whose Read and Write make raw system calls. Everything else
// is the embedded *net.TCPConn's.
type Conn struct {
	*net.TCPConn
	rc syscall.RawConn
}

// Wrap returns c as a *Conn when it is a TCP connection, and c itself otherwise.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return &Conn{TCPConn: tc, rc: rc}
}

// Dial dials as pgconn does by default (TCP keepalives every 5 minutes) and wraps the
// connection; it fits pgconn.Config.DialFunc.
func Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{KeepAlive: 5 * 60 * 1e9}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return Wrap(c), nil
}

// maxRW bounds one call, as the standard library does.
const maxRW = 1 << 30

// Read reads into b with read(2), waiting in the poller while nothing has arrived.
func (c *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if len(b) > maxRW {
		b = b[:maxRW]
	}
	var n int
	var errno syscall.Errno
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false
			}
			n, errno = int(r), e
			return true
		}
	})
	if err == nil && errno != 0 {
		err = os.NewSyscallError("read", errno)
	}
	if err != nil {
		return 0, c.opError("read", err)
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of b with write(2), waiting in the poller while the socket's buffer
// is full.
func (c *Conn) Write(b []byte) (int, error) {
	var written int
	var errno syscall.Errno
	err := c.rc.Write(func(fd uintptr) bool {
		for written < len(b) {
			chunk := b[written:]
			if len(chunk) > maxRW {
				chunk = chunk[:maxRW]
			}
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&chunk[0])), uintptr(len(chunk)))
			switch e {
			case 0:
				written += int(r)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err == nil && errno != 0 {
		err = os.NewSyscallError("write", errno)
	}
	if err != nil {
		return written, c.opError("write", err)
	}
	return written, nil
}

// opError reports err as net.Conn's Read and Write do: a *net.OpError whose Err is the
// poller's error (os.ErrDeadlineExceeded, net.ErrClosed) or the system call's.
func (c *Conn) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
