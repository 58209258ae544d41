package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/lab/shardset/sqlite"
)

// readVariants are the ways a Store can be opened that change how Get reaches SQLite:
// its own connections below database/sql (WAL or rollback journal), or the writer's one
// connection through database/sql (OneConn).
var readVariants = []struct {
	name string
	opts sqlite.Options
}{
	{"wal", sqlite.Options{}},
	{"wal, one read connection", sqlite.Options{ReadConns: 1}},
	{"rollback journal", sqlite.Options{Journal: sqlite.JournalDelete}},
	{"one connection", sqlite.Options{OneConn: true}},
	{"rollback journal, one connection", sqlite.Options{Journal: sqlite.JournalDelete, OneConn: true}},
	{"group commit", sqlite.Options{GroupCommit: true}},
}

func TestGetAnswersInEveryVariant(t *testing.T) {
	ctx := context.Background()
	for _, v := range readVariants {
		t.Run(v.name, func(t *testing.T) {
			st := openStore(t, v.opts)
			if _, err := st.Get(ctx, "absent"); !errors.Is(err, shardset.ErrNotFound) {
				t.Errorf("Get of a missing key = %v, want ErrNotFound", err)
			}
			for _, kv := range []struct{ key, data string }{{"a", "1"}, {"empty", ""}, {"a", "2"}} {
				if err := st.Put(ctx, kv.key, []byte(kv.data)); err != nil {
					t.Fatal(err)
				}
				got, err := st.Get(ctx, kv.key)
				if err != nil || string(got) != kv.data || got == nil {
					t.Errorf("Get(%q) = %q (nil %v), %v; want %q", kv.key, got, got == nil, err, kv.data)
				}
			}
			// The value returned is the caller's: reading again must not change it.
			first, _ := st.Get(ctx, "a")
			if err := st.Put(ctx, "a", []byte("3")); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Get(ctx, "a"); err != nil {
				t.Fatal(err)
			}
			if string(first) != "2" {
				t.Errorf("an earlier Get's value changed to %q", first)
			}
			cancelled, cancel := context.WithCancel(ctx)
			cancel()
			if _, err := st.Get(cancelled, "a"); !errors.Is(err, context.Canceled) {
				t.Errorf("Get with a cancelled context = %v, want context.Canceled", err)
			}
		})
	}
}

// TestGetSeesEveryAcknowledgedWrite: writers bump their keys' versions while readers on
// every read connection check that no Get ever returns a version older than the last
// one whose Put had returned before the Get began.
func TestGetSeesEveryAcknowledgedWrite(t *testing.T) {
	for _, v := range readVariants {
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			st := openStore(t, v.opts)
			const keys, versions = 4, 60
			var acked [keys]atomic.Int64 // highest version acknowledged per key
			for k := range keys {
				if err := st.Put(ctx, fmt.Sprint("k", k), []byte("0")); err != nil {
					t.Fatal(err)
				}
			}
			var wg sync.WaitGroup
			stop := make(chan struct{})
			for k := range keys {
				wg.Go(func() {
					for ver := int64(1); ver <= versions; ver++ {
						if err := st.Put(ctx, fmt.Sprint("k", k), []byte(fmt.Sprint(ver))); err != nil {
							t.Errorf("Put: %v", err)
							return
						}
						acked[k].Store(ver)
					}
				})
			}
			var reads atomic.Int64
			for r := range 8 {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						k := (r + i) % keys
						floor := acked[k].Load()
						got, err := st.Get(ctx, fmt.Sprint("k", k))
						if err != nil {
							t.Errorf("Get: %v", err)
							return
						}
						var ver int64
						fmt.Sscan(string(got), &ver)
						if ver < floor {
							t.Errorf("k%d: Get returned version %d after version %d was acknowledged", k, ver, floor)
							return
						}
						reads.Add(1)
					}
				})
			}
			deadline := time.After(20 * time.Second)
			for done := false; !done; {
				select {
				case <-deadline:
					done = true
				case <-time.After(10 * time.Millisecond):
					done = true
					for k := range keys {
						done = done && acked[k].Load() == versions
					}
				}
			}
			close(stop)
			wg.Wait()
			if reads.Load() == 0 {
				t.Error("no read ran")
			}
		})
	}
}

// TestCloseWhileReading closes a store under a read load: every Get returns the value
// or ErrClosed, Close waits for the reads in flight and returns nil, and later Gets get
// ErrClosed.
func TestCloseWhileReading(t *testing.T) {
	for _, v := range readVariants {
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			st, err := sqlite.Open(ctx, t.TempDir()+"/shard.db", v.opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Put(ctx, "k", []byte("v")); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var ok, refused atomic.Int64
			started := make(chan struct{})
			var once sync.Once
			for range 16 {
				wg.Go(func() {
					for {
						got, err := st.Get(ctx, "k")
						once.Do(func() { close(started) })
						switch {
						case err == nil && string(got) == "v":
							ok.Add(1)
						case errors.Is(err, sqlite.ErrClosed):
							refused.Add(1)
							return
						default:
							t.Errorf("Get = %q, %v; want the value or ErrClosed", got, err)
							return
						}
					}
				})
			}
			<-started
			time.Sleep(20 * time.Millisecond)
			if err := st.Close(); err != nil {
				t.Errorf("Close under load: %v", err)
			}
			wg.Wait()
			if ok.Load() == 0 || refused.Load() != 16 {
				t.Errorf("%d reads answered, %d refused; want some answered and all 16 readers refused", ok.Load(), refused.Load())
			}
			if _, err := st.Get(ctx, "k"); !errors.Is(err, sqlite.ErrClosed) {
				t.Errorf("Get after Close = %v, want ErrClosed", err)
			}
		})
	}
}

// TestGetWaitsForAFreeConnection: with one read connection, concurrent Gets take turns
// on it, and a Get whose context has expired does not start.
func TestGetWaitsForAFreeConnection(t *testing.T) {
	ctx := context.Background()
	st := openStore(t, sqlite.Options{ReadConns: 1})
	if err := st.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				if got, err := st.Get(ctx, "k"); err != nil || string(got) != "v" {
					t.Errorf("Get = %q, %v", got, err)
					return
				}
			}
		})
	}
	wg.Wait()
	short, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	<-short.Done()
	if _, err := st.Get(short, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Get with an expired context = %v, want DeadlineExceeded", err)
	}
}
