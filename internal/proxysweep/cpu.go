package proxysweep

import (
	"bytes"
	"errors"
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
	cpu time.Duration // user and system time, every thread
	// runq is the time its threads were runnable but waited for a CPU (the
	// scheduler's run delay, /proc/PID/task/TID/schedstat); runqOK is false when the
	// kernel does not keep it.
	runq   time.Duration
	runqOK bool
}

// groupUsage returns the usage so far of the live processes of process group pgid,
// from /proc. A service runs in a group of its own (startService), so this counts
// pgbouncer under runuser as well as the proxy.
func groupUsage(pgid int) (usage, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return usage{}, err
	}
	var u usage
	var ticks int64
	found := false
	u.runqOK = true
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
		wait, ok := runDelay(filepath.Dir(path))
		u.runq += wait
		u.runqOK = u.runqOK && ok
	}
	if !found {
		return usage{}, os.ErrNotExist
	}
	u.cpu = time.Duration(ticks) * time.Second / clockTicks
	return u, nil
}

// runDelay sums the run delay of every thread of the process whose /proc directory is
// dir: the second field of each task's schedstat, in nanoseconds.
func runDelay(dir string) (time.Duration, bool) {
	tasks, err := filepath.Glob(filepath.Join(dir, "task", "[0-9]*", "schedstat"))
	if err != nil || len(tasks) == 0 {
		return 0, false
	}
	var sum time.Duration
	for _, path := range tasks {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the thread ended in between
		}
		f := bytes.Fields(b)
		if len(f) < 2 {
			return 0, false
		}
		ns, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil {
			return 0, false
		}
		sum += time.Duration(ns)
	}
	return sum, true
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
	if end.runqOK && c.start.runqOK {
		r.runqPerTx = float64(end.runq-c.start.runq) / float64(time.Microsecond) / txs
	}
	return r
}

func cpuField(x float64) string {
	if math.IsNaN(x) {
		return ""
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}
