// Package httpceiling is the http-ceiling command: the demo-server's endpoints answered by
// trivial net/http handlers that touch no database. Driven by the same loadgen as the
// demo-server, it measures the HTTP ceiling of the machine, so the demo-server's
// throughput can be quoted as a share of it (scripts/http_ceiling.sh).
package httpceiling

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// ErrUsage marks a command-line mistake.
var ErrUsage = errors.New("usage")

// Handler answers /get, /insert, /healthz and /stats with fixed bodies shaped like the
// demo-server's, after reading the request body.
func Handler() http.Handler {
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
	return mux
}

// Run serves Handler until ctx is cancelled. It returns flag.ErrHelp for --help and an
// error wrapping ErrUsage for a bad command line.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("http-ceiling", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "http-ceiling answers /get, /insert, /healthz and /stats with fixed bodies: the HTTP ceiling.\n\nUsage: http-ceiling [flags]\n\nFlags:\n")
		fs.PrintDefaults()
	}
	addr := fs.String("addr", "127.0.0.1:8081", "listen address; port 0 picks a free port")
	addrFile := fs.String("addr-file", "", "write the address actually bound to this file")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile, []byte(ln.Addr().String()+"\n"), 0o644); err != nil {
			ln.Close()
			return err
		}
	}
	fmt.Fprintf(stdout, "http-ceiling: listening on http://%s\n", ln.Addr())
	srv := &http.Server{Handler: Handler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	<-done
	return nil
}
