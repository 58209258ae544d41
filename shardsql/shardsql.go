// Package shardsql is a database/sql driver for a sharded database: a Go program keeps
// using database/sql (and whatever sits on it, sqlx or sqlc's output) and gets sharding
// by opening a different handle. It is the in-process counterpart of the wire proxy,
// as Sharding-JDBC is of ShardingSphere-Proxy.
//
//	db, err := shardsql.Open(shardsql.Config{Rules: compiled})
//	// or, with the driver registered under "shardlab":
//	db, err := sql.Open("shardlab", "rules.toml")
//
// Statements are written against logical tables with PostgreSQL's $1, $2 placeholders;
// the SQL core (packages sqlplan and sqlexec) routes them to the shards, rewrites table
// names and merges cross-shard answers exactly, or refuses them with SQLSTATE 0A000.
// Behind it sit the shards' own drivers: pgx (its pool, made by postgresdb.NewPool like
// every pool in shardlab), one pool per data source, and for SQLite data sources the
// project's SQLite opener. Statements borrow pgx's connections directly rather than
// through pgx's database/sql driver: a database/sql pool under a database/sql driver
// would add a second layer of pooling to every statement.
//
// # Transactions
//
// A transaction opens a transaction on each data source a statement of it touches and
// commits them all at the end. By default the commit is best effort: data sources
// commit one after another, and if data source 2 fails after data source 1 committed,
// data source 1's part stays committed and Commit returns an error naming both, a
// half-applied transaction. With Config.TwoPhase, Commit uses PostgreSQL's two-phase
// commit (PREPARE TRANSACTION, then COMMIT PREPARED), which needs
// max_prepared_transactions above zero on every data source; Open first finishes any
// prepared transaction a crash left behind, and until Close the handle keeps settling
// transactions left in doubt (a data source that failed in the middle of a commit, a
// program that was killed), every Config.SettleInterval. See sqlexec.Committer and
// sqlexec.Settler.
//
// # Errors
//
// An error from a shard is a *sqlexec.ShardError naming the data source; errors.As
// still finds the server's *pgconn.PgError with its SQLSTATE. A data source that is
// down fails only the statements that need it. Cancelling a statement's context
// cancels its query on every shard it runs on.
package shardsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardlab/shardlab/internal/postgresdb"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// DriverName is the name the driver registers with database/sql.
const DriverName = "shardlab"

func init() { sql.Register(DriverName, Driver{}) }

// DefaultMaxConns is the default size of each data source's pool.
const DefaultMaxConns = 20

// Config describes a sharded database.
type Config struct {
	// Rules are the compiled sharding rules; their data sources are PostgreSQL DSNs.
	Rules *rules.Compiled
	// TwoPhase commits transactions that span data sources with two-phase commit.
	TwoPhase bool
	// SettleInterval is how often, with TwoPhase, transactions left in doubt are
	// looked for and settled (0: sqlexec.DefaultSettleInterval; negative: only when the
	// handle is opened).
	SettleInterval time.Duration
	// MaxConns bounds each data source's pool; default DefaultMaxConns. A SELECT's
	// open rows hold a connection of each data source they read until they end, so
	// it must exceed the answers a program keeps open while it runs other statements.
	MaxConns int
	// PlanCacheSize bounds the plan cache (sqlplan.Options.CacheSize).
	PlanCacheSize int
	// MaxHeld bounds the bytes of rows one statement holds in memory when its answer
	// is read whole before it is merged (aggregates and DISTINCT across shards): past
	// it the statement fails with SQLSTATE 54000 (0: sqlexec.DefaultMaxHeld, 1 GiB;
	// negative: no bound). Streamed answers hold a few batches per shard whatever their
	// size. See sqlexec.Engine.SetMaxHeld.
	MaxHeld int64
	// DeadlockInterval is how often transactions are checked for deadlocks across data
	// sources, which no one server can see (0: sqlexec.DefaultDeadlockInterval;
	// negative: never). The victim's statement fails with SQLSTATE 40P01.
	DeadlockInterval time.Duration
	// Coordinate has a coordinator database answer the SELECTs that the merge cannot
	// answer exactly over several shards (joins on any column, CTEs, subqueries,
	// window functions, expressions over aggregates ...), as shard-proxy does: a
	// database on the default data source's server, made and kept in step by this
	// handle, where PostgreSQL evaluates the statement over every shard's rows through
	// postgres_fdw (package coordinator; docs/sql-sharding.md). Without it those
	// statements are refused with SQLSTATE 0A000. On PostgreSQL it needs a login that
	// may create databases, and postgres_fdw on that server; the handle listens on a
	// port of its own (the relay that counts what the shards send). On SQLite data
	// sources SQLite answers them itself, over every file attached to one connection
	// (sqlite_attach.go; at most 10 files).
	Coordinate bool
	// CoordinatorDatabase names the coordinator database (default: the default data
	// source's database name + "_coordinator"). It has one owner at a time: give each
	// process its own.
	CoordinatorDatabase string
	// CoordinatorMaxMoved bounds the bytes of rows one coordinated statement reads from
	// the shards: past it the statement is cut off and fails with SQLSTATE 54000
	// (0: DefaultCoordinatorMaxMoved; negative: no bound).
	CoordinatorMaxMoved int64
	// CoordinatorPoolSize bounds the connections to the coordinator database
	// (0: DefaultCoordinatorPoolSize).
	CoordinatorPoolSize int
}

// DefaultCoordinatorMaxMoved is the usual Config.CoordinatorMaxMoved: 1 GB, as Citus's
// max_intermediate_result_size.
const DefaultCoordinatorMaxMoved = 1 << 30

// DefaultCoordinatorPoolSize is the usual Config.CoordinatorPoolSize.
const DefaultCoordinatorPoolSize = 4

// Driver is the database/sql driver. Its data source name is the path of a rules file
// (see package rules), optionally followed by query parameters (see ParseDSN). Data
// sources are PostgreSQL DSNs, or "sqlite:PATH" for SQLite files (see sqlite.go for
// the part of the SQL they take).
type Driver struct{}

var _ driver.DriverContext = Driver{}

// Open implements driver.Driver.
func (d Driver) Open(name string) (driver.Conn, error) {
	c, err := d.OpenConnector(name)
	if err != nil {
		return nil, err
	}
	return c.Connect(context.Background())
}

// OpenConnector implements driver.DriverContext: it reads the rules file once.
func (Driver) OpenConnector(name string) (driver.Connector, error) {
	cfg, err := ParseDSN(name)
	if err != nil {
		return nil, err
	}
	return NewConnector(context.Background(), cfg)
}

// ParseDSN reads a data source name: a rules file path, then optional query
// parameters two_phase (a boolean), max_conns (an integer), settle_interval (a Go
// duration), max_held (bytes, see Config.MaxHeld), coordinate (a boolean),
// coordinator_database (a name) and coordinator_max_moved (bytes):
//
//	rules.toml?two_phase=true&coordinate=true
func ParseDSN(name string) (Config, error) {
	path, query, _ := strings.Cut(name, "?")
	if path == "" {
		return Config{}, errors.New("shardsql: the data source name must be the path of a rules file")
	}
	var cfg Config
	q, err := url.ParseQuery(query)
	if err != nil {
		return cfg, fmt.Errorf("shardsql: data source name %q: %w", name, err)
	}
	for k, v := range q {
		switch k {
		case "two_phase":
			if cfg.TwoPhase, err = strconv.ParseBool(v[0]); err != nil {
				return cfg, fmt.Errorf("shardsql: two_phase=%q: want true or false", v[0])
			}
		case "max_conns":
			if cfg.MaxConns, err = strconv.Atoi(v[0]); err != nil || cfg.MaxConns < 1 {
				return cfg, fmt.Errorf("shardsql: max_conns=%q: want a positive integer", v[0])
			}
		case "max_held":
			if cfg.MaxHeld, err = strconv.ParseInt(v[0], 10, 64); err != nil {
				return cfg, fmt.Errorf("shardsql: max_held=%q: want a number of bytes (0 the default, below 0 no bound)", v[0])
			}
		case "settle_interval":
			if cfg.SettleInterval, err = time.ParseDuration(v[0]); err != nil || cfg.SettleInterval <= 0 {
				return cfg, fmt.Errorf("shardsql: settle_interval=%q: want a positive duration such as 1s", v[0])
			}
		case "coordinate":
			if cfg.Coordinate, err = strconv.ParseBool(v[0]); err != nil {
				return cfg, fmt.Errorf("shardsql: coordinate=%q: want true or false", v[0])
			}
		case "coordinator_database":
			if v[0] == "" {
				return cfg, errors.New("shardsql: coordinator_database is empty: want a database name")
			}
			cfg.CoordinatorDatabase = v[0]
		case "coordinator_max_moved":
			if cfg.CoordinatorMaxMoved, err = strconv.ParseInt(v[0], 10, 64); err != nil {
				return cfg, fmt.Errorf("shardsql: coordinator_max_moved=%q: want a number of bytes (0 the default, below 0 no bound)", v[0])
			}
		default:
			return cfg, fmt.Errorf("shardsql: unknown parameter %q in the data source name (want two_phase, max_conns, settle_interval, max_held, coordinate, coordinator_database, coordinator_max_moved)", k)
		}
	}
	if cfg.Rules, err = rules.Load(path); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// Open returns a *sql.DB over the sharded database cfg describes. Closing it closes the
// data sources' pools.
//
// A logical connection holds no shard connection while idle (it borrows one from a data
// source's pool for each statement or transaction), so keeping idle ones costs nothing,
// while database/sql's default of two idle connections would close and reopen them,
// re-preparing every *sql.Stmt, under any concurrency above two: Open keeps as many as a
// pool's size. A handle from sql.Open("shardlab", ...) has database/sql's default; call
// its SetMaxIdleConns.
func Open(cfg Config) (*sql.DB, error) {
	c, err := NewConnector(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	return OpenDB(c), nil
}

// OpenDB returns a *sql.DB over c, keeping idle logical connections as Open does.
func OpenDB(c *Connector) *sql.DB {
	db := sql.OpenDB(c)
	db.SetMaxIdleConns(max(c.cfg.MaxConns, DefaultMaxConns))
	return db
}

// CloseIdle closes the data sources' idle connections, and those in use as they are
// given back: a program that takes turns between several sharded handles on one server
// (a benchmark, for instance) gives the server its connections back between turns.
// The pools stay open and reconnect on demand.
func (c *Connector) CloseIdle() {
	for _, p := range c.pgxPools {
		p.Reset()
	}
}

// Connector is a sharded database's driver.Connector: the data sources' pools and the
// SQL core shared by every connection sql.DB makes.
type Connector struct {
	cfg       Config
	pools     sqlexec.Pool
	pgxPools  sqlexec.PgxPools // the data sources' pools
	sqlite    *sqliteShards    // set when the data sources are SQLite files
	planner   *sqlplan.Planner
	catalog   *sqlexec.Catalog
	committer *sqlexec.Committer
	settler   *sqlexec.Settler // with TwoPhase
	engine    *sqlexec.Engine
	detector  *sqlexec.DeadlockDetector
	coord     *coordination // with Config.Coordinate, on PostgreSQL data sources
	// sqliteCoord answers, with Config.Coordinate on SQLite data sources, what the
	// merge cannot (sqlite_attach.go).
	sqliteCoord *liteCoordinator
	closeOnce   sync.Once
}

var _ driver.Connector = (*Connector)(nil)

// NewConnector opens a pool per data source (connections are made on demand) and, with
// TwoPhase, starts a settler: it finishes the prepared transactions a crash left behind
// (which needs every data source up) and settles transactions in doubt until Close.
func NewConnector(ctx context.Context, cfg Config) (*Connector, error) {
	if cfg.Rules == nil {
		return nil, errors.New("shardsql: Config.Rules is nil")
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxConns < 1 || cfg.MaxConns > postgresdb.MaxPoolSize {
		return nil, fmt.Errorf("shardsql: MaxConns must be 1..%d, got %d", postgresdb.MaxPoolSize, cfg.MaxConns)
	}
	c := &Connector{cfg: cfg}
	lite, err := isSQLite(cfg.Rules)
	if err != nil {
		return nil, err
	}
	if lite {
		if cfg.TwoPhase {
			return nil, errors.New("shardsql: two-phase commit needs PostgreSQL data sources; SQLite has no PREPARE TRANSACTION")
		}
		if c.sqlite, err = openSQLite(ctx, cfg.Rules); err != nil {
			return nil, err
		}
		if cfg.Coordinate {
			if c.sqliteCoord, err = newLiteCoordinator(c.sqlite); err != nil {
				c.sqlite.close()
				return nil, err
			}
		}
		c.planner = sqlplan.New(cfg.Rules, sqliteCatalog{c.sqlite}, sqlplan.Options{CacheSize: cfg.PlanCacheSize, Coordinate: cfg.Coordinate})
		c.committer = sqlexec.NewCommitter(cfg.Rules, false)
		c.engine = sqlexec.NewEngine(cfg.Rules, nil, c.committer)
		c.engine.SetMaxHeld(cfg.MaxHeld)
		return c, nil
	}
	for _, ds := range cfg.Rules.DataSources() {
		// The project's one pool constructor (timeouts as everywhere), seen through pgx's
		// database/sql driver.
		// Every connection tells its server the layout it routes by: after a
		// resharding move switched to another, the move's fence refuses its writes
		// (package reshard).
		pool, err := postgresdb.NewPool(ctx, ds.DSN, postgresdb.Options{PoolSize: int32(cfg.MaxConns), Lazy: true,
			RuntimeParams: map[string]string{rules.LayoutSetting: cfg.Rules.Digest()}})
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("shardsql: data source %s: %w", ds.Name, err)
		}
		c.pgxPools = append(c.pgxPools, pool)
	}
	// Statements borrow pgx's pooled connections directly: a database/sql pool under a
	// database/sql driver would be a second layer of pooling on every statement.
	c.pools = c.pgxPools
	if cfg.Coordinate {
		if c.coord, err = openCoordination(ctx, cfg); err != nil {
			c.Close()
			return nil, err
		}
		c.pools = coordinatedPools{c.pgxPools, c.coord}
	}
	c.catalog = sqlexec.NewCatalog(cfg.Rules, c.pools)
	c.planner = sqlplan.New(cfg.Rules, c.catalog, sqlplan.Options{CacheSize: cfg.PlanCacheSize, Coordinate: cfg.Coordinate, ShardAggregates: cfg.Coordinate})
	c.committer = sqlexec.NewCommitter(cfg.Rules, cfg.TwoPhase)
	c.engine = sqlexec.NewEngine(cfg.Rules, c.catalog, c.committer)
	c.engine.SetMaxHeld(cfg.MaxHeld)
	if cfg.DeadlockInterval >= 0 {
		c.detector = sqlexec.NewDeadlockDetector(cfg.Rules, c.pools, cfg.DeadlockInterval)
		c.detector.Start()
	}
	if cfg.TwoPhase {
		s, err := sqlexec.NewSettler(c.committer, sqlexec.SettlerConfig{Interval: cfg.SettleInterval})
		if err == nil {
			err = s.Start(ctx)
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		c.settler = s
	}
	return c, nil
}

// Connect implements driver.Connector: a logical connection, holding shard
// connections only while it needs them.
func (c *Connector) Connect(context.Context) (driver.Conn, error) {
	if c.sqlite != nil {
		return &conn{c: c, sq: &sqliteSession{c: c}}, nil
	}
	s := sqlexec.NewSession(c.pools, c.committer)
	// The coordinator database reads committed rows in transactions of its own, never
	// in the program's (see readyCoordinator).
	s.SetOutside(sqlplan.CoordinatorSource(c.cfg.Rules))
	if c.detector != nil {
		s.SetDeadlockDetector(c.detector)
	}
	return &conn{c: c, s: s}, nil
}

// Driver implements driver.Connector.
func (c *Connector) Driver() driver.Driver { return Driver{} }

// Planner returns the connector's planner (to explain a statement's plan).
func (c *Connector) Planner() *sqlplan.Planner { return c.planner }

// Settler returns the settler of two-phase transactions in doubt (its Stats count
// them); nil without TwoPhase.
func (c *Connector) Settler() *sqlexec.Settler { return c.settler }

// Close stops the settler and closes the data sources' pools; sql.DB.Close calls it.
func (c *Connector) Close() error {
	var first error
	c.closeOnce.Do(func() {
		if c.settler != nil {
			c.settler.Close()
		}
		if c.detector != nil {
			c.detector.Close()
		}
		if c.sqliteCoord != nil {
			c.sqliteCoord.close()
		}
		if c.sqlite != nil {
			first = c.sqlite.close()
		}
		for _, p := range c.pgxPools {
			p.Close()
		}
		if c.coord != nil {
			c.coord.close()
		}
	})
	return first
}
