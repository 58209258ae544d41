package postgresdb_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/internal/postgresdb"
)

func TestPoolConfigAppliesOptions(t *testing.T) {
	const dsn = "postgres://u@127.0.0.1:1/db?sslmode=disable&pool_max_conns=50&connect_timeout=7" // never dialled
	tests := []struct {
		name        string
		dsn         string
		opts        postgresdb.Options
		maxConns    int32
		dialTimeout time.Duration
	}{
		{"defaults; the DSN's connect_timeout", dsn, postgresdb.Options{}, postgresdb.DefaultPoolSize, 7 * time.Second},
		{"options win over the DSN", dsn, postgresdb.Options{PoolSize: 3, ConnectTimeout: 2 * time.Second}, 3, 2 * time.Second},
		{"no connect_timeout anywhere", "postgres://u@127.0.0.1:1/db", postgresdb.Options{PoolSize: 1}, 1, postgresdb.DefaultConnectTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := postgresdb.PoolConfig(tt.dsn, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.MaxConns != tt.maxConns || cfg.MinConns != 0 || cfg.ConnConfig.ConnectTimeout != tt.dialTimeout {
				t.Errorf("MaxConns %d MinConns %d ConnectTimeout %v; want %d, 0, %v",
					cfg.MaxConns, cfg.MinConns, cfg.ConnConfig.ConnectTimeout, tt.maxConns, tt.dialTimeout)
			}
		})
	}
	if _, err := postgresdb.PoolConfig(dsn, postgresdb.Options{PoolSize: -1}); !errors.Is(err, postgresdb.ErrBadOptions) {
		t.Errorf("negative pool size: %v, want ErrBadOptions", err)
	}
	if _, err := postgresdb.PoolConfig("postgres://u:secret@h:notaport/db", postgresdb.Options{}); !errors.Is(err, postgresdb.ErrBadDSN) || strings.Contains(err.Error(), "secret") {
		t.Errorf("bad DSN: %v, want ErrBadDSN without the password", err)
	}
	o, err := postgresdb.Options{}.WithDefaults()
	if err != nil || o.PoolSize != postgresdb.DefaultPoolSize || o.QueryTimeout != postgresdb.DefaultQueryTimeout {
		t.Errorf("WithDefaults = %+v, %v", o, err)
	}
}

// TestNewPool opens real pools: the size asked for is the size the pool keeps to, and a
// server that is not there is named, password redacted, unless the pool is lazy.
func TestNewPool(t *testing.T) {
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t, "newpool")
	pool, err := postgresdb.NewPool(ctx, dsn, postgresdb.Options{PoolSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if got := pool.Stat().MaxConns(); got != 2 {
		t.Errorf("MaxConns %d, want 2", got)
	}
	// Three concurrent acquisitions: two get a connection, the third must wait.
	c1, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if c3, err := pool.Acquire(waitCtx); err == nil {
		c3.Release()
		t.Error("a third connection was handed out from a pool of 2")
	}
	c1.Release()
	c2.Release()

	dead := closedPortDSN(t)
	if _, err := postgresdb.NewPool(ctx, dead, postgresdb.Options{}); err == nil || !strings.Contains(err.Error(), "postgres:xxxxx@127.0.0.1") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("NewPool on a closed port = %v, want an error naming the redacted DSN", err)
	}
	lazy, err := postgresdb.NewPool(ctx, dead, postgresdb.Options{Lazy: true})
	if err != nil {
		t.Fatalf("lazy NewPool on a closed port: %v", err)
	}
	lazy.Close()
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// closedPortDSN is a DSN, with a password, of a loopback port nothing listens on.
func closedPortDSN(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return fmt.Sprintf("postgres://postgres:s3cret@127.0.0.1:%d/db?sslmode=disable", port)
}
