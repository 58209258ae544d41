// Package sqlite is the SQLite shard backend: one database file per shard.
//
// Each shard is tuned the same way whether the lab runs one shard or many, so the single
// baseline is honest: WAL journal, a busy timeout, one writer connection that opens every
// write transaction with BEGIN IMMEDIATE (no lock upgrade deadlocks), a separate pool of
// read-only connections, and prepared statements.
//
// Every SQLite file of shardlab is opened by package sqlitedb: the shards here, the
// hot-row counters (package counters) and the auto-splitting block store (package
// autoshard) all go through it with the same Options.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/mattn/go-sqlite3" // registers the "sqlite3" database/sql driver

	"github.com/shardlab/shardlab/internal/fanout"
	"github.com/shardlab/shardlab/internal/sqlitedb"
	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/routing"
)

// Options tunes one database file (see sqlitedb.Options).
type Options = sqlitedb.Options

// Sync and journal modes accepted by Options (see package sqlitedb).
const (
	SyncNormal    = sqlitedb.SyncNormal
	SyncFull      = sqlitedb.SyncFull
	SyncOff       = sqlitedb.SyncOff
	JournalWAL    = sqlitedb.JournalWAL
	JournalDelete = sqlitedb.JournalDelete
	DriverName    = sqlitedb.DriverName
)

// ErrBadOptions is wrapped by errors about invalid Options (sqlitedb.ErrBadOptions).
var ErrBadOptions = sqlitedb.ErrBadOptions

// DB is a database file opened for a writer and readers (sqlitedb.DB).
type DB = sqlitedb.DB

// ErrClosed is returned by a Put or a Get on a closed Store.
var ErrClosed = errors.New("sqlite: store closed")

// Store is one shard's database file.
type Store struct {
	db    *DB
	put   *sql.Stmt
	get   *sql.Stmt
	count *sql.Stmt
	group *groupCommitter // nil without Options.GroupCommit
	// points serves Get on connections of its own, below database/sql; nil with
	// Options.OneConn, where reads must share the writer's one connection and so go
	// through its pool.
	points *pointReader
	closed atomic.Bool

	closeOnce sync.Once
	closeErr  error
}

var _ shardset.Backend = (*Store)(nil)

const getSQL = `SELECT data FROM records WHERE user_id = ?`

const schema = `CREATE TABLE IF NOT EXISTS records (
	user_id    TEXT PRIMARY KEY,
	data       BLOB NOT NULL,
	updated_at INTEGER NOT NULL
) WITHOUT ROWID`

// Open opens (creating if needed) the shard database at path (see OpenDB).
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	db, err := sqlitedb.OpenDB(ctx, path, opts)
	if err != nil {
		return nil, err
	}
	if _, err := db.Writer().ExecContext(ctx, schema); err != nil {
		return nil, errors.Join(fmt.Errorf("sqlite: create schema in %s: %w", path, err), db.Close())
	}
	s := &Store{db: db}
	prepare := func(db *sql.DB, q string) *sql.Stmt {
		if err != nil {
			return nil
		}
		var st *sql.Stmt
		st, err = db.PrepareContext(ctx, q)
		return st
	}
	s.put = prepare(db.Writer(), `INSERT INTO records (user_id, data, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (user_id) DO UPDATE SET data = excluded.data, updated_at = excluded.updated_at`)
	if db.Options().OneConn {
		s.get = prepare(db.Reader(), getSQL) // otherwise Get reads through s.points
	}
	s.count = prepare(db.Reader(), `SELECT count(*) FROM records`)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("sqlite: prepare statements for %s: %w", path, err)
	}
	if db.Options().GroupCommit {
		s.group = startGroupCommitter(db.Writer(), s.put)
	}
	if !db.Options().OneConn {
		s.points = newPointReader(db, db.Options().ReadConns, getSQL)
	}
	return s, nil
}

// Path returns the database file's path.
func (s *Store) Path() string { return s.db.Path() }

// DB returns the shard's database, for inspection (its settings, its file); writing to
// the records table behind the Store's back is not supported.
func (s *Store) DB() *DB { return s.db }

// Put implements shardset.Backend. The upsert runs in its own BEGIN IMMEDIATE transaction
// on the shard's single writer connection; with Options.GroupCommit it joins the writes
// waiting for the writer in one transaction instead. Either way Put returns nil only once
// the transaction holding the write has committed (and, with SyncFull, reached the disk).
// Cancelling ctx while a group-committed write waits returns ctx's error, but the write
// may still be committed.
func (s *Store) Put(ctx context.Context, key string, data []byte) error {
	if data == nil {
		data = []byte{} // the column is NOT NULL; an empty value is still a value
	}
	if s.group != nil {
		return s.group.put(ctx, key, data)
	}
	tx, err := s.db.Writer().BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if _, err := tx.StmtContext(ctx, s.put).ExecContext(ctx, key, data, time.Now().UnixMicro()); err != nil {
		tx.Rollback()
		return fmt.Errorf("upsert: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// CommitStats returns how many transactions Put committed and how many writes they held.
// Without group commit both count the same; with it, writes/commits is the mean batch.
// It reports zeros for a Store without group commit.
func (s *Store) CommitStats() (commits, writes int64) {
	if s.group == nil {
		return 0, 0
	}
	return s.group.commits.Load(), s.group.writes.Load()
}

// Get implements shardset.Backend. It reads on one of Options.ReadConns read-only
// connections that the Store holds below database/sql, each with the lookup prepared
// (with Options.OneConn, on the writer's one connection through its pool). Cancelling ctx
// stops a Get that waits for a connection; a lookup already running finishes first. On a
// closed Store it returns ErrClosed.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	if s.points != nil {
		return s.points.get(ctx, key)
	}
	var data []byte
	err := s.get.QueryRowContext(ctx, key).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, shardset.ErrNotFound
	}
	if err != nil && s.closed.Load() {
		// Close ran between the check above and the lookup: the statement or the
		// pool is closed under it.
		return nil, ErrClosed
	}
	if err != nil {
		return nil, err
	}
	return data, nil
}

// Count implements shardset.Backend.
func (s *Store) Count(ctx context.Context) (int64, error) {
	var n int64
	err := s.count.QueryRowContext(ctx).Scan(&n)
	return n, err
}

// Ping implements shardset.Backend.
func (s *Store) Ping(ctx context.Context) error { return s.db.Reader().PingContext(ctx) }

// Close waits for the Gets in flight, then closes the point-read connections, the
// statements and both pools, and returns the first error; a second call returns nil.
func (s *Store) Close() error {
	first := func(err error) {
		if err != nil && s.closeErr == nil {
			s.closeErr = err
		}
	}
	done := false
	s.closeOnce.Do(func() {
		done = true
		s.closed.Store(true)
		if s.points != nil {
			first(s.points.close()) // waits for the reads in flight
		}
		if s.group != nil {
			s.group.close() // commits the writes already handed to it
		}
		for _, st := range []*sql.Stmt{s.put, s.get, s.count} {
			if st != nil {
				first(st.Close())
			}
		}
		first(s.db.Close())
	})
	if !done {
		return nil
	}
	return s.closeErr
}

// ShardFile returns the file name of shard i inside a data directory.
func ShardFile(dir string, i int) string {
	return filepath.Join(dir, fmt.Sprintf("shard-%d.db", i))
}

// OpenShards opens n shard files in dir (created if needed), shard i at ShardFile(dir, i),
// concurrently (fanout.Do). On error the shards already opened are closed and the
// error names every shard that failed: "open shard 1: ...".
func OpenShards(ctx context.Context, dir string, n int, opts Options) ([]*Store, error) {
	if _, err := opts.WithDefaults(); err != nil {
		return nil, err
	}
	if n < 1 {
		return nil, fmt.Errorf("%w: shard count must be at least 1, got %d", ErrBadOptions, n)
	}
	stores := make([]*Store, n)
	err := fanout.Do(ctx, routing.DestinationAll{}, n, func(ctx context.Context, i int) error {
		st, err := Open(ctx, ShardFile(dir, i), opts)
		if err != nil {
			return err
		}
		stores[i] = st
		return nil
	})
	if err != nil {
		for _, st := range stores {
			if st != nil {
				st.Close()
			}
		}
		var errs shardset.Errors
		if !errors.As(err, &errs) {
			return nil, err
		}
		failed := make([]error, len(errs))
		for i, se := range errs {
			failed[i] = fmt.Errorf("open shard %d: %w", se.Shard, se.Err)
		}
		return nil, errors.Join(failed...)
	}
	return stores, nil
}
