package proxysweep

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRunDelays reads the second field of each thread's schedstat, skips nothing
// it should keep, and compares two readings thread by thread: an ended thread's wait
// is not subtracted, and a new thread counts from zero.
func TestRunDelays(t *testing.T) {
	dir := t.TempDir()
	for tid, line := range map[string]string{"10": "111 222 3\n", "11": "5 7000 1\n"} {
		if err := os.MkdirAll(filepath.Join(dir, "task", tid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "task", tid, "schedstat"), []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m := map[string]time.Duration{}
	if err := runDelays(dir, "9/", m); err != nil {
		t.Fatal(err)
	}
	if m["9/10"] != 222 || m["9/11"] != 7000 || len(m) != 2 {
		t.Fatalf("run delays %v, want 9/10: 222ns, 9/11: 7µs", m)
	}
	// Thread 11 ended, 12 started, 10 waited 100ns more.
	end := map[string]time.Duration{"9/10": 322, "9/12": 50}
	if got := runDelaySince(m, end); got != 150 {
		t.Errorf("run delay since: %v, want 150ns", got)
	}
	if err := runDelays(filepath.Join(dir, "gone"), "", m); !os.IsNotExist(err) {
		t.Errorf("a process that ended: %v, want not exist", err)
	}
	bad := t.TempDir()
	os.MkdirAll(filepath.Join(bad, "task", "1"), 0o755)
	os.WriteFile(filepath.Join(bad, "task", "1", "schedstat"), []byte("x\n"), 0o644)
	if err := runDelays(bad, "", m); err == nil {
		t.Error("a malformed schedstat was read")
	}
}

// TestMachineTimesAndOwnThreads: this process's threads are found with their run
// delays, and the machine's idle time grows no faster than its total.
func TestMachineTimesAndOwnThreads(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("no /proc")
	}
	idle0, tot0, err := machineTimes()
	if err != nil {
		t.Fatal(err)
	}
	stop := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(stop) {
	}
	idle1, tot1, err := machineTimes()
	if err != nil || tot1 <= tot0 || idle1 < idle0 || idle1-idle0 > tot1-tot0 {
		t.Errorf("machine times: idle %d -> %d, total %d -> %d (%v)", idle0, idle1, tot0, tot1, err)
	}
	if _, err := os.Stat("/proc/self/schedstat"); err != nil {
		t.Skip("the kernel keeps no schedstat")
	}
	m := map[string]time.Duration{}
	self, err := os.Readlink("/proc/self")
	if err != nil {
		t.Fatal(err)
	}
	if err := runDelays(filepath.Join("/proc", self), "", m); err != nil {
		t.Fatal(err)
	}
	tasks, _ := filepath.Glob("/proc/self/task/[0-9]*")
	if len(m) == 0 || len(m) > len(tasks)+8 {
		t.Errorf("%d threads read, /proc lists %d", len(m), len(tasks))
	}
}
