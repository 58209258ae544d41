package loadgen

import (
	"context"
	"errors"
	"io"
	"net"
)

// Target is what the engine loads: a key-value service, in the shape of go-ycsb's DB.
// The engine calls it from Config.Concurrency goroutines at once, so implementations are
// safe for concurrent use. Each call's context carries Config.Timeout and the run's
// cancellation.
//
// HTTPTarget drives the demo-server, SQLTarget a database/sql handle (a PostgreSQL
// database, and through the same interface the sharding driver or a wire proxy reached
// with pgx's stdlib driver). A Target can do more through the optional interfaces
// Replier and ErrorClassifier.
type Target interface {
	// Read looks key up. A key that is not there is an answer (found false, err nil),
	// not a failure.
	Read(ctx context.Context, key string) (found bool, err error)
	// Write stores value under key, replacing any earlier value. nil means the target
	// acknowledged the write.
	Write(ctx context.Context, key, value string) error
}

// Reply is what a Replier says about an answer beyond found and err: for HTTP, the status
// and the body.
type Reply struct {
	Status int    // protocol status (HTTP), 0 when there was no answer
	Body   []byte // the raw answer
}

// Replier is an optional capability of a Target whose answers carry more than found and
// err. When Config.OnResult is set, the engine calls these methods instead of Read and
// Write and hands the Reply to OnResult as Outcome.Status and Outcome.Body; a test can
// then check, for example, which shard acknowledged a write. Otherwise the engine calls
// Read and Write, which need not keep the body.
type Replier interface {
	// ReadReply is Read that also returns the answer.
	ReadReply(ctx context.Context, key string) (found bool, reply Reply, err error)
	// WriteReply is Write that also returns the answer.
	WriteReply(ctx context.Context, key, value string) (reply Reply, err error)
}

// ErrorClassifier is an optional capability of a Target that knows its own failures: it
// names the kind of a failed call for Result.ErrorsByKind (e.g. "http_503",
// "sqlstate_40001"). Targets without it get ClassifyError.
type ErrorClassifier interface {
	ClassifyError(err error) string
}

// ClassifyError names the kind of a failed call from what any target's error can say:
// "timeout" for a deadline or a network timeout, "cancelled", "connection" for a refused,
// reset or cut connection, and "other".
func ClassifyError(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	var oe *net.OpError
	if errors.As(err, &oe) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "connection"
	}
	return "other"
}

func classify(t Target, err error) string {
	if c, ok := t.(ErrorClassifier); ok {
		return c.ClassifyError(err)
	}
	return ClassifyError(err)
}
