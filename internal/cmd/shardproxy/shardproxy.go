// Package shardproxy is the shard-proxy command: flags, the rules they make, the logger,
// and graceful shutdown. It lives apart from cmd/shard-proxy so tests can run the
// command in-process.
package shardproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/shardlab/shardlab/internal/postgresdb"
	"github.com/shardlab/shardlab/proxy"
	"github.com/shardlab/shardlab/proxy/auth"
	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/proxy/router"
	"github.com/shardlab/shardlab/reshard"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlexec"
)

// ErrUsage marks a command-line mistake; the command exits with status 2 for it.
var ErrUsage = errors.New("usage")

const usageHead = `shard-proxy is a PostgreSQL wire-protocol sharding proxy: clients (psql, pgbench,
sysbench, any driver) connect to it as to one database, and it runs their SQL on the
shards, merging cross-shard answers exactly or refusing them (SQLSTATE 0A000).

Usage:
  shard-proxy --database app --shard DSN [--shard DSN ...] [--sharded TABLE=COLUMN ...]
              [--broadcast TABLE ...] [flags]
  shard-proxy --database app --config rules.toml [flags]

Tables: --sharded spreads a table over every shard by PostgreSQL's hash of COLUMN (its
type read from the first shard's catalog; a trailing * in TABLE matches a name prefix,
as in 'sbtest*=id'); --broadcast keeps a full copy on every shard; every other table
lives on the first shard. On every shard the physical table has the logical name.
A --shard DSN with search_path=NAME is a shard that is a schema of that database.
--config reads the SQL core's rules file instead (layouts, algorithms, bindings).

Flags:
`

type options struct {
	listen, database, config, addrFile  string
	shards, sharded, broadcast          []string
	poolMode                            string
	poolSize, maxClients, maxMessage    int
	maxHeld                             int64
	procs, maxTransactions              int
	checkoutTimeout, connectTimeout     time.Duration
	reshardDrain, reshardCatchUp        time.Duration
	shutdownTimeout, lockWaitTimeout    time.Duration
	deadlockInterval, crossPoolWait     time.Duration
	statsInterval, settleInterval       time.Duration
	adminDatabase, metricsListen        string
	users, tlsCert, tlsKey, logLevel    string
	twoPhase, aggregate, coordinate     bool
	coordinatorDatabase                 string
	coordinatorPoolSize                 int
	coordinatorMaxMoved                 int64
	coordinatorRelayHost                string
	cpuProfile                          string
	keepIdle, keepInterval, userTimeout time.Duration
	clientUserTimeout                   time.Duration
	keepCount                           int
	banTime                             time.Duration
}

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("shard-proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageHead)
		fs.PrintDefaults()
	}
	var shards, sharded, broadcast list
	fs.StringVar(&o.listen, "listen", "127.0.0.1:6432", "address to listen on; port 0 picks a free port")
	fs.StringVar(&o.database, "database", "", "database name clients connect to (required); any other gets FATAL 3D000")
	fs.Var(&shards, "shard", "a shard's PostgreSQL URL; repeat once per shard, in order")
	fs.Var(&sharded, "sharded", "TABLE=COLUMN: shard TABLE by COLUMN (trailing * in TABLE: a name prefix); repeatable")
	fs.Var(&broadcast, "broadcast", "TABLE: keep a copy of TABLE on every shard; repeatable")
	fs.StringVar(&o.config, "config", "", "rules file (TOML, the SQL core's format) instead of --shard/--sharded/--broadcast")
	fs.StringVar(&o.poolMode, "pool-mode", "transaction", "transaction (a server connection per transaction) or session (per client)")
	fs.IntVar(&o.poolSize, "pool-size", backend.DefaultSize, "server connections per data source")
	fs.DurationVar(&o.reshardDrain, "reshard-drain", reshard.DefaultDrain, "the admin console's RESHARD CUTOVER: how long the transactions in flight may take to end once new ones are held")
	fs.DurationVar(&o.reshardCatchUp, "reshard-catch-up", reshard.DefaultCatchUp, "the admin console's RESHARD CUTOVER: how long the new data sources may take to apply the last changes")
	fs.DurationVar(&o.checkoutTimeout, "checkout-timeout", backend.DefaultCheckoutTimeout, "how long a statement waits for a free server connection before it fails (53300)")
	fs.DurationVar(&o.connectTimeout, "connect-timeout", backend.DefaultConnectTimeout, "bound on connecting to a shard")
	fs.DurationVar(&o.keepIdle, "tcp-keepalive-idle", backend.DefaultKeepAliveIdle, "client and server connections: silence before the first TCP keepalive probe; 0 turns probes off")
	fs.DurationVar(&o.keepInterval, "tcp-keepalive-interval", backend.DefaultKeepAliveInterval, "time between TCP keepalive probes")
	fs.IntVar(&o.keepCount, "tcp-keepalive-count", backend.DefaultKeepAliveCount, "unanswered TCP keepalive probes after which a connection fails (on a connection with a user timeout, Linux goes by the user timeout instead)")
	fs.DurationVar(&o.userTimeout, "tcp-user-timeout", backend.DefaultUserTimeout, "server connections: data or keepalive probes unacknowledged this long end the connection (TCP_USER_TIMEOUT), so a statement that needs a shard the network cut off fails with 08006 after about this long; a live server running a long query is never cut. "+userTimeoutCaveats+" 0 leaves the system's behaviour (a statement in flight waits about 15 minutes)")
	fs.DurationVar(&o.clientUserTimeout, "client-tcp-user-timeout", 0, "client connections: as --tcp-user-timeout. 0 (default): off, since a live client may keep its window closed for long (one that stops reading a large answer, a LISTEN client that reads nothing); keepalive alone finds a client that vanished while idle in a transaction (after --tcp-keepalive-idle + interval x count), rolls its transaction back and frees its locks. "+userTimeoutCaveats)
	fs.DurationVar(&o.banTime, "ban-time", backend.DefaultBanTime, "after the TCP connection to a shard cannot be made (refused, no route, no answer within --connect-timeout), statements that need a new one fail at once (08006) for this long instead of each waiting for --connect-timeout; a connection made lifts it; 0 turns it off")
	fs.IntVar(&o.maxClients, "max-clients", proxy.DefaultMaxClients, "client connections at most; the next gets FATAL 53300")
	fs.IntVar(&o.maxMessage, "max-message-size", 64<<20, "largest client message in bytes; a larger one ends the connection")
	fs.Int64Var(&o.maxHeld, "max-held-memory", 1<<30, "bytes of rows one statement may hold when its answer is read whole before it is merged (aggregates and DISTINCT across shards, text sorted under a collation, RETURNING, portals executed with a row limit); past it the statement fails with 54000; streamed answers hold a few batches whatever their size")
	fs.StringVar(&o.users, "users", "", `users file for SCRAM-SHA-256 authentication, lines of "user" "password or SCRAM secret" (pgbouncer's userlist.txt), optionally followed by "server user" ["server password"]: each client runs on the shards as that server login, or as itself (with its password when given in plain text); without a users file every client is trusted and runs as the --shard DSNs' user`)
	fs.StringVar(&o.tlsCert, "tls-cert", "", "TLS certificate (PEM) offered to clients that ask for SSL; needs --tls-key")
	fs.StringVar(&o.tlsKey, "tls-key", "", "TLS private key (PEM)")
	fs.DurationVar(&o.lockWaitTimeout, "lock-wait-timeout", router.DefaultLockWaitTimeout, "bound on a lock wait of a transaction that spans shards, a backstop to --deadlock-interval; past it the transaction fails with 40P01 (deadlock detected) so that clients retry; 0 (default) waits forever")
	fs.DurationVar(&o.deadlockInterval, "deadlock-interval", sqlexec.DefaultDeadlockInterval, "how often the shards' lock waits are checked for a deadlock across shards, which no single server sees; the youngest transaction of a cycle fails with 40P01; 0 turns it off")
	fs.DurationVar(&o.crossPoolWait, "cross-pool-wait", router.DefaultCrossPoolWait, "how long a transaction holding server connections of other data sources waits for one more; past it the transaction fails with 40P01 (deadlock detected), since transactions holding each other's pools would otherwise wait forever. A client holding none waits up to --checkout-timeout")
	fs.IntVar(&o.maxTransactions, "max-transactions", router.AutoMaxTransactions, "in transaction pooling, at most N clients hold server connections at once (each for a transaction, or a statement outside one); the others wait their turn up to --checkout-timeout. Below --pool-size, transactions that span shards never wait on each other's pools (see docs/proxy.md); 0: no bound; -1 (default): --pool-size minus 1 when there are several pools, no bound with one pool (one shard, or --aggregate)")
	fs.BoolVar(&o.coordinate, "coordinator", true, "answer the SELECTs the merge cannot answer exactly over several shards (joins on any column, CTEs, window functions, expressions over aggregates, ...) in a coordinator database on the default data source's server, where PostgreSQL evaluates them over the shards' rows through postgres_fdw; --coordinator=false refuses them with 0A000, so that every cross-shard cost is explicit. The server needs postgres_fdw (shipped with PostgreSQL's server), the data sources' user CREATEDB; without them such statements are refused, naming why")
	fs.StringVar(&o.coordinatorDatabase, "coordinator-database", "", "the coordinator database's name (default: the default data source's database name + \"_coordinator\"); it is made if missing, and its contents are the proxy's")
	fs.IntVar(&o.coordinatorPoolSize, "coordinator-pool-size", proxy.DefaultCoordinatorPoolSize, "with --coordinator, at most this many statements run in the coordinator database at once (each holds a connection to every shard it reads while it runs); the others wait as for any pool")
	fs.Int64Var(&o.coordinatorMaxMoved, "coordinator-max-moved", proxy.DefaultCoordinatorMaxMoved, "bytes of rows one statement may read from the shards into the coordinator database (with --coordinator), counted on the wire while it runs, and bytes of rows an INSERT ... SELECT into a sharded table reads before it writes them; past it the statement fails with 54000 naming this flag (default 1 GB, as Citus's max_intermediate_result_size; 0: no bound)")
	fs.StringVar(&o.coordinatorRelayHost, "coordinator-relay-host", "", "with --coordinator, the address the relay listens on, through which the coordinator database reads the shards (and the proxy counts what it reads); the default data source's server must reach it (default: this machine's address toward that server)")
	fs.BoolVar(&o.twoPhase, "two-phase", false, "commit transactions that span shards with two-phase commit (needs max_prepared_transactions > 0 on every shard)")
	fs.DurationVar(&o.settleInterval, "settle-interval", sqlexec.DefaultSettleInterval, "with --two-phase, how often the shards are checked for prepared transactions left in doubt (a shard that failed in the middle of a commit, a coordinator that was killed), which are then committed or rolled back; a prepared transaction keeps its row locks, so clients wait on it until then. Once at start, before clients are accepted, then at this interval")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long open transactions may take to finish before their clients are cut off")
	fs.DurationVar(&o.statsInterval, "stats-interval", time.Minute, "log every pool's connections in use and idle at this interval; 0 turns it off")
	fs.StringVar(&o.adminDatabase, "admin-database", "shardlab", "database name of the admin console (SHOW POOLS, SHOW DATABASES, SHOW ROUTE <statement>, SHOW HELP); empty turns it off")
	fs.StringVar(&o.metricsListen, "metrics-listen", "", "serve Prometheus metrics on http://ADDR/metrics (pool connections in use, idle, waiting; clients)")
	fs.StringVar(&o.addrFile, "addr-file", "", "write the address actually listened on to this file")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&o.procs, "procs", 0, "OS threads that run the proxy's Go code at once (GOMAXPROCS); 0 (default) chooses by the machine: 1 on a machine of 2 CPUs or fewer, "+
		"where one thread costs the least CPU per statement beside the clients and servers it shares the machine with (docs/proxy.md, \"Where the time goes\"), "+
		"else Go's choice, one per CPU; a GOMAXPROCS environment variable is kept")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file at shutdown (go tool pprof)")
	fs.BoolVar(&o.aggregate, "aggregate", false, "shards that are schemas of one database (--shard DSNs differing only in search_path=NAME) share one pool of --pool-size connections, and a transaction over several of them one connection")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	}
	o.shards, o.sharded, o.broadcast = shards, sharded, broadcast
	switch {
	case o.database == "":
		return nil, fmt.Errorf("%w: --database is required (the name clients connect to)", ErrUsage)
	case o.config != "" && (len(o.shards) > 0 || len(o.sharded) > 0 || len(o.broadcast) > 0):
		return nil, fmt.Errorf("%w: --config names the shards and tables itself; do not combine it with --shard, --sharded or --broadcast", ErrUsage)
	case o.config == "" && len(o.shards) == 0:
		return nil, fmt.Errorf("%w: give at least one --shard (or a --config rules file)", ErrUsage)
	case o.poolMode != "transaction" && o.poolMode != "session":
		return nil, fmt.Errorf("%w: --pool-mode must be transaction or session, got %q", ErrUsage, o.poolMode)
	case o.poolSize < 1 || o.poolSize > 10000:
		return nil, fmt.Errorf("%w: --pool-size must be 1..10000, got %d", ErrUsage, o.poolSize)
	case o.coordinatorPoolSize < 1 || o.coordinatorPoolSize > 10000:
		return nil, fmt.Errorf("%w: --coordinator-pool-size must be 1..10000, got %d", ErrUsage, o.coordinatorPoolSize)
	case o.coordinatorMaxMoved < 0:
		return nil, fmt.Errorf("%w: --coordinator-max-moved must be 0 (no bound) or a number of bytes, got %d", ErrUsage, o.coordinatorMaxMoved)
	case !o.coordinate && o.coordinatorDatabase != "":
		return nil, fmt.Errorf("%w: --coordinator-database names the database of --coordinator, which is off", ErrUsage)
	case o.procs < 0 || o.procs > 1024:
		return nil, fmt.Errorf("%w: --procs must be 0 (Go's choice) or 1..1024, got %d", ErrUsage, o.procs)
	case o.maxClients < 1:
		return nil, fmt.Errorf("%w: --max-clients must be at least 1, got %d", ErrUsage, o.maxClients)
	case o.maxTransactions < router.AutoMaxTransactions || (o.maxTransactions > 0 && o.maxTransactions >= o.poolSize):
		return nil, fmt.Errorf("%w: --max-transactions must be -1 (the default: chosen by the pools), 0 (no bound) or below --pool-size (%d; a connection of each pool stays for the deadlock detector and the catalog), got %d", ErrUsage, o.poolSize, o.maxTransactions)
	case o.crossPoolWait <= 0:
		return nil, fmt.Errorf("%w: --cross-pool-wait must be positive, got %v", ErrUsage, o.crossPoolWait)
	case o.settleInterval <= 0:
		return nil, fmt.Errorf("%w: --settle-interval must be positive, got %v", ErrUsage, o.settleInterval)
	case o.checkoutTimeout <= 0 || o.connectTimeout <= 0 || o.shutdownTimeout < 0 || o.lockWaitTimeout < 0 || o.deadlockInterval < 0 || o.statsInterval < 0:
		return nil, fmt.Errorf("%w: --checkout-timeout and --connect-timeout must be positive, --shutdown-timeout, --lock-wait-timeout, --deadlock-interval and --stats-interval not negative", ErrUsage)
	case o.keepIdle < 0 || o.keepInterval <= 0 || o.keepCount < 1 || o.userTimeout < 0 || o.clientUserTimeout < 0 || o.banTime < 0:
		return nil, fmt.Errorf("%w: --tcp-keepalive-interval and --tcp-keepalive-count must be positive, --tcp-keepalive-idle, --tcp-user-timeout, --client-tcp-user-timeout and --ban-time not negative", ErrUsage)
	case o.maxHeld < 1<<20:
		return nil, fmt.Errorf("%w: --max-held-memory must be at least 1048576 bytes (1 MB), got %d", ErrUsage, o.maxHeld)
	case o.maxMessage < 1024:
		return nil, fmt.Errorf("%w: --max-message-size must be at least 1024 bytes, got %d", ErrUsage, o.maxMessage)
	case o.adminDatabase == o.database:
		return nil, fmt.Errorf("%w: --admin-database must differ from --database", ErrUsage)
	case (o.tlsCert == "") != (o.tlsKey == ""):
		return nil, fmt.Errorf("%w: --tls-cert and --tls-key go together", ErrUsage)
	}
	if _, err := logLevel(o.logLevel); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	return o, nil
}

func logLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level must be debug, info, warn or error, got %q", s)
	}
	return l, nil
}

// Rules builds the rules of the command-line flags: data sources ds_0, ds_1 ... in
// --shard order, a pghash-sharded table per --sharded, and the broadcast tables.
func flagRules(o *options) (*rules.Compiled, error) {
	r := rules.Rules{Broadcast: o.broadcast}
	for i, dsn := range o.shards {
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: dsn})
	}
	for _, s := range o.sharded {
		table, column, ok := strings.Cut(s, "=")
		table, column = strings.TrimSpace(table), strings.TrimSpace(column)
		if !ok || table == "" || column == "" {
			return nil, fmt.Errorf("%w: --sharded wants TABLE=COLUMN, got %q", ErrUsage, s)
		}
		r.Tables = append(r.Tables, rules.Table{Name: table, Strategy: rules.Strategy{Column: column}})
	}
	c, err := rules.Compile(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	return c, nil
}

// Run runs the proxy until ctx is cancelled (SIGINT or SIGTERM in the command), then
// shuts it down gracefully.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	level, _ := logLevel(o.logLevel)
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	var rs *rules.Compiled
	if o.config != "" {
		if rs, err = rules.Load(o.config); err != nil {
			return fmt.Errorf("%w: --config: %v", ErrUsage, err)
		}
	} else if rs, err = flagRules(o); err != nil {
		return err
	}
	if o.coordinatorMaxMoved == 0 {
		o.coordinatorMaxMoved = -1 // the flag's 0, no bound, is the Config's negative
	}
	cfg := proxy.Config{
		Rules: rs, Database: o.database, MaxClients: o.maxClients, MaxMessage: o.maxMessage, MaxHeld: o.maxHeld, TwoPhase: o.twoPhase, SettleInterval: o.settleInterval, Aggregate: o.aggregate,
		Coordinate: o.coordinate, CoordinatorDatabase: o.coordinatorDatabase, CoordinatorPoolSize: o.coordinatorPoolSize,
		CoordinatorMaxMoved: o.coordinatorMaxMoved, CoordinatorRelayHost: o.coordinatorRelayHost,
		LockWaitTimeout: o.lockWaitTimeout, DeadlockInterval: deadlockInterval(o.deadlockInterval), CrossPoolWait: o.crossPoolWait, MaxTransactions: o.maxTransactions, StatsInterval: o.statsInterval, AdminDatabase: o.adminDatabase,
		Pool:      backend.Options{Size: o.poolSize, CheckoutTimeout: o.checkoutTimeout, ConnectTimeout: o.connectTimeout, TCP: tcpFlags(o, o.userTimeout), BanTime: offIfZero(o.banTime)},
		ClientTCP: tcpFlags(o, o.clientUserTimeout),
		Logger:    log,
		// A resharding move may have switched the layout: a proxy given the old rules
		// refuses to start, and one between a cutover and its finish reads through
		// the move's views.
		CheckLayout:    true,
		ReshardDrain:   o.reshardDrain,
		ReshardCatchUp: o.reshardCatchUp,
	}
	if o.poolMode == "session" {
		cfg.PoolMode = router.PoolSession
	}
	if o.users != "" {
		if cfg.Users, err = auth.LoadUsers(o.users); err != nil {
			return fmt.Errorf("%w: --users: %v", ErrUsage, err)
		}
	}
	if o.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
		if err != nil {
			return fmt.Errorf("%w: --tls-cert/--tls-key: %v", ErrUsage, err)
		}
		cfg.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if procs := o.procs; procs > 0 || os.Getenv("GOMAXPROCS") == "" {
		if procs == 0 {
			procs = DefaultProcs(runtime.NumCPU())
		}
		if procs > 0 {
			runtime.GOMAXPROCS(procs)
		}
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	for _, ds := range rs.DataSources() {
		log.Info("data source", "name", ds.Name, "dsn", postgresdb.RedactDSN(ds.DSN))
	}
	srv, err := proxy.New(ctx, cfg)
	if err != nil {
		return err
	}
	if o.metricsListen != "" {
		ln, err := net.Listen("tcp", o.metricsListen)
		if err != nil {
			srv.Close()
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", srv.MetricsHandler())
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(ln)
		defer hs.Close()
		log.Info("metrics at http://" + ln.Addr().String() + "/metrics")
	}
	served := make(chan error, 1)
	go func() {
		served <- srv.ListenAndServe(o.listen, func(addr net.Addr) {
			fmt.Fprintf(stdout, "shard-proxy listening on %s (database %q, %d data sources, %s pooling)\n",
				addr, o.database, len(rs.DataSources()), cfg.PoolMode)
			if o.addrFile != "" {
				if err := os.WriteFile(o.addrFile, []byte(addr.String()+"\n"), 0o644); err != nil {
					log.Error("write --addr-file", "err", err)
				}
			}
		})
	}()
	select {
	case err := <-served:
		srv.Close()
		return fmt.Errorf("listen on %s: %w", o.listen, err)
	case <-ctx.Done():
	}
	log.Info("shutting down: waiting for open transactions", "timeout", o.shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("shutdown cut off clients still in a transaction", "err", err)
	}
	<-served
	return nil
}

// deadlockInterval maps the flag's 0 (off) to the router's "never".
func deadlockInterval(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// DefaultProcs is the number of OS threads (GOMAXPROCS) the proxy runs its Go code on
// when --procs is 0, for a machine of numCPU CPUs: 1 on 2 CPUs or fewer, where the
// proxy shares the machine with its clients and servers and one thread measured the
// least CPU per statement (the Go scheduler then stops handing goroutines between
// threads around every socket call); 0, Go's own choice (one per CPU), on larger ones.
func DefaultProcs(numCPU int) int {
	if numCPU <= 2 {
		return 1
	}
	return 0
}

// userTimeoutCaveats is what --help says of both user timeouts.
const userTimeoutCaveats = "A user timeout also ends a connection whose peer keeps its receive window closed (reads nothing) that long while the proxy has data for it (Linux 5.11 and later); " +
	"and with one set, Linux ignores --tcp-keepalive-count: the user timeout decides when unanswered probes end the connection."

// tcpFlags maps the --tcp-* flags, whose 0 means off, to backend.TCP, whose 0 means
// the default, with userTimeout for TCP_USER_TIMEOUT (the server's or the clients').
func tcpFlags(o *options, userTimeout time.Duration) backend.TCP {
	return backend.TCP{KeepAliveIdle: offIfZero(o.keepIdle), KeepAliveInterval: o.keepInterval,
		KeepAliveCount: o.keepCount, UserTimeout: offIfZero(userTimeout)}
}

// offIfZero maps a flag's 0 (off) to the library's negative (off; 0 is its default).
func offIfZero(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
