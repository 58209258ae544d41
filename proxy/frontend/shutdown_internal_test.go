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

// TestShutdownSparesAMessageJustReceived: Shutdown may interrupt an idle client's wait
// just after its message (BEGIN) arrived, before the client noted it was busy. The
// past read deadline it set must not fail the client's next read, or a client that
// just began a transaction is cut off in it; once the client is idle again, it may
// not wait for another message.
func TestShutdownSparesAMessageJustReceived(t *testing.T) {
	s := NewServer(Config{Database: "db"})
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := &client{srv: s, nc: a}
	c.setIdle(true)
	// Receive has returned BEGIN here; Shutdown begins.
	s.shuttingDown.Store(true)
	c.interruptIfIdle()
	c.received()
	if !c.waitable() {
		t.Fatal("a client in a transaction may not wait for its next message during Shutdown")
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		b.Write([]byte{'Q'})
	}()
	if _, err := a.Read(make([]byte, 1)); err != nil {
		t.Fatalf("the next read of a client whose message arrived before Shutdown's interrupt: %v", err)
	}
	c.setIdle(true) // its transaction ended
	if c.waitable() {
		t.Error("an idle client may wait for a message after Shutdown began")
	}
}
