package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardlab/shardlab/internal/fanout"
	"github.com/shardlab/shardlab/internal/postgresdb"
	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/routing"
)

const layoutSchema = `CREATE TABLE IF NOT EXISTS shardlab_layout (
	singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
	shard     integer NOT NULL,
	shards    integer NOT NULL,
	router    text NOT NULL,
	backend   text NOT NULL
)`

// CheckLayout is the PostgreSQL counterpart of shardset.EnsureLayout: it records in the
// shard's database that it is shard number shard of layout l, or, when the database
// already holds such a record, checks that it says the same. A mismatch gives an error
// wrapping shardset.ErrLayoutMismatch. It catches --dsn arguments given in another
// order than last time and databases reused for another shard count or router, both
// of which would otherwise look for records on shards that do not hold them.
func (s *Store) CheckLayout(ctx context.Context, shard int, l shardset.Layout) error {
	var have struct {
		shard, shards   int
		router, backend string
	}
	err := s.do(ctx, true, func(ctx context.Context, c *pgxpool.Conn) error {
		if _, err := c.Exec(ctx, layoutSchema); err != nil && !postgresdb.IsAlreadyExists(err) {
			return err
		}
		if _, err := c.Exec(ctx, `INSERT INTO shardlab_layout (shard, shards, router, backend)
			VALUES ($1, $2, $3, $4) ON CONFLICT (singleton) DO NOTHING`,
			shard, l.Shards, l.Router, l.Backend); err != nil {
			return err
		}
		return c.QueryRow(ctx, `SELECT shard, shards, router, backend FROM shardlab_layout`).
			Scan(&have.shard, &have.shards, &have.router, &have.backend)
	})
	if err != nil {
		return fmt.Errorf("postgres: check layout: %w", err)
	}
	if have.shard != shard || have.shards != l.Shards || have.router != l.Router || have.backend != l.Backend {
		return fmt.Errorf("%w: database %s was set up as shard %d of %d (router %s, backend %s); asked to be shard %d of %d (router %s, backend %s) (check the order of the DSNs, or use fresh databases; resharding is not supported)",
			shardset.ErrLayoutMismatch, s.dsn, have.shard, have.shards, have.router, have.backend,
			shard, l.Shards, l.Router, l.Backend)
	}
	return nil
}

// CheckLayouts runs CheckLayout on every shard concurrently (fanout.Do), stores[i]
// being shard i, and returns a shardset.Errors naming each shard that failed.
func CheckLayouts(ctx context.Context, stores []*Store, l shardset.Layout) error {
	if len(stores) == 0 {
		return nil
	}
	return fanout.Do(ctx, routing.DestinationAll{}, len(stores), func(ctx context.Context, i int) error {
		return stores[i].CheckLayout(ctx, i, l)
	})
}
