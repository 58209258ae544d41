package delayline

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// kernelTimer sleeps on a timerfd, a kernel timer that keeps microseconds, through Go's
// network poller: the goroutine parks, no thread blocks, and epoll wakes it the moment
// the timer fires. (A plain nanosleep would block a thread per waiting chunk and make Go's
// scheduler hand processors between threads for each one, which costs several times the
// CPU.)
type kernelTimer struct {
	fd   int
	file *os.File // fd, non-blocking, registered with the poller
}

// newKernelTimer returns a timer, or nil when the kernel refuses one; sleep then falls
// back to Go's timers.
func newKernelTimer() *kernelTimer {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	return &kernelTimer{fd: fd, file: os.NewFile(uintptr(fd), "delayline-timer")}
}

// sleep returns after d.
func (t *kernelTimer) sleep(d time.Duration) {
	if t == nil {
		time.Sleep(d)
		return
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	if err := unix.TimerfdSettime(t.fd, 0, &spec, nil); err != nil {
		time.Sleep(d)
		return
	}
	var expirations [8]byte
	if _, err := t.file.Read(expirations[:]); err != nil {
		time.Sleep(d)
	}
}

func (t *kernelTimer) close() {
	if t != nil {
		t.file.Close()
	}
}
