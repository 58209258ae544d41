package sqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/sqlitedb"
	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/lab/shardset/sqlite"
)

// openStore opens a shard file in a fresh directory and closes it after the test.
func openStore(t *testing.T, opts sqlite.Options) *sqlite.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "shard.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return st
}

func allBytes() []byte {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

func TestPutGetRoundTrip(t *testing.T) {
	ctx := context.Background()
	for _, sync := range []string{sqlite.SyncNormal, sqlite.SyncFull} {
		t.Run(sync, func(t *testing.T) {
			st := openStore(t, sqlite.Options{Sync: sync})
			tests := []struct {
				name string
				key  string
				data []byte
			}{
				{"text", "user1", []byte("hello")},
				{"all 256 byte values", "binary", allBytes()},
				{"NUL bytes only", "nuls", []byte{0, 0, 0}},
				{"empty", "empty", []byte{}},
				{"nil is stored as empty", "nil", nil},
				{"unicode key", "ключ-🔑", []byte("v")},
				{"large", "large", bytes.Repeat([]byte{0xff, 0x00, 'a'}, 30000)},
			}
			for _, tt := range tests {
				if err := st.Put(ctx, tt.key, tt.data); err != nil {
					t.Fatalf("%s: put: %v", tt.name, err)
				}
			}
			for _, tt := range tests {
				got, err := st.Get(ctx, tt.key)
				if err != nil {
					t.Fatalf("%s: get: %v", tt.name, err)
				}
				if !bytes.Equal(got, tt.data) {
					t.Errorf("%s: got %d bytes %q, want %d bytes", tt.name, len(got), got[:min(len(got), 16)], len(tt.data))
				}
			}
			n, err := st.Count(ctx)
			if err != nil || n != int64(len(tests)) {
				t.Errorf("Count = %d, %v; want %d", n, err, len(tests))
			}
		})
	}
}

func TestNotFoundAndUpsert(t *testing.T) {
	ctx := context.Background()
	st := openStore(t, sqlite.Options{})
	if _, err := st.Get(ctx, "nobody"); !errors.Is(err, shardset.ErrNotFound) {
		t.Fatalf("Get of a missing key: %v, want shardset.ErrNotFound", err)
	}
	for _, v := range []string{"one", "two", ""} {
		if err := st.Put(ctx, "k", []byte(v)); err != nil {
			t.Fatal(err)
		}
		got, err := st.Get(ctx, "k")
		if err != nil || string(got) != v {
			t.Fatalf("after Put %q: Get = %q, %v", v, got, err)
		}
	}
	if n, err := st.Count(ctx); err != nil || n != 1 {
		t.Errorf("Count after 3 writes of one key = %d, %v; want 1", n, err)
	}
	if err := st.Ping(ctx); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

// TestConcurrentWritersAndReaders: with writers and readers running at once, no write is
// lost and no reader sees an error or a value nobody wrote. Run it with -race.
// TestConcurrentWritersAndReaders runs in every access variant: each must store every
// write and serve every read, whatever it serializes.
func TestConcurrentWritersAndReaders(t *testing.T) {
	for name, opts := range map[string]sqlite.Options{
		"wal":                        {ReadConns: 4},
		"group commit":               {ReadConns: 4, GroupCommit: true},
		"group commit, full sync":    {ReadConns: 4, GroupCommit: true, Sync: sqlite.SyncFull},
		"one connection":             {OneConn: true},
		"rollback journal":           {ReadConns: 4, Journal: sqlite.JournalDelete},
		"rollback journal, one conn": {Journal: sqlite.JournalDelete, OneConn: true, GroupCommit: true},
	} {
		t.Run(name, func(t *testing.T) { concurrentWritersAndReaders(t, opts) })
	}
}

func concurrentWritersAndReaders(t *testing.T, opts sqlite.Options) {
	ctx := context.Background()
	st := openStore(t, opts)
	const writers, perWriter, readers = 4, 60, 4
	var wg sync.WaitGroup
	errs := make(chan error, writers+readers)
	stop := make(chan struct{})
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				// Each key is written twice so upserts race with reads too.
				for v := range 2 {
					if err := st.Put(ctx, fmt.Sprintf("w%d-k%d", w, i), fmt.Appendf(nil, "w%d-k%d-v%d", w, i, v)); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	var rg sync.WaitGroup
	for r := range readers {
		rg.Add(1)
		go func() {
			defer rg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-k%d", r%writers, i%perWriter)
				got, err := st.Get(ctx, key)
				if errors.Is(err, shardset.ErrNotFound) {
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("reader: %w", err)
					return
				}
				if !bytes.HasPrefix(got, []byte(key+"-v")) {
					errs <- fmt.Errorf("reader: %s holds %q", key, got)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n, err := st.Count(ctx); err != nil || n != writers*perWriter {
		t.Fatalf("Count = %d, %v; want %d", n, err, writers*perWriter)
	}
	for w := range writers {
		for i := range perWriter {
			key := fmt.Sprintf("w%d-k%d", w, i)
			got, err := st.Get(ctx, key)
			if err != nil || string(got) != key+"-v1" {
				t.Errorf("%s = %q, %v; want the last write", key, got, err)
			}
		}
	}
}

func TestBadOptionsRefused(t *testing.T) {
	tests := []struct {
		name string
		opts sqlite.Options
	}{
		{"unknown sync", sqlite.Options{Sync: "sometimes"}},
		{"sync in capitals", sqlite.Options{Sync: "FULL"}},
		{"negative read conns", sqlite.Options{ReadConns: -1}},
		{"too many read conns", sqlite.Options{ReadConns: 1025}},
		{"negative busy timeout", sqlite.Options{BusyTimeout: -time.Second}},
		{"unknown journal", sqlite.Options{Journal: "memory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "shard.db")
			st, err := sqlite.Open(context.Background(), path, tt.opts)
			if !errors.Is(err, sqlite.ErrBadOptions) {
				if st != nil {
					st.Close()
				}
				t.Fatalf("Open = %v, want sqlite.ErrBadOptions", err)
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("refused options still created %s (%v)", path, err)
			}
			if _, err := sqlite.OpenShards(context.Background(), t.TempDir(), 2, tt.opts); !errors.Is(err, sqlite.ErrBadOptions) {
				t.Errorf("OpenShards = %v, want sqlite.ErrBadOptions", err)
			}
		})
	}
}

func TestCloseIdempotentAndDataSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	stores, err := sqlite.OpenShards(ctx, dir, 2, sqlite.Options{Sync: sqlite.SyncFull})
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range stores {
		if want := sqlite.ShardFile(dir, i); st.Path() != want {
			t.Errorf("shard %d at %s, want %s", i, st.Path(), want)
		}
		if _, err := os.Stat(sqlite.ShardFile(dir, i)); err != nil {
			t.Errorf("shard %d file: %v", i, err)
		}
		if err := st.Put(ctx, "k", []byte(fmt.Sprint("shard", i))); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range stores {
		if err := st.Close(); err != nil {
			t.Fatalf("first Close: %v", err)
		}
		if err := st.Close(); err != nil {
			t.Errorf("second Close: %v, want nil", err)
		}
		if _, err := st.Get(ctx, "k"); err == nil {
			t.Error("Get on a closed store succeeded")
		}
	}
	again, err := sqlite.OpenShards(ctx, dir, 2, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range again {
		got, err := st.Get(ctx, "k")
		if err != nil || string(got) != fmt.Sprint("shard", i) {
			t.Errorf("after reopen shard %d holds %q, %v", i, got, err)
		}
		st.Close()
	}
}

func TestShardFile(t *testing.T) {
	if got, want := sqlite.ShardFile("/data", 3), filepath.Join("/data", "shard-3.db"); got != want {
		t.Errorf("ShardFile = %s, want %s", got, want)
	}
}

// TestPragmas reads the settings back from the file itself: WAL is recorded in the
// database, so another connection must see it.
func TestPragmas(t *testing.T) {
	ctx := context.Background()
	st := openStore(t, sqlite.Options{})
	if err := st.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open(sqlite.DriverName, "file:"+st.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" {
		t.Errorf("journal_mode = %q, want wal", mode)
	}
	if _, err := os.Stat(st.Path() + "-wal"); err != nil {
		t.Errorf("no WAL file next to the database: %v", err)
	}
	var withoutRowid int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_list WHERE name = 'records' AND wr = 1`).Scan(&withoutRowid); err != nil {
		t.Fatal(err)
	}
	if withoutRowid != 1 {
		t.Error("records is not a WITHOUT ROWID table")
	}
}

func TestVersion(t *testing.T) {
	v, err := sqlitedb.Version(context.Background())
	if err != nil || v == "" || v[0] != '3' {
		t.Errorf("Version = %q, %v", v, err)
	}
}

// TestPathWithURICharacters: a data directory whose name holds characters that mean
// something in a URI ('#', '?', '%', space) must still get its shard file inside it.
func TestPathWithURICharacters(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "we ird#x?y%20z")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := sqlite.ShardFile(dir, 0)
	s, err := sqlite.Open(context.Background(), path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(context.Background(), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("shard file not where it belongs: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Dir(dir))
	for _, e := range entries {
		if e.Name() != filepath.Base(dir) {
			t.Errorf("stray file %q next to the data directory", e.Name())
		}
	}
}

// TestGroupCommitBatchesWaitingWrites holds the writer connection while writes arrive, so
// they must wait together: the committer then commits them in at most two transactions
// (the first write it took before finding the connection busy, and the rest), and every
// one is acknowledged and stored.
func TestGroupCommitBatchesWaitingWrites(t *testing.T) {
	ctx := context.Background()
	st := openStore(t, sqlite.Options{GroupCommit: true, Sync: sqlite.SyncFull})
	hold, err := st.DB().Writer().Conn(ctx) // the pool's only connection
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- st.Put(ctx, fmt.Sprintf("k%d", i), []byte{byte(i)}) }()
	}
	// Nothing can commit while the connection is held; give every writer time to queue.
	time.Sleep(200 * time.Millisecond)
	if commits, _ := st.CommitStats(); commits != 0 {
		t.Fatalf("%d commits while the writer connection was held", commits)
	}
	hold.Close()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	commits, writes := st.CommitStats()
	if writes != n || commits > 2 {
		t.Errorf("CommitStats = %d commits, %d writes; want at most 2 commits holding %d writes", commits, writes, n)
	}
	for i := range n {
		got, err := st.Get(ctx, fmt.Sprintf("k%d", i))
		if err != nil || !bytes.Equal(got, []byte{byte(i)}) {
			t.Errorf("k%d = %v, %v", i, got, err)
		}
	}
}

// TestGroupCommitCloseCommitsQueuedWrites closes the store while writes wait: each is
// either committed and acknowledged, or refused with ErrClosed, never lost after a nil.
func TestGroupCommitCloseCommitsQueuedWrites(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "shard.db")
	st, err := sqlite.Open(ctx, path, sqlite.Options{GroupCommit: true})
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = st.Put(ctx, fmt.Sprintf("k%d", i), []byte("v")) })
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := st.Put(ctx, "late", []byte("v")); !errors.Is(err, sqlite.ErrClosed) {
		t.Errorf("Put after Close = %v, want ErrClosed", err)
	}
	again, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	for i, err := range errs {
		switch _, getErr := again.Get(ctx, fmt.Sprintf("k%d", i)); {
		case err == nil && getErr != nil:
			t.Errorf("k%d acknowledged but not stored: %v", i, getErr)
		case err != nil && !errors.Is(err, sqlite.ErrClosed):
			t.Errorf("k%d: Put = %v, want nil or ErrClosed", i, err)
		}
	}
}

// TestAccessVariantsInEffect reads back what the naive variants change: the journal
// mode of the file, and one connection for reads and writes.
func TestAccessVariantsInEffect(t *testing.T) {
	ctx := context.Background()
	st := openStore(t, sqlite.Options{Journal: sqlite.JournalDelete, OneConn: true})
	var mode string
	if err := st.DB().Reader().QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "delete" {
		t.Errorf("journal_mode = %q, %v; want delete", mode, err)
	}
	if st.DB().Reader() != st.DB().Writer() {
		t.Error("OneConn: Reader is not the writer's pool")
	}
	if err := st.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Get(ctx, "k"); err != nil || string(got) != "v" {
		t.Errorf("Get = %q, %v", got, err)
	}
	if n := st.DB().Writer().Stats().OpenConnections; n != 1 {
		t.Errorf("%d open connections, want 1", n)
	}
}
