package counters_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/counters"
	"github.com/shardlab/shardlab/internal/sqlitedb"
)

func TestValidateKey(t *testing.T) {
	cases := []struct {
		key string
		ok  bool
	}{
		{"192.168.0.1", true},
		{"k", true},
		{strings.Repeat("x", counters.MaxKeyLen), true},
		{"héllo wörld", true},
		{"", false},
		{strings.Repeat("x", counters.MaxKeyLen+1), false},
		{"a\x00b", false},
		{"\xc3\x28", false},
	}
	for _, tc := range cases {
		err := counters.ValidateKey(tc.key)
		if tc.ok && err != nil {
			t.Errorf("ValidateKey(%q) = %v, want nil", tc.key, err)
		}
		if !tc.ok && !errors.Is(err, counters.ErrInvalidKey) {
			t.Errorf("ValidateKey(%q) = %v, want ErrInvalidKey", tc.key, err)
		}
	}
}

func TestValidateBy(t *testing.T) {
	for _, by := range []int64{1, 2, counters.MaxBy} {
		if err := counters.ValidateBy(by); err != nil {
			t.Errorf("ValidateBy(%d) = %v, want nil", by, err)
		}
	}
	for _, by := range []int64{0, -1, counters.MaxBy + 1, 1 << 62} {
		if err := counters.ValidateBy(by); !errors.Is(err, counters.ErrInvalidBy) {
			t.Errorf("ValidateBy(%d) = %v, want ErrInvalidBy", by, err)
		}
	}
}

func TestParse(t *testing.T) {
	for _, s := range []string{"row", "append", "bucket"} {
		if st, err := counters.ParseStrategy(s); err != nil || string(st) != s {
			t.Errorf("ParseStrategy(%q) = %q, %v", s, st, err)
		}
	}
	for _, s := range []string{"random", "time", "worker"} {
		if b, err := counters.ParseBucketBy(s); err != nil || string(b) != s {
			t.Errorf("ParseBucketBy(%q) = %q, %v", s, b, err)
		}
	}
	for _, s := range []string{"", "Row", "buckets", "worker"} {
		if _, err := counters.ParseStrategy(s); !errors.Is(err, counters.ErrInvalidOptions) {
			t.Errorf("ParseStrategy(%q) = %v, want ErrInvalidOptions", s, err)
		}
	}
	for _, s := range []string{"", "rand", "bucket"} {
		if _, err := counters.ParseBucketBy(s); !errors.Is(err, counters.ErrInvalidOptions) {
			t.Errorf("ParseBucketBy(%q) = %v, want ErrInvalidOptions", s, err)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		name string
		o    counters.Options
		ok   bool
	}{
		{"row", counters.Options{Strategy: counters.StrategyRow}, true},
		{"row ignores buckets", counters.Options{Strategy: counters.StrategyRow, Buckets: -5, BucketBy: "nonsense"}, true},
		{"append", counters.Options{Strategy: counters.StrategyAppend, TablePrefix: "t1_"}, true},
		{"bucket", counters.Options{Strategy: counters.StrategyBucket, Buckets: 100, BucketBy: counters.BucketWorker}, true},
		{"bucket max", counters.Options{Strategy: counters.StrategyBucket, Buckets: counters.MaxBuckets, BucketBy: counters.BucketTime}, true},
		{"zero value", counters.Options{}, false},
		{"unknown strategy", counters.Options{Strategy: "rows"}, false},
		{"bucket without count", counters.Options{Strategy: counters.StrategyBucket, BucketBy: counters.BucketRandom}, false},
		{"bucket too many", counters.Options{Strategy: counters.StrategyBucket, Buckets: counters.MaxBuckets + 1, BucketBy: counters.BucketRandom}, false},
		{"bucket without chooser", counters.Options{Strategy: counters.StrategyBucket, Buckets: 10}, false},
		{"prefix with quote", counters.Options{Strategy: counters.StrategyRow, TablePrefix: `x"; drop table y; --`}, false},
		{"prefix upper case", counters.Options{Strategy: counters.StrategyRow, TablePrefix: "Abc"}, false},
		{"prefix leading digit", counters.Options{Strategy: counters.StrategyRow, TablePrefix: "1abc"}, false},
		{"prefix too long", counters.Options{Strategy: counters.StrategyRow, TablePrefix: "a" + strings.Repeat("b", 32)}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if tc.ok && err != nil {
				t.Errorf("Validate() = %v, want nil", err)
			}
			if !tc.ok && !errors.Is(err, counters.ErrInvalidOptions) {
				t.Errorf("Validate() = %v, want ErrInvalidOptions", err)
			}
		})
	}
}

func TestOptionsString(t *testing.T) {
	o := counters.Options{Strategy: counters.StrategyBucket, Buckets: 100, BucketBy: counters.BucketRandom}
	if got := o.String(); got != "bucket/100/random" {
		t.Errorf("String() = %q", got)
	}
	if got := (counters.Options{Strategy: counters.StrategyAppend, Buckets: 3}).String(); got != "append" {
		t.Errorf("String() = %q", got)
	}
}

// TestOpenSQLiteSettings reads the settings back from the counter's own
// connections: the sync mode asked for is the one its commits run with, and
// a counter keeps full sync unless told otherwise, as before the options were
// shared with package sqlite.
func TestOpenSQLiteSettings(t *testing.T) {
	opts := counters.Options{Strategy: counters.StrategyRow}
	for _, tt := range []struct {
		so   counters.SQLiteOptions
		sync string
		read int
	}{
		{counters.SQLiteOptions{}, sqlitedb.SyncFull, 4},
		{counters.SQLiteOptions{Sync: sqlitedb.SyncNormal, ReadConns: 2}, sqlitedb.SyncNormal, 2},
		{counters.SQLiteOptions{Sync: sqlitedb.SyncFull}, sqlitedb.SyncFull, 4},
	} {
		t.Run(tt.sync, func(t *testing.T) {
			c, err := counters.OpenSQLite(t.Context(), filepath.Join(t.TempDir(), "c.db"), opts, tt.so)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.Incr(t.Context(), "k", 1); err != nil {
				t.Fatal(err)
			}
			if got, err := c.DB().Synchronous(t.Context()); err != nil || got != tt.sync {
				t.Errorf("synchronous = %q, %v; want %q", got, err, tt.sync)
			}
			if got := c.DB().Reader().Stats().MaxOpenConnections; got != tt.read {
				t.Errorf("read pool of %d, want %d", got, tt.read)
			}
		})
	}
	_, err := counters.OpenSQLite(t.Context(), filepath.Join(t.TempDir(), "c.db"), opts, counters.SQLiteOptions{Sync: "sometimes"})
	if !errors.Is(err, counters.ErrInvalidOptions) || !errors.Is(err, sqlitedb.ErrBadOptions) {
		t.Errorf("bad sync mode: %v, want ErrInvalidOptions wrapping sqlitedb.ErrBadOptions", err)
	}
}
