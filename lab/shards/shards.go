// Package shards opens the lab's shard sets from a description: the SQLite files of a data
// directory, or one PostgreSQL database per shard (listed, or created from one base
// DSN), each checked against the layout it was made for. It is the demo-server's wiring
// as a library, so that a second program opens the very same shards the same way,
// without copying code: same options, same layout checks, same refusals.
//
//	shards, err := lab.Open(ctx, lab.Config{Backend: lab.BackendSQLite, Shards: 3, Dir: "./data"})
//	if err != nil { ... }
//	defer shards.Close()
//	shard, err := shards.Set.Put(ctx, "alice", []byte("hello"))
package shards

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/shardlab/shardlab/counters"
	"github.com/shardlab/shardlab/internal/fanout"
	"github.com/shardlab/shardlab/internal/postgresdb"
	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/lab/shardset/postgres"
	"github.com/shardlab/shardlab/lab/shardset/sqlite"
	"github.com/shardlab/shardlab/routing"
)

// Backends accepted by Config.Backend.
const (
	BackendSQLite   = "sqlite"   // one file per shard in Config.Dir
	BackendPostgres = "postgres" // one database per shard
)

// CounterFile is the name of the hot-row counter database in a SQLite data directory.
const CounterFile = "counters.db"

// ErrBadConfig is wrapped by Open's errors about a Config that cannot describe a shard
// set. Errors about the options of a backend wrap that backend's own sentinel instead
// (sqlite.ErrBadOptions, postgres.ErrBadOptions, postgres.ErrBadDSN).
var ErrBadConfig = errors.New("lab: invalid configuration")

// cleanupTimeout bounds dropping the databases a refused Open created, which must happen
// even when the caller's context has ended.
const cleanupTimeout = 30 * time.Second

// Config describes a shard set.
type Config struct {
	// Backend is BackendSQLite (the default) or BackendPostgres.
	Backend string
	// Shards is the number of shards, 1..routing.MaxShards; 0 means 1.
	Shards int
	// Router is the routing strategy (routing.Strategies); empty means crc32.
	Router string

	// Dir is the SQLite data directory: shard i is sqlite.ShardFile(Dir, i), and the
	// layout is recorded in shardset.LayoutFile there.
	Dir string
	// SQLite tunes every SQLite file: the shards and the counter database.
	SQLite sqlite.Options

	// DSNs are the PostgreSQL shards, one per shard in shard order; with Create, base
	// DSNs naming servers (and an existing database to connect to on each, such as
	// "postgres"), one or more.
	DSNs []string
	// Create makes the databases <DatabasePrefix>0..N-1 if they are missing and uses
	// them: shard i's on the server of DSNs[i mod len(DSNs)], so that with one base DSN
	// per host every shard of up to that many has a host of its own. A refused Open
	// drops the ones it created.
	Create bool
	// Reset, with Create, drops those databases first: it DELETES their data.
	Reset bool
	// DatabasePrefix names the databases Create makes; empty means
	// postgres.DefaultDatabasePrefix.
	DatabasePrefix string
	// Postgres tunes every pool: the shards' and the counter's. With Lazy, shards that
	// do not answer at start are reported in Shards.Down instead of failing Open.
	Postgres postgres.Options
}

// Shards is an open shard set and what it was opened with.
type Shards struct {
	// Set routes keys to the shards; Close closes it.
	Set *shardset.Set
	// Layout is what every shard was checked against.
	Layout shardset.Layout
	// PoolSize is the connections per shard: the PostgreSQL pool size, or the SQLite
	// read connections (the writer is always one).
	PoolSize int
	// Down lists the PostgreSQL shards that did not answer at start under
	// Config.Postgres.Lazy; their layout is checked by nobody until a restart.
	Down shardset.Errors

	cfg    Config          // defaults filled in
	dsns   []string        // the PostgreSQL shards' DSNs, after Create
	stores []*sqlite.Store // the SQLite shards
}

// Open opens the shard set cfg describes and checks that every shard was made for this
// layout (shard index, shard count, router, backend), recording the layout where it is
// new. A mismatch fails with an error wrapping shardset.ErrLayoutMismatch: keys would
// otherwise be looked for on shards that do not hold them.
//
// A PostgreSQL shard that does not answer fails Open, naming it, unless
// Config.Postgres.Lazy is set. With Create, a refused Open drops the databases it
// created, so that trying a wrong layout leaves the server as it was.
//
// Cancelling ctx abandons opening; nothing stays open.
func Open(ctx context.Context, cfg Config) (*Shards, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	router, err := routing.New(c.Router, c.Shards)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	s := &Shards{Layout: shardset.Layout{Backend: c.Backend, Shards: c.Shards, Router: c.Router}, cfg: c}
	var backends []shardset.Backend
	switch c.Backend {
	case BackendSQLite:
		backends, err = s.openSQLite(ctx)
	case BackendPostgres:
		backends, err = s.openPostgres(ctx)
	}
	if err != nil {
		return nil, err
	}
	if s.Set, err = shardset.New(router, backends); err != nil {
		for _, b := range backends {
			b.Close()
		}
		return nil, err
	}
	return s, nil
}

func (cfg Config) withDefaults() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return cfg, fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
	if cfg.Backend == "" {
		cfg.Backend = BackendSQLite
	}
	if cfg.Shards == 0 {
		cfg.Shards = 1
	}
	if cfg.Router == "" {
		cfg.Router = routing.StrategyCRC32
	}
	if cfg.DatabasePrefix == "" {
		cfg.DatabasePrefix = postgres.DefaultDatabasePrefix
	}
	if cfg.Shards < 1 || cfg.Shards > routing.MaxShards {
		return bad("shards must be 1..%d, got %d", routing.MaxShards, cfg.Shards)
	}
	switch cfg.Backend {
	case BackendSQLite:
		if cfg.Dir == "" {
			return bad("a SQLite shard set needs a data directory")
		}
		if len(cfg.DSNs) > 0 || cfg.Create || cfg.Reset {
			return bad("DSNs, Create and Reset are for the PostgreSQL backend")
		}
		var err error
		if cfg.SQLite, err = cfg.SQLite.WithDefaults(); err != nil {
			return cfg, err
		}
	case BackendPostgres:
		switch {
		case cfg.Create && len(cfg.DSNs) == 0:
			return bad("Create needs a base DSN")
		case cfg.Create && len(cfg.DSNs) > cfg.Shards:
			return bad("Create spreads %d shard(s) over the base DSNs, got %d: more servers than shards", cfg.Shards, len(cfg.DSNs))
		case !cfg.Create && len(cfg.DSNs) != cfg.Shards:
			return bad("%d shard(s) need %d DSNs, got %d", cfg.Shards, cfg.Shards, len(cfg.DSNs))
		case cfg.Reset && !cfg.Create:
			return bad("Reset only works with Create")
		case cfg.Reset && cfg.Postgres.Lazy:
			return bad("Reset needs every shard up; it cannot be combined with Lazy")
		}
		var err error
		if cfg.Postgres, err = cfg.Postgres.WithDefaults(); err != nil {
			return cfg, err
		}
	default:
		return bad("backend must be %s or %s, got %q", BackendSQLite, BackendPostgres, cfg.Backend)
	}
	return cfg, nil
}

func (s *Shards) openSQLite(ctx context.Context) ([]shardset.Backend, error) {
	c := s.cfg
	if err := shardset.EnsureLayout(c.Dir, s.Layout); err != nil {
		return nil, err
	}
	stores, err := sqlite.OpenShards(ctx, c.Dir, c.Shards, c.SQLite)
	if err != nil {
		return nil, err
	}
	s.PoolSize = c.SQLite.ReadConns
	s.stores = stores
	backends := make([]shardset.Backend, len(stores))
	for i, st := range stores {
		backends[i] = st
	}
	return backends, nil
}

func (s *Shards) openPostgres(ctx context.Context) (_ []shardset.Backend, err error) {
	c := s.cfg
	s.dsns = c.DSNs
	if c.Create {
		if c.Reset {
			if err := postgres.DropShardDatabasesOn(ctx, c.DSNs, c.DatabasePrefix, c.Shards); err != nil {
				return nil, fmt.Errorf("reset shard databases: %w", err)
			}
		}
		var created [][]string
		s.dsns, created, err = postgres.CreateMissingShardDatabasesOn(ctx, c.DSNs, c.DatabasePrefix, c.Shards)
		defer func() {
			if err != nil {
				for b, names := range created {
					err = errors.Join(err, dropCreated(ctx, c.DSNs[b], names))
				}
			}
		}()
		if err != nil {
			return nil, fmt.Errorf("create shard databases: %w", err)
		}
	}
	stores, err := postgres.OpenShards(ctx, s.dsns, c.Postgres)
	if err != nil {
		return nil, err
	}
	closeAll := func() {
		for _, st := range stores {
			st.Close()
		}
	}
	err = fanout.Do(ctx, routing.DestinationAll{}, len(stores), func(ctx context.Context, i int) error {
		return stores[i].CheckLayout(ctx, i, s.Layout)
	})
	var errs shardset.Errors
	if errors.As(err, &errs) {
		var refused shardset.Errors
		for _, se := range errs {
			if c.Postgres.Lazy && !errors.Is(se, shardset.ErrLayoutMismatch) {
				// Down at start: a mismatch is still refused for every shard that answers.
				s.Down = append(s.Down, se)
				continue
			}
			refused = append(refused, se)
		}
		if len(refused) > 0 {
			closeAll()
			return nil, refused
		}
	} else if err != nil {
		closeAll()
		return nil, err
	}
	s.PoolSize = int(c.Postgres.PoolSize)
	backends := make([]shardset.Backend, len(stores))
	for i, st := range stores {
		backends[i] = st
	}
	return backends, nil
}

// dropCreated drops the databases a refused Open created, with a context of its own:
// the caller's may be what ended the start.
func dropCreated(ctx context.Context, baseDSN string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var errs []error
	for _, name := range names {
		if err := postgresdb.DropDatabase(ctx, baseDSN, name); err != nil {
			errs = append(errs, fmt.Errorf("drop database %s created by this refused start: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Config returns the configuration the set was opened with, defaults filled in.
func (s *Shards) Config() Config { return s.cfg }

// OpenCounter opens the hot-row counter store that goes with the set, with the set's own
// settings: CounterFile in the data directory with Config.SQLite (its sync mode
// included), or shard 0's PostgreSQL database through a pool made with
// Config.Postgres (its pool size included). The caller closes it. The record shards'
// variants (group commit, the rollback journal, one connection) do not apply to it: the
// counter store keeps its own design.
func (s *Shards) OpenCounter(ctx context.Context, opts counters.Options) (counters.Counter, error) {
	if s.cfg.Backend == BackendPostgres {
		return counters.OpenPostgres(ctx, s.dsns[0], opts, s.cfg.Postgres)
	}
	so := s.cfg.SQLite
	so.GroupCommit, so.OneConn, so.Journal = false, false, sqlite.JournalWAL
	return counters.OpenSQLite(ctx, filepath.Join(s.cfg.Dir, CounterFile), opts, so)
}

// CommitStats adds up, over the SQLite shards with group commit, the transactions
// committed and the writes they held; zeros otherwise.
func (s *Shards) CommitStats() (commits, writes int64) {
	for _, st := range s.stores {
		c, w := st.CommitStats()
		commits, writes = commits+c, writes+w
	}
	return commits, writes
}

// Close closes every shard and returns the first error; a second call returns nil.
func (s *Shards) Close() error { return s.Set.Close() }
