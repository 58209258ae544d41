package counters_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/shardlab/shardlab/counters"
)

// FuzzKeyRoundTrip feeds arbitrary keys, as an HTTP client could, to
// ValidateKey and to a SQLite counter: a key is either rejected with
// ErrInvalidKey before touching the database, or stored and read back as the
// same key with the right count, whatever its bytes.
func FuzzKeyRoundTrip(f *testing.F) {
	for _, k := range []string{"192.168.0.1", "", "a\x00b", "\xff", "'; DROP TABLE x; --", "%_*?", "ключ", "🔥", strings.Repeat("z", 257)} {
		f.Add(k)
	}
	c, err := counters.OpenSQLite(f.Context(), filepath.Join(f.TempDir(), "fuzz.db"),
		counters.Options{Strategy: counters.StrategyBucket, Buckets: 4, BucketBy: counters.BucketWorker}, counters.SQLiteOptions{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { c.Close() })
	f.Fuzz(func(t *testing.T, key string) {
		err := counters.ValidateKey(key)
		valid := key != "" && len(key) <= counters.MaxKeyLen && utf8.ValidString(key) && !strings.ContainsRune(key, 0)
		if valid != (err == nil) {
			t.Fatalf("ValidateKey(%q) = %v, but valid = %v", key, err, valid)
		}
		before := int64(0)
		if v, err := c.Get(t.Context(), key); err == nil {
			before = v.Count
		} else if !errors.Is(err, counters.ErrNotFound) && !errors.Is(err, counters.ErrInvalidKey) {
			t.Fatalf("Get(%q): %v", key, err)
		}
		err = c.Incr(t.Context(), key, 1)
		if !valid {
			if !errors.Is(err, counters.ErrInvalidKey) {
				t.Fatalf("Incr(%q) = %v, want ErrInvalidKey", key, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("Incr(%q): %v", key, err)
		}
		v, err := c.Get(t.Context(), key)
		if err != nil || v.Key != key || v.Count != before+1 {
			t.Fatalf("Get(%q) = %+v, %v; want count %d", key, v, err, before+1)
		}
	})
}
