package proxysweep

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// TestGroupUsageCountsBusyThreads: a process group's CPU time and run delay grow
// while its threads compete for the CPUs, and the machine's idle share stays within
// its bounds.
func TestGroupUsageCountsBusyThreads(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("no /proc")
	}
	pgid := syscall.Getpgrp()
	before, err := groupUsage(pgid)
	if err != nil {
		t.Fatal(err)
	}
	idle0, tot0, err := machineTimes()
	if err != nil {
		t.Fatal(err)
	}
	// More busy goroutines than CPUs, for long enough that some wait for one.
	stop := time.Now().Add(300 * time.Millisecond)
	done := make(chan bool)
	for range 8 {
		go func() {
			n := 0
			for time.Now().Before(stop) {
				n++
			}
			done <- n > 0
		}()
	}
	for range 8 {
		<-done
	}
	after, err := groupUsage(pgid)
	if err != nil {
		t.Fatal(err)
	}
	if d := after.cpu - before.cpu; d < 100*time.Millisecond {
		t.Errorf("the group used %v of CPU while busy for 300ms", d)
	}
	if _, err := os.Stat("/proc/self/schedstat"); err == nil {
		if !after.runqOK || after.runq < before.runq {
			t.Errorf("run delay %v then %v (known: %v)", before.runq, after.runq, after.runqOK)
		}
	}
	idle1, tot1, err := machineTimes()
	if err != nil || tot1 <= tot0 || idle1 < idle0 || idle1-idle0 > tot1-tot0 {
		t.Errorf("machine times: idle %d -> %d, total %d -> %d (%v)", idle0, idle1, tot0, tot1, err)
	}
}
