package proxysweep_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/cmd/proxysweep"
	"github.com/shardlab/shardlab/internal/pgtest"
)

// TestRelay: a client reaches PostgreSQL through the relay, in both directions beyond
// the relay's buffer, and the relay stops, closing its connections, when its context
// ends.
func TestRelay(t *testing.T) {
	dsn := pgtest.DSN(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	upstream := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	go func() { done <- proxysweep.Relay(ctx, ln, upstream) }()

	rcfg := cfg.Copy()
	rcfg.Host, rcfg.Port = "127.0.0.1", uint16(ln.Addr().(*net.TCPAddr).Port)
	conn, err := pgx.ConnectConfig(context.Background(), rcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	big := make([]byte, 100<<10)
	for i := range big {
		big[i] = 'a' + byte(i%26)
	}
	var n int
	var echoed string
	if err := conn.QueryRow(context.Background(), "SELECT count(*), $1::text FROM generate_series(1, 50000)", string(big)).Scan(&n, &echoed); err != nil {
		t.Fatal(err)
	}
	if n != 50000 || echoed != string(big) {
		t.Fatalf("through the relay: count %d, echo of %d bytes intact %v", n, len(echoed), echoed == string(big))
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Relay returned %v after its context ended, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Relay still runs 10s after its context ended")
	}
	if err := conn.Ping(context.Background()); err == nil {
		t.Error("the client's connection still works after the relay stopped")
	}
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Error("the relay still accepts connections after it stopped")
	}
}
