package sqlexec

import (
	"context"
	"slices"
	"testing"
)

// TestCarry: a transaction that has begun on no data source moves to another session
// with its BEGIN, its savepoints, its chained flag and its failed state; one that has is not carried,
// and stays where it is.
func TestCarry(t *testing.T) {
	old, next := NewSession(nil, nil), NewSession(nil, nil)
	if !next.Carry(old) || next.InTransaction() {
		t.Fatal("carrying no transaction: want true, and none open")
	}
	const begin = "BEGIN ISOLATION LEVEL SERIALIZABLE"
	if err := old.Begin(begin); err != nil {
		t.Fatal(err)
	}
	old.chained = true
	if err := old.Savepoint(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	old.failed = true
	if !next.Carry(old) {
		t.Fatal("a transaction begun on no data source was not carried")
	}
	if old.InTransaction() {
		t.Error("the old session is in a transaction still")
	}
	if !next.InTransaction() || next.BeginStatement() != begin || !next.chained || !next.Failed() || !slices.Equal(next.saves, []string{"a"}) {
		t.Errorf("carried: in a transaction %v, %q, chained %v, failed %v, savepoints %q", next.InTransaction(), next.BeginStatement(), next.chained, next.Failed(), next.saves)
	}

	joined, other := NewSession(nil, nil), NewSession(nil, nil)
	if err := joined.Begin(""); err != nil {
		t.Fatal(err)
	}
	joined.begun[0] = true
	if other.Carry(joined) {
		t.Error("a transaction that began on a data source was carried")
	}
	if !joined.InTransaction() || other.InTransaction() {
		t.Errorf("after a refused carry: old in a transaction %v, new %v", joined.InTransaction(), other.InTransaction())
	}
}
