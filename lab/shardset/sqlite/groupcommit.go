package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// maxBatch bounds the writes of one group commit, so that one transaction stays short.
const maxBatch = 512

// groupCommitter is a shard's writer goroutine under Options.GroupCommit. Writers hand it
// their upserts; it takes every write waiting, commits them in one transaction, and only
// then answers each. While one commit waits for the disk the next writes queue, so the
// batch grows with the load and a lone write is committed at once, without added delay.
// It is what PostgreSQL's WAL does: one fsync makes many transactions durable.
type groupCommitter struct {
	writer *sql.DB
	upsert *sql.Stmt
	reqs   chan *writeReq
	done   chan struct{}

	mu struct {
		sync.RWMutex
		closed bool
	}
	commits, writes atomic.Int64
}

type writeReq struct {
	key    string
	data   []byte
	at     int64
	result chan error // buffered: the committer never waits for the writer
}

func startGroupCommitter(writer *sql.DB, put *sql.Stmt) *groupCommitter {
	g := &groupCommitter{writer: writer, upsert: put, reqs: make(chan *writeReq, maxBatch), done: make(chan struct{})}
	go g.run()
	return g
}

// put hands one write to the committer and waits for the commit that holds it.
func (g *groupCommitter) put(ctx context.Context, key string, data []byte) error {
	r := &writeReq{key: key, data: data, at: time.Now().UnixMicro(), result: make(chan error, 1)}
	g.mu.RLock()
	if g.mu.closed {
		g.mu.RUnlock()
		return ErrClosed
	}
	select {
	case g.reqs <- r:
	case <-ctx.Done():
		g.mu.RUnlock()
		return ctx.Err()
	}
	g.mu.RUnlock()
	select {
	case err := <-r.result:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *groupCommitter) run() {
	defer close(g.done)
	batch := make([]*writeReq, 0, maxBatch)
	for first := range g.reqs {
		batch = append(batch[:0], first)
	gather:
		for len(batch) < maxBatch {
			select {
			case r, ok := <-g.reqs:
				if !ok {
					break gather
				}
				batch = append(batch, r)
			default:
				break gather
			}
		}
		err := g.commit(batch)
		if err != nil && len(batch) > 1 {
			// One bad write must not fail the others: commit each on its own.
			for _, r := range batch {
				r.result <- g.commit([]*writeReq{r})
			}
			continue
		}
		for _, r := range batch {
			r.result <- err
		}
	}
}

// commit runs batch in one BEGIN IMMEDIATE transaction. It does not take a writer's
// context: the transaction is shared, and one writer giving up must not abort the others.
func (g *groupCommitter) commit(batch []*writeReq) error {
	ctx := context.Background()
	tx, err := g.writer.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	put := tx.StmtContext(ctx, g.upsert)
	for _, r := range batch {
		if _, err := put.ExecContext(ctx, r.key, r.data, r.at); err != nil {
			return errors.Join(fmt.Errorf("upsert: %w", err), tx.Rollback())
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	g.commits.Add(1)
	g.writes.Add(int64(len(batch)))
	return nil
}

// close refuses new writes, lets the committer commit those already handed to it, and
// waits for it to stop.
func (g *groupCommitter) close() {
	g.mu.Lock()
	if !g.mu.closed {
		g.mu.closed = true
		close(g.reqs)
	}
	g.mu.Unlock()
	<-g.done
}
