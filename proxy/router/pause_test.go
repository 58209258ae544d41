package router

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestPauseGenerations: a RESUME wakes a PAUSE that waits (ErrNotPaused), and a PAUSE
// that gives up later never lifts a pause that began after it.
func TestPauseGenerations(t *testing.T) {
	r := &Router{}
	if err := r.pause.enter(context.Background(), nil, time.Second); err != nil {
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
	r.pause.leave()
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
