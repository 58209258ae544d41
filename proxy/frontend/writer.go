package frontend

import (
	"io"

	"github.com/jackc/pgx/v5/pgproto3"
)

// writeThreshold is how much output gathers before it is written without a Flush: a
// large result streams to the client instead of piling up in memory.
const writeThreshold = 32 << 10

// Writer encodes messages to a client with pgproto3, buffering them until Flush or
// until enough has gathered. A write error sticks: later calls do nothing and Err
// reports it, so that a statement's answer can still be drained from the server
// after the client went away.
type Writer struct {
	w   io.Writer
	buf []byte
	err error
}

// NewWriter returns a writer to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w, buf: make([]byte, 0, 8<<10)} }

// Send queues msg.
func (w *Writer) Send(msg pgproto3.BackendMessage) {
	if w.err != nil {
		return
	}
	buf, err := msg.Encode(w.buf)
	if err != nil {
		w.err = err
		return
	}
	w.buf = buf
	if len(w.buf) >= writeThreshold {
		w.Flush()
	}
}

// Flush writes what is queued.
func (w *Writer) Flush() error {
	if w.err != nil {
		return w.err
	}
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.w.Write(w.buf)
	if cap(w.buf) > 1<<20 {
		w.buf = make([]byte, 0, 8<<10)
	} else {
		w.buf = w.buf[:0]
	}
	w.err = err
	return err
}

// Pending reports whether messages are queued.
func (w *Writer) Pending() bool { return len(w.buf) > 0 }

// Err returns the first write error.
func (w *Writer) Err() error { return w.err }
