package delayline_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/shardlab/shardlab/lab/delayline"
)

// echoServer accepts connections on loopback and writes back whatever it reads, until
// the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				io.Copy(c, c)
			})
		}
	})
	return ln.Addr().String()
}

// proxy starts a Toxiproxy proxy (the library the delay line serves) on a free port in
// front of upstream and stops it when the test ends.
func proxy(t *testing.T, upstream string) *toxiproxy.Proxy {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "echo", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

func addDelay(t *testing.T, p *toxiproxy.Proxy, name, stream string, delayUS, jitterUS int) {
	t.Helper()
	body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"attributes":{"delay_us":%d,"jitter_us":%d}}`,
		name, delayline.ToxicType, stream, delayUS, jitterUS)
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		t.Fatalf("add %s: %v", body, err)
	}
}

// roundTrips writes one byte and reads it back n times over one connection and returns
// the shortest round trip and the median.
func roundTrips(t *testing.T, addr string, n int) (shortest, median time.Duration) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	var rtts []time.Duration
	b := []byte{'x'}
	for range n {
		start := time.Now()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatal(err)
		}
		rtts = append(rtts, time.Since(start))
	}
	shortest = rtts[0]
	for _, r := range rtts {
		shortest = min(shortest, r)
	}
	// A sort would do; the median of few values is found well enough by selection.
	for i := range rtts {
		for j := i + 1; j < len(rtts); j++ {
			if rtts[j] < rtts[i] {
				rtts[i], rtts[j] = rtts[j], rtts[i]
			}
		}
	}
	return shortest, rtts[len(rtts)/2]
}

// TestDelayHoldsEachDirection: a round trip through the delay toxic takes the upstream
// and the downstream delays together, and not much more: the sub-millisecond delays
// the lab's zone preset uses must not round up to Go's millisecond timers.
func TestDelayHoldsEachDirection(t *testing.T) {
	p := proxy(t, echoServer(t))
	base, _ := roundTrips(t, p.Listen, 50)
	addDelay(t, p, "up", "upstream", 300, 0)
	addDelay(t, p, "down", "downstream", 200, 0)
	shortest, median := roundTrips(t, p.Listen, 50)
	if shortest < 500*time.Microsecond {
		t.Errorf("shortest round trip %v with 300 µs + 200 µs of delay: a chunk left early", shortest)
	}
	// Go's timers alone would make each direction about 1 ms (2.1 ms in all), every
	// round trip included; the shortest of 50, which a busy machine's noise only
	// lengthens now and then (a median of 2.5 ms failed a CI run at load 3.8), must stay
	// under that.
	if limit := base + 500*time.Microsecond + 1100*time.Microsecond; shortest > limit {
		t.Errorf("shortest round trip %v (median %v) with 500 µs of delay over a %v path: want under %v", shortest, median, base, limit)
	}
}

// TestDelayKeepsTheStream: with jitter, which draws a different delay for every chunk,
// and with toxics replaced and removed while data flows (as netlab.sh does to change a
// delay), every byte arrives once and in order.
func TestDelayKeepsTheStream(t *testing.T) {
	p := proxy(t, echoServer(t))
	addDelay(t, p, "up", "upstream", 200, 190)
	addDelay(t, p, "down", "downstream", 100, 100)
	c, err := net.Dial("tcp", p.Listen)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	payload := make([]byte, 4<<20)
	rand.Read(payload)
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(c, int64(len(payload))))
		got <- b
	}()
	for i := 0; i < len(payload); i += 64 << 10 {
		if _, err := c.Write(payload[i : i+64<<10]); err != nil {
			t.Fatal(err)
		}
		switch i {
		case 1 << 20:
			if err := p.Toxics.RemoveToxic(context.Background(), "up"); err != nil {
				t.Fatal(err)
			}
			addDelay(t, p, "up", "upstream", 50, 50)
		case 2 << 20:
			if err := p.Toxics.RemoveToxic(context.Background(), "down"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if b := <-got; !bytes.Equal(b, payload) {
		t.Fatalf("the stream came back changed: %d bytes of %d, first difference at %d", len(b), len(payload), firstDiff(b, payload))
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestServe runs the delay line as cmd/delayline does: the proxies of a file, and the
// delay toxic created through Toxiproxy's HTTP API by its type name. Cancelling the
// context stops the proxies. (Toxiproxy's API listener stays until the test binary
// exits; Serve documents it.)
func TestServe(t *testing.T) {
	upstream := echoServer(t)
	listen, api := freeAddr(t), freeAddr(t)
	file := filepath.Join(t.TempDir(), "proxies.json")
	proxies, _ := json.Marshal([]map[string]string{{"name": "echo", "listen": listen, "upstream": upstream}})
	if err := os.WriteFile(file, proxies, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- delayline.Serve(ctx, delayline.Config{API: api, ProxiesFile: file}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if c, err := net.Dial("tcp", listen); err == nil {
			c.Close()
			t.Errorf("the proxy on %s still accepts connections after Serve returned", listen)
		}
	}()
	var resp *http.Response
	var err error
	for range 100 {
		if resp, err = http.Get("http://" + api + "/version"); err == nil {
			resp.Body.Close()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("API never answered: %v", err)
	}
	for _, stream := range []string{"upstream", "downstream"} {
		body := fmt.Sprintf(`{"name":"d_%s","type":"delay","stream":%q,"attributes":{"delay_us":2000}}`, stream, stream)
		resp, err := http.Post("http://"+api+"/proxies/echo/toxics", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("create toxic %s: %s %s", body, resp.Status, msg)
		}
	}
	if shortest, _ := roundTrips(t, listen, 5); shortest < 4*time.Millisecond {
		t.Errorf("shortest round trip %v through two 2 ms delays", shortest)
	}
}

// TestServeRefuses: a bad configuration is an error, not an exit of the process.
func TestServeRefuses(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`[{"name":"x"}]`), 0o644)
	for _, cfg := range []delayline.Config{
		{API: "no-port"},
		{API: taken.Addr().String()},
		{API: "127.0.0.1:0", ProxiesFile: bad},
		{API: "127.0.0.1:0", ProxiesFile: bad + ".missing"},
		{API: "127.0.0.1:0", LogLevel: "loud"},
	} {
		if err := delayline.Serve(context.Background(), cfg); err == nil {
			t.Errorf("Serve(%+v) succeeded", cfg)
		}
	}
}
