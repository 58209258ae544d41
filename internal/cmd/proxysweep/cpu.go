package proxysweep

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// clockTicks is the unit of the CPU times in /proc/PID/stat (USER_HZ), 100 on Linux.
const clockTicks = 100

// usage is what a service's processes have used so far.
type usage struct {
	cpu time.Duration // user and system time, every thread, ended ones included
	// runq holds each live thread's run delay (the time it was runnable but waited
	// for a CPU, /proc/PID/task/TID/schedstat), by "PID/TID"; nil when the kernel
	// does not keep it. Ended threads take theirs with them, so two readings are
	// compared thread by thread (runDelaySince).
	runq map[string]time.Duration
}

// groupUsage returns the usage so far of the live processes of process group pgid,
// from /proc. A service runs in a group of its own (startService), so this counts
// pgbouncer under runuser as well as the proxy.
func groupUsage(pgid int) (usage, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return usage{}, err
	}
	u := usage{runq: map[string]time.Duration{}}
	var ticks int64
	found, kept := false, true
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the process ended in between
		}
		// The fields after the command name, which is in parentheses and may hold
		// anything: state, ppid, pgrp, ... utime (14th of the line), stime (15th).
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 13 {
			continue
		}
		if g, err := strconv.Atoi(string(f[2])); err != nil || g != pgid {
			continue
		}
		ut, err1 := strconv.ParseInt(string(f[11]), 10, 64)
		st, err2 := strconv.ParseInt(string(f[12]), 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		ticks += ut + st
		found = true
		dir := filepath.Dir(path)
		if err := runDelays(dir, filepath.Base(dir)+"/", u.runq); err != nil && !errors.Is(err, os.ErrNotExist) {
			kept = false
		}
	}
	if !found {
		return usage{}, os.ErrNotExist
	}
	u.cpu = time.Duration(ticks) * time.Second / clockTicks
	if !kept {
		u.runq = nil
	}
	return u, nil
}

// runDelays adds to m the run delay of every thread of the process whose /proc
// directory is dir (the second field of each task's schedstat, in nanoseconds), keyed
// by prefix and the thread id. A process or thread that ended in between is skipped;
// an error means the kernel keeps no schedstat (os.ErrNotExist: the process ended).
func runDelays(dir, prefix string, m map[string]time.Duration) error {
	tasks, err := filepath.Glob(filepath.Join(dir, "task", "[0-9]*", "schedstat"))
	if err != nil {
		return err
	}
	if len(tasks) == 0 {
		if _, err := os.Stat(dir); err != nil {
			return os.ErrNotExist
		}
		return errors.New("no schedstat")
	}
	for _, path := range tasks {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the thread ended in between
		}
		f := bytes.Fields(b)
		if len(f) < 2 {
			return fmt.Errorf("%s: %q", path, b)
		}
		ns, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		m[prefix+filepath.Base(filepath.Dir(path))] = time.Duration(ns)
	}
	return nil
}

// runDelaySince is the run delay the threads of end accrued since start: for each
// thread the growth of its own count, from 0 for a thread that started in between.
// Threads that ended in between are missing from end, and so is their wait.
func runDelaySince(start, end map[string]time.Duration) time.Duration {
	var sum time.Duration
	for k, v := range end {
		sum += max(0, v-start[k])
	}
	return sum
}

// machineTimes returns the machine's idle and total CPU time so far, in clock ticks,
// from the first line of /proc/stat (idle counts iowait too).
func machineTimes() (idle, total int64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 6 || string(f[0]) != "cpu" {
		return 0, 0, errors.New("/proc/stat: no cpu line")
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return 0, 0, err
		}
		if i == 3 || i == 4 {
			idle += n
		}
		if i < 8 { // user ... steal; guest time is counted in user already
			total += n
		}
	}
	return idle, total, nil
}

// cpuMeter measures a service's CPU time and run delay, and the machine's idle share,
// over a client run's measured part.
type cpuMeter struct {
	pgid  int // 0: no service (a direct run); the machine is measured all the same
	mu    sync.Mutex
	start usage
	ok    bool
	idle0 int64
	tot0  int64
	mok   bool
	timer *time.Timer
}

func (v *service) cpuMeter() *cpuMeter {
	if v == nil || v.cmd.Process == nil {
		return &cpuMeter{}
	}
	return &cpuMeter{pgid: v.cmd.Process.Pid}
}

// startAfter takes the starting reading once the client's warm-up d has passed.
func (c *cpuMeter) startAfter(d time.Duration) {
	read := func() {
		var u usage
		var err error
		if c.pgid != 0 {
			u, err = groupUsage(c.pgid)
		}
		idle, tot, merr := machineTimes()
		c.mu.Lock()
		c.start, c.ok = u, c.pgid != 0 && err == nil
		c.idle0, c.tot0, c.mok = idle, tot, merr == nil
		c.mu.Unlock()
	}
	if d <= 0 {
		read()
		return
	}
	c.timer = time.AfterFunc(d, read)
}

// meterReading is what a cpuMeter measured; NaN where it could not.
type meterReading struct {
	cpuPerTx  float64 // the service's CPU time, µs per transaction
	runqPerTx float64 // its threads' run delay, µs per transaction
	idlePct   float64 // the machine's idle share of its CPU time, percent
}

// read returns what was used since the start, per transaction where it applies.
func (c *cpuMeter) read(txs float64) meterReading {
	r := meterReading{math.NaN(), math.NaN(), math.NaN()}
	if c.timer != nil {
		c.timer.Stop()
	}
	var end usage
	var err error = os.ErrNotExist
	if c.pgid != 0 {
		end, err = groupUsage(c.pgid)
	}
	idle, tot, merr := machineTimes()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mok && merr == nil && tot > c.tot0 {
		r.idlePct = 100 * float64(idle-c.idle0) / float64(tot-c.tot0)
	}
	if err != nil || !c.ok || txs <= 0 {
		return r
	}
	r.cpuPerTx = float64(end.cpu-c.start.cpu) / float64(time.Microsecond) / txs
	if end.runq != nil && c.start.runq != nil {
		r.runqPerTx = float64(runDelaySince(c.start.runq, end.runq)) / float64(time.Microsecond) / txs
	}
	return r
}

func cpuField(x float64) string {
	if math.IsNaN(x) {
		return ""
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}
