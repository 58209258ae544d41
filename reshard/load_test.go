package reshard_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// withAccountsOn makes the accounts table on the first two data sources, rows accounts
// of 100 placed as pghash over two places them.
func withAccountsOn(t *testing.T, dsns []string, rows int) {
	t.Helper()
	for i, d := range dsns[:2] {
		exec(t, d, "CREATE TABLE accounts (id bigint PRIMARY KEY, bal bigint NOT NULL)",
			fmt.Sprintf(`INSERT INTO accounts SELECT g, 100 FROM generate_series(1, %d) g
				WHERE satisfies_hash_partition('hash_oracle'::regclass, 2, %d, g::bigint)`, rows, i))
	}
}

// clients are the clients of a proxy at addr during a test: goroutines that write and
// read through it until halt, counting what they did and the failures they met.
type clients struct {
	t        *testing.T
	ctx      context.Context
	addr     string
	stop     atomic.Bool
	wg       sync.WaitGroup
	txs      atomic.Int64 // transfers
	reads    atomic.Int64 // counts of the reader
	mu       sync.Mutex
	failures []string
}

func newClients(t *testing.T, addr string) *clients {
	return &clients{t: t, ctx: context.Background(), addr: addr}
}

func (c *clients) url(db string) string {
	return "postgres://postgres@" + c.addr + "/" + db + "?sslmode=disable"
}

func (c *clients) fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.failures) < 10 {
		c.failures = append(c.failures, fmt.Sprintf(format, args...))
	}
}

// connect opens a client connection to the proxy's application database (nil, and a
// failure, when it cannot).
func (c *clients) connect() *pgx.Conn {
	cn, err := pgx.Connect(c.ctx, c.url("app"))
	if err != nil {
		c.fail("connect: %v", err)
		return nil
	}
	return cn
}

// transfers starts n clients that move money between the accounts 1..rows, each
// transfer a transaction over two accounts.
func (c *clients) transfers(n, rows int) {
	for w := range n {
		c.wg.Go(func() {
			cn := c.connect()
			if cn == nil {
				return
			}
			defer cn.Close(c.ctx)
			for i := 0; !c.stop.Load(); i++ {
				a, b := int64((w*7919+i*31)%rows+1), int64((w*104729+i*17)%rows+1)
				if a == b {
					continue
				}
				// The lower id first: two transfers never wait for each other in a
				// cycle across data sources, which no server would see.
				first, second, d := min(a, b), max(a, b), int64(1)
				if first != a {
					d = -1
				}
				err := pgx.BeginFunc(c.ctx, cn, func(tx pgx.Tx) error {
					if _, err := tx.Exec(c.ctx, "UPDATE accounts SET bal = bal - $2 WHERE id = $1", first, d); err != nil {
						return err
					}
					_, err := tx.Exec(c.ctx, "UPDATE accounts SET bal = bal + $2 WHERE id = $1", second, d)
					return err
				})
				if err != nil {
					c.fail("transfer %d -> %d: %v", a, b, err)
					return
				}
				c.txs.Add(1)
			}
		})
	}
}

// reader starts a client that counts the accounts again and again: always rows.
func (c *clients) reader(rows int64) {
	c.wg.Go(func() {
		cn := c.connect()
		if cn == nil {
			return
		}
		defer cn.Close(c.ctx)
		for !c.stop.Load() {
			var n int64
			if err := cn.QueryRow(c.ctx, "SELECT count(*) FROM accounts").Scan(&n); err != nil {
				c.fail("reader: %v", err)
				return
			}
			if n != rows {
				c.fail("the reader counted %d accounts, want %d", n, rows)
			}
			c.reads.Add(1)
		}
	})
}

// admin runs a statement on the proxy's admin console, within 2 minutes: a step that
// waits for ever fails the test, with the goroutines of this process (the proxy's).
func (c *clients) admin(sql string) ([]*pgconn.Result, error) {
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer cancel()
	a, err := pgconn.Connect(ctx, c.url("shardlab_admin"))
	if err != nil {
		return nil, err
	}
	defer a.Close(context.Background())
	res, err := a.Exec(ctx, sql).ReadAll()
	if ctx.Err() != nil {
		buf := make([]byte, 1<<20)
		c.t.Logf("%s did not end within 2 minutes; the goroutines:\n%s", sql, buf[:runtime.Stack(buf, true)])
	}
	return res, err
}

// halt stops the clients, waits for them (at most a minute) and reports their failures.
func (c *clients) halt() {
	c.t.Helper()
	c.stop.Store(true)
	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		c.t.Error("the clients did not stop within a minute")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.failures {
		c.t.Error(f)
	}
}
