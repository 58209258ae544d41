package reshard

import (
	"os"
	"path/filepath"
	"testing"
)

// TestReadTransactionsDropsCutLines: the line pgbench's thread wrote last when it was
// stopped may be cut short and still parse (its lag cut to its first digits), so each
// client's last transaction is left out, and none of the others.
func TestReadTransactionsDropsCutLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "transactions.log")
	log := "0 1 1500 0 1795706200 100000 500\n" +
		"1 1 78000000 0 1795706200 200000 77990000\n" +
		"0 2 1700 0 1795706201 100000 600\n" +
		"1 2 78263823 0 1795706294 836659 781\n" + // cut short: the lag was 78103462
		"\n" +
		"0 3 1800 0 1795706202 100000 700\n"
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	ts, err := readTransactions(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 3 {
		t.Fatalf("%d transactions, want 3 (client 0's first two, client 1's first): %+v", len(ts), ts)
	}
	for _, x := range ts {
		if x.latency-x.lag > 10_000 {
			t.Errorf("a transaction of %d µs from its actual start was kept: %+v", x.latency-x.lag, x)
		}
	}
}
