package counterbench

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/shardlab/shardlab/counters"
	"github.com/shardlab/shardlab/internal/postgresdb"
	"github.com/shardlab/shardlab/internal/sqlitedb"
)

// target is a database the benchmark owns; every open returns a counter on
// fresh tables, so that no run inherits another run's rows.
type target interface {
	open(ctx context.Context, o counters.Options) (counters.Counter, error)
	version(ctx context.Context) string
	close(ctx context.Context) error
}

func openTarget(ctx context.Context, cfg Config, stderr io.Writer) (target, error) {
	if cfg.Backend == "sqlite" {
		return openSQLiteTarget(cfg)
	}
	return openPGTarget(ctx, cfg, stderr)
}

type pgTarget struct {
	adminDSN, name string // the server the database was made on, and its name
	pool           *pgxpool.Pool
	runs           int
}

func openPGTarget(ctx context.Context, cfg Config, stderr io.Writer) (*pgTarget, error) {
	var r [6]byte
	rand.Read(r[:])
	name := "shardlab_counterbench_" + hex.EncodeToString(r[:])
	dsn, err := postgresdb.CreateDatabase(ctx, cfg.DSN, name)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "counterbench: created database %s\n", name)
	t := &pgTarget{adminDSN: cfg.DSN, name: name}
	pcfg, err := postgresdb.PoolConfig(dsn, postgresdb.Options{PoolSize: int32(cfg.Pool)})
	if err != nil {
		return nil, t.failed(ctx, err)
	}
	// Keep every connection open, so that no run pays for connecting.
	pcfg.MinConns = int32(cfg.Pool)
	if t.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return nil, t.failed(ctx, err)
	}
	// Open every connection now, so that no run pays for connecting.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(cfg.Pool)
	conns := make([]*pgxpool.Conn, cfg.Pool)
	for i := range conns {
		g.Go(func() (err error) {
			conns[i], err = t.pool.Acquire(gctx)
			return err
		})
	}
	err = g.Wait()
	for _, c := range conns {
		if c != nil {
			c.Release()
		}
	}
	if err != nil {
		return nil, t.failed(ctx, fmt.Errorf("open %d connections: %w", cfg.Pool, err))
	}
	return t, nil
}

func (t *pgTarget) failed(ctx context.Context, err error) error {
	if cerr := t.close(context.WithoutCancel(ctx)); cerr != nil {
		return fmt.Errorf("%w (and %v)", err, cerr)
	}
	return err
}

func (t *pgTarget) open(ctx context.Context, o counters.Options) (counters.Counter, error) {
	t.runs++
	o.TablePrefix = fmt.Sprintf("r%d_", t.runs)
	return counters.NewPostgres(ctx, t.pool, o)
}

func (t *pgTarget) version(ctx context.Context) string {
	var v string
	if err := t.pool.QueryRow(ctx, "SELECT version()").Scan(&v); err != nil {
		return "unknown: " + err.Error()
	}
	return v
}

func (t *pgTarget) close(ctx context.Context) error {
	if t.pool != nil {
		t.pool.Close()
	}
	return postgresdb.DropDatabase(ctx, t.adminDSN, t.name)
}

type sqliteTarget struct {
	dir     string // removed by close
	readers int
	runs    int
}

func openSQLiteTarget(cfg Config) (*sqliteTarget, error) {
	// An empty cfg.SQLiteDir makes MkdirTemp use the system's temp dir.
	dir, err := os.MkdirTemp(cfg.SQLiteDir, "counterbench-")
	if err != nil {
		return nil, err
	}
	return &sqliteTarget{dir: dir, readers: cfg.Pool}, nil
}

func (t *sqliteTarget) open(ctx context.Context, o counters.Options) (counters.Counter, error) {
	t.runs++
	path := filepath.Join(t.dir, fmt.Sprintf("run%d.db", t.runs))
	// Full sync, as writeMeta reports: every measured increment waits for the disk.
	return counters.OpenSQLite(ctx, path, o, counters.SQLiteOptions{Sync: sqlitedb.SyncFull, ReadConns: t.readers})
}

func (t *sqliteTarget) version(ctx context.Context) string {
	db, err := sql.Open(sqlitedb.DriverName, ":memory:")
	if err != nil {
		return "unknown: " + err.Error()
	}
	defer db.Close()
	var v string
	if err := db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&v); err != nil {
		return "unknown: " + err.Error()
	}
	return "SQLite " + v + " (mattn/go-sqlite3), WAL, synchronous=FULL"
}

func (t *sqliteTarget) close(context.Context) error { return os.RemoveAll(t.dir) }

// writeMeta records what the numbers were measured on, next to them.
func writeMeta(ctx context.Context, cfg Config, tg target, args []string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "date: %s\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "command: counterbench %s\n", strings.Join(args, " "))
	fmt.Fprintf(&b, "backend: %s\n", tg.version(ctx))
	fmt.Fprintf(&b, "cpus: %d (%s)\n", runtime.NumCPU(), cpuModel())
	fmt.Fprintf(&b, "go: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		// Other work on the machine is the main source of noise; say how much.
		fmt.Fprintf(&b, "loadavg at start: %s", la)
	}
	fmt.Fprintf(&b, "workers: %d, pool: %d, ops: %d, duration: %s, warmup: %s, trials: %d\n",
		cfg.Workers, cfg.Pool, cfg.Ops, cfg.Duration, cfg.Warmup, cfg.Trials)
	return os.WriteFile(filepath.Join(cfg.Out, "meta_"+cfg.Backend+".txt"), []byte(b.String()), 0o644)
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}
