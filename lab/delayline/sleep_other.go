//go:build !linux

package delayline

import "time"

// kernelTimer is Go's timer where the lab does not run (it needs Linux's network
// namespaces): a wait is rounded up to about a millisecond when the process is idle.
type kernelTimer struct{}

func newKernelTimer() *kernelTimer { return nil }

func (t *kernelTimer) sleep(d time.Duration) { time.Sleep(d) }

func (t *kernelTimer) close() {}
