package autoshard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/shardlab/shardlab/internal/sqlitedb"
)

const shardSchema = `
CREATE TABLE IF NOT EXISTS blocks (
	hash           BLOB    NOT NULL,
	blocklist_hash BLOB    NOT NULL,
	idx            INTEGER NOT NULL,
	"offset"       INTEGER NOT NULL,
	size           INTEGER NOT NULL,
	PRIMARY KEY (hash, blocklist_hash, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS applied_batches (
	batch_id TEXT    NOT NULL PRIMARY KEY,
	rows     INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS shard_meta (
	id    INTEGER PRIMARY KEY CHECK (id = 0),
	level INTEGER NOT NULL,
	shard INTEGER NOT NULL,
	rows  INTEGER NOT NULL
);
`

// shard is one SQLite database of one level.
type shard struct {
	level, index int
	path         string
	db           *sqlitedb.DB
	w, r         *sql.DB // db's writer and read pool
	rows         int64   // rows stored; guarded by Store.writeMu
}

func openShard(ctx context.Context, path string, level, index int, sync SyncMode) (*shard, error) {
	db, err := openSQLite(ctx, path, sync, shardSchema)
	if err != nil {
		return nil, err
	}
	s := &shard{level: level, index: index, path: path, db: db, w: db.Writer(), r: db.Reader()}
	if _, err := s.w.ExecContext(ctx, `INSERT OR IGNORE INTO shard_meta (id, level, shard, rows) VALUES (0, ?, ?, 0)`, level, index); err != nil {
		return nil, errors.Join(fmt.Errorf("init %s: %w", path, err), s.close())
	}
	// Open the read connection now, so the first lookup does not pay for it.
	if err := s.r.PingContext(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("open %s for reading: %w", path, err), s.close())
	}
	var gotLevel, gotIndex int
	if err := s.w.QueryRowContext(ctx, `SELECT level, shard, rows FROM shard_meta WHERE id = 0`).Scan(&gotLevel, &gotIndex, &s.rows); err != nil {
		return nil, errors.Join(fmt.Errorf("read meta of %s: %w", path, err), s.close())
	}
	if gotLevel != level || gotIndex != index {
		return nil, errors.Join(fmt.Errorf("%w: %s says it is level %d shard %d", ErrCorruptLayout, path, gotLevel, gotIndex), s.close())
	}
	return s, nil
}

// apply inserts blocks as part of batch id in one transaction, unless this
// shard already applied that batch. It returns the rows the batch added to
// this shard (on a repeat, the number recorded the first time) and whether
// the batch was already there.
func (s *shard) apply(ctx context.Context, id string, blocks []Block) (inserted int64, repeat bool, err error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return 0, false, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var prev int64
	switch err := tx.QueryRowContext(ctx, `SELECT rows FROM applied_batches WHERE batch_id = ?`, id).Scan(&prev); {
	case err == nil:
		return prev, true, tx.Rollback()
	case !errors.Is(err, sql.ErrNoRows):
		return 0, false, err
	}
	stmt, err := tx.PrepareContext(ctx, `INSERT OR IGNORE INTO blocks (hash, blocklist_hash, idx, "offset", size) VALUES (?, ?, ?, ?, ?)`)
	if err != nil {
		return 0, false, err
	}
	defer stmt.Close()
	for i := range blocks {
		b := &blocks[i]
		res, err := stmt.ExecContext(ctx, b.Hash, b.BlocklistHash, b.Idx, b.Offset, b.Size)
		if err != nil {
			return 0, false, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, false, err
		}
		inserted += n
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO applied_batches (batch_id, rows) VALUES (?, ?)`, id, inserted); err != nil {
		return 0, false, err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE shard_meta SET rows = rows + ? WHERE id = 0`, inserted); err != nil {
		return 0, false, err
	}
	if err := tx.Commit(); err != nil {
		return 0, false, err
	}
	return inserted, false, nil
}

func (s *shard) lookup(ctx context.Context, hash []byte) ([]Match, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT hash, blocklist_hash, idx, "offset", size FROM blocks WHERE hash = ?`, hash)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Match
	for rows.Next() {
		m := Match{Level: s.level, Shard: s.index}
		if err := rows.Scan(&m.Hash, &m.BlocklistHash, &m.Idx, &m.Offset, &m.Size); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

func (s *shard) close() error {
	return s.db.Close()
}
