//go:build race

package rawio

import (
	"runtime"
	"unsafe"
)

// ioSync stands for what a socket passes between goroutines: as the syscall package
// does for the race detector, a write releases it and a read acquires it, and the
// buffers are marked read or written, since the raw calls are invisible to the detector.
var ioSync int64

func raceReleaseWrite() { runtime.RaceReleaseMerge(unsafe.Pointer(&ioSync)) }

func raceWritten(b []byte) {
	if len(b) > 0 {
		runtime.RaceReadRange(unsafe.Pointer(&b[0]), len(b))
	}
}

func raceRead(b []byte) {
	if len(b) > 0 {
		runtime.RaceWriteRange(unsafe.Pointer(&b[0]), len(b))
	}
	runtime.RaceAcquire(unsafe.Pointer(&ioSync))
}
