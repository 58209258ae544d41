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
// is the embedded *net.TCPConn's, except File, which is refused: the file's descriptor
// would be put in blocking mode, and a raw call that blocks stalls the whole program.
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

// DialFunc is the signature of pgconn.Config.DialFunc.
type DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// Wrapping returns dial with its connections wrapped (see Wrap).
func Wrapping(dial DialFunc) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return Wrap(c), nil
	}
}

// errFile is File's refusal.
var errFile = errors.New("rawio: File would put the socket in blocking mode, under raw system calls")

// File refuses (see Conn).
func (c *Conn) File() (*os.File, error) { return nil, errFile }

// maxRW bounds one call, as the standard library does.
const maxRW = 1 << 30

// Read reads into b with read(2), waiting in the poller while nothing has arrived.
func (c *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		// As net.Conn: an error if the connection is closed.
		if err := c.rc.Read(func(uintptr) bool { return true }); err != nil {
			return 0, c.opError("read", err)
		}
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
	raceRead(b[:n])
	return n, nil
}

// Write writes all of b with write(2), waiting in the poller while the socket's buffer
// is full.
func (c *Conn) Write(b []byte) (int, error) {
	raceReleaseWrite()
	var written int
	var errno syscall.Errno
	var short bool
	err := c.rc.Write(func(fd uintptr) bool {
		for written < len(b) {
			chunk := b[written:]
			if len(chunk) > maxRW {
				chunk = chunk[:maxRW]
			}
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&chunk[0])), uintptr(len(chunk)))
			switch {
			case e == 0 && (r == 0 || int(r) > len(chunk)):
				short = true // not for a TCP socket, but never loop on it
				return true
			case e == 0:
				written += int(r)
			case e == syscall.EINTR:
			case e == syscall.EAGAIN:
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
	if err == nil && short {
		err = io.ErrUnexpectedEOF
	}
	raceWritten(b[:written])
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
