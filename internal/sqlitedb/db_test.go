package sqlitedb_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/sqlitedb"
)

func openDB(t *testing.T, path string, opts sqlitedb.Options) *sqlitedb.DB {
	t.Helper()
	db, err := sqlitedb.OpenDB(context.Background(), path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return db
}

// TestOpenDBSettingsAreInEffect reads every setting back from the connections that use
// it: a pragma that never reached them would show here.
func TestOpenDBSettingsAreInEffect(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		opts     sqlitedb.Options
		sync     string
		fk       int
		reads    int
		busyMs   int64
		readSync int // what the read connections say: the same setting, though only writes use it
	}{
		{sqlitedb.Options{}, "normal", 0, sqlitedb.DefaultReadConns(), 5000, 1},
		{sqlitedb.Options{Sync: sqlitedb.SyncFull, ReadConns: 3, BusyTimeout: 1500 * time.Millisecond}, "full", 0, 3, 1500, 2},
		{sqlitedb.Options{Sync: sqlitedb.SyncOff, ReadConns: 1, ForeignKeys: true}, "off", 1, 1, 5000, 0},
	} {
		t.Run(tt.sync, func(t *testing.T) {
			db := openDB(t, filepath.Join(t.TempDir(), "x.db"), tt.opts)
			if got, err := db.Synchronous(ctx); err != nil || got != tt.sync {
				t.Errorf("Synchronous = %q, %v; want %q", got, err, tt.sync)
			}
			var fk, readSync int
			var busy int64
			var mode string
			if err := db.Writer().QueryRowContext(ctx, "PRAGMA foreign_keys").Scan(&fk); err != nil || fk != tt.fk {
				t.Errorf("writer foreign_keys = %d, %v; want %d", fk, err, tt.fk)
			}
			if err := db.Writer().QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil || busy != tt.busyMs {
				t.Errorf("writer busy_timeout = %d, %v; want %d", busy, err, tt.busyMs)
			}
			if err := db.Reader().QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
				t.Errorf("reader journal_mode = %q, %v; want wal", mode, err)
			}
			if err := db.Reader().QueryRowContext(ctx, "PRAGMA synchronous").Scan(&readSync); err != nil || readSync != tt.readSync {
				t.Errorf("reader synchronous = %d, %v; want %d", readSync, err, tt.readSync)
			}
			if got := db.Reader().Stats().MaxOpenConnections; got != tt.reads {
				t.Errorf("read pool of %d connections, want %d", got, tt.reads)
			}
			if got := db.Writer().Stats().MaxOpenConnections; got != 1 {
				t.Errorf("writer pool of %d connections, want 1", got)
			}
			if db.Options().Sync != tt.sync || db.Options().ReadConns != tt.reads {
				t.Errorf("Options() = %+v", db.Options())
			}
		})
	}
}

// TestOpenDBReaderIsReadOnly: the read pool refuses writes, so a write that took the
// wrong pool fails loudly instead of racing the single writer.
func TestOpenDBReaderIsReadOnly(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, filepath.Join(t.TempDir(), "x.db"), sqlitedb.Options{ReadConns: 2})
	if _, err := db.Writer().ExecContext(ctx, "CREATE TABLE t (k TEXT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Reader().ExecContext(ctx, "INSERT INTO t VALUES ('a')"); err == nil {
		t.Error("a write through the read pool succeeded")
	}
	if _, err := db.Writer().ExecContext(ctx, "INSERT INTO t VALUES ('b')"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.Reader().QueryRowContext(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 1 {
		t.Errorf("reader sees %d rows, %v; want the writer's 1", n, err)
	}
}

// TestOpenDBWriterBeginsImmediate: a transaction begun on the writer takes the write lock
// at BEGIN, before any statement, so another writer is turned away at once instead of
// deadlocking later on a lock upgrade.
func TestOpenDBWriterBeginsImmediate(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "x.db")
	db := openDB(t, path, sqlitedb.Options{})
	tx, err := db.Writer().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	other, err := sql.Open(sqlitedb.DriverName, "file:"+path+"?_busy_timeout=0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	_, err = other.ExecContext(ctx, "BEGIN IMMEDIATE")
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "locked") {
		other.ExecContext(ctx, "ROLLBACK")
		t.Errorf("a second writer began while the writer's empty transaction was open: %v", err)
	}
}

func TestOpenDBRefusesBadOptionsWithoutCreatingAFile(t *testing.T) {
	for _, opts := range []sqlitedb.Options{{Sync: "sometimes"}, {ReadConns: -1}, {BusyTimeout: -time.Second}} {
		path := filepath.Join(t.TempDir(), "x.db")
		db, err := sqlitedb.OpenDB(context.Background(), path, opts)
		if !errors.Is(err, sqlitedb.ErrBadOptions) {
			if db != nil {
				db.Close()
			}
			t.Errorf("OpenDB(%+v) = %v, want ErrBadOptions", opts, err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("OpenDB(%+v) created %s (%v)", opts, path, err)
		}
	}
}

// TestOpenDBPathWithURICharacters: the file lands exactly at path, whatever URI
// metacharacters its directories hold, and closing twice is fine.
func TestOpenDBPathWithURICharacters(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a?b#c%41 d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "x.db")
	db, err := sqlitedb.OpenDB(context.Background(), path, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if db.Path() != path {
		t.Errorf("Path = %s, want %s", db.Path(), path)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("database not at %s: %v", path, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	entries, _ := os.ReadDir(filepath.Dir(dir))
	if len(entries) != 1 {
		t.Errorf("%d entries next to the data directory, want only it", len(entries))
	}
}
