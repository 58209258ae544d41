// Package mattn benchmarks mattn/go-sqlite3, the C library through cgo.
package mattn

import (
	"database/sql"
	"testing"

	_ "github.com/mattn/go-sqlite3"
	"github.com/shardlab/shardlab/internal/sqlitedrivers/drivertest"
)

func BenchmarkMattn(b *testing.B) {
	drivertest.Run(b, func(path string, readOnly bool) (*sql.DB, error) {
		q := "_busy_timeout=5000&_journal_mode=WAL&_synchronous=NORMAL"
		if readOnly {
			q += "&_query_only=1"
		} else {
			q += "&_txlock=immediate"
		}
		return sql.Open("sqlite3", "file:"+path+"?"+q)
	})
}
