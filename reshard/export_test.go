package reshard

import (
	"testing"
	"time"
)

// StreamName exposes streamName to the tests.
var StreamName = streamName

// CrashAfterRecord makes a cutover stop once the new layout is recorded, as a crash.
func CrashAfterRecord(o *CutoverOptions) { o.crashAfterRecord = true }

// ErrCrashed is what such a cutover returns.
var ErrCrashed = errCrashed

// SetSlotWait bounds the wait for a slot for the rest of a test.
func SetSlotWait(t testing.TB, d time.Duration) {
	old := slotWait
	slotWait = d
	t.Cleanup(func() { slotWait = old })
}

// StopVerifyAfter makes a verify stop, as a crash, once it has recorded n chunks.
func StopVerifyAfter(o *VerifyOptions, n int) { o.stopAfterChunks = n }
