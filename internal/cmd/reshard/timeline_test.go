package reshard

import (
	"os"
	"path/filepath"
	"strings"
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

// TestLongestThrough: the longest wait through a hold counts the transactions that
// ended after it began and started before a second after it ended, failed ones left
// out, from the scheduled start and from the actual one.
func TestLongestThrough(t *testing.T) {
	const hs, he = 10_000, 10_050 // ms
	ts := []txn{
		{end: 9_999_000, latency: 900_000},                // ended before the hold
		{end: 10_020_000, latency: 300_000, lag: 250_000}, // through it: 300 ms, 50 from its start
		{end: 10_400_000, latency: 120_000, lag: 0},       // through it: 120 ms from its start
		{end: 12_000_000, latency: 500_000, lag: 0},       // started 1.45 s after it ended
		{end: 10_030_000, latency: 800_000, failed: true}, // failed
	}
	longest, run := longestThrough(ts, hs, he)
	if longest != 300_000 || run != 120_000 {
		t.Errorf("longestThrough = %d, %d µs; want 300000, 120000", longest, run)
	}
}

// TestVerifiedHow: the summary says whether verify was pinned, with the longest wait
// its report gives, and otherwise that it was not.
func TestVerifiedHow(t *testing.T) {
	pinned := "ds_0 -> ds_2, pgbench_accounts: 10 rows in 1 chunks: the same\nevery stream's rows are on its destination, as on its source\n" +
		"pinned: each table compared at one point of its source; writes to it waited at most 12.5ms (pgbench_accounts on ds_1)\ncompared in 2s"
	if got, want := verifiedHow(pinned), "under load, each table pinned to one point of its source's WAL: writes to it waited at most 12.5ms (pgbench_accounts on ds_1)"; got != want {
		t.Errorf("pinned: %q, want %q", got, want)
	}
	ranges := "pinned: each range of chunks compared at one point of its source (10 pins over 4 tables); writes to a table waited at most 8.04ms (people on ds_1)\ncompared in 2s"
	if got, want := verifiedHow(ranges), "under load, each range of chunks pinned to one point of its source's WAL (10 pins over 4 tables); writes to a table waited at most 8.04ms (people on ds_1)"; got != want {
		t.Errorf("pinned by range: %q, want %q", got, want)
	}
	if got := verifiedHow("every stream's rows are on its destination, as on its source\ncompared in 2s"); got != "under load; it is not pinned to one WAL position" {
		t.Errorf("unpinned: %q", got)
	}
	if got := verifyHeld(pinned); got != "" {
		t.Errorf("held, without --max-active: %q", got)
	}
	held := strings.Replace(pinned, "\ncompared in", "\nheld 2.5s in all while other sessions ran more statements than --max-active allows\ncompared in", 1)
	if got, want := verifyHeld(held), "2.5s in all while other sessions ran more statements than --max-active allows"; got != want {
		t.Errorf("held: %q, want %q", got, want)
	}
}

// TestOldestOpen: the summary's oldest open transaction during verify is the greatest
// sample, and lines that are not samples are left out.
func TestOldestOpen(t *testing.T) {
	if oldest, n := oldestOpen("1700000000000 0.5\n1700000001000 12.3\nERROR: x\n1700000002000 2\n"); oldest != 12.3 || n != 3 {
		t.Errorf("oldestOpen: %v over %d samples, want 12.3 over 3", oldest, n)
	}
	if _, n := oldestOpen(""); n != 0 {
		t.Errorf("no samples: %d", n)
	}
}

// TestCopyHeld: the summary says how long a copy with --max-active was held in all,
// from start's last line that says it, and nothing for a copy without the hold.
func TestCopyHeld(t *testing.T) {
	progress := "reshard: ds_0 -> ds_2: copied 10 rows of public.a (no rate bound, held 1.2s in all while other sessions kept more than 4 statements running (--max-active))\n" +
		"reshard: ds_1 -> ds_3: copied 12 rows of public.a (no rate bound, held 3.5s in all while other sessions kept more than 4 statements running (--max-active))\n"
	if got, want := copyHeld(progress), "3.5s in all while other sessions kept more than 4 statements running (--max-active)"; got != want {
		t.Errorf("copyHeld: %q, want %q", got, want)
	}
	if got := copyHeld("reshard: ds_0 -> ds_2: copied 10 rows of public.a (at most 50000 rows/s)\n"); got != "" {
		t.Errorf("copyHeld without the hold: %q", got)
	}
}
