package proxy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestShutdownEndsIdleClientsAtOnce: Shutdown tells every client idle outside a
// transaction 57P01 and closes its connection while the client sends nothing, whether
// it has run a statement or sent nothing at all since it connected, and so returns
// at once. (A client that sends its next statement after Shutdown began is told at that
// point anyway; these ones never would be, and Shutdown would wait for its deadline.)
func TestShutdownEndsIdleClientsAtOnce(t *testing.T) {
	e := startProxy(t, 1, nil, nil)
	ctx := context.Background()
	fresh, used := e.pgconnect(t), e.pgconnect(t)
	if _, err := used.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		done <- e.srv.Shutdown(sctx)
	}()
	for name, c := range map[string]*pgconn.PgConn{"a client that sent nothing": fresh, "a client idle after a statement": used} {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := c.WaitForNotification(wctx) // sends nothing, reads what comes
		cancel()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "57P01" {
			t.Errorf("%s: %v after %v, want FATAL 57P01 at once", name, err, time.Since(start).Round(time.Millisecond))
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("shutdown took %v with only idle clients", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("shutdown still waits for idle clients after 10s")
	}
}
