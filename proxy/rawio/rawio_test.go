package rawio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// pair returns both ends of a loopback TCP connection, the first wrapped.
func pair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c, err := Wrapping((&net.Dialer{}).DialContext)(t.Context(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	if _, ok := c.(*Conn); !ok {
		t.Fatalf("the dial returned %T, want *Conn", c)
	}
	t.Cleanup(func() { c.Close(); peer.Close() })
	return c, peer
}

// TestLargeTransferBothWays sends more than the sockets' buffers hold in each
// direction, so that writes wait for room and reads for data, and checks every byte.
func TestLargeTransferBothWays(t *testing.T) {
	c, peer := pair(t)
	data := make([]byte, 8<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, dir := range []struct {
		name string
		w, r net.Conn
	}{{"wrapped writes", c, peer}, {"wrapped reads", peer, c}} {
		t.Run(dir.name, func(t *testing.T) {
			errc := make(chan error, 1)
			go func() {
				n, err := dir.w.Write(data)
				if err == nil && n != len(data) {
					err = io.ErrShortWrite
				}
				errc <- err
			}()
			got := make([]byte, len(data))
			if _, err := io.ReadFull(dir.r, got); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatal("the bytes read differ from the bytes written")
			}
		})
	}
}

func TestEOFWhenPeerCloses(t *testing.T) {
	c, peer := pair(t)
	if _, err := peer.Write([]byte("last")); err != nil {
		t.Fatal(err)
	}
	peer.Close()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "last" {
		t.Fatalf("ReadAll = %q, %v; want \"last\", nil", got, err)
	}
	if n, err := c.Read(make([]byte, 4)); n != 0 || err != io.EOF {
		t.Fatalf("Read after EOF = %d, %v; want 0, io.EOF", n, err)
	}
}

func TestReadDeadline(t *testing.T) {
	c, _ := pair(t)
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := c.Read(make([]byte, 10))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past its deadline = %v; want a timeout", err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "read" {
		t.Fatalf("error %v is not a read *net.OpError", err)
	}
}

func TestWriteDeadline(t *testing.T) {
	c, _ := pair(t) // the peer never reads: the buffers fill up
	c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	n, err := c.Write(make([]byte, 64<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write past its deadline = %v; want a timeout", err)
	}
	if n < 0 || n >= 64<<20 {
		t.Fatalf("Write reported %d bytes written before its deadline; want fewer than all", n)
	}
}

func TestCloseEndsAWaitingRead(t *testing.T) {
	c, _ := pair(t)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 10))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	c.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read on a closed connection = %v; want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read still waits after Close")
	}
}

func TestWriteToResetConnection(t *testing.T) {
	c, peer := pair(t)
	peer.(*net.TCPConn).SetLinger(0)
	peer.Close() // sends RST
	var err error
	deadline := time.Now().Add(5 * time.Second)
	for err == nil && time.Now().Before(deadline) {
		_, err = c.Write([]byte("x"))
		time.Sleep(time.Millisecond)
	}
	if err == nil {
		t.Fatal("writes to a reset connection kept succeeding")
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "write" {
		t.Fatalf("error %v is not a write *net.OpError", err)
	}
}

func TestWrapLeavesOtherConnectionsAlone(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if Wrap(a) != a {
		t.Fatal("Wrap changed a connection that is not TCP")
	}
}

func TestFileIsRefused(t *testing.T) {
	c, _ := pair(t)
	if f, err := c.(*Conn).File(); err == nil || f != nil {
		t.Fatalf("File = %v, %v; want a refusal", f, err)
	}
}

func TestZeroLengthReadOnAClosedConnection(t *testing.T) {
	c, _ := pair(t)
	if n, err := c.Read(nil); n != 0 || err != nil {
		t.Fatalf("Read(nil) = %d, %v; want 0, nil", n, err)
	}
	c.Close()
	if _, err := c.Read(nil); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read(nil) after Close = %v; want net.ErrClosed", err)
	}
}

// TestConcurrentWritesStayWhole writes records from several goroutines at once through
// one connection, as net.Conn allows: each Write must reach the peer whole, since the
// connection keeps one Write's state at a time.
func TestConcurrentWritesStayWhole(t *testing.T) {
	c, peer := pair(t)
	const writers, records, size = 4, 2000, 64
	errc := make(chan error, writers)
	for w := range writers {
		go func() {
			rec := bytes.Repeat([]byte{byte('a' + w)}, size)
			for range records {
				if _, err := c.Write(rec); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	counts := map[byte]int{}
	rec := make([]byte, size)
	for range writers * records {
		if _, err := io.ReadFull(peer, rec); err != nil {
			t.Fatal(err)
		}
		if bytes.Count(rec, rec[:1]) != size {
			t.Fatalf("a record mixes writes: %q", rec)
		}
		counts[rec[0]]++
	}
	for range writers {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	for w := range writers {
		if got := counts[byte('a'+w)]; got != records {
			t.Errorf("writer %d: %d records arrived, want %d", w, got, records)
		}
	}
}

// TestReadAndWriteDoNotAllocate: the proxy reads and writes every message through
// these calls, so an allocation per call would be one per message.
func TestReadAndWriteDoNotAllocate(t *testing.T) {
	c, peer := pair(t)
	out, in := []byte("ping"), make([]byte, 4)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := c.Write(out); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, in); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(out); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, in); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per write and read, want 0", allocs)
	}
}
