package frontend_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/proxy/frontend"
	"github.com/shardlab/shardlab/proxy/router"
	"github.com/shardlab/shardlab/rules"
)

// seeds are client byte streams: valid sessions and broken ones.
func seeds(tb testing.TB) [][]byte {
	tb.Helper()
	enc := func(msgs ...pgproto3.FrontendMessage) []byte {
		var b []byte
		for _, m := range msgs {
			var err error
			if b, err = m.Encode(b); err != nil {
				tb.Fatal(err)
			}
		}
		return b
	}
	startup := &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{"user": "u", "database": "app"}}
	return [][]byte{
		enc(startup, &pgproto3.Query{String: "SELECT 1; BEGIN"}, &pgproto3.Terminate{}),
		enc(startup, &pgproto3.Parse{Name: "s", Query: "SELECT $1::int"}, &pgproto3.Describe{ObjectType: 'S', Name: "s"},
			&pgproto3.Bind{PreparedStatement: "s", Parameters: [][]byte{[]byte("1")}}, &pgproto3.Execute{}, &pgproto3.Sync{}),
		enc(&pgproto3.SSLRequest{}, startup, &pgproto3.Query{String: "COPY t FROM STDIN"}, &pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}),
		enc(&pgproto3.CancelRequest{ProcessID: 1, SecretKey: []byte{1, 2, 3, 4}}),
		enc(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion32, Parameters: map[string]string{"user": "u", "_pq_.x": "y"}}),
		{0, 0, 0, 8, 0, 2, 0, 0},
		{0, 0, 0, 4},
		append(enc(startup), 'B', 0, 0, 0, 5, 1),
	}
}

// FuzzReader: the message decoder never panics and never reads past a message.
func FuzzReader(f *testing.F) {
	for _, s := range seeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := frontend.NewReader(bytes.NewReader(data), 4096)
		if _, err := r.ReadStartup(); err != nil {
			return
		}
		for range 1000 {
			if _, err := r.Receive(); err != nil {
				var pe *frontend.ProtocolError
				if !errors.As(err, &pe) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("unexpected error type %T: %v", err, err)
				}
				return
			}
		}
	})
}

// FuzzStartupPath runs whole client sessions from fuzzed bytes through a server whose
// only data source cannot be reached: whatever a client sends, the session ends, in
// bounded time, without a panic.
func FuzzStartupPath(f *testing.F) {
	for _, s := range seeds(f) {
		f.Add(s)
	}
	r, err := rules.Compile(rules.Rules{
		DataSources: []rules.DataSource{{Name: "ds_0", DSN: "postgres://u@127.0.0.1:1/x?sslmode=disable"}},
		Tables:      []rules.Table{{Name: "t", Strategy: rules.Strategy{Column: "id", Type: rules.TypeInt4}}},
	})
	if err != nil {
		f.Fatal(err)
	}
	pool, err := backend.NewPool("ds_0", "postgres://u@127.0.0.1:1/x?sslmode=disable", backend.Options{Size: 2, ConnectTimeout: 200 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(pool.Close)
	rt, err := router.New(router.Config{Rules: r, Pools: []*backend.Pool{pool}})
	if err != nil {
		f.Fatal(err)
	}
	srv := frontend.NewServer(frontend.Config{Router: rt, Database: "app", MaxMessage: 4096, StartupTimeout: 2 * time.Second})
	f.Fuzz(func(t *testing.T, data []byte) {
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() {
			srv.Serve(server)
			close(done)
		}()
		go io.Copy(io.Discard, client)
		// Write in pieces: a message may span writes.
		for len(data) > 0 {
			n := min(len(data), 7+len(data)%13)
			client.SetWriteDeadline(time.Now().Add(2 * time.Second))
			if _, err := client.Write(data[:n]); err != nil {
				break
			}
			data = data[n:]
		}
		client.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the session did not end after the client closed")
		}
	})
}

// TestReaderLimits: the reader refuses a message over its limit and a startup packet
// of an impossible length, with the SQLSTATE a client should see.
func TestReaderLimits(t *testing.T) {
	var b bytes.Buffer
	b.Write([]byte{'Q', 0, 0, 0, 0})
	binary.BigEndian.PutUint32(b.Bytes()[1:], 5000)
	r := frontend.NewReader(&b, 1024)
	_, err := r.Receive()
	var pe *frontend.ProtocolError
	if !errors.As(err, &pe) || pe.Code != "08P01" {
		t.Errorf("oversized message: %v", err)
	}
	r = frontend.NewReader(bytes.NewReader([]byte{0, 0, 0, 8, 0, 4, 0, 0}), 0)
	if _, err := r.ReadStartup(); !errors.As(err, &pe) || pe.Code != "0A000" {
		t.Errorf("protocol 4.0: %v", err)
	}
	r = frontend.NewReader(bytes.NewReader([]byte{0, 0, 0xff, 0xff}), 0)
	if _, err := r.ReadStartup(); !errors.As(err, &pe) || pe.Code != "08P01" {
		t.Errorf("startup packet of 65535 bytes: %v", err)
	}
}
