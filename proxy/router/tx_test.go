package router

import "testing"

// TestSetTransactionOf: a BEGIN's options become the SET TRANSACTION that sets them
// in a transaction that began already.
func TestSetTransactionOf(t *testing.T) {
	for begin, want := range map[string]string{
		"BEGIN ISOLATION LEVEL SERIALIZABLE":                                        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
		"START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ WRITE, DEFERRABLE": "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ WRITE, DEFERRABLE",
		"begin read only not deferrable":                                            "SET TRANSACTION READ ONLY, NOT DEFERRABLE",
	} {
		got, err := setTransactionOf(begin)
		if err != nil || got != want {
			t.Errorf("%s: %q (%v), want %q", begin, got, err, want)
		}
	}
}
