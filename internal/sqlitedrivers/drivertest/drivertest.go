// Package drivertest benchmarks a SQLite driver on the shard's own work: the point read
// and the upsert of package sqlite (same schema, statements and pragmas), one driver per
// test binary, because two drivers may register the same database/sql name.
package drivertest

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Schema, Upsert and Get are the shard's table and statements (sqlite/sqlite.go).
const (
	Schema = `CREATE TABLE IF NOT EXISTS records (
	user_id    TEXT PRIMARY KEY,
	data       BLOB NOT NULL,
	updated_at INTEGER NOT NULL
) WITHOUT ROWID`
	Upsert = `INSERT INTO records (user_id, data, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (user_id) DO UPDATE SET data = excluded.data, updated_at = excluded.updated_at`
	Get = `SELECT data FROM records WHERE user_id = ?`
)

// Keys is the number of rows preloaded before a benchmark reads.
const Keys = 10000

// Value is the record written by every upsert: the size the lab's loadgen sends.
var Value = make([]byte, 64)

// Key returns the i-th key.
func Key(i int) string { return "user" + strconv.Itoa(i%Keys) }

// Opener opens path through database/sql as package sqlite does: WAL, busy timeout 5 s,
// synchronous NORMAL; a writer whose transactions begin IMMEDIATE, or a read-only reader.
type Opener func(path string, readOnly bool) (*sql.DB, error)

// Run runs the database/sql benchmarks of one driver.
func Run(b *testing.B, open Opener) {
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "shard.db")
	w, err := open(path, false)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	w.SetMaxOpenConns(1)
	if _, err := w.ExecContext(ctx, Schema); err != nil {
		b.Fatal(err)
	}
	put, err := w.PrepareContext(ctx, Upsert)
	if err != nil {
		b.Fatal(err)
	}
	defer put.Close()
	upsert := func(i int) error {
		tx, err := w.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.StmtContext(ctx, put).ExecContext(ctx, Key(i), Value, time.Now().UnixMicro()); err != nil {
			tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	for i := range Keys {
		if err := upsert(i); err != nil {
			b.Fatal(err)
		}
	}
	r, err := open(path, true)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	r.SetMaxOpenConns(4)
	r.SetMaxIdleConns(4)
	get, err := r.PrepareContext(ctx, Get)
	if err != nil {
		b.Fatal(err)
	}
	defer get.Close()
	read := func(i int) error {
		var data []byte
		if err := get.QueryRowContext(ctx, Key(i)).Scan(&data); err != nil {
			return err
		}
		if len(data) != len(Value) {
			return fmt.Errorf("read %d bytes, want %d", len(data), len(Value))
		}
		return nil
	}
	b.Run("get", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if err := read(i); err != nil {
				b.Fatal(err)
			}
			i += 7919
		}
	})
	b.Run("get-parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if err := read(i); err != nil {
					b.Error(err)
					return
				}
				i += 7919
			}
		})
	})
	b.Run("upsert", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if err := upsert(i); err != nil {
				b.Fatal(err)
			}
			i += 7919
		}
	})
}

// Pragmas is the URI query that sets package sqlite's pragmas in the _pragma=name(value)
// form that modernc.org/sqlite and ncruces/go-sqlite3 share.
func Pragmas(readOnly bool) string {
	q := "_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(normal)"
	if readOnly {
		return q + "&_pragma=query_only(1)"
	}
	return q + "&_txlock=immediate"
}
