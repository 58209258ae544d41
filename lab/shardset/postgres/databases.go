package postgres

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/shardlab/shardlab/internal/postgresdb"
	"github.com/shardlab/shardlab/routing"
)

// DefaultDatabasePrefix names the databases CreateShardDatabases makes:
// shardlab_shard_0, shardlab_shard_1, ...
const DefaultDatabasePrefix = "shardlab_shard_"

// prefixPattern keeps generated names plain lower-case identifiers, so they need no
// quoting surprises in psql and stay within PostgreSQL's 63-byte limit.
var prefixPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,50}$`)

// ShardDatabaseName returns the name of shard i's database: prefix followed by i.
func ShardDatabaseName(prefix string, i int) string { return prefix + strconv.Itoa(i) }

func checkShardDatabases(prefix string, n int) error {
	if !prefixPattern.MatchString(prefix) {
		return fmt.Errorf("%w: database prefix %q must be 1..51 of [a-z0-9_], not starting with a digit", ErrBadOptions, prefix)
	}
	if n < 1 || n > routing.MaxShards {
		return fmt.Errorf("%w: shard count must be 1..%d, got %d", ErrBadOptions, routing.MaxShards, n)
	}
	return nil
}

// CreateShardDatabases makes sure the server that baseDSN points at holds the databases
// shardlab_shard_0 .. shardlab_shard_{n-1} and returns one DSN per shard: baseDSN with
// the database replaced. See CreateShardDatabasesWithPrefix.
func CreateShardDatabases(ctx context.Context, baseDSN string, n int) ([]string, error) {
	return CreateShardDatabasesWithPrefix(ctx, baseDSN, DefaultDatabasePrefix, n)
}

// CreateShardDatabasesWithPrefix is CreateShardDatabases for databases named prefix0,
// prefix1, ... It connects to the database baseDSN names (which must exist; "postgres"
// is the usual choice) as a user allowed to create databases.
//
// Databases that already exist are kept with their data, like the lab's reused data
// directories; the caller is expected to check that they were made for the same layout.
// Creating concurrently with another process is safe: losing the race counts as
// "already exists". Cancelling ctx stops between databases; those created stay.
func CreateShardDatabasesWithPrefix(ctx context.Context, baseDSN, prefix string, n int) ([]string, error) {
	dsns, _, err := CreateMissingShardDatabases(ctx, baseDSN, prefix, n)
	return dsns, err
}

// CreateMissingShardDatabases is CreateShardDatabasesWithPrefix that also returns the
// names of the databases this call created, on success and on failure alike, so that a
// caller that then refuses to start can drop what it made and leave the server as it
// found it. A database another session created first is not in the list.
func CreateMissingShardDatabases(ctx context.Context, baseDSN, prefix string, n int) (dsns, created []string, err error) {
	if err := checkShardDatabases(prefix, n); err != nil {
		return nil, nil, err
	}
	dsns = make([]string, n)
	names := make([]string, n)
	for i := range n {
		names[i] = ShardDatabaseName(prefix, i)
		var err error
		if dsns[i], err = postgresdb.WithDatabase(baseDSN, names[i]); err != nil {
			return nil, nil, err
		}
	}
	if created, err = postgresdb.CreateDatabases(ctx, baseDSN, names); err != nil {
		return nil, created, err
	}
	return dsns, created, nil
}

// CreateMissingShardDatabasesOn is CreateMissingShardDatabases over several servers:
// shard i's database, prefix<i>, is on the server of bases[i mod len(bases)], so that
// with as many servers as shards every shard has one of its own. It returns one DSN per
// shard, and per server the names of the databases this call created there.
func CreateMissingShardDatabasesOn(ctx context.Context, bases []string, prefix string, n int) (dsns []string, created [][]string, err error) {
	if err := checkShardDatabases(prefix, n); err != nil {
		return nil, nil, err
	}
	if len(bases) == 0 {
		return nil, nil, fmt.Errorf("%w: no base DSN", ErrBadOptions)
	}
	dsns = make([]string, n)
	names := spread(bases, prefix, n)
	for b, base := range bases {
		for _, name := range names[b] {
			i := shardOf(prefix, name)
			if dsns[i], err = postgresdb.WithDatabase(base, name); err != nil {
				return nil, nil, err
			}
		}
	}
	created = make([][]string, len(bases))
	for b, base := range bases {
		if len(names[b]) == 0 {
			continue
		}
		if created[b], err = postgresdb.CreateDatabases(ctx, base, names[b]); err != nil {
			return nil, created, err
		}
	}
	return dsns, created, nil
}

// DropShardDatabasesOn is DropShardDatabasesWithPrefix over the servers of
// CreateMissingShardDatabasesOn.
func DropShardDatabasesOn(ctx context.Context, bases []string, prefix string, n int) error {
	if err := checkShardDatabases(prefix, n); err != nil {
		return err
	}
	if len(bases) == 0 {
		return fmt.Errorf("%w: no base DSN", ErrBadOptions)
	}
	names := spread(bases, prefix, n)
	for b, base := range bases {
		if len(names[b]) == 0 {
			continue // more servers than shards: nothing of theirs on this one
		}
		if err := postgresdb.DropDatabases(ctx, base, names[b]); err != nil {
			return err
		}
	}
	return nil
}

// spread names the shard databases each server of bases holds: shard i on bases[i mod
// len(bases)].
func spread(bases []string, prefix string, n int) [][]string {
	names := make([][]string, len(bases))
	for i := range n {
		b := i % len(bases)
		names[b] = append(names[b], ShardDatabaseName(prefix, i))
	}
	return names
}

// shardOf is the shard index of a name spread made.
func shardOf(prefix, name string) int {
	i, _ := strconv.Atoi(strings.TrimPrefix(name, prefix))
	return i
}

// DropShardDatabases drops shardlab_shard_0 .. shardlab_shard_{n-1} on the server that
// baseDSN points at. See DropShardDatabasesWithPrefix.
func DropShardDatabases(ctx context.Context, baseDSN string, n int) error {
	return DropShardDatabasesWithPrefix(ctx, baseDSN, DefaultDatabasePrefix, n)
}

// DropShardDatabasesWithPrefix drops the databases prefix0 .. prefix{n-1} and all their
// data, for tests and cleanup. Databases that do not exist are skipped, and sessions
// still connected to them are terminated (DROP DATABASE ... WITH (FORCE)).
func DropShardDatabasesWithPrefix(ctx context.Context, baseDSN, prefix string, n int) error {
	if err := checkShardDatabases(prefix, n); err != nil {
		return err
	}
	names := make([]string, n)
	for i := range n {
		names[i] = ShardDatabaseName(prefix, i)
	}
	return postgresdb.DropDatabases(ctx, baseDSN, names)
}
