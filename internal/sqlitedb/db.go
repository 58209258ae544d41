// Package sqlitedb opens SQLite database files the one way shardlab opens them: the lab's
// key-value shards, the hot-row counters (package counters), the auto-splitting block
// store (package autoshard) and the database/sql driver's SQLite data sources all go
// through OpenDB with the same Options.
package sqlitedb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/mattn/go-sqlite3" // also registers the "sqlite3" database/sql driver
)

// Sync modes accepted by Options.Sync.
const (
	// SyncNormal commits without waiting for the disk; in WAL mode a committed write
	// survives a crash of the process but can be lost if the machine loses power.
	SyncNormal = "normal"
	// SyncFull waits for the disk on every commit; a committed write survives power loss.
	SyncFull = "full"
	// SyncOff hands commits to the OS without any sync: a crash of the machine can
	// corrupt the file. It is for throwaway benchmarks only.
	SyncOff = "off"
)

// DriverName is the database/sql driver shardlab opens SQLite with: mattn/go-sqlite3, the
// SQLite C library through cgo (internal/sqlitedrivers measures why).
const DriverName = "sqlite3"

// Journal modes accepted by Options.Journal.
const (
	JournalWAL    = "wal"    // write-ahead log: readers and the writer never block each other
	JournalDelete = "delete" // rollback journal: a commit locks readers out of the file
)

// ErrBadOptions is wrapped by errors about invalid Options.
var ErrBadOptions = errors.New("sqlite: invalid options")

// Options tunes one database file. The zero value is usable: it gets the defaults below.
type Options struct {
	Sync        string        // SyncNormal (default), SyncFull or SyncOff
	ReadConns   int           // read-only connections; default max(4, GOMAXPROCS)
	BusyTimeout time.Duration // how long a connection waits for a lock; default 5s
	// Journal is JournalWAL (default) or JournalDelete, SQLite's rollback journal, in
	// which a writer's commit locks every reader out of the file: the naive design the
	// lab compares WAL with.
	Journal string
	// OneConn gives the file a single connection for reads and writes alike (Reader
	// returns the writer's pool), so that every access to the file waits for the one
	// before it: the other naive design the lab measures.
	OneConn bool
	// GroupCommit makes Store.Put hand its write to the shard's writer goroutine, which
	// commits the writes waiting at once in one transaction and acknowledges each only
	// after that commit (see Store.Put). It applies to the record shards (Store) only.
	GroupCommit bool
	// ForeignKeys turns on the enforcement of FOREIGN KEY constraints (PRAGMA
	// foreign_keys). Off by default, as in SQLite itself; it is set explicitly either
	// way so that a driver built with another default changes nothing.
	ForeignKeys bool
}

// WithDefaults returns o with the defaults filled in, or an error wrapping ErrBadOptions,
// so that a caller can check options before it creates anything.
func (o Options) WithDefaults() (Options, error) { return o.withDefaults() }

func (o Options) withDefaults() (Options, error) {
	if o.Sync == "" {
		o.Sync = SyncNormal
	}
	if o.Sync != SyncNormal && o.Sync != SyncFull && o.Sync != SyncOff {
		return o, fmt.Errorf("%w: sync must be %q, %q or %q, got %q", ErrBadOptions, SyncNormal, SyncFull, SyncOff, o.Sync)
	}
	if o.Journal == "" {
		o.Journal = JournalWAL
	}
	if o.Journal != JournalWAL && o.Journal != JournalDelete {
		return o, fmt.Errorf("%w: journal must be %q or %q, got %q", ErrBadOptions, JournalWAL, JournalDelete, o.Journal)
	}
	if o.ReadConns == 0 {
		o.ReadConns = DefaultReadConns()
	}
	if o.ReadConns < 1 || o.ReadConns > 1024 {
		return o, fmt.Errorf("%w: read connections must be 1..1024, got %d", ErrBadOptions, o.ReadConns)
	}
	if o.BusyTimeout == 0 {
		o.BusyTimeout = 5 * time.Second
	}
	if o.BusyTimeout < 0 {
		return o, fmt.Errorf("%w: busy timeout must not be negative", ErrBadOptions)
	}
	return o, nil
}

// DefaultReadConns is the read pool size per shard when Options.ReadConns is 0.
func DefaultReadConns() int { return max(4, runtime.GOMAXPROCS(0)) }

// Version returns the SQLite library version, e.g. "3.50.4".
func Version(ctx context.Context) (string, error) {
	db, err := sql.Open(DriverName, ":memory:")
	if err != nil {
		return "", err
	}
	defer db.Close()
	var v string
	err = db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&v)
	return v, err
}

// DB is one SQLite database file opened the way every part of shardlab opens SQLite (the
// key-value shards, the hot-row counters, the auto-splitting block store):
//
//   - WAL journal, so that readers never block the writer nor each other (or, for the
//     lab's naive variant, the rollback journal of Options.Journal);
//   - in WAL mode with more than one connection, SQLite's "unix-excl" VFS: the process
//     that opens the file first holds it for as long as it keeps a connection open, and
//     the WAL index lives in that process's memory, so that the locks every transaction
//     takes on it are counters in memory instead of two fcntl system calls per read
//     (see uri). Another process that opens the file meanwhile gets SQLITE_BUSY;
//   - the busy timeout, synchronous mode and foreign-key enforcement of Options;
//   - a writer pool of exactly one connection whose transactions begin with
//     BEGIN IMMEDIATE, so that writers of this process queue in Go instead of failing
//     with SQLITE_BUSY when a read transaction tries to upgrade its lock;
//   - a pool of Options.ReadConns read-only connections (PRAGMA query_only), or, with
//     Options.OneConn, none: reads share the writer's one connection.
//
// Callers create their schema through Writer and read through Reader.
type DB struct {
	path   string
	opts   Options
	writer *sql.DB
	reader *sql.DB

	closeOnce sync.Once
	closeErr  error
}

// uri returns the database/sql name of path for the mattn/go-sqlite3 driver with o's
// settings. The driver runs each _name=value parameter as a PRAGMA on every new
// connection; _txlock=immediate makes every BeginTx a BEGIN IMMEDIATE.
func uri(path string, o Options, readOnly bool) string {
	q := url.Values{}
	q.Set("_busy_timeout", fmt.Sprint(o.BusyTimeout.Milliseconds()))
	q.Set("_journal_mode", strings.ToUpper(o.Journal))
	q.Set("_synchronous", strings.ToUpper(o.Sync))
	fk := "0"
	if o.ForeignKeys {
		fk = "1"
	}
	q.Set("_foreign_keys", fk)
	if o.Journal == JournalWAL && !o.OneConn {
		// A WAL read transaction takes a shared lock on a read mark of the WAL index, an
		// fcntl call to take it and one to release it whenever no other connection of the
		// process holds it: as much of the demo-server's time under a read load as
		// SQLite's own code. unix-excl keeps the WAL index in the heap and its locks in
		// the process. The naive variants (rollback journal, OneConn) keep the default VFS.
		q.Set("vfs", "unix-excl")
	}
	if readOnly {
		q.Set("_query_only", "1")
	} else {
		q.Set("_txlock", "immediate")
	}
	// The path is escaped: SQLite reads "file:" names as URIs, so a raw '#', '?' or '%'
	// in a directory name would cut the path short or alter it and put the database
	// somewhere else.
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

// AttachURI returns the name under which another connection of this process attaches
// the database read-only (ATTACH DATABASE): its file, with the VFS its own connections
// use, since the WAL index of unix-excl lives in this process's heap and every
// connection to the file must find it there.
func (d *DB) AttachURI() string {
	q := "mode=ro"
	if d.opts.Journal == JournalWAL && !d.opts.OneConn {
		q += "&vfs=unix-excl"
	}
	return "file:" + (&url.URL{Path: d.path}).EscapedPath() + "?" + q
}

// OpenDB opens (creating if needed) the SQLite database at path with opts, after
// validating them: bad options create no file and give an error wrapping ErrBadOptions.
// It connects the writer before returning, so the file exists and is in WAL mode before
// any reader connects; read connections are opened when first used. Cancelling ctx
// abandons that first connection. Close releases both pools.
func OpenDB(ctx context.Context, path string, opts Options) (*DB, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	d := &DB{path: path, opts: o}
	if d.writer, err = sql.Open(DriverName, uri(path, o, false)); err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	// One connection, never recycled: it is the file's only writer in this process.
	d.writer.SetMaxOpenConns(1)
	d.writer.SetMaxIdleConns(1)
	d.writer.SetConnMaxLifetime(0)
	d.writer.SetConnMaxIdleTime(0)
	if err := d.writer.PingContext(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("sqlite: open %s: %w", path, err), d.writer.Close())
	}
	if o.OneConn {
		d.reader = d.writer
		return d, nil
	}
	if d.reader, err = sql.Open(DriverName, uri(path, o, true)); err != nil {
		return nil, errors.Join(fmt.Errorf("sqlite: open %s for reading: %w", path, err), d.writer.Close())
	}
	d.reader.SetMaxOpenConns(o.ReadConns)
	d.reader.SetMaxIdleConns(o.ReadConns)
	d.reader.SetConnMaxLifetime(0)
	d.reader.SetConnMaxIdleTime(0)
	return d, nil
}

// Writer returns the pool of the one write connection. Every transaction begun on it
// starts with BEGIN IMMEDIATE.
func (d *DB) Writer() *sql.DB { return d.writer }

// Reader returns the pool of read-only connections; a write through it fails. With
// Options.OneConn it is the writer's pool itself.
func (d *DB) Reader() *sql.DB { return d.reader }

// Path returns the database file's path.
func (d *DB) Path() string { return d.path }

// Options returns the options in effect, defaults filled in.
func (d *DB) Options() Options { return d.opts }

// Synchronous returns the synchronous mode in effect on the writer connection, the one
// whose commits it governs, as SQLite reports it: "off", "normal", "full" or "extra".
// It exists so that tests and operators can check that a setting really arrived.
func (d *DB) Synchronous(ctx context.Context) (string, error) {
	var n int
	if err := d.writer.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&n); err != nil {
		return "", fmt.Errorf("sqlite: %s: read synchronous: %w", d.path, err)
	}
	switch n {
	case 0:
		return SyncOff, nil
	case 1:
		return SyncNormal, nil
	case 2:
		return SyncFull, nil
	case 3:
		return "extra", nil
	}
	return fmt.Sprint(n), nil
}

// Close closes the read pool, then the writer, waiting for statements in flight, and
// returns their errors joined. A second call returns nil.
func (d *DB) Close() error {
	done := false
	d.closeOnce.Do(func() {
		done = true
		var readErr error
		if d.reader != d.writer {
			readErr = d.reader.Close()
		}
		d.closeErr = errors.Join(readErr, d.writer.Close())
	})
	if !done {
		return nil
	}
	return d.closeErr
}

// OpenReadConn opens one read-only connection with the settings of the DB's read pool,
// through the driver directly rather than database/sql. The caller owns it and closes it
// before the DB. It is how a Store's point reads get their own connections while the
// file is still opened in one place, OpenDB, with one set of Options.
func (d *DB) OpenReadConn() (driver.Conn, error) {
	conn, err := (&sqlite3.SQLiteDriver{}).Open(uri(d.path, d.opts, true))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s for reading: %w", d.path, err)
	}
	return conn, nil
}
