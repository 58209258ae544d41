package sqlexec

import "testing"

// TestChainBeginOf: the BEGIN statement of a chained transaction says every
// characteristic PostgreSQL reports, and nothing it does not know is written into it.
func TestChainBeginOf(t *testing.T) {
	for _, c := range []struct{ iso, ro, def, want string }{
		{"read committed", "off", "off", "BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE NOT DEFERRABLE"},
		{"serializable", "on", "on", "BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY DEFERRABLE"},
		{"repeatable read", "off", "on", "BEGIN ISOLATION LEVEL REPEATABLE READ READ WRITE DEFERRABLE"},
		{"read uncommitted", "on", "off", "BEGIN ISOLATION LEVEL READ UNCOMMITTED READ ONLY NOT DEFERRABLE"},
		{"snapshot; DROP TABLE t", "off", "off", ""},
		{"serializable", "yes", "off", ""},
		{"serializable", "off", "", ""},
	} {
		got, err := chainBeginOf(c.iso, c.ro, c.def)
		if c.want == "" {
			if err == nil {
				t.Errorf("%q %q %q: %q, want an error", c.iso, c.ro, c.def, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q %q %q: %q (%v), want %q", c.iso, c.ro, c.def, got, err, c.want)
		}
	}
}
