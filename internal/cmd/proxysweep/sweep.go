package proxysweep

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Config is one sweep.
type Config struct {
	Out      string // the run directory: results.csv, logs/, report
	Work     string // scratch directory for the cluster and pgbouncer (removed after)
	BinDir   string // PostgreSQL server programs
	ProxyBin string // the shard-proxy binary

	// Server is a PostgreSQL server to use ("HOST:PORT", user postgres, trust) instead
	// of one the sweep starts: the lab across hosts puts it on a host of its own. The
	// sweep creates its databases there (refusing if they exist) and drops them after.
	Server string
	// Listen is where the proxy, pgbouncer and the relay listen ("HOST:PORT"; default
	// 127.0.0.1 and a free port); Reach is where the clients reach them (default
	// Listen): the lab across hosts puts a delay line in between.
	Listen, Reach string
	// ClientNetns runs sysbench and pgbench in this network namespace (ip netns exec):
	// the lab's client host.
	ClientNetns string

	Workloads      []string // sysbench workloads
	Threads        []int
	Tables         int
	TableSize      int
	Time           time.Duration // of each client run
	Warmup         time.Duration // sysbench runs this long before the measured time
	Trials         int
	PoolSize       int      // the proxy's --pool-size, and pgbouncer's in transaction mode
	ProxyProcs     int      // the proxy's --procs (0: Go's choice)
	ProxyArgs      []string // more shard-proxy flags, for every proxy target
	Shards         int      // schemas of the sharded database
	PgbenchClients []int
	PgbenchModes   []string
	PgbenchScale   int

	Progress io.Writer
}

// Targets of the sysbench part and of the pgbench part.
const (
	TargetDirect      = "direct"
	TargetBouncerSess = "pgbouncer-session"
	TargetBouncerTx   = "pgbouncer-transaction"
	TargetProxy       = "proxy"
	TargetProxyAgg    = "proxy-aggregate"
	TargetProxyPass   = "proxy-passthrough"
	// TargetRelay is a byte relay (Relay) in front of the direct database: the floor
	// of a Go middleware's cost, for scale.
	TargetRelay         = "go-relay"
	SuiteSysbench       = "sysbench"
	SuitePgbench        = "pgbench"
	sampleEvery         = 100 * time.Millisecond
	directDB, shardedDB = "direct", "sharded"
)

// SysbenchTargets and PgbenchTargets are the targets each part compares.
var (
	SysbenchTargets = []string{TargetDirect, TargetBouncerSess, TargetProxy, TargetProxyAgg}
	PgbenchTargets  = []string{TargetDirect, TargetBouncerTx, TargetProxyPass, TargetRelay}
)

// Row is one client run.
type Row struct {
	Trial    int
	Suite    string
	Workload string // sysbench workload, or "select-only/<mode>" for pgbench
	Threads  int
	Target   string
	Measure
	PeakBackends int
	// Status is "ok", or why the client failed (what it measured before is kept).
	Status string
	// MiddlewareCPU is the CPU time (user and system) the proxy or pgbouncer spent per
	// transaction of the measured part, in microseconds; NaN for direct runs. On a
	// machine the client, the server and the middleware share, it is what the
	// middleware takes from the other two, and far steadier than throughput.
	MiddlewareCPU float64
	// MiddlewareRunQueue is the time the middleware's threads waited for a CPU while
	// runnable, in microseconds per transaction; NaN for direct runs. A middleware
	// whose one thread serves every client is busy for CPU + wait per transaction,
	// which bounds the throughput.
	MiddlewareRunQueue float64
	// MachineIdle is the share of the machine's CPU time left idle during the
	// measured part, in percent: near 0 when throughput is bound by CPU.
	MachineIdle float64
}

// CSVHeader names results.csv's columns.
var CSVHeader = []string{"trial", "suite", "workload", "threads", "target", "tps", "qps", "p95_ms", "p99_ms",
	"errors", "latencies", "duration_s", "peak_backends", "status", "mw_cpu_us_per_tx",
	"mw_runq_us_per_tx", "idle_pct"}

func (r Row) record() []string {
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	return []string{strconv.Itoa(r.Trial), r.Suite, r.Workload, strconv.Itoa(r.Threads), r.Target, f(r.TPS), f(r.QPS),
		f(r.P95), f(r.P99), f(r.Errors), strconv.Itoa(r.Latencies), f(r.DurationS), strconv.Itoa(r.PeakBackends), r.Status, cpuField(r.MiddlewareCPU),
		cpuField(r.MiddlewareRunQueue), cpuField(r.MachineIdle)}
}

type sweep struct {
	cfg     Config
	db      endpoint // the PostgreSQL server, as the clients and the services reach it
	created []string // databases this run created (dropped at the end on a --server)
	runAs   string
	csv     *csv.Writer
	csvFile *os.File
	done    int
	total   int
	start   time.Time
}

// Run runs the sweep. Cancelling ctx stops it between client runs (and the client
// run in progress); what was measured so far stays in results.csv.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	s := &sweep{cfg: cfg, start: time.Now()}
	var err error
	if s.runAs, err = serviceUser(); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(cfg.Out, "logs"), 0o755); err != nil {
		return err
	}
	if s.csvFile, err = os.Create(filepath.Join(cfg.Out, "results.csv")); err != nil {
		return err
	}
	defer s.csvFile.Close()
	s.csv = csv.NewWriter(s.csvFile)
	s.csv.Write(CSVHeader)
	s.csv.Flush()

	maxThreads := 0
	for _, t := range cfg.Threads {
		maxThreads = max(maxThreads, t)
	}
	if cfg.Server != "" {
		if s.db, err = parseEndpoint(cfg.Server); err != nil {
			return fmt.Errorf("server: %w", err)
		}
		s.progress("using the PostgreSQL server at %s", s.db)
		// Direct runs and pgbouncer in session mode hold a server connection per
		// thread, the relay one per pgbench client, the proxy up to its pool per shard.
		need := max(maxThreads, s.cfg.PoolSize*s.cfg.Shards)
		for _, c := range cfg.PgbenchClients {
			need = max(need, c)
		}
		if err := s.checkServer(ctx, need); err != nil {
			return err
		}
	} else {
		maxConns := max(600, 2*maxThreads+100)
		s.progress("starting a PostgreSQL cluster of the sweep's own (max_connections = %d)", maxConns)
		cl, err := startCluster(ctx, cfg.BinDir, filepath.Join(cfg.Work, "pg"), []string{
			"max_connections = " + strconv.Itoa(maxConns), "shared_buffers = 256MB", "synchronous_commit = off",
			"max_prepared_transactions = 0", "log_min_messages = warning", "log_checkpoints = off"})
		if err != nil {
			return err
		}
		defer func() {
			if err := cl.stop(); err != nil {
				fmt.Fprintln(cfg.Progress, err)
			}
		}()
		s.db = endpoint{"127.0.0.1", cl.port}
	}
	err = s.setup(ctx)
	if cfg.Server != "" {
		defer s.dropDatabases()
	}
	if err != nil {
		return err
	}
	s.total = cfg.Trials * (len(cfg.Workloads)*len(cfg.Threads)*len(SysbenchTargets) +
		len(cfg.PgbenchModes)*len(cfg.PgbenchClients)*len(PgbenchTargets))
	for trial := 1; trial <= cfg.Trials; trial++ {
		for wi, w := range cfg.Workloads {
			for ti, th := range cfg.Threads {
				for _, target := range rotate(SysbenchTargets, trial+wi+ti) {
					if err := s.measure(ctx, trial, SuiteSysbench, w, th, target); err != nil {
						return err
					}
				}
			}
		}
		for mi, mode := range cfg.PgbenchModes {
			for ci, c := range cfg.PgbenchClients {
				for _, target := range rotate(PgbenchTargets, trial+mi+ci) {
					if err := s.measure(ctx, trial, SuitePgbench, "select-only/"+mode, c, target); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// rotate starts the list at k: interleaved trials do not always run one target first.
func rotate(xs []string, k int) []string {
	k %= len(xs)
	return append(append([]string{}, xs[k:]...), xs[:k]...)
}

func (s *sweep) progress(format string, args ...any) {
	fmt.Fprintf(s.cfg.Progress, "%s proxy_sweep: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// dsn is the sweep's own connection string for database db.
func (s *sweep) dsn(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&connect_timeout=10", s.db, db)
}

// checkServer refuses a server given with --server that cannot take the sweep: one
// with too few connections for its largest thread count, or with its databases.
func (s *sweep) checkServer(ctx context.Context, need int) error {
	conn, err := pgx.Connect(ctx, s.dsn("postgres"))
	if err != nil {
		return fmt.Errorf("server %s: %w", s.db, err)
	}
	defer conn.Close(ctx)
	var maxConns int
	if err := conn.QueryRow(ctx, "SELECT current_setting('max_connections')::int").Scan(&maxConns); err != nil {
		return err
	}
	// The sweep's own sampler holds one more, and superuser_reserved_connections
	// (3 by default) are not for the sweep's clients.
	if need+5 > maxConns {
		return fmt.Errorf("server %s has max_connections = %d: too few for the sweep's %d server connections at most (the largest of the thread counts, the pgbench client counts, and --pool-size x --shards), and its own", s.db, maxConns, need)
	}
	for _, db := range []string{directDB, shardedDB} {
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", db).Scan(&exists); err != nil {
			return err
		}
		if exists {
			return fmt.Errorf("server %s already has a database %q: the sweep creates its own, and would not drop one it did not create", s.db, db)
		}
	}
	return nil
}

// dropDatabases drops the databases the sweep created on a server given with --server.
func (s *sweep) dropDatabases() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Only those this run created: another may have made one of the same name
	// between the check and the creation.
	for _, db := range s.created {
		if err := s.exec(ctx, "postgres", "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); err != nil {
			s.progress("dropping database %s on %s: %v", db, s.db, err)
		}
	}
}

func (s *sweep) exec(ctx context.Context, db, sql string) error {
	conn, err := pgx.Connect(ctx, s.dsn(db))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// setup creates the databases and loads them: sysbench's tables straight into the
// direct database and through a proxy into the sharded one (schemas s0, s1 ...), and
// pgbench's into the direct database.
func (s *sweep) setup(ctx context.Context) error {
	cfg := s.cfg
	for _, db := range []string{directDB, shardedDB} {
		if err := s.exec(ctx, "postgres", "CREATE DATABASE "+db); err != nil {
			return err
		}
		s.created = append(s.created, db)
	}
	for i := range cfg.Shards {
		if err := s.exec(ctx, shardedDB, fmt.Sprintf("CREATE SCHEMA s%d", i)); err != nil {
			return err
		}
	}
	s.progress("sysbench prepare: %d tables x %d rows, direct", cfg.Tables, cfg.TableSize)
	if _, err := s.client(ctx, "prepare_direct.txt", "sysbench", s.sysbenchArgs("oltp_read_write", s.db, directDB, 2, "prepare")...); err != nil {
		return err
	}
	s.progress("sysbench prepare: %d tables x %d rows, through the proxy over %d schema shards", cfg.Tables, cfg.TableSize, cfg.Shards)
	p, err := withFreshPort(func() (*service, error) { return s.startProxy(ctx, false, "prepare") })
	if err != nil {
		return err
	}
	_, err = s.client(ctx, "prepare_sharded.txt", "sysbench", s.sysbenchArgs("oltp_read_write", p.reach, shardedDB, 2, "prepare")...)
	p.stop()
	if err != nil {
		return err
	}
	s.progress("pgbench -i -s %d, direct", cfg.PgbenchScale)
	if _, err := s.client(ctx, "pgbench_init.txt", "pgbench", "-h", s.db.host, "-p", strconv.Itoa(s.db.port), "-U", "postgres",
		"-i", "-q", "-s", strconv.Itoa(cfg.PgbenchScale), directDB); err != nil {
		return err
	}
	for _, db := range []string{directDB, shardedDB} {
		if err := s.exec(ctx, db, "VACUUM ANALYZE"); err != nil {
			return err
		}
	}
	return nil
}

func (s *sweep) sysbenchArgs(workload string, at endpoint, db string, threads int, command string) []string {
	cfg := s.cfg
	args := []string{workload, "--db-driver=pgsql", "--pgsql-host=" + at.host, "--pgsql-port=" + strconv.Itoa(at.port),
		"--pgsql-user=postgres", "--pgsql-db=" + db, "--tables=" + strconv.Itoa(cfg.Tables),
		"--table-size=" + strconv.Itoa(cfg.TableSize), "--threads=" + strconv.Itoa(threads), "--auto_inc=off",
		"--rand-type=uniform", "--range_selects=off"}
	if command == "run" {
		// sysbench 1.0.20 has no --warmup-time: a report checkpoint at the end of the
		// warm-up resets the counters, and the final report covers the rest.
		w := int(cfg.Warmup.Seconds())
		args = append(args, "--time="+strconv.Itoa(w+int(cfg.Time.Seconds())), "--report-interval=0", "--histogram=on",
			"--forced-shutdown=15")
		if w > 0 {
			args = append(args, "--report-checkpoints="+strconv.Itoa(w))
		}
	}
	return append(args, command)
}

// client runs a client program to the end (on the client host, with ClientNetns),
// its output into logs/name; it returns the output.
func (s *sweep) client(ctx context.Context, name, prog string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, prog, args...)
	if s.cfg.ClientNetns != "" {
		cmd = exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", s.cfg.ClientNetns, prog}, args...)...)
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	path := filepath.Join(s.cfg.Out, "logs", name)
	werr := os.WriteFile(path, append([]byte("$ "+strings.Join(cmd.Args, " ")+"\n"), out.Bytes()...), 0o644)
	if err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %w (output in %s)", prog, strings.Join(args, " "), err, path)
	}
	return out.Bytes(), werr
}

// service is a server the sweep started: a proxy or pgbouncer.
type service struct {
	cmd   *exec.Cmd
	reach endpoint // where the clients reach it
	done  chan struct{}
}

func (v *service) stop() {
	if v == nil || v.cmd.Process == nil {
		return
	}
	syscall.Kill(-v.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-v.done:
	case <-time.After(15 * time.Second):
		syscall.Kill(-v.cmd.Process.Pid, syscall.SIGKILL)
		<-v.done
	}
}

func startService(cmd *exec.Cmd, logPath string) (*service, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	v := &service{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); logf.Close(); close(v.done) }()
	return v, nil
}

// errExitedEarly is a service that exited before it listened: most often because the
// port freePort found free was taken by another process before the service bound it.
var errExitedEarly = errors.New("exited before it listened")

// withFreshPort starts a service again, on another free port, when it exits before it
// listens: twice at most.
func withFreshPort(start func() (*service, error)) (*service, error) {
	for attempt := 1; ; attempt++ {
		v, err := start()
		if err == nil || attempt == 3 || !errors.Is(err, errExitedEarly) {
			return v, err
		}
	}
}

// waitListen waits until something accepts connections at listen; the clients reach
// the service at reach.
func (v *service) waitListen(listen, reach endpoint) error {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-v.done:
			return errExitedEarly
		default:
		}
		if c, err := net.DialTimeout("tcp", listen.String(), time.Second); err == nil {
			c.Close()
			v.reach = reach
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("did not listen within 20s")
}

// startProxy starts shard-proxy over the sharded database's schemas (aggregated or
// not), or with sharding off over the direct database (passthrough).
func (s *sweep) startProxy(_ context.Context, aggregate bool, label string) (*service, error) {
	listen, reach, err := s.serviceAddrs()
	if err != nil {
		return nil, err
	}
	args := []string{"--listen", listen.String(), "--pool-size", strconv.Itoa(s.cfg.PoolSize),
		"--stats-interval", "0", "--log-level", "warn", "--shutdown-timeout", "5s", "--max-clients", "2000",
		"--procs", strconv.Itoa(s.cfg.ProxyProcs)}
	args = append(args, s.cfg.ProxyArgs...)
	if label == TargetProxyPass {
		args = append(args, "--database", directDB, "--shard", s.dsn(directDB))
	} else {
		args = append(args, "--database", shardedDB, "--sharded", "sbtest*=id")
		for i := range s.cfg.Shards {
			args = append(args, "--shard", s.dsn(shardedDB)+"&search_path=s"+strconv.Itoa(i))
		}
		if aggregate {
			args = append(args, "--aggregate")
		}
	}
	v, err := startService(exec.Command(s.cfg.ProxyBin, args...), filepath.Join(s.cfg.Out, "logs", "proxy_"+label+".log"))
	if err != nil {
		return nil, err
	}
	if err := v.waitListen(listen, reach); err != nil {
		v.stop()
		return nil, fmt.Errorf("shard-proxy %s: %w (see logs/proxy_%s.log)", label, err, label)
	}
	return v, nil
}

// startRelay starts this program's byte relay (proxysweep relay) in front of the
// server, with shard-proxy's --procs.
func (s *sweep) startRelay() (*service, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	listen, reach, err := s.serviceAddrs()
	if err != nil {
		return nil, err
	}
	v, err := startService(exec.Command(exe, "relay", "--listen", listen.String(),
		"--to", s.db.String(), "--procs", strconv.Itoa(s.cfg.ProxyProcs)),
		filepath.Join(s.cfg.Out, "logs", "go-relay.log"))
	if err != nil {
		return nil, err
	}
	if err := v.waitListen(listen, reach); err != nil {
		v.stop()
		return nil, fmt.Errorf("go-relay: %w (see logs/go-relay.log)", err)
	}
	return v, nil
}

// startBouncer starts pgbouncer in front of the direct database.
func (s *sweep) startBouncer(mode string, poolSize int) (*service, error) {
	dir := filepath.Join(s.cfg.Work, "pgbouncer")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := chownTo(s.runAs, dir); err != nil {
		return nil, err
	}
	listen, reach, err := s.serviceAddrs()
	if err != nil {
		return nil, err
	}
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%d dbname=%s user=postgres

[pgbouncer]
listen_addr = %s
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 2000
max_db_connections = 0
ignore_startup_parameters = extra_float_digits,options
logfile = %s
log_connections = 0
log_disconnections = 0
`, directDB, s.db.host, s.db.port, directDB, listen.host, listen.port, filepath.Join(dir, "userlist.txt"), mode, poolSize, filepath.Join(dir, "pgbouncer.log"))
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(`"postgres" ""`+"\n"), 0o644); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(path, []byte(ini), 0o644); err != nil {
		return nil, err
	}
	v, err := startService(runAsArgs(s.runAs, "pgbouncer", path), filepath.Join(s.cfg.Out, "logs", "pgbouncer_stdout.log"))
	if err != nil {
		return nil, err
	}
	if err := v.waitListen(listen, reach); err != nil {
		v.stop()
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	return v, nil
}

// sampler counts the server's client backends (other than its own) until stopped,
// keeping the peak.
type sampler struct {
	stopc chan struct{}
	wg    sync.WaitGroup
	peak  int
	err   error
}

func (s *sweep) startSampler(ctx context.Context) (*sampler, error) {
	conn, err := pgx.Connect(ctx, s.dsn("postgres"))
	if err != nil {
		return nil, err
	}
	sm := &sampler{stopc: make(chan struct{})}
	sm.wg.Add(1)
	go func() {
		defer sm.wg.Done()
		defer conn.Close(context.Background())
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			var n int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
				sm.err = err
				return
			}
			sm.peak = max(sm.peak, n)
			select {
			case <-sm.stopc:
				return
			case <-t.C:
			}
		}
	}()
	return sm, nil
}

func (sm *sampler) stop() (int, error) {
	close(sm.stopc)
	sm.wg.Wait()
	return sm.peak, sm.err
}

// measure runs one client run against one target and records it.
func (s *sweep) measure(ctx context.Context, trial int, suite, workload string, threads int, target string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.waitQuiet(ctx); err != nil {
		return err
	}
	var svc *service
	var err error
	at, db := s.db, directDB
	switch target {
	case TargetBouncerSess:
		svc, err = withFreshPort(func() (*service, error) { return s.startBouncer("session", threads) })
	case TargetBouncerTx:
		svc, err = withFreshPort(func() (*service, error) { return s.startBouncer("transaction", s.cfg.PoolSize) })
	case TargetProxy, TargetProxyAgg:
		svc, err = withFreshPort(func() (*service, error) { return s.startProxy(ctx, target == TargetProxyAgg, target) })
		db = shardedDB
	case TargetProxyPass:
		svc, err = withFreshPort(func() (*service, error) { return s.startProxy(ctx, false, target) })
	case TargetRelay:
		svc, err = withFreshPort(s.startRelay)
	}
	if err != nil {
		return err
	}
	defer svc.stop()
	if svc != nil {
		at = svc.reach
	}
	sm, err := s.startSampler(ctx)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("t%d_%s_%d_%s", trial, strings.ReplaceAll(workload, "/", "-"), threads, target)
	// A client that hangs (a thread that died holding a transaction others wait for)
	// is stopped, and the run recorded as failed.
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Warmup+s.cfg.Time+time.Minute)
	defer cancel()
	var m Measure
	var out []byte
	cpu := svc.cpuMeter()
	if suite == SuiteSysbench {
		cpu.startAfter(s.cfg.Warmup) // sysbench's warm-up is not measured
		out, err = s.client(rctx, name+".txt", "sysbench", s.sysbenchArgs(workload, at, db, threads, "run")...)
		m, _ = ParseSysbench(bytes.NewReader(out))
	} else {
		cpu.startAfter(0)
		m, err = s.pgbench(rctx, name, at, db, threads, strings.TrimPrefix(workload, "select-only/"))
	}
	txs := m.TPS * m.DurationS // pgbench: DurationS is the measured time
	if suite == SuiteSysbench {
		txs = m.Transactions // its DurationS includes the warm-up, its last report does not
	}
	use := cpu.read(txs)
	mwCPU := use.cpuPerTx
	peak, serr := sm.stop()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	status := "ok"
	if err != nil {
		status = failure(out, err)
		s.progress("%s failed: %s", name, status)
	}
	if serr != nil {
		return fmt.Errorf("sampling pg_stat_activity: %w", serr)
	}
	row := Row{Trial: trial, Suite: suite, Workload: workload, Threads: threads, Target: target, Measure: m, PeakBackends: peak, Status: status,
		MiddlewareCPU: mwCPU, MiddlewareRunQueue: use.runqPerTx, MachineIdle: use.idlePct}
	s.csv.Write(row.record())
	s.csv.Flush()
	if err := s.csv.Error(); err != nil {
		return err
	}
	s.done++
	elapsed := time.Since(s.start)
	left := time.Duration(float64(elapsed) / float64(s.done) * float64(s.total-s.done))
	cpuNote := ""
	if !math.IsNaN(mwCPU) {
		cpuNote = fmt.Sprintf(", %s %.1f µs CPU", target, mwCPU)
		if !math.IsNaN(use.runqPerTx) {
			cpuNote += fmt.Sprintf(" + %.1f µs waiting for a CPU", use.runqPerTx)
		}
		cpuNote += " per transaction"
	}
	if !math.IsNaN(use.idlePct) {
		cpuNote += fmt.Sprintf(", machine %.0f%% idle", use.idlePct)
	}
	s.progress("[%d/%d] trial %d %s %s %d %s: %.0f tps %.0f qps, p99 %.2f ms, peak %d backends%s (elapsed %s, about %s left)",
		s.done, s.total, trial, suite, workload, threads, target, m.TPS, m.QPS, m.P99, peak, cpuNote,
		elapsed.Round(time.Second), left.Round(time.Second))
	return nil
}

// pgbench runs pgbench -S in the given protocol mode, with per-transaction logs for the
// latency percentiles.
func (s *sweep) pgbench(ctx context.Context, name string, at endpoint, db string, clients int, mode string) (Measure, error) {
	logDir, err := os.MkdirTemp(s.cfg.Work, "pgbench-log")
	if err != nil {
		return Measure{}, err
	}
	defer os.RemoveAll(logDir)
	jobs := 1
	if clients%2 == 0 {
		jobs = 2
	}
	out, err := s.client(ctx, name+".txt", "pgbench", "-h", at.host, "-p", strconv.Itoa(at.port), "-U", "postgres",
		"-n", "-S", "-M", mode, "-c", strconv.Itoa(clients), "-j", strconv.Itoa(jobs),
		"-T", strconv.Itoa(int(s.cfg.Time.Seconds())), "-l", "--log-prefix", filepath.Join(logDir, "tx"), db)
	if err != nil {
		return Measure{}, err
	}
	files, err := filepath.Glob(filepath.Join(logDir, "tx*"))
	if err != nil {
		return Measure{}, err
	}
	var logs []io.Reader
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return Measure{}, err
		}
		logs = append(logs, bytes.NewReader(b))
	}
	m, err := ParsePgbench(bytes.NewReader(out), logs...)
	m.DurationS = s.cfg.Time.Seconds()
	return m, err
}

// waitQuiet waits (a few seconds at most) until the previous run's server connections
// are gone, so that they do not count in the next run's peak.
func (s *sweep) waitQuiet(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.dsn("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for range 100 {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// failure says in a line why a client run failed: its first FATAL line, or how it
// ended.
func failure(out []byte, err error) string {
	msg := "failed"
	if u := errors.Unwrap(err); u != nil {
		msg = u.Error() // exit status 1, signal: killed
	}
	if errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "signal: killed") {
		msg = "timed out (killed)"
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "FATAL: ") {
			msg += ": " + strings.TrimPrefix(line, "FATAL: ")
			break
		}
	}
	msg = strings.NewReplacer("\n", " ", ",", ";").Replace(msg)
	if len(msg) > 240 {
		msg = msg[:240]
	}
	return msg
}
