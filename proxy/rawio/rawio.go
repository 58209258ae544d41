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
	"sync"
	"syscall"
	"unsafe"
)

// Conn is a TCP connection whose Read and Write make raw system calls. Everything else
// is the embedded *net.TCPConn's, except File, which is refused: the file's descriptor
// would be put in blocking mode, and a raw call that blocks stalls the whole program.
//
// The functions given to the raw connection are made once, with the connection, and
// keep their arguments and results in it: a closure made per call would cost two or
// three allocations per Read and per Write.
type Conn struct {
	*net.TCPConn
	rc syscall.RawConn

	rmu sync.Mutex // one Read at a time uses rd
	rd  readOp
	wmu sync.Mutex // one Write at a time uses wr
	wr  writeOp
}

// readOp is one Read's system calls: into b, n bytes read or errno.
type readOp struct {
	b     []byte
	n     int
	errno syscall.Errno
	do    func(fd uintptr) bool // run, bound once
}

func (op *readOp) run(fd uintptr) bool {
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&op.b[0])), uintptr(len(op.b)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		op.n, op.errno = int(r), e
		return true
	}
}

// writeOp is one Write's system calls: of b, written bytes so far, then errno or
// short (a write that wrote nothing, or more than asked).
type writeOp struct {
	b       []byte
	written int
	errno   syscall.Errno
	short   bool
	do      func(fd uintptr) bool // run, bound once
}

func (op *writeOp) run(fd uintptr) bool {
	for op.written < len(op.b) {
		chunk := op.b[op.written:]
		if len(chunk) > maxRW {
			chunk = chunk[:maxRW]
		}
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&chunk[0])), uintptr(len(chunk)))
		switch {
		case e == 0 && (r == 0 || int(r) > len(chunk)):
			op.short = true // not for a TCP socket, but never loop on it
			return true
		case e == 0:
			op.written += int(r)
		case e == syscall.EINTR:
		case e == syscall.EAGAIN:
			return false
		default:
			op.errno = e
			return true
		}
	}
	return true
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
	rw := &Conn{TCPConn: tc, rc: rc}
	rw.rd.do = rw.rd.run
	rw.wr.do = rw.wr.run
	return rw
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
	c.rmu.Lock()
	op := &c.rd
	op.b, op.n, op.errno = b, 0, 0
	err := c.rc.Read(op.do)
	n, errno := op.n, op.errno
	op.b = nil
	c.rmu.Unlock()
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
	c.wmu.Lock()
	op := &c.wr
	op.b, op.written, op.errno, op.short = b, 0, 0, false
	err := c.rc.Write(op.do)
	written, errno, short := op.written, op.errno, op.short
	op.b = nil
	c.wmu.Unlock()
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
