package proxysweep

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// clockTicks is the unit of the CPU times in /proc/PID/stat (USER_HZ), 100 on Linux.
const clockTicks = 100

// groupCPU returns the CPU time (user and system, every thread) used so far by the
// live processes of process group pgid, from /proc. A service runs in a group of its
// own (startService), so this counts pgbouncer under runuser as well as the proxy.
func groupCPU(pgid int) (time.Duration, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return 0, err
	}
	var ticks int64
	found := false
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
	}
	if !found {
		return 0, os.ErrNotExist
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// cpuMeter measures a service's CPU time over a client run's measured part.
type cpuMeter struct {
	pgid  int // 0: nothing to measure (a direct run)
	mu    sync.Mutex
	start time.Duration
	ok    bool
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
	if c.pgid == 0 {
		return
	}
	read := func() {
		t, err := groupCPU(c.pgid)
		c.mu.Lock()
		c.start, c.ok = t, err == nil
		c.mu.Unlock()
	}
	if d <= 0 {
		read()
		return
	}
	c.timer = time.AfterFunc(d, read)
}

// perTx returns the CPU time since the start, in microseconds per transaction; NaN
// when there is nothing to measure or no transaction.
func (c *cpuMeter) perTx(txs float64) float64 {
	if c.pgid == 0 {
		return math.NaN()
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	end, err := groupCPU(c.pgid)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || !c.ok || txs <= 0 {
		return math.NaN()
	}
	return float64(end-c.start) / float64(time.Microsecond) / txs
}

func cpuField(x float64) string {
	if math.IsNaN(x) {
		return ""
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}
