// Package pgtest gives shardlab's tests real PostgreSQL databases: a fresh database on
// the server named by $SHARDLAB_PG_DSN, or a whole throwaway server (a "cluster" in
// PostgreSQL's words) that a test can stop and start to play a shard going down.
//
// Tests skip, saying why, when PostgreSQL is not available; CI sets
// SHARDLAB_REQUIRE_PG=1 so that the same condition fails the test instead of silently
// skipping it.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/postgresdb"
)

// Environment variables read by this package.
const (
	// EnvDSN names the PostgreSQL server tests use, as a URL such as
	// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable. Its user must be
	// allowed to create databases.
	EnvDSN = "SHARDLAB_PG_DSN"
	// EnvBinDir overrides the directory holding initdb and pg_ctl (DefaultBinDir).
	EnvBinDir = "SHARDLAB_PG_BINDIR"
	// EnvRequire, when set to 1, turns every skip of this package into a failure.
	EnvRequire = "SHARDLAB_REQUIRE_PG"
)

// DefaultBinDir is where Debian's postgresql-15 package installs the server programs.
const DefaultBinDir = "/usr/lib/postgresql/15/bin"

// setupTimeout bounds creating or dropping a database.
const setupTimeout = 30 * time.Second

func skip(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(EnvRequire) == "1" {
		t.Fatalf("%s (%s=1 forbids skipping)", msg, EnvRequire)
	}
	t.Skip(msg)
}

// DSN returns $SHARDLAB_PG_DSN, skipping the test when it is unset.
func DSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(EnvDSN)
	if dsn == "" {
		skip(t, "%s is not set: set it to a PostgreSQL server URL whose user may create databases, "+
			"e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable, to run this test", EnvDSN)
	}
	return dsn
}

var unsafeChars = regexp.MustCompile(`[^a-z0-9_]+`)

// UniqueName returns prefix, lower-cased and reduced to [a-z0-9_], followed by "_" and
// 12 random hex digits: a database name no other test will pick.
func UniqueName(prefix string) string {
	p := unsafeChars.ReplaceAllString(strings.ToLower(prefix), "_")
	if p == "" || (p[0] >= '0' && p[0] <= '9') {
		p = "t" + p
	}
	if len(p) > 40 {
		p = p[:40]
	}
	var b [6]byte
	rand.Read(b[:])
	return p + "_" + hex.EncodeToString(b[:])
}

// NewDatabase creates a uniquely named database (see UniqueName) on the server named
// by $SHARDLAB_PG_DSN and returns its DSN. The database is dropped, with any sessions
// still connected to it, when the test ends. It skips like DSN.
func NewDatabase(t testing.TB, prefix string) string {
	t.Helper()
	return NewDatabaseOn(t, DSN(t), prefix)
}

// NewDatabaseOn is NewDatabase on the server baseDSN points at. For a Cluster, use
// Cluster.NewDatabase: the drop at the end would fail if the test left it stopped.
func NewDatabaseOn(t testing.TB, baseDSN, prefix string) string {
	t.Helper()
	name := UniqueName(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	dsn, err := postgresdb.CreateDatabase(ctx, baseDSN, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		if err := postgresdb.DropDatabase(ctx, baseDSN, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return dsn
}

// Cluster is a throwaway PostgreSQL server owned by one test: its own data directory
// in t.TempDir(), listening on a free loopback port, with trust authentication and
// fsync off (it is for tests, not for keeping data through a power cut).
// Its methods must be called from the test's goroutine, since they fail the test.
type Cluster struct {
	t        testing.TB
	binDir   string
	dir      string // t.TempDir(): data/, postgres.log
	port     int
	running  bool
	frozen   []int  // processes stopped by Freeze
	runAs    string // OS user the server programs run as; "" is the current one
	settings []string
}

// StartCluster creates and starts a PostgreSQL server for the test and stops it when
// the test ends. It needs initdb and pg_ctl (DefaultBinDir, or $SHARDLAB_PG_BINDIR) and
// skips when they are missing. Run as root, it runs them as the "postgres" OS user,
// which PostgreSQL insists on. It takes a second or two.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	return StartClusterWith(t)
}

// StartClusterWith is StartCluster with extra postgresql.conf settings, such as
// "max_prepared_transactions = 20" for two-phase commit (the default cluster, like a
// default installation, has 0).
func StartClusterWith(t testing.TB, settings ...string) *Cluster {
	t.Helper()
	binDir := os.Getenv(EnvBinDir)
	if binDir == "" {
		binDir = DefaultBinDir
	}
	for _, prog := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(binDir, prog)); err != nil {
			skip(t, "pgtest: PostgreSQL server programs not found (%v); install postgresql-15 or set %s", err, EnvBinDir)
		}
	}
	c := &Cluster{t: t, binDir: binDir, dir: t.TempDir(), settings: settings}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			skip(t, "pgtest: running as root needs a \"postgres\" OS user to run the server: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(c.dir, uid, gid); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		// t.TempDir's parent is private to the test process's user; the server only
		// needs to pass through it.
		if err := os.Chmod(filepath.Dir(c.dir), 0o711); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		c.runAs = "postgres"
	}
	if out, err := c.run("initdb", "-D", c.dataDir(), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	t.Cleanup(c.cleanup)
	for attempt := 1; ; attempt++ {
		c.port = freePort(t)
		err := c.writeConfig()
		if err == nil {
			err = c.start()
		}
		if err == nil {
			break
		}
		// Another process may have taken the port between freePort and the bind.
		if attempt < 3 && strings.Contains(c.logTail(), "could not bind") {
			continue
		}
		t.Fatalf("pgtest: start cluster: %v\n%s", err, c.logTail())
	}
	return c
}

// NewDatabase creates a uniquely named database (see UniqueName) in the cluster and
// returns its DSN. It is not dropped: the whole cluster goes when the test ends, even
// if the test left it stopped.
func (c *Cluster) NewDatabase(prefix string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	dsn, err := postgresdb.CreateDatabase(ctx, c.DSN(), UniqueName(prefix))
	if err != nil {
		c.t.Fatalf("pgtest: %v", err)
	}
	return dsn
}

// DSN returns the URL of the cluster's "postgres" database.
func (c *Cluster) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Port returns the loopback TCP port the cluster listens on.
func (c *Cluster) Port() int { return c.port }

// Stop shuts the server down cleanly (pg_ctl stop -m fast): sessions are disconnected
// and new connections are refused until Start. Stopping a stopped cluster does nothing.
func (c *Cluster) Stop() {
	c.t.Helper()
	c.stop("fast")
}

// Kill stops the server the way a crash would (pg_ctl stop -m immediate): no
// checkpoint, so Start goes through WAL recovery.
func (c *Cluster) Kill() {
	c.t.Helper()
	c.stop("immediate")
}

// Start starts a stopped server on the same port and data directory, returning when
// it accepts connections. Starting a running cluster does nothing.
func (c *Cluster) Start() {
	c.t.Helper()
	if c.running {
		return
	}
	if err := c.start(); err != nil {
		c.t.Fatalf("pgtest: start cluster: %v\n%s", err, c.logTail())
	}
}

// Freeze stops every process of the server with SIGSTOP, playing a host that hangs or
// a network that drops packets: connections stay open and new ones are accepted by the
// kernel, but nothing answers until Thaw. It works on Linux only.
func (c *Cluster) Freeze() {
	c.t.Helper()
	if !c.running || c.frozen != nil {
		return
	}
	raw, err := os.ReadFile(filepath.Join(c.dataDir(), "postmaster.pid"))
	if err != nil {
		c.t.Fatalf("pgtest: freeze: %v", err)
	}
	first, _, _ := strings.Cut(string(raw), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		c.t.Fatalf("pgtest: freeze: postmaster.pid: %v", err)
	}
	// The postmaster first, so that it forks no new backend while we look.
	pids := []int{postmaster}
	if err := syscall.Kill(postmaster, syscall.SIGSTOP); err != nil {
		c.t.Fatalf("pgtest: freeze: %v", err)
	}
	c.frozen = pids
	children, err := childProcesses(postmaster)
	if err != nil {
		c.t.Fatalf("pgtest: freeze: %v", err)
	}
	for _, pid := range children {
		if syscall.Kill(pid, syscall.SIGSTOP) == nil {
			c.frozen = append(c.frozen, pid)
		}
	}
}

// Thaw resumes the processes Freeze stopped.
func (c *Cluster) Thaw() {
	c.t.Helper()
	if err := c.thaw(); err != nil {
		c.t.Fatalf("pgtest: thaw: %v", err)
	}
}

func (c *Cluster) thaw() error {
	var first error
	// Children first, so the postmaster finds them running.
	for i := len(c.frozen) - 1; i >= 0; i-- {
		if err := syscall.Kill(c.frozen[i], syscall.SIGCONT); err != nil && first == nil && err != syscall.ESRCH {
			first = err
		}
	}
	c.frozen = nil
	return first
}

// childProcesses lists the processes whose parent is pid, from /proc.
func childProcesses(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat[i+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out, nil
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }
func (c *Cluster) logFile() string { return filepath.Join(c.dir, "postgres.log") }

func (c *Cluster) writeConfig() error {
	conf := fmt.Sprintf(`
# pgtest
port = %d
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
max_connections = 50
shared_buffers = 16MB
fsync = off
full_page_writes = off
%s
`, c.port, strings.Join(c.settings, "\n"))
	f, err := os.OpenFile(filepath.Join(c.dataDir(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(conf); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (c *Cluster) start() error {
	out, err := c.run("pg_ctl", "-D", c.dataDir(), "-l", c.logFile(), "-w", "-t", "60", "start")
	if err != nil {
		return fmt.Errorf("pg_ctl start: %v: %s", err, out)
	}
	c.running = true
	return nil
}

func (c *Cluster) stop(mode string) {
	if !c.running {
		return
	}
	if err := c.thaw(); err != nil {
		c.t.Fatalf("pgtest: thaw before stop: %v", err)
	}
	if out, err := c.run("pg_ctl", "-D", c.dataDir(), "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		c.t.Fatalf("pgtest: pg_ctl stop -m %s: %v\n%s\n%s", mode, err, out, c.logTail())
	}
	c.running = false
}

func (c *Cluster) cleanup() {
	if err := c.thaw(); err != nil {
		c.t.Errorf("pgtest: thaw cluster at end of test: %v", err)
	}
	if !c.running {
		return
	}
	if out, err := c.run("pg_ctl", "-D", c.dataDir(), "-m", "immediate", "-w", "-t", "60", "stop"); err != nil {
		c.t.Errorf("pgtest: stop cluster at end of test: %v\n%s", err, out)
	}
	c.running = false
}

// run runs one of the server programs as c.runAs, from the cluster's directory (which
// that user can read, unlike the test's working directory).
func (c *Cluster) run(prog string, args ...string) ([]byte, error) {
	path := filepath.Join(c.binDir, prog)
	var cmd *exec.Cmd
	if c.runAs != "" {
		cmd = exec.Command("runuser", append([]string{"-u", c.runAs, "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = c.dir
	// pg_ctl start leaves the server running with its output sent to the log file;
	// should anything keep our pipe open, do not wait for it forever.
	cmd.WaitDelay = 10 * time.Second
	return cmd.CombinedOutput()
}

// logTail returns the end of the server's log, for failure messages.
func (c *Cluster) logTail() string {
	b, err := os.ReadFile(c.logFile())
	if err != nil {
		return ""
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// NewDatabaseWithOptions is NewDatabase with CREATE DATABASE options, such as
// "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'" for a database whose
// default collation is ICU's (where text does not sort by its bytes).
func NewDatabaseWithOptions(t testing.TB, prefix, options string) string {
	t.Helper()
	base := DSN(t)
	name := UniqueName(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name+" "+options); err != nil {
		t.Fatalf("pgtest: create database %s %s: %v", name, options, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		if err := postgresdb.DropDatabase(ctx, base, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	dsn, err := postgresdb.WithDatabase(base, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return dsn
}

// NewRole creates a uniquely named role (see UniqueName) on the server named by
// $SHARDLAB_PG_DSN, with CREATE ROLE options such as "LOGIN PASSWORD 'x'", and returns
// its name. Roles belong to the whole server: the role is dropped when the test ends.
// Create it before the databases it will own objects in, so that they are dropped
// first. It skips like DSN.
func NewRole(t testing.TB, prefix, options string) string {
	t.Helper()
	base := DSN(t)
	name := UniqueName(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE ROLE "+name+" "+options); err != nil {
		t.Fatalf("pgtest: create role %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("pgtest: drop role %s: %v", name, err)
			return
		}
		defer conn.Close(context.Background())
		// Sessions still logged in as the role (a proxy's pool closing) hold it.
		conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", name)
		for attempt := 0; ; attempt++ {
			_, err := conn.Exec(ctx, "DROP ROLE IF EXISTS "+name)
			if err == nil || attempt == 20 {
				if err != nil {
					t.Errorf("pgtest: drop role %s: %v", name, err)
				}
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return name
}
