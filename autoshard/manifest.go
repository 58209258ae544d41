package autoshard

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

const manifestSchema = `
CREATE TABLE IF NOT EXISTS batches (
	id       TEXT    NOT NULL PRIMARY KEY,
	digest   BLOB    NOT NULL,
	blocks   INTEGER NOT NULL,
	plan     TEXT    NOT NULL,
	state    TEXT    NOT NULL CHECK (state IN ('pending', 'done')),
	inserted INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
`

// segment sends blocks[start:end] of a deduplicated batch to one level.
type segment struct {
	Level int `json:"level"`
	Start int `json:"start"`
	End   int `json:"end"`
}

// journalEntry is a batch as recorded in manifest.db.
type journalEntry struct {
	digest   []byte
	plan     []segment
	done     bool
	inserted int64
}

// batchDigest identifies the content of a batch, so a retry under the same id
// with different blocks is refused instead of silently writing a mix.
func batchDigest(blocks []Block) []byte {
	h := sha256.New()
	var buf [binary.MaxVarintLen64]byte
	put := func(v int64) {
		n := binary.PutVarint(buf[:], v)
		h.Write(buf[:n])
	}
	for i := range blocks {
		b := &blocks[i]
		put(int64(len(b.Hash)))
		h.Write(b.Hash)
		put(int64(len(b.BlocklistHash)))
		h.Write(b.BlocklistHash)
		put(int64(b.Idx))
		put(b.Offset)
		put(int64(b.Size))
	}
	return h.Sum(nil)
}

func readJournal(ctx context.Context, db *sql.DB, id string) (*journalEntry, error) {
	var (
		e     journalEntry
		plan  string
		state string
	)
	err := db.QueryRowContext(ctx, `SELECT digest, plan, state, inserted FROM batches WHERE id = ?`, id).Scan(&e.digest, &plan, &state, &e.inserted)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read journal for batch %q: %w", id, err)
	}
	if err := json.Unmarshal([]byte(plan), &e.plan); err != nil {
		return nil, fmt.Errorf("decode plan of batch %q: %w", id, err)
	}
	e.done = state == "done"
	return &e, nil
}

func writeJournal(ctx context.Context, db *sql.DB, id string, e *journalEntry, blocks int) error {
	plan, err := json.Marshal(e.plan)
	if err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, `INSERT INTO batches (id, digest, blocks, plan, state) VALUES (?, ?, ?, ?, 'pending')`, id, e.digest, blocks, string(plan))
	if err != nil {
		return fmt.Errorf("journal batch %q: %w", id, err)
	}
	return nil
}

func markDone(ctx context.Context, db *sql.DB, id string, inserted int64) error {
	_, err := db.ExecContext(ctx, `UPDATE batches SET state = 'done', inserted = ? WHERE id = ?`, inserted, id)
	if err != nil {
		return fmt.Errorf("mark batch %q done: %w", id, err)
	}
	return nil
}
