package proxysweep

import (
	"context"
	"errors"
	"net"
	"sync"

	"github.com/shardlab/shardlab/proxy/rawio"
)

// Relay serves a byte relay on ln to the server at upstream until ctx ends: each client
// connection gets an upstream connection of its own, and bytes flow both ways
// unchanged, one goroutine per direction, through the raw system calls shard-proxy
// uses (package rawio). It decodes nothing, pools nothing and routes nothing: the
// sweep runs it beside shard-proxy and pgbouncer (target go-relay) as the least a Go
// middleware of goroutines per connection costs per transaction on the machine.
func Relay(ctx context.Context, ln net.Listener, upstream string) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	var d net.Dialer
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		wg.Go(func() {
			defer c.Close()
			s, err := d.DialContext(ctx, "tcp", upstream)
			if err != nil {
				return
			}
			defer s.Close()
			client, server := rawio.Wrap(c), rawio.Wrap(s)
			done := context.AfterFunc(ctx, func() { c.Close(); s.Close() })
			defer done()
			var inner sync.WaitGroup
			inner.Go(func() {
				pump(server, client)
				closeWrite(server)
			})
			pump(client, server)
			closeWrite(client)
			inner.Wait()
		})
	}
}

// pump copies src to dst until either fails or src ends.
func pump(dst, src net.Conn) {
	buf := make([]byte, 16<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// closeWrite ends a connection's sending half, so the peer sees the end of the stream.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}
