package sqlite

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// batchFixture opens a WAL store with one read connection and takes that connection
// away, as a read in flight would, so that the Gets started next queue.
type batchFixture struct {
	t    *testing.T
	st   *Store
	held *pointConn
}

func newBatchFixture(t *testing.T) *batchFixture {
	t.Helper()
	st, err := Open(context.Background(), filepath.Join(t.TempDir(), "shard.db"), Options{ReadConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	f := &batchFixture{t: t, st: st}
	if err := st.Put(context.Background(), "k", []byte("old")); err != nil {
		t.Fatal(err)
	}
	p := st.points
	p.mu.Lock()
	f.held = p.mu.idle[0]
	p.mu.idle = p.mu.idle[:0]
	p.mu.held++
	p.mu.Unlock()
	return f
}

// waitQueued waits until n reads wait in the queue.
func (f *batchFixture) waitQueued(n int) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.st.points.mu.Lock()
		q := len(f.st.points.mu.queue)
		f.st.points.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%d reads queued after 10 s, want %d", q, n)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// get starts a Get of k and returns where its value will arrive.
func (f *batchFixture) get() <-chan string {
	out := make(chan string, 1)
	go func() {
		v, err := f.st.Get(context.Background(), "k")
		if err != nil {
			f.t.Errorf("Get: %v", err)
		}
		out <- string(v)
	}()
	return out
}

// TestBatchSnapshotBeginsAtFirstLookup: a write committed between a batch's BEGIN and its
// first lookup is seen by every read of the batch, since SQLite takes a deferred
// transaction's snapshot at its first read, not at BEGIN.
func TestBatchSnapshotBeginsAtFirstLookup(t *testing.T) {
	f := newBatchFixture(t)
	f.st.points.afterBegin = func() {
		if err := f.st.Put(context.Background(), "k", []byte("new")); err != nil {
			t.Error(err)
		}
	}
	var gets []<-chan string
	for i := range 3 {
		gets = append(gets, f.get())
		f.waitQueued(i + 1)
	}
	f.st.points.release(f.held)
	for i, g := range gets {
		if v := <-g; v != "new" {
			t.Errorf("read %d of the batch = %q, want the write committed before its first lookup", i, v)
		}
	}
	if s := f.st.ReadStats(); s.Batches != 1 || s.BatchedReads != 3 {
		t.Errorf("ReadStats = %+v, want one batch of 3", s)
	}
}

// TestReadArrivingDuringBatchWaitsForNext: once a batch's snapshot has begun, a write
// acknowledged then is not in it, so a read that arrives after that write must not join
// the batch: it is answered by the next transaction and sees the write.
func TestReadArrivingDuringBatchWaitsForNext(t *testing.T) {
	f := newBatchFixture(t)
	late := make(chan (<-chan string), 1)
	var once sync.Once
	f.st.points.afterFirstLookup = func() {
		once.Do(func() {
			if err := f.st.Put(context.Background(), "k", []byte("new")); err != nil {
				t.Error(err)
			}
			late <- f.get() // arrives after the write was acknowledged
			f.waitQueued(1)
		})
	}
	var gets []<-chan string
	for i := range 3 {
		gets = append(gets, f.get())
		f.waitQueued(i + 1)
	}
	f.st.points.release(f.held)
	for i, g := range gets {
		// The batch's snapshot began before the write: it proves that the reads of a
		// batch do share one transaction.
		if v := <-g; v != "old" {
			t.Errorf("read %d of the batch = %q, want the snapshot's %q", i, v, "old")
		}
	}
	if v := <-<-late; v != "new" {
		t.Errorf("a read that arrived after a write was acknowledged got %q, want %q", v, "new")
	}
	if s := f.st.ReadStats(); s.Batches != 1 || s.BatchedReads != 3 {
		t.Errorf("ReadStats = %+v, want one batch of 3 (the late read alone)", s)
	}
}

// TestLoneReadDoesNotWait: a Get that finds a free connection is answered on it at once,
// even while another connection is held, and never starts a batch.
func TestLoneReadDoesNotWait(t *testing.T) {
	st, err := Open(context.Background(), filepath.Join(t.TempDir(), "shard.db"), Options{ReadConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Put(context.Background(), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	p := st.points
	p.mu.Lock()
	held := p.mu.idle[0]
	p.mu.idle = p.mu.idle[1:]
	p.mu.held++
	p.mu.Unlock()
	for range 100 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		v, err := st.Get(ctx, "k")
		cancel()
		if err != nil || string(v) != "v" {
			t.Fatalf("Get with a free connection = %q, %v", v, err)
		}
	}
	if s := st.ReadStats(); s.Batches != 0 {
		t.Errorf("lone reads formed batches: %+v", s)
	}
	p.release(held)
}
