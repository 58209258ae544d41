// Package ncruces benchmarks ncruces/go-sqlite3, SQLite compiled to WebAssembly and
// translated to Go: through database/sql, and through its own API (no database/sql).
package ncruces

import (
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/ncruces/go-sqlite3"
	_ "github.com/ncruces/go-sqlite3/driver"
	"github.com/shardlab/shardlab/internal/sqlitedrivers/drivertest"
)

func BenchmarkNcruces(b *testing.B) {
	drivertest.Run(b, func(path string, readOnly bool) (*sql.DB, error) {
		return sql.Open("sqlite3", "file:"+path+"?"+drivertest.Pragmas(readOnly))
	})
}

// BenchmarkNcrucesDirect runs the same work on one connection through the driver's own
// API: a prepared statement stepped directly, no database/sql pool in between.
func BenchmarkNcrucesDirect(b *testing.B) {
	path := filepath.Join(b.TempDir(), "shard.db")
	c, err := sqlite3.Open("file:" + path + "?" + drivertest.Pragmas(false))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.Exec(drivertest.Schema); err != nil {
		b.Fatal(err)
	}
	put, _, err := c.Prepare(drivertest.Upsert)
	if err != nil {
		b.Fatal(err)
	}
	defer put.Close()
	get, _, err := c.Prepare(drivertest.Get)
	if err != nil {
		b.Fatal(err)
	}
	defer get.Close()
	upsert := func(i int) error {
		if err := c.Exec("BEGIN IMMEDIATE"); err != nil {
			return err
		}
		put.BindText(1, drivertest.Key(i))
		put.BindBlob(2, drivertest.Value)
		put.BindInt64(3, time.Now().UnixMicro())
		if err := put.Exec(); err != nil {
			c.Exec("ROLLBACK")
			return err
		}
		return c.Exec("COMMIT")
	}
	for i := range drivertest.Keys {
		if err := upsert(i); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("get", func(b *testing.B) {
		i := 0
		for b.Loop() {
			get.BindText(1, drivertest.Key(i))
			if !get.Step() {
				b.Fatal("no row", get.Err())
			}
			if n := len(get.ColumnRawBlob(0)); n != len(drivertest.Value) {
				b.Fatalf("read %d bytes", n)
			}
			if err := get.Reset(); err != nil {
				b.Fatal(err)
			}
			i += 7919
		}
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
