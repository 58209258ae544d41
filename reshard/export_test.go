package reshard

// StreamName exposes streamName to the tests.
var StreamName = streamName

// CrashAfterRecord makes a cutover stop once the new layout is recorded, as a crash.
func CrashAfterRecord(o *CutoverOptions) { o.crashAfterRecord = true }

// ErrCrashed is what such a cutover returns.
var ErrCrashed = errCrashed
