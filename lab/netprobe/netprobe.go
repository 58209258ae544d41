// Package netprobe measures a network path the way the lab's experiments use it: the
// round trip of a trivial SQL statement over one open connection, and whether a TCP
// connection can be opened at all (it is answered, refused, or times out as it does
// across a network partition). scripts/netlab.sh runs it inside its hosts (cmd/netprobe).
package netprobe

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// ErrNoSamples is returned by Summarize for an empty slice.
var ErrNoSamples = errors.New("netprobe: no samples")

// Summary describes a set of round-trip times.
type Summary struct {
	N                 int
	Min, Median, P99  time.Duration
	Max, Mean, Stddev time.Duration
}

// Summarize sorts a copy of samples and returns their summary; P99 is the nearest-rank
// 99th percentile (with 100 samples or fewer, the largest but one or the largest).
func Summarize(samples []time.Duration) (Summary, error) {
	if len(samples) == 0 {
		return Summary{}, ErrNoSamples
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	n := len(s)
	var sum float64
	for _, d := range s {
		sum += float64(d)
	}
	mean := sum / float64(n)
	var sq float64
	for _, d := range s {
		sq += (float64(d) - mean) * (float64(d) - mean)
	}
	median := s[n/2]
	if n%2 == 0 {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	return Summary{
		N:      n,
		Min:    s[0],
		Median: median,
		P99:    s[int(math.Ceil(0.99*float64(n)))-1],
		Max:    s[n-1],
		Mean:   time.Duration(mean),
		Stddev: time.Duration(math.Sqrt(sq / float64(n))),
	}, nil
}

// warmup is how many round trips SQLRoundTrips makes before it starts timing: the
// first ones pay for the server's catalog caches and the CPU's.
const warmup = 5

// SQLRoundTrips opens one connection to dsn and times n round trips of "SELECT 1" in
// PostgreSQL's simple query protocol (one message each way), after a few untimed ones.
// Cancelling ctx ends the connection and returns ctx's error.
func SQLRoundTrips(ctx context.Context, dsn string, n int) ([]time.Duration, error) {
	if n < 1 {
		return nil, fmt.Errorf("netprobe: %d round trips: want at least 1", n)
	}
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("netprobe: connect: %w", err)
	}
	defer conn.Close(context.Background())
	samples := make([]time.Duration, 0, n)
	for i := -warmup; i < n; i++ {
		start := time.Now()
		if _, err := conn.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
			return nil, fmt.Errorf("netprobe: SELECT 1: %w", err)
		}
		if i >= 0 {
			samples = append(samples, time.Since(start))
		}
	}
	return samples, nil
}

// Read is what ReadAnswer measured of one answer.
type Read struct {
	Rows, Bytes int64         // rows and bytes of values received
	FirstRow    time.Duration // from sending the query to its first row (0: no rows)
	Total       time.Duration // to its end
}

// ReadAnswer opens one connection to dsn, runs query in PostgreSQL's extended protocol
// (the whole answer at once, as a driver asks for it) and reads the answer row by row
// as it arrives, keeping none: the time to its first row and to its end, and its size.
func ReadAnswer(ctx context.Context, dsn, query string) (Read, error) {
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return Read{}, fmt.Errorf("netprobe: connect: %w", err)
	}
	defer conn.Close(context.Background())
	var r Read
	start := time.Now()
	rr := conn.ExecParams(ctx, query, nil, nil, nil, nil)
	for rr.NextRow() {
		if r.Rows == 0 {
			r.FirstRow = time.Since(start)
		}
		r.Rows++
		for _, v := range rr.Values() {
			r.Bytes += int64(len(v))
		}
	}
	if _, err := rr.Close(); err != nil {
		return r, fmt.Errorf("netprobe: %s: %w", query, err)
	}
	r.Total = time.Since(start)
	return r, nil
}

// ReadAnswerInParts is ReadAnswer for a client that fetches the answer fetch rows at a
// time, as JDBC does with a fetch size: in a transaction, one portal, Execute with a row
// limit until the answer ends, one round trip per part.
func ReadAnswerInParts(ctx context.Context, dsn, query string, fetch uint32) (Read, error) {
	if fetch == 0 {
		return Read{}, errors.New("netprobe: fetch size 0: want at least 1 row a part")
	}
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return Read{}, fmt.Errorf("netprobe: connect: %w", err)
	}
	defer conn.Close(context.Background())
	stop := context.AfterFunc(ctx, func() { conn.Conn().SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := conn.Exec(ctx, "BEGIN").ReadAll(); err != nil {
		return Read{}, fmt.Errorf("netprobe: BEGIN: %w", err)
	}
	var r Read
	start := time.Now()
	fe := conn.Frontend()
	fe.Send(&pgproto3.Parse{Query: query})
	fe.Send(&pgproto3.Bind{DestinationPortal: "parts"})
	for done := false; !done; {
		fe.Send(&pgproto3.Execute{Portal: "parts", MaxRows: fetch})
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			return r, fmt.Errorf("netprobe: %w", err)
		}
		var failed error
		for {
			msg, err := fe.Receive()
			if err != nil {
				return r, fmt.Errorf("netprobe: %w", ctxOr(ctx, err))
			}
			switch m := msg.(type) {
			case *pgproto3.DataRow:
				if r.Rows == 0 {
					r.FirstRow = time.Since(start)
				}
				r.Rows++
				for _, v := range m.Values {
					r.Bytes += int64(len(v))
				}
			case *pgproto3.CommandComplete:
				done = true
			case *pgproto3.ErrorResponse:
				failed = pgconn.ErrorResponseToPgError(m)
			}
			if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
				break
			}
		}
		if failed != nil {
			return r, fmt.Errorf("netprobe: %s: %w", query, failed)
		}
	}
	r.Total = time.Since(start)
	if _, err := conn.Exec(ctx, "COMMIT").ReadAll(); err != nil {
		return r, fmt.Errorf("netprobe: COMMIT: %w", err)
	}
	return r, nil
}

// ctxOr returns ctx's error when ctx ended (it interrupted err), else err.
func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Outcome is what became of an attempt to open a TCP connection.
type Outcome string

// The outcomes of Dial.
const (
	// Answered: the connection was established.
	Answered Outcome = "answered"
	// Refused: the host answered with a reset (nothing listens, or a firewall rejects).
	Refused Outcome = "refused"
	// TimedOut: nothing came back before the timeout, as across a partition that drops
	// packets without a word.
	TimedOut Outcome = "timeout"
	// Unreachable: the local network stack had no way there (no route, or a local
	// firewall rule rejected the packet before it left).
	Unreachable Outcome = "unreachable"
)

// Dial tries to open a TCP connection to addr within timeout and closes it at once. It
// returns the outcome, and an error only for an outcome none of the four describes.
// Cancelling ctx ends the attempt early with ctx's error.
func Dial(ctx context.Context, addr string, timeout time.Duration) (Outcome, error) {
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	switch {
	case err == nil:
		conn.Close()
		return Answered, nil
	case ctx.Err() != nil:
		return "", ctx.Err()
	case errors.Is(err, syscall.ECONNREFUSED):
		return Refused, nil
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return Unreachable, nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return TimedOut, nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return TimedOut, nil
	}
	return "", fmt.Errorf("netprobe: dial %s: %w", addr, err)
}
