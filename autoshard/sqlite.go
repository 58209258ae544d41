package autoshard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// openSQLite opens path twice: a single-connection pool for writes (so one
// shard never has two writers fighting over its lock) and a small pool for
// reads, which WAL mode lets run beside the writer.
func openSQLite(ctx context.Context, path string, sync SyncMode, schema string) (w, r *sql.DB, err error) {
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "synchronous("+sync.pragma()+")")
	q.Add("_pragma", "foreign_keys(OFF)")
	wq := url.Values{}
	for k, v := range q {
		wq[k] = v
	}
	wq.Set("_txlock", "immediate")
	// Escape the path: a raw '?', '#' or '%' in it would end or alter the
	// file name SQLite opens.
	uri := "file:" + (&url.URL{Path: path}).EscapedPath() + "?"
	w, err = sql.Open("sqlite", uri+wq.Encode())
	if err != nil {
		return nil, nil, err
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	if _, err := w.ExecContext(ctx, schema); err != nil {
		return nil, nil, errors.Join(fmt.Errorf("create schema in %s: %w", path, err), w.Close())
	}
	r, err = sql.Open("sqlite", uri+q.Encode())
	if err != nil {
		return nil, nil, errors.Join(err, w.Close())
	}
	r.SetMaxOpenConns(2)
	r.SetMaxIdleConns(1)
	return w, r, nil
}
