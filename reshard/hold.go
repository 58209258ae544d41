package reshard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/rules"
)

// The phases a layout record names.
const (
	phaseDone      = "done"      // the layout serves alone
	phaseCutover   = "cutover"   // a move was cut over, and not finished or reverted
	phaseFinishing = "finishing" // a finish began: the move can no longer be reverted
	phaseReverting = "reverting" // a move was reverted, and what it made is being removed
)

// phaseRank orders the phases one version passes through, so that where a step
// stopped part way (its record written on some data sources only) the later one wins.
func phaseRank(phase string) int {
	switch phase {
	case phaseCutover:
		return 1
	case phaseFinishing:
		return 2
	case phaseReverting:
		return 3
	}
	return 0
}

// hold is the pause in which a cutover, or a revert, switches a deployment from one
// layout to the other: the proxy holds new transactions, those in flight end, the new
// record is written on every data source (the fence refuses the writes of processes
// that route by the other layout from then on), the streams' destinations apply every
// change their sources committed, the streams stop, and the proxy switches and lets
// the held transactions go on.
type hold struct {
	// from and to are the layouts of the move (a revert's too): every data source of
	// either gets the record.
	from, to *rules.Compiled
	px       Proxy        // nil: no proxy
	sw       func() error // switches the proxy, once paused
	streams  []stream     // caught up and stopped in the hold
	prior    *Record      // written back where the hold gives up
	next     *Record      // the record the hold writes
	opts     CutoverOptions
	gaveUp   error  // wrapped in the error of a hold that gave up
	name     string // "cutover" or "revert"
	// stopped runs once the streams stopped, before the proxy switches, calling step
	// with each of its steps' names as each ends; an error gives the hold up.
	// undoStopped undoes it when the hold gives up, before the streams start again.
	stopped     func(ctx context.Context, conns map[string]*pgx.Conn, step func(string)) error
	undoStopped func(ctx context.Context, conns map[string]*pgx.Conn) error
	// undoFailed reports, after a hold that gave up, that putting things back failed.
	undoFailed bool
}

// run makes the hold. switched reports whether the proxy switched (then a failure is
// only that the pause did not lift). A step that fails or overruns its bound gives the
// hold up: the records written are put back, the streams started again, the proxy
// resumed on the layout it had, and the error wraps h.gaveUp.
func (h *hold) run(ctx context.Context, conns map[string]*pgx.Conn, rep *CutoverReport) (switched bool, err error) {
	held := time.Now()
	resume := func() error { return nil }
	if h.px != nil {
		dctx, stop := context.WithTimeout(ctx, h.opts.Drain)
		resume, err = h.px.Pause(dctx)
		stop()
		if err != nil {
			return false, fmt.Errorf("%w: the transactions in flight did not end within %v: %v", h.gaveUp, h.opts.Drain, err)
		}
	}
	rep.Drain = time.Since(held)
	fmt.Fprintf(h.opts.Progress, "reshard: new transactions held; those in flight ended in %v\n", rep.Drain.Round(time.Microsecond))
	fail := func(step string, err error, undo ...func() error) (bool, error) {
		for _, u := range undo {
			if uerr := u(); uerr != nil {
				err = errors.Join(err, uerr)
				h.undoFailed = true
			}
		}
		if rerr := resume(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return false, fmt.Errorf("%w: %s: %v", h.gaveUp, step, err)
	}
	// The undo runs on connections of its own: a step cut short by its bound closes
	// the connection its statement was on.
	undoOn := func(fn func(ctx context.Context, conns map[string]*pgx.Conn) error) error {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		fresh, err := connectAll(uctx, h.from, h.to)
		if err != nil {
			return err
		}
		defer closeAll(fresh)
		return fn(uctx, fresh)
	}
	var written []string
	restore := func() error {
		return undoOn(func(uctx context.Context, fresh map[string]*pgx.Conn) error {
			var errs []error
			for _, ds := range written {
				errs = append(errs, writeRecord(uctx, fresh[ds], h.prior))
			}
			return errors.Join(errs...)
		})
	}
	restart := func() error {
		return undoOn(func(uctx context.Context, fresh map[string]*pgx.Conn) error {
			return startStreams(uctx, h.streams, fresh)
		})
	}

	t := time.Now()
	last := t
	step := func(name string) {
		rep.Steps = append(rep.Steps, Step{name, time.Since(last)})
		last = time.Now()
	}
	// A comparison in the hold (CutoverOptions.Verify) has a bound of its own, on top:
	// the steps after it must not find their bound spent by it.
	cctx, stop := context.WithTimeout(ctx, h.opts.CatchUp+max(h.opts.Verify, 0))
	defer stop()
	// A transaction prepared for two-phase commit and not yet committed would commit
	// its changes after the streams stop: the hold waits for none to be left.
	if err := noPrepared(cctx, h.streams, conns); err != nil {
		return fail("waiting for prepared transactions", err)
	}
	// The new record first, switching: from then on the fence refuses every write of
	// a process that says its layout, those routed by either layout (writeRecord waits
	// for those that passed the fence), so the catch-up below carries every write the
	// layout in force took, and no process writes on the new one before the streams
	// stopped (a process left over from an earlier switch to it, say).
	switching := *h.next
	switching.Switching = true
	// Listed before they are written: a commit whose answer was lost may have landed.
	written = allDataSources(h.from, h.to)
	if err := recordOn(cctx, written, conns, &switching); err != nil {
		return fail("recording the layout", err, restore)
	}
	step("prepared_and_switching_record")
	crashPoint(h.name + "-switching")
	if h.opts.crashAfterRecord {
		return false, errCrashed // a test's kill -9: nothing undone, nothing resumed
	}
	undoStopped := func() error {
		if h.undoStopped == nil {
			return nil
		}
		return undoOn(h.undoStopped)
	}
	err = catchUp(cctx, h.streams, conns)
	if err == nil {
		step("streams_caught_up")
		err = stopStreams(cctx, h.streams, conns)
	}
	if err == nil {
		step("streams_stopped")
		if h.stopped != nil {
			err = h.stopped(cctx, conns, step)
		}
	}
	if err != nil {
		return fail("catching up", err, restore, undoStopped, restart)
	}
	crashPoint(h.name + "-stopped")
	// Then the record itself: the processes of the new layout write from here.
	if err := recordOn(cctx, allDataSources(h.from, h.to), conns, h.next); err != nil {
		return fail("recording the layout", err, restore, undoStopped, restart)
	}
	step("final_record")
	crashPoint(h.name + "-final")
	rep.CatchUp = time.Since(t)
	fmt.Fprintf(h.opts.Progress, "reshard: layout recorded; the destinations applied every change and the streams stopped in %v\n", rep.CatchUp.Round(time.Microsecond))

	t = time.Now()
	if err := h.sw(); err != nil {
		return fail("switching the proxy", err, restore, undoStopped, restart)
	}
	rep.Switch = time.Since(t)
	if err := resume(); err != nil {
		return true, fmt.Errorf("reshard: the layout switched, but the pause did not lift: %w", err)
	}
	rep.Pause = time.Since(held)
	fmt.Fprintf(h.opts.Progress, "reshard: layout version %d in force; held transactions went on after %v\n", h.next.Version, rep.Pause.Round(time.Microsecond))
	return true, nil
}

// recordOn writes rec on the data sources names, side by side.
func recordOn(ctx context.Context, names []string, conns map[string]*pgx.Conn, rec *Record) error {
	return eachDataSource(ctx, names, func(ctx context.Context, ds string) error {
		if err := writeRecord(ctx, conns[ds], rec); err != nil {
			return fmt.Errorf("data source %s: %w", ds, err)
		}
		return nil
	})
}

// withDefaults fills in the bounds and the writer that o leaves out.
func (o CutoverOptions) withDefaults() CutoverOptions {
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Drain <= 0 {
		o.Drain = DefaultDrain
	}
	if o.CatchUp <= 0 {
		o.CatchUp = DefaultCatchUp
	}
	return o
}

// openMove connects to every data source of both layouts, checks that they are the
// move's, and reads the layout record in force (nil: none). The caller closes the
// connections.
func openMove(ctx context.Context, from, to *rules.Compiled) (map[string]*pgx.Conn, *Record, error) {
	conns, err := connectAll(ctx, from, to)
	if err != nil {
		return nil, nil, err
	}
	cur, err := checkedRecord(ctx, from, to, conns)
	if err != nil {
		closeAll(conns)
		return nil, nil, err
	}
	return conns, cur, nil
}

func checkedRecord(ctx context.Context, from, to *rules.Compiled, conns map[string]*pgx.Conn) (*Record, error) {
	if err := checkMove(ctx, from, to, conns); err != nil {
		return nil, err
	}
	return currentRecord(ctx, from, to, conns)
}
