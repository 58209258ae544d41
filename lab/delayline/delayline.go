// Package delayline is the network lab's delay line in user space: a Toxiproxy server
// (TCP proxies whose traffic passes through a chain of "toxics", configured over an HTTP
// API) with one more toxic, "delay", that holds every chunk of data for a delay plus or
// minus a jitter, counted in microseconds.
//
// The lab's kernel has no netem qdisc, so delay cannot be added to packets; it is added
// to the byte stream instead, at the server end of each TCP connection. Toxiproxy's own
// "latency" toxic counts in whole milliseconds, too coarse for a network inside one zone
// (a round trip of half a millisecond). scripts/netlab.sh runs one delay line per server
// host (docs/netlab.md).
package delayline

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// ToxicType is the name the delay toxic is registered under: the "type" of a toxic
// created through the API, with attributes delay_us and jitter_us.
const ToxicType = "delay"

// Delay is the delay toxic. Every chunk of data read from one side of a connection is
// written to the other DelayUS ± JitterUS microseconds after it was read (the jitter
// uniform, drawn per chunk, and never below zero). Chunks leave in the order they came:
// a chunk drawn a shorter delay than the one before it waits for that one, as bytes of
// one TCP stream must. Chunks are timed from when they were read, not from when the
// previous one left, so the line holds many at once and a delay does not cap throughput.
//
// To change a delay, remove the toxic and add it again. Toxiproxy 2.5's update decodes
// the new attributes into the toxic (and sets its toxicity) while connections read them:
// a data race.
type Delay struct {
	DelayUS  int64 `json:"delay_us"`
	JitterUS int64 `json:"jitter_us"`
}

var _ toxics.BufferedToxic = (*Delay)(nil)

func init() {
	// Toxiproxy's registry is global and filled from init functions (its
	// CREATING_TOXICS.md); the API looks toxic types up there.
	toxics.Register(ToxicType, new(Delay))
}

// GetBufferSize is how many chunks may wait in the line, as for Toxiproxy's latency toxic.
func (d *Delay) GetBufferSize() int { return 1024 }

// hold draws how long one chunk stays in the line.
func (d *Delay) hold() time.Duration {
	us := d.DelayUS
	if d.JitterUS > 0 {
		us += rand.Int64N(2*d.JitterUS+1) - d.JitterUS
	}
	return time.Duration(max(us, 0)) * time.Microsecond
}

// coarseMargin is how much a Go timer may overshoot: with nothing else to run, Go's
// scheduler waits for timers in epoll with a timeout in whole milliseconds, so a timer
// of 200 µs fires after about 1 ms. The delay toxic waits on a Go timer (which an
// interrupt can cut short) only until this margin before its deadline and sleeps the
// rest on a kernel timer (kernelTimer), which keeps microseconds.
const coarseMargin = 1500 * time.Microsecond

// coarseAbove is the wait above which the delay toxic waits on a Go timer first. The
// kernel timer costs less CPU per chunk, but an interrupt must wait until it fires.
const coarseAbove = 20 * time.Millisecond

// Pipe moves chunks from the stub's input to its output, each after its delay. When the
// toxic is interrupted (updated or removed through the API) the chunk it holds is passed
// on at once, so no byte is lost; an interrupt that comes during the last
// coarseMargin of a wait waits for it.
//
// A connection whose writing side fails (its peer reset it) while chunks are in the
// line leaves this goroutine, and its kernel timer, blocked on the stub's output for
// good: Toxiproxy 2.5's link stops reading the output after a write error and tells
// no toxic, so Toxiproxy's own toxics, its no-op stub and its reader stay blocked the
// same way. A toxic cannot tell that apart from a slow reader (a bound on the wait
// would drop bytes of a live connection); the fix belongs in Toxiproxy's link.
func (d *Delay) Pipe(stub *toxics.ToxicStub) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	fine := newKernelTimer()
	defer fine.close()
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			deadline := c.Timestamp.Add(d.hold())
			if wait := time.Until(deadline); wait > coarseAbove {
				timer.Reset(wait - coarseMargin)
				select {
				case <-timer.C:
				case <-stub.Interrupt:
					stub.Output <- c
					return
				}
			}
			if wait := time.Until(deadline); wait > 0 {
				fine.sleep(wait)
				// Later toxics in the chain time the chunk from when it left this one.
				c.Timestamp = deadline
			}
			stub.Output <- c
		}
	}
}

// Config is what Serve needs.
type Config struct {
	// API is the address of Toxiproxy's HTTP API, e.g. 127.0.0.1:8474.
	API string
	// ProxiesFile, when set, is a JSON file in Toxiproxy's format, a list of
	// {"name", "listen", "upstream"} objects: the proxies created at start.
	ProxiesFile string
	// Log receives Toxiproxy's log lines (JSON); nil discards them.
	Log io.Writer
	// LogLevel is zerolog's level name: debug, info, warn (the default) or error.
	LogLevel string
}

// Serve runs the delay line until ctx is cancelled: Toxiproxy's API on cfg.API and the
// proxies of cfg.ProxiesFile. Cancelling ctx stops the proxies, closing their listeners
// and connections, and returns nil. Toxiproxy's API server has no shutdown: its listener
// stays open until the process exits, which is why this is for a command of its own
// (cmd/delayline), not for a test process.
func Serve(ctx context.Context, cfg Config) error {
	host, port, err := net.SplitHostPort(cfg.API)
	if err != nil {
		return fmt.Errorf("delayline: API address %q: %w", cfg.API, err)
	}
	level := zerolog.WarnLevel
	if cfg.LogLevel != "" {
		if level, err = zerolog.ParseLevel(cfg.LogLevel); err != nil {
			return fmt.Errorf("delayline: log level %q: %w", cfg.LogLevel, err)
		}
	}
	logw := cfg.Log
	if logw == nil {
		logw = io.Discard
	}
	logger := zerolog.New(logw).Level(level).With().Timestamp().Logger()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), logger)
	if cfg.ProxiesFile != "" {
		f, err := os.Open(cfg.ProxiesFile)
		if err != nil {
			return fmt.Errorf("delayline: %w", err)
		}
		_, err = server.Collection.PopulateJson(server, f)
		f.Close()
		if err != nil {
			server.Collection.Clear()
			return fmt.Errorf("delayline: proxies from %s: %w", cfg.ProxiesFile, err)
		}
	}
	// Toxiproxy's Listen ends the process when it cannot bind: try the address first,
	// so that a taken port is an error returned here.
	probe, err := net.Listen("tcp", cfg.API)
	if err != nil {
		server.Collection.Clear()
		return fmt.Errorf("delayline: API: %w", err)
	}
	probe.Close()
	go server.Listen(host, port)
	<-ctx.Done()
	server.Collection.Clear()
	return nil
}
