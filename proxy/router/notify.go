package router

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/proxy/backend"
)

// LISTEN, UNLISTEN and NOTIFY run on the default data source, where every client's
// channels meet. A client that listens keeps that server connection (in transaction
// pooling it is pinned, as for any state that lives on one connection), and the
// notifications the server sends on it reach the client as from PostgreSQL itself:
// those that arrive during a statement go before its ReadyForQuery (PendingNotifications),
// and those that arrive while the client is idle go at once, read off the connection
// by a watch that lasts while the client waits (WatchNotifications). Clients that never
// listened have no watch.

// PendingNotifications sends the client the notifications queued on the connections
// it keeps; the frontend calls it before each ReadyForQuery.
func (s *Session) PendingNotifications() {
	s.sendNotices()
	if len(s.leases.listens) == 0 {
		return // never listened (the map changes on the client's goroutine only)
	}
	for _, c := range s.leases.listening() {
		for _, n := range c.TakeNotifications() {
			s.client.Send(n)
		}
	}
}

// WatchNotifications starts relaying to the client the notifications that reach the
// connections it keeps and listens on, while it is idle: from another goroutine, which
// sends and flushes to the client while the client's own goroutine waits for its next
// message. The frontend calls it when it waits for that message, and StopWatching
// before it handles it; without a LISTEN it does nothing (and allocates nothing).
func (s *Session) WatchNotifications() {
	if len(s.leases.listens) == 0 || s.explicit {
		return
	}
	conns := s.leases.listening()
	if len(conns) == 0 {
		return
	}
	send := func(notes []*pgproto3.NotificationResponse, notice *pgproto3.NoticeResponse) bool {
		for _, n := range notes {
			s.client.Send(n)
		}
		if notice != nil {
			s.client.Send(notice)
		}
		return s.client.Flush() == nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &watch{cancel: cancel, done: make(chan struct{}, len(conns))}
	for _, c := range conns {
		go func(c *backend.Conn) {
			defer func() { w.done <- struct{}{} }()
			var notice *pgproto3.NoticeResponse
			for {
				if notes := c.TakeNotifications(); (len(notes) > 0 || notice != nil) && !w.send(send, notes, notice) {
					return
				}
				var err error
				if notice, err = c.WaitNotification(ctx); err != nil {
					return
				}
			}
		}(c)
	}
	w.n = len(conns)
	s.watch = w
}

// StopWatching ends the watch WatchNotifications started, and waits until it has.
func (s *Session) StopWatching() {
	w := s.watch
	if w == nil {
		return
	}
	s.watch = nil
	w.cancel()
	for range w.n {
		<-w.done
	}
}

// watch is a WatchNotifications in progress.
type watch struct {
	cancel func()
	done   chan struct{}
	n      int
	mu     sync.Mutex // one send at a time
}

func (w *watch) send(send func([]*pgproto3.NotificationResponse, *pgproto3.NoticeResponse) bool,
	notes []*pgproto3.NotificationResponse, notice *pgproto3.NoticeResponse) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return send(notes, notice)
}

// listening returns the connections the client keeps on data sources where it ran
// LISTEN.
func (l *leases) listening() []*backend.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*backend.Conn
	for ds := range l.listens {
		if c := l.pinned[ds]; c != nil {
			out = append(out, c)
		}
	}
	return out
}

// listen records that the client ran LISTEN on data source ds.
func (l *leases) listen(ds int) {
	l.mu.Lock()
	l.listens[ds] = true
	l.mu.Unlock()
}

// Notices that statements run through pgconn raise (the core's COMMIT, which fires
// deferred triggers; the reads and writes of several shards) are queued as they are
// read, on whichever goroutine reads them, and sent before the client's next
// ReadyForQuery, in the order they came. A relayed answer's notices go in its stream.

// maxQueuedNotices bounds the notices queued for one statement.
const maxQueuedNotices = 10000

// queueNotice queues a notice for the client (see SetNoticeSink).
func (s *Session) queueNotice(n *pgconn.Notice) {
	s.notices.Lock()
	defer s.notices.Unlock()
	if len(s.notices.q) < maxQueuedNotices {
		s.notices.q = append(s.notices.q, &pgproto3.NoticeResponse{
			Severity: n.Severity, SeverityUnlocalized: n.SeverityUnlocalized, Code: n.Code, Message: n.Message,
			Detail: n.Detail, Hint: n.Hint, Position: n.Position, InternalPosition: n.InternalPosition,
			InternalQuery: n.InternalQuery, Where: n.Where, SchemaName: n.SchemaName, TableName: n.TableName,
			ColumnName: n.ColumnName, DataTypeName: n.DataTypeName, ConstraintName: n.ConstraintName,
			File: n.File, Line: n.Line, Routine: n.Routine,
		})
	}
}

// sendNotices sends the queued notices.
func (s *Session) sendNotices() {
	s.notices.Lock()
	q := s.notices.q
	s.notices.q = nil
	s.notices.Unlock()
	for _, n := range q {
		s.client.Send(n)
	}
}
