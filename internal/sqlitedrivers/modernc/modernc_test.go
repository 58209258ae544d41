// Package modernc benchmarks modernc.org/sqlite, SQLite translated to Go.
package modernc

import (
	"database/sql"
	"testing"

	"github.com/shardlab/shardlab/internal/sqlitedrivers/drivertest"
	_ "modernc.org/sqlite"
)

func BenchmarkModernc(b *testing.B) {
	drivertest.Run(b, func(path string, readOnly bool) (*sql.DB, error) {
		return sql.Open("sqlite", "file:"+path+"?"+drivertest.Pragmas(readOnly))
	})
}
