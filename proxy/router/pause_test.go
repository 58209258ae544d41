package router

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardlab/shardlab/sqlplan"
)

// TestPauseGenerations: a RESUME wakes a PAUSE that waits (ErrNotPaused), and a PAUSE
// that gives up later never lifts a pause that began after it.
func TestPauseGenerations(t *testing.T) {
	r := &Router{}
	if _, _, err := r.pause.enter(context.Background(), nil, time.Second, true); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	first := make(chan error, 1)
	go func() { first <- r.Pause(ctx) }()
	for paused, _ := r.Paused(); !paused; paused, _ = r.Paused() {
		time.Sleep(time.Millisecond)
	}
	if err := r.Resume(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-first:
		if !errors.Is(err, ErrNotPaused) {
			t.Errorf("the PAUSE a RESUME ended: %v, want ErrNotPaused", err)
		}
	case <-time.After(200 * time.Millisecond):
		t.Fatal("RESUME did not wake the PAUSE waiting for a unit of work")
	}
	// A second pause, while the unit is still in progress, that gives up by itself.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if err := r.Pause(ctx2); err == nil {
		t.Fatal("a PAUSE with a unit in progress succeeded")
	}
	if paused, active := r.Paused(); paused || active != 1 {
		t.Errorf("after a PAUSE gave up: paused %v, %d active", paused, active)
	}
	r.pause.leave(0)
	if err := r.Pause(context.Background()); err != nil {
		t.Fatalf("PAUSE with nothing in progress: %v", err)
	}
	if err := r.Pause(context.Background()); !errors.Is(err, ErrPaused) {
		t.Errorf("a second PAUSE: %v", err)
	}
	if err := r.Resume(); err != nil {
		t.Fatal(err)
	}
}

// TestPauseTablesPasses: while some tables are paused, a new unit passes (the pause
// does not wait for it); when the pause ends, the passing units become ordinary ones,
// which the next pause waits for; a unit that waits in enter without mayPass waits
// for the end of the pause; UnitsEnded waits for units of both kinds.
func TestPauseTablesPasses(t *testing.T) {
	r := &Router{}
	ctx := context.Background()
	if _, _, err := r.pause.enter(ctx, nil, time.Second, true); err != nil {
		t.Fatal(err)
	}
	moving := func(table string) bool { return table == "t" }
	paused := make(chan error, 1)
	go func() { paused <- r.PauseTables(ctx, moving) }()
	for p, _ := r.Paused(); !p; p, _ = r.Paused() {
		time.Sleep(time.Millisecond)
	}
	m, gen, ok := r.pause.tryEnter(true)
	if !ok || m == nil || gen == 0 || !m("t") || m("d") {
		t.Fatalf("a new unit while t is paused: admitted %v, passing pause %d", ok, gen)
	}
	if p, active := r.Paused(); !p || active != 1 {
		t.Errorf("paused %v with %d units waited for, want the one that began before the pause", p, active)
	}
	if _, _, err := r.pause.enter(ctx, nil, 20*time.Millisecond, false); err == nil {
		t.Error("a unit that may not pass entered during the pause")
	}
	select {
	case err := <-paused:
		t.Fatalf("the pause ended its wait with a unit of before it in progress: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	r.pause.leave(0)
	if err := <-paused; err != nil {
		t.Fatalf("the pause, once the unit of before it ended: %v", err)
	}
	ended := r.UnitsEnded()
	select {
	case <-ended:
		t.Fatal("UnitsEnded with a passing unit in progress")
	default:
	}
	if !r.pause.stillPasses(gen) {
		t.Error("the passing unit does not pass the pause in force")
	}
	if err := r.Resume(); err != nil {
		t.Fatal(err)
	}
	if r.pause.stillPasses(gen) {
		t.Error("a unit passes a pause that ended")
	}
	if _, active := r.Paused(); active != 1 {
		t.Errorf("after the pause: %d units, want the one that passed it", active)
	}
	// The next pause waits for the unit that passed the last one.
	ctx2, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := r.PauseTables(ctx2, moving); err == nil {
		t.Error("a pause began with a unit in progress that passed the last one")
	}
	r.pause.leave(gen)
	select {
	case <-ended:
	case <-time.After(time.Second):
		t.Fatal("UnitsEnded did not end once the last unit left")
	}
	if p, active := r.Paused(); p || active != 0 {
		t.Errorf("at the end: paused %v, %d units", p, active)
	}
}

// TestTouches: a plan of SELECT, INSERT, UPDATE or DELETE touches the tables it
// names; one of the session alone touches none; every other kind, and a statement that
// may keep its server connection, counts as touching.
func TestTouches(t *testing.T) {
	moving := func(table string) bool { return table == "t" }
	for _, c := range []struct {
		plan *sqlplan.Plan
		want bool
	}{
		{&sqlplan.Plan{Kind: sqlplan.KindSelect, Tables: []string{"d", "t"}}, true},
		{&sqlplan.Plan{Kind: sqlplan.KindSelect, Tables: []string{"d"}}, false},
		{&sqlplan.Plan{Kind: sqlplan.KindSet}, false},
		{&sqlplan.Plan{Kind: sqlplan.KindPassthrough}, true},
		{&sqlplan.Plan{Kind: sqlplan.KindDDL, Unparsed: true}, true},
		{&sqlplan.Plan{Kind: sqlplan.KindDDL}, true},
		{&sqlplan.Plan{Kind: sqlplan.KindCopy, Tables: []string{"d"}}, true},
		{&sqlplan.Plan{Kind: sqlplan.KindCopy}, true},
		{&sqlplan.Plan{Kind: sqlplan.KindLock}, true},
		{&sqlplan.Plan{Kind: sqlplan.KindListen}, true},
		{&sqlplan.Plan{Kind: sqlplan.KindExplain, Tables: []string{"d"}}, true},
		{&sqlplan.Plan{Kind: sqlplan.KindSelect, Tables: []string{"d"}, Session: sqlplan.EffectBinds}, true},
		{&sqlplan.Plan{Kind: sqlplan.KindSelect, Tables: []string{"d"}, OwnText: true}, true},
		{&sqlplan.Plan{Kind: sqlplan.KindSelect, Tables: []string{"d"}, Session: sqlplan.EffectSetConfig}, false},
		{&sqlplan.Plan{Kind: sqlplan.KindTransaction, Tx: sqlplan.TxCommit}, false},
		{&sqlplan.Plan{Kind: sqlplan.KindTransaction, Tx: sqlplan.TxPrepare}, true},
		{&sqlplan.Plan{Kind: sqlplan.KindInsert, Tables: []string{"d"}}, false},
	} {
		if got := touches(moving, c.plan); got != c.want {
			t.Errorf("touches(%v of %v) = %v, want %v", c.plan.Kind, c.plan.Tables, got, c.want)
		}
	}
}
