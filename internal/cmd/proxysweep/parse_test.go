package proxysweep_test

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/internal/cmd/proxysweep"
)

func TestParseSysbench(t *testing.T) {
	// The second file has a report checkpoint (the end of the warm-up) before the final
	// report, which is the one that counts.
	for _, name := range []string{"testdata/sysbench_point_select.txt", "testdata/sysbench_checkpoint.txt"} {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := proxysweep.ParseSysbench(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		// 100 latencies: the 95th is the 95th smallest (bucket 0.300), the 99th the
		// 99th (bucket 0.400).
		want := proxysweep.Measure{TPS: 50, QPS: 50, P95: 0.3, P99: 0.4, Errors: 2, Latencies: 100, DurationS: 2.0012, Transactions: 100}
		if m != want {
			t.Errorf("%s: got %+v\nwant %+v", name, m, want)
		}
	}
	if _, err := proxysweep.ParseSysbench(strings.NewReader("FATAL: connection refused\n")); !errors.Is(err, proxysweep.ErrNoResult) {
		t.Errorf("output without a result: %v, want ErrNoResult", err)
	}
}

func TestParsePgbench(t *testing.T) {
	report := `pgbench (15.10 (Debian 15.10-0+deb12u1))
transaction type: <builtin: select only>
number of failed transactions: 0 (0.000%)
latency average = 0.400 ms
tps = 19876.543210 (without initial connection time)
`
	var log1, log2 strings.Builder
	for i := 1; i <= 100; i++ {
		// client tx latency_us script epoch us: latencies 10us .. 1000us
		line := "0 1 " + strconv.Itoa(i*10) + " 0 1700000000 1\n"
		if i%2 == 0 {
			log1.WriteString(line)
		} else {
			log2.WriteString(line)
		}
	}
	m, err := proxysweep.ParsePgbench(strings.NewReader(report), strings.NewReader(log1.String()), strings.NewReader(log2.String()))
	if err != nil {
		t.Fatal(err)
	}
	if m.TPS != 19876.54321 || m.Latencies != 100 || m.P95 != 0.95 || m.P99 != 0.99 || m.Errors != 0 {
		t.Errorf("got %+v", m)
	}
	if _, err := proxysweep.ParsePgbench(strings.NewReader("pgbench: error: connection refused\n")); !errors.Is(err, proxysweep.ErrNoResult) {
		t.Errorf("output without a result: %v, want ErrNoResult", err)
	}
}
