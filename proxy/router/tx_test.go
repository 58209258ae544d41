package router

import "testing"

// TestWithCharacteristics: the chained BEGIN takes the characteristics of the BEGIN
// and the SET TRANSACTION and SET LOCAL transaction_* statements after it, the last
// word winning, and leaves unset ones to the defaults.
func TestWithCharacteristics(t *testing.T) {
	for _, c := range []struct {
		begin string
		sets  []string
		want  string
	}{
		{"BEGIN", nil, "BEGIN"},
		{"START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ WRITE, DEFERRABLE", nil,
			"BEGIN ISOLATION LEVEL REPEATABLE READ READ WRITE DEFERRABLE"},
		{"BEGIN", []string{"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ ONLY"},
			"BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY"},
		{"BEGIN ISOLATION LEVEL REPEATABLE READ NOT DEFERRABLE", []string{"SET TRANSACTION READ ONLY", "SET work_mem = '8MB'", "SET LOCAL transaction_read_only = off"},
			"BEGIN ISOLATION LEVEL REPEATABLE READ READ WRITE NOT DEFERRABLE"},
		{"BEGIN", []string{"SET LOCAL transaction_isolation = 'read committed'", "SET LOCAL transaction_deferrable TO true"},
			"BEGIN ISOLATION LEVEL READ COMMITTED DEFERRABLE"},
	} {
		got, err := withCharacteristics(c.begin, c.sets)
		if err != nil || got != c.want {
			t.Errorf("%q + %q: %q (%v), want %q", c.begin, c.sets, got, err, c.want)
		}
	}
}
