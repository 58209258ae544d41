package frontend

import (
	"net"
	"testing"
	"time"
)

// TestShutdownAndIdleClientTakeLocksInOneOrder: Shutdown holds the server's lock while
// it takes each client's; a client going idle holds its own lock while it asks
// whether the server is closing. That question must not need the server's lock, or
// the two wait for each other forever (a CI run hung 28 minutes in Shutdown).
func TestShutdownAndIdleClientTakeLocksInOneOrder(t *testing.T) {
	s := NewServer(Config{Database: "db"})
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := &client{srv: s, nc: a}
	c.setIdle(true)

	s.mu.Lock() // as Shutdown does while it walks the clients
	asked := make(chan bool)
	go func() { asked <- c.waitable() }()
	select {
	case ok := <-asked:
		if !ok {
			t.Errorf("waitable = false before Shutdown began")
		}
	case <-time.After(10 * time.Second):
		s.mu.Unlock()
		<-asked
		t.Fatal("a client asking whether the server is closing waits for the server's lock")
	}
	s.mu.Unlock()

	s.shuttingDown.Store(true)
	if c.waitable() {
		t.Errorf("an idle client may wait for a message after Shutdown began")
	}
}
