package autoshard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shardlab/shardlab/internal/sqlitedb"
)

// openSQLite opens path the way all of shardlab opens SQLite (sqlitedb.OpenDB): a
// single-connection pool for writes, so one shard never has two writers
// fighting over its lock, and a small read-only pool, which WAL mode lets run
// beside the writer. Foreign keys stay off: the schema has none.
func openSQLite(ctx context.Context, path string, sync SyncMode, schema string) (*sqlitedb.DB, error) {
	db, err := sqlitedb.OpenDB(ctx, path, sqlitedb.Options{
		Sync:        sync.String(),
		BusyTimeout: 10 * time.Second,
		ReadConns:   2,
	})
	if err != nil {
		return nil, err
	}
	// One idle reader at rest: filesPerDatabase counts on it, and a store keeps
	// thousands of databases open.
	db.Reader().SetMaxIdleConns(1)
	if _, err := db.Writer().ExecContext(ctx, schema); err != nil {
		return nil, errors.Join(fmt.Errorf("create schema in %s: %w", path, err), db.Close())
	}
	return db, nil
}
