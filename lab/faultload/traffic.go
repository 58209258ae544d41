// Package faultload measures how the sharding proxy behaves while a shard host fails:
// it runs traffic through the proxy, logs every statement (when it began and ended, the
// keys it touched, how it ended), and then reads that log against the times faults began
// and healed: how soon statements that need the faulty shard failed and with what error,
// whether the others kept their latency, how soon the shard answered again after
// healing, and whether every acknowledged write can be read. scripts/netlab.sh run
// faults drives it across the lab's network hosts (cmd/faultload).
package faultload

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The tables the traffic uses, both sharded by id: items is loaded before (ids 1 to
// Keys), acks receives the writes.
const (
	CreateItems = "CREATE TABLE fault_items (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0)"
	CreateAcks  = "CREATE TABLE fault_acks (id bigint NOT NULL, worker int NOT NULL, seq bigint NOT NULL, PRIMARY KEY (id, worker, seq))"
)

// Traffic describes the load.
type Traffic struct {
	DSN     string // the proxy
	Workers int    // connections, each one statement at a time
	// Keys are the ids of fault_items, 1 to Keys.
	Keys int64
	// ByShard, when set, holds the keys of each shard: worker w then reads and writes
	// the keys of shard w mod len(ByShard) only (a pair's second key is on the next
	// shard), so that a shard that stops answering holds up its own workers, not every
	// worker, as independent clients would not be held up either.
	ByShard [][]int64
	// Pace is the gap between one worker's statements (0: none).
	Pace time.Duration
	// Pairs makes every other write a transaction that inserts two keys (likely on two
	// shards): with the proxy's --two-phase, both rows or neither.
	Pairs bool
	// Bound is how long the client waits for one statement before it gives up on it
	// (a hang, as the analysis calls it); the connection is then dropped.
	Bound time.Duration
	// ConnectTimeout bounds each (re)connection.
	ConnectTimeout time.Duration
	Seed           uint64
}

// Op is what a statement did.
type Op string

// The operations.
const (
	Read  Op = "read"  // SELECT n FROM fault_items WHERE id = $1
	Write Op = "write" // INSERT INTO fault_acks VALUES ($1, worker, seq)
	Pair  Op = "pair"  // BEGIN; two such inserts, keys Key and Key2; COMMIT
)

// Event is one statement (or one pair transaction) of the log.
type Event struct {
	Start, End time.Time
	Worker     int
	Op         Op
	Key, Key2  int64 // Key2: a pair's second key
	Seq        int64 // the worker's write sequence (writes and pairs)
	Code       string
	Err        string // empty when it succeeded (a write is then acknowledged)
}

// OK reports whether the statement succeeded.
func (e Event) OK() bool { return e.Err == "" }

// Latency is how long it took.
func (e Event) Latency() time.Duration { return e.End.Sub(e.Start) }

// HangCode marks a statement the client gave up on after Traffic.Bound.
const HangCode = "hang"

// Run runs t until ctx ends, sending every event to emit (from one goroutine at a
// time). Errors of statements are events, not errors of Run; Run fails only when t is
// wrong.
func Run(ctx context.Context, t Traffic, emit func(Event)) error {
	if t.Workers < 1 || t.Keys < 2 || t.Bound <= 0 {
		return errors.New("faultload: want workers >= 1, keys >= 2 and a positive bound")
	}
	for i, keys := range t.ByShard {
		if len(keys) == 0 {
			return fmt.Errorf("faultload: shard %d has no keys", i)
		}
	}
	if t.ConnectTimeout <= 0 {
		t.ConnectTimeout = 5 * time.Second
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range t.Workers {
		wg.Go(func() {
			worker(ctx, t, w, func(e Event) {
				mu.Lock()
				emit(e)
				mu.Unlock()
			})
		})
	}
	wg.Wait()
	return nil
}

func worker(ctx context.Context, t Traffic, w int, emit func(Event)) {
	rng := rand.New(rand.NewPCG(t.Seed, uint64(w)))
	pick := func(int) int64 { return 1 + rng.Int64N(t.Keys) }
	if n := len(t.ByShard); n > 0 {
		pick = func(shard int) int64 {
			keys := t.ByShard[shard%n]
			return keys[rng.IntN(len(keys))]
		}
	}
	var conn *pgconn.PgConn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	var seq int64
	for i := 0; ctx.Err() == nil; i++ {
		if t.Pace > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(t.Pace):
			}
		}
		e := Event{Worker: w, Op: Read, Key: pick(w)}
		switch {
		case i%2 == 0:
		case t.Pairs && i%4 == 1:
			e.Op, e.Key2 = Pair, pick(w+1)
			for e.Key2 == e.Key {
				e.Key2 = pick(w + 1)
			}
		default:
			e.Op = Write
		}
		if e.Op != Read {
			seq++
			e.Seq = seq
		}
		e.Start = time.Now()
		sctx, cancel := context.WithTimeout(ctx, t.Bound)
		var err error
		if conn == nil {
			cctx, ccancel := context.WithTimeout(sctx, t.ConnectTimeout)
			conn, err = pgconn.Connect(cctx, t.DSN)
			ccancel()
		}
		if err == nil {
			err = statement(sctx, conn, e)
		}
		e.End = time.Now()
		cancel()
		if ctx.Err() != nil && err != nil {
			return // the run ended during the statement: not an event
		}
		if err != nil {
			e.Code, e.Err = classify(err, sctx)
			if conn != nil && (conn.IsClosed() || e.Code == HangCode || !recoverable(err)) {
				conn.Close(context.Background())
				conn = nil
			}
		}
		emit(e)
	}
}

func statement(ctx context.Context, conn *pgconn.PgConn, e Event) error {
	key := func(k int64) []byte { return strconv.AppendInt(nil, k, 10) }
	insert := "INSERT INTO fault_acks (id, worker, seq) VALUES ($1, $2, $3)"
	args := func(k int64) [][]byte { return [][]byte{key(k), key(int64(e.Worker)), key(e.Seq)} }
	switch e.Op {
	case Read:
		_, err := conn.ExecParams(ctx, "SELECT n FROM fault_items WHERE id = $1", [][]byte{key(e.Key)}, nil, nil, nil).Close()
		return err
	case Write:
		_, err := conn.ExecParams(ctx, insert, args(e.Key), nil, nil, nil).Close()
		return err
	}
	if _, err := conn.Exec(ctx, "BEGIN").ReadAll(); err != nil {
		return err
	}
	for _, k := range []int64{e.Key, e.Key2} {
		if _, err := conn.ExecParams(ctx, insert, args(k), nil, nil, nil).Close(); err != nil {
			conn.Exec(ctx, "ROLLBACK").ReadAll()
			return err
		}
	}
	_, err := conn.Exec(ctx, "COMMIT").ReadAll()
	return err
}

// classify returns the SQLSTATE (or hang, or "conn" for a connection that failed
// without one) and the message.
func classify(err error, ctx context.Context) (string, string) {
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe):
		return pe.Code, pe.Message
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return HangCode, "no answer within the client's bound: " + err.Error()
	}
	return "conn", err.Error()
}

// recoverable reports whether the connection may go on after err: a server's ERROR
// leaves it usable.
func recoverable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Severity != "FATAL" && pe.Severity != "PANIC"
}

// eventHeader is the log's CSV header.
var eventHeader = []string{"start_unix_us", "end_unix_us", "worker", "op", "key", "key2", "seq", "code", "error"}

// Log writes events as CSV.
type Log struct{ w *csv.Writer }

// NewLog writes the header to w and returns the log.
func NewLog(w io.Writer) (*Log, error) {
	l := &Log{w: csv.NewWriter(w)}
	return l, l.w.Write(eventHeader)
}

// Write appends e.
func (l *Log) Write(e Event) error {
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	return l.w.Write([]string{i(e.Start.UnixMicro()), i(e.End.UnixMicro()), i(int64(e.Worker)), string(e.Op), i(e.Key), i(e.Key2), i(e.Seq), e.Code, e.Err})
}

// Flush flushes the log and returns its first error.
func (l *Log) Flush() error {
	l.w.Flush()
	return l.w.Error()
}

// ReadLog reads a log NewLog wrote.
func ReadLog(r io.Reader) ([]Event, error) {
	recs, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 || len(recs[0]) != len(eventHeader) || recs[0][0] != eventHeader[0] {
		return nil, errors.New("faultload: not an event log (its header is missing)")
	}
	events := make([]Event, 0, len(recs)-1)
	for n, r := range recs[1:] {
		var v [7]int64
		for i := range v {
			if i == 3 {
				continue
			}
			x, err := strconv.ParseInt(r[i], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("faultload: event %d: %s: %q is not a number", n+1, eventHeader[i], r[i])
			}
			v[i] = x
		}
		events = append(events, Event{Start: time.UnixMicro(v[0]), End: time.UnixMicro(v[1]), Worker: int(v[2]), Op: Op(r[3]),
			Key: v[4], Key2: v[5], Seq: v[6], Code: r[7], Err: r[8]})
	}
	return events, nil
}
