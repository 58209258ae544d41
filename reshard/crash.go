package reshard

import (
	"os"
	"syscall"
)

// CrashEnv names the environment variable that makes a process running a move kill
// itself (SIGKILL, as kill -9 would) when it reaches the point named: the tests of
// crash safety run the real reshard command with it, once at each point. Unset,
// nothing happens. The points:
//
//	start-stream        start, once its first stream is made
//	cutover-switching   the cutover's hold, once the switching record is written
//	cutover-stopped     the cutover's hold, once the streams stopped and the streams back marked
//	cutover-final       the cutover's hold, once the record proper is written
//	cutover-done        the cutover, after its hold, before it subscribes the streams back
//	revert-switching    the revert's hold, once the switching record is written
//	revert-stopped      the revert's hold, once the streams back stopped
//	revert-final        the revert's hold, once the record proper is written
//	revert-removing     the revert, after its hold, before it removes what the move made
//	finish-finishing    the finish, once it recorded that it began
//	finish-deleted      the finish, once the rows that moved are deleted
const CrashEnv = "SHARDLAB_RESHARD_CRASH_AT"

// crashPoint kills the process when CrashEnv names point.
func crashPoint(point string) {
	if os.Getenv(CrashEnv) != point {
		return
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
