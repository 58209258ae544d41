package sqlexec

import "testing"

// TestPhantomCycleNeedsConfirming: a cycle is acted on only when an earlier pass saw
// the same transactions wait for each other; a pass in which one of them had ended
// (a new transaction of the same session), or in which an edge was missing, does not
// confirm it.
func TestPhantomCycleNeedsConfirming(t *testing.T) {
	a, b, c := NewSession(nil, nil), NewSession(nil, nil), NewSession(nil, nil)
	graph := func(txn map[*Session]uint64, edges ...[2]*Session) *waitGraph {
		g := &waitGraph{waits: map[*Session]map[*Session]bool{}, txn: txn}
		for _, e := range edges {
			if g.waits[e[0]] == nil {
				g.waits[e[0]] = map[*Session]bool{}
			}
			g.waits[e[0]][e[1]] = true
		}
		return g
	}
	same := map[*Session]uint64{a: 1, b: 7, c: 3}
	later := graph(same, [2]*Session{a, b}, [2]*Session{b, c}, [2]*Session{c, a})
	cycle := cycles(later.waits)
	if len(cycle) != 1 || len(cycle[0]) != 3 {
		t.Fatalf("cycles = %v, want one of three sessions", cycle)
	}
	for _, tc := range []struct {
		name    string
		earlier *waitGraph
		want    bool
	}{
		{"same transactions, same edges", graph(same, [2]*Session{a, b}, [2]*Session{b, c}, [2]*Session{c, a}), true},
		{"b's transaction ended in between", graph(map[*Session]uint64{a: 1, b: 6, c: 3}, [2]*Session{a, b}, [2]*Session{b, c}, [2]*Session{c, a}), false},
		{"c had no transaction", graph(map[*Session]uint64{a: 1, b: 7}, [2]*Session{a, b}, [2]*Session{b, c}, [2]*Session{c, a}), false},
		{"c did not wait for a", graph(same, [2]*Session{a, b}, [2]*Session{b, c}), false},
	} {
		if got := tc.earlier.saw(later, cycle[0]); got != tc.want {
			t.Errorf("%s: saw = %v, want %v", tc.name, got, tc.want)
		}
	}
}
