package netprobe_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/lab/netprobe"
)

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

func TestSummarize(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = ms(float64(100 - i)) // 100 ms down to 1 ms: unsorted on purpose
	}
	tests := []struct {
		name    string
		samples []time.Duration
		want    netprobe.Summary
	}{
		{"one", []time.Duration{ms(2)}, netprobe.Summary{N: 1, Min: ms(2), Median: ms(2), P99: ms(2), Max: ms(2), Mean: ms(2)}},
		{"odd", []time.Duration{ms(3), ms(1), ms(2)}, netprobe.Summary{N: 3, Min: ms(1), Median: ms(2), P99: ms(3), Max: ms(3), Mean: ms(2), Stddev: time.Duration(816497)}},
		{"even", []time.Duration{ms(4), ms(1), ms(3), ms(2)}, netprobe.Summary{N: 4, Min: ms(1), Median: ms(2.5), P99: ms(4), Max: ms(4), Mean: ms(2.5), Stddev: time.Duration(1118033)}},
		// Nearest rank: the 99th of 100 sorted values.
		{"hundred", hundred, netprobe.Summary{N: 100, Min: ms(1), Median: ms(50.5), P99: ms(99), Max: ms(100), Mean: ms(50.5), Stddev: time.Duration(28866070)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := netprobe.Summarize(tt.samples)
			if err != nil {
				t.Fatal(err)
			}
			if d := got.Stddev - tt.want.Stddev; d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("Stddev = %v, want %v", got.Stddev, tt.want.Stddev)
			}
			got.Stddev = tt.want.Stddev
			if got != tt.want {
				t.Errorf("Summarize = %+v, want %+v", got, tt.want)
			}
		})
	}
	if _, err := netprobe.Summarize(nil); !errors.Is(err, netprobe.ErrNoSamples) {
		t.Errorf("Summarize(nil): %v, want ErrNoSamples", err)
	}
	// The caller's slice keeps its order.
	if hundred[0] != ms(100) {
		t.Errorf("Summarize sorted the caller's samples")
	}
}

func TestDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	open := ln.Addr().String()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	defer ln.Close()
	tests := []struct {
		addr string
		want netprobe.Outcome
	}{
		{open, netprobe.Answered},
		{closedAddr, netprobe.Refused},
	}
	for _, tt := range tests {
		got, err := netprobe.Dial(context.Background(), tt.addr, 2*time.Second)
		if err != nil || got != tt.want {
			t.Errorf("Dial(%s) = %q, %v; want %q", tt.addr, got, err, tt.want)
		}
	}
	// The timeout and unreachable outcomes need a network that drops packets or has no
	// route: internal/netlab checks them inside the lab's namespaces.
	if _, err := netprobe.Dial(context.Background(), "no-port", time.Second); err == nil {
		t.Errorf("Dial of an address without a port succeeded")
	}
}

func TestSQLRoundTrips(t *testing.T) {
	dsn := pgtest.DSN(t)
	samples, err := netprobe.SQLRoundTrips(context.Background(), dsn, 20)
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != 20 {
		t.Fatalf("%d samples, want 20", len(samples))
	}
	for _, s := range samples {
		if s <= 0 || s > 10*time.Second {
			t.Errorf("round trip %v", s)
		}
	}
	if _, err := netprobe.SQLRoundTrips(context.Background(), dsn, 0); err == nil {
		t.Errorf("0 round trips: no error")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := netprobe.SQLRoundTrips(ctx, dsn, 5); err == nil {
		t.Errorf("cancelled context: no error")
	}
}

func TestReadAnswer(t *testing.T) {
	dsn := pgtest.DSN(t)
	r, err := netprobe.ReadAnswer(context.Background(), dsn, "SELECT g, repeat('x', 10) FROM generate_series(1, 1000) g")
	if err != nil {
		t.Fatal(err)
	}
	// 1..9: 9 bytes, 10..99: 180, 100..999: 2700, 1000: 4; then ten x's a row.
	if r.Rows != 1000 || r.Bytes != 9+180+2700+4+10000 {
		t.Errorf("rows %d, bytes %d", r.Rows, r.Bytes)
	}
	if r.FirstRow <= 0 || r.FirstRow > r.Total {
		t.Errorf("first row after %v of %v", r.FirstRow, r.Total)
	}
	if _, err := netprobe.ReadAnswer(context.Background(), dsn, "SELECT * FROM no_such_table"); err == nil {
		t.Errorf("a failing query: no error")
	}
}

func TestReadAnswerInParts(t *testing.T) {
	dsn := pgtest.DSN(t)
	const q = "SELECT g, repeat('x', 10) FROM generate_series(1, 1000) g"
	for _, fetch := range []uint32{1, 7, 1000, 5000} {
		r, err := netprobe.ReadAnswerInParts(context.Background(), dsn, q, fetch)
		if err != nil {
			t.Fatal(err)
		}
		if r.Rows != 1000 || r.Bytes != 9+180+2700+4+10000 {
			t.Errorf("fetch %d: rows %d, bytes %d", fetch, r.Rows, r.Bytes)
		}
		if r.FirstRow <= 0 || r.FirstRow > r.Total {
			t.Errorf("fetch %d: first row after %v of %v", fetch, r.FirstRow, r.Total)
		}
	}
	// An error in a later part: every row before it came, and the error names it.
	r, err := netprobe.ReadAnswerInParts(context.Background(), dsn, "SELECT 1 / (g - 500) FROM generate_series(1, 1000) g", 100)
	if err == nil || !strings.Contains(err.Error(), "division by zero") || r.Rows != 499 {
		t.Errorf("a query failing at row 500, 100 rows a part: %d rows, %v", r.Rows, err)
	}
	if _, err := netprobe.ReadAnswerInParts(context.Background(), dsn, q, 0); err == nil {
		t.Errorf("fetch 0: no error")
	}
}
