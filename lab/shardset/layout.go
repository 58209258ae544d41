package shardset

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// ErrLayoutMismatch is returned by EnsureLayout when a data directory was created with
// another shard count, router or backend. Opening it anyway would look for records on
// shards that do not hold them, so the lab refuses instead of silently losing data.
var ErrLayoutMismatch = errors.New("shardset: data directory was created with another layout")

// LayoutFile is the name of the layout record inside a data directory.
const LayoutFile = "shardlab.json"

// Layout is what a data directory was created with.
type Layout struct {
	Backend string `json:"backend"`
	Shards  int    `json:"shards"`
	Router  string `json:"router"`
}

// EnsureLayout records l in dir when dir holds no layout yet, and otherwise checks that
// the recorded layout equals l. dir is created if needed.
func EnsureLayout(dir string, l Layout) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("shardset: create data directory: %w", err)
	}
	path := filepath.Join(dir, LayoutFile)
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		raw, _ = json.MarshalIndent(l, "", "  ")
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, append(raw, '\n'), 0o644); err != nil {
			return fmt.Errorf("shardset: write layout: %w", err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("shardset: write layout: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("shardset: read layout: %w", err)
	}
	var have Layout
	if err := json.Unmarshal(raw, &have); err != nil {
		return fmt.Errorf("shardset: parse %s: %w", path, err)
	}
	if have != l {
		return fmt.Errorf("%w: %s says %d shards, router %s, backend %s; asked for %d shards, router %s, backend %s (use a fresh --data directory; resharding is not supported)",
			ErrLayoutMismatch, path, have.Shards, have.Router, have.Backend, l.Shards, l.Router, l.Backend)
	}
	return nil
}
