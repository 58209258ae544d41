// Command http-ceiling serves the demo-server's endpoints with trivial net/http handlers
// that touch no database: /get answers a fixed record, /insert a fixed acknowledgement.
// Driven by the same loadgen as the demo-server, it measures the HTTP ceiling of the
// machine, so the demo-server's throughput can be quoted as a share of it
// (scripts/http_ceiling.sh).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "http-ceiling:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("http-ceiling", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "http-ceiling answers /get, /insert, /healthz and /stats with fixed bodies: the HTTP ceiling.\n\nUsage: http-ceiling [flags]\n\nFlags:")
		fs.PrintDefaults()
	}
	addr := fs.String("addr", "127.0.0.1:8081", "listen address; port 0 picks a free port")
	addrFile := fs.String("addr-file", "", "write the address actually bound to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	mux := http.NewServeMux()
	fixed := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, body)
		}
	}
	mux.HandleFunc("/get", fixed(`{"user_id":"user1","data":"ceiling","shard":0}`+"\n"))
	mux.HandleFunc("/insert", fixed(`{"user_id":"user1","shard":0,"status":"stored"}`+"\n"))
	mux.HandleFunc("/healthz", fixed(`{"status":"ok"}`+"\n"))
	mux.HandleFunc("/stats", fixed(`{"mode":"single","backend":"none","router":"none","shards":1}`+"\n"))
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile, []byte(ln.Addr().String()+"\n"), 0o644); err != nil {
			return err
		}
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
