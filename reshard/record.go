package reshard

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/rules"
)

// ErrOtherMove is wrapped when status, verify or cancel are given layouts other than
// those of the move under way on their data sources.
var ErrOtherMove = errors.New("reshard: another move is under way")

// layoutDigest identifies a layout: its rules, data sources and DSNs included.
func layoutDigest(l *rules.Compiled) string { return l.Digest() }

// recordMove writes on every source which move is under way, before anything else
// of it: status, verify and cancel given other layouts then refuse, instead of
// taking its streams for theirs.
func recordMove(ctx context.Context, from, to *rules.Compiled, conns map[string]*pgx.Conn) error {
	for _, d := range from.DataSources() {
		_, err := conns[d.Name].Exec(ctx, fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %[1]s;
			CREATE TABLE IF NOT EXISTS %[1]s.move (one int PRIMARY KEY DEFAULT 1 CHECK (one = 1), from_layout text NOT NULL, to_layout text NOT NULL,
				started timestamptz NOT NULL DEFAULT now())`, prefix))
		if err == nil {
			_, err = conns[d.Name].Exec(ctx, "INSERT INTO "+prefix+".move (from_layout, to_layout) VALUES ($1, $2) ON CONFLICT DO NOTHING",
				layoutDigest(from), layoutDigest(to))
		}
		if err != nil {
			return fmt.Errorf("data source %s: recording the move: %w", d.Name, err)
		}
	}
	return nil
}

// checkMove refuses layouts other than those of the move recorded on the current
// layout's data sources; none recorded is no move under way.
func checkMove(ctx context.Context, from, to *rules.Compiled, conns map[string]*pgx.Conn) error {
	want := [2]string{layoutDigest(from), layoutDigest(to)}
	for _, d := range from.DataSources() {
		c := conns[d.Name]
		var exists bool
		if err := c.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", prefix+".move").Scan(&exists); err != nil {
			return fmt.Errorf("data source %s: %w", d.Name, err)
		}
		if !exists {
			continue
		}
		var got [2]string
		err := c.QueryRow(ctx, "SELECT from_layout, to_layout FROM "+prefix+".move").Scan(&got[0], &got[1])
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return fmt.Errorf("data source %s: %w", d.Name, err)
		}
		if got != want {
			return fmt.Errorf("%w on data source %s: it was started from layout %s to layout %s, and these are %s to %s; give the rules files that started it",
				ErrOtherMove, d.Name, got[0], got[1], want[0], want[1])
		}
	}
	return nil
}
