package proxysweep

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DefaultBinDir holds initdb, pg_ctl and postgres.
const DefaultBinDir = "/usr/lib/postgresql/15/bin"

// cluster is the sweep's own PostgreSQL server: its own data directory and port, so
// that the sweep's hundreds of connections never reach a shared server.
type cluster struct {
	binDir, dir string
	port        int
	runAs       string // OS user for the server programs ("" the current one)
}

// runAsArgs prefixes a command to run as user u, or returns it as is.
func runAsArgs(u string, name string, args ...string) *exec.Cmd {
	if u == "" {
		return exec.Command(name, args...)
	}
	return exec.Command("runuser", append([]string{"-u", u, "--", name}, args...)...)
}

// serviceUser is the OS user server programs (postgres, pgbouncer) run as: they
// refuse root.
func serviceUser() (string, error) {
	if os.Geteuid() != 0 {
		return "", nil
	}
	if _, err := user.Lookup("postgres"); err != nil {
		return "", fmt.Errorf("running as root needs a \"postgres\" OS user to run the servers: %w", err)
	}
	return "postgres", nil
}

// chownTo gives dir to the service user, when there is one.
func chownTo(u, dir string) error {
	if u == "" {
		return nil
	}
	usr, err := user.Lookup(u)
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(usr.Uid)
	gid, _ := strconv.Atoi(usr.Gid)
	return os.Chown(dir, uid, gid)
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startCluster initialises and starts a server in dir with the given settings.
func startCluster(ctx context.Context, binDir, dir string, settings []string) (*cluster, error) {
	runAs, err := serviceUser()
	if err != nil {
		return nil, err
	}
	c := &cluster{binDir: binDir, dir: dir, runAs: runAs}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := chownTo(runAs, dir); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if out, err := runAsArgs(runAs, filepath.Join(binDir, "initdb"), "-D", data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	if c.port, err = freePort(); err != nil {
		return nil, err
	}
	conf := append([]string{"listen_addresses = '127.0.0.1'", "port = " + strconv.Itoa(c.port), "unix_socket_directories = ''"}, settings...)
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	_, err = f.WriteString("\n" + strings.Join(conf, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if out, err := runAsArgs(runAs, filepath.Join(binDir, "pg_ctl"), "-D", data, "-l", filepath.Join(dir, "postgres.log"),
		"-w", "-t", "60", "start").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pg_ctl start: %v\n%s", err, out)
	}
	return c, nil
}

// stop stops the server fast.
func (c *cluster) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := runAsArgs(c.runAs, filepath.Join(c.binDir, "pg_ctl"), "-D", filepath.Join(c.dir, "data"), "-m", "fast", "-w", "stop")
	out, err := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	return nil
}

// endpoint is a TCP address: a server, or where a service listens or is reached.
type endpoint struct {
	host string
	port int
}

func (e endpoint) String() string { return net.JoinHostPort(e.host, strconv.Itoa(e.port)) }

// parseEndpoint reads "HOST:PORT" with a numeric port.
func parseEndpoint(s string) (endpoint, error) {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return endpoint{}, fmt.Errorf("want HOST:PORT, got %q", s)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 || host == "" {
		return endpoint{}, fmt.Errorf("want HOST:PORT with a port from 1 to 65535, got %q", s)
	}
	return endpoint{host, port}, nil
}

// CheckAddr reports whether s is HOST:PORT with a numeric port, as --server,
// --listen and --reach take it.
func CheckAddr(s string) error {
	_, err := parseEndpoint(s)
	return err
}

// serviceAddrs is where the next service listens and where the clients reach it:
// Config.Listen and Config.Reach, or a free loopback port for both.
func (s *sweep) serviceAddrs() (listen, reach endpoint, err error) {
	if s.cfg.Listen == "" {
		port, err := freePort()
		if err != nil {
			return endpoint{}, endpoint{}, err
		}
		e := endpoint{"127.0.0.1", port}
		return e, e, nil
	}
	if listen, err = parseEndpoint(s.cfg.Listen); err != nil {
		return endpoint{}, endpoint{}, fmt.Errorf("listen: %w", err)
	}
	reach = listen
	if s.cfg.Reach != "" {
		if reach, err = parseEndpoint(s.cfg.Reach); err != nil {
			return endpoint{}, endpoint{}, fmt.Errorf("reach: %w", err)
		}
	}
	return listen, reach, nil
}
