package report

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// RunInfoName is the file a lab script writes into its run directory, beside the
// results CSV: what ran, from which commit, and how loaded the machine was.
const RunInfoName = "run.txt"

// BusyOtherShare is the share of the machine's CPU time that other work may take during
// a run before the report calls the machine busy. Above a tenth, other processes take a
// noticeable and varying slice of the cores the lab's server and load generator share,
// which shows up as differences between configurations that are not theirs.
const BusyOtherShare = 0.10

// ErrBadRunInfo is returned for a run.txt line that cannot be read.
var ErrBadRunInfo = errors.New("bad run.txt")

// RunInfo is what a lab script recorded about one run in its run.txt, a file of
// "key: value" lines (scripts/lib.sh writes it). A zero field was not recorded.
type RunInfo struct {
	RunID     string
	Command   string
	GitCommit string
	Started   string // UTC, RFC 3339
	Finished  string
	CPUs      int
	CPUModel  string
	// LoadStart and LoadEnd are the 1, 5 and 15 minute load averages when the run
	// started and ended; nil when not recorded.
	LoadStart, LoadEnd []float64
	// WallS is the run's length in seconds; MachineCPUS the CPU seconds the whole
	// machine was busy meanwhile (from /proc/stat, steal included); LabCPUS the CPU
	// seconds of the run's own processes. Zero WallS means not recorded.
	WallS, MachineCPUS, LabCPUS float64
}

// ReadRunInfo reads a run.txt file.
func ReadRunInfo(path string) (*RunInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := ParseRunInfo(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return info, nil
}

// ParseRunInfo reads run.txt's "key: value" lines. Unknown keys are ignored, so that
// newer scripts may record more; a known key with a value that does not parse is an
// error wrapping ErrBadRunInfo.
func ParseRunInfo(r io.Reader) (*RunInfo, error) {
	info := &RunInfo{}
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		var err error
		switch strings.TrimSpace(key) {
		case "run_id":
			info.RunID = value
		case "command":
			info.Command = value
		case "git_commit":
			info.GitCommit = value
		case "started":
			info.Started = value
		case "finished":
			info.Finished = value
		case "cpu_model":
			info.CPUModel = value
		case "cpus":
			info.CPUs, err = strconv.Atoi(value)
		case "loadavg_start":
			info.LoadStart, err = parseLoad(value)
		case "loadavg_end":
			info.LoadEnd, err = parseLoad(value)
		case "wall_s":
			info.WallS, err = strconv.ParseFloat(value, 64)
		case "machine_cpu_s":
			info.MachineCPUS, err = strconv.ParseFloat(value, 64)
		case "lab_cpu_s":
			info.LabCPUS, err = strconv.ParseFloat(value, 64)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %s: %v", ErrBadRunInfo, line, strings.TrimSpace(key), err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRunInfo, err)
	}
	return info, nil
}

// parseLoad parses three load averages, as /proc/loadavg starts.
func parseLoad(s string) ([]float64, error) {
	fields := strings.Fields(s)
	if len(fields) != 3 {
		return nil, fmt.Errorf("want three load averages, got %q", s)
	}
	out := make([]float64, 3)
	for i, f := range fields {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("bad load average %q", f)
		}
		out[i] = v
	}
	return out, nil
}

// OtherCPUs is the average number of CPUs that work other than the run's own took while
// it ran: the machine's busy CPU time minus the run's, over the run's length. ok is
// false when run.txt does not record the CPU times.
func (ri *RunInfo) OtherCPUs() (cpus float64, ok bool) {
	if ri == nil || ri.WallS <= 0 || ri.MachineCPUS <= 0 {
		return 0, false
	}
	return max(0, ri.MachineCPUS-ri.LabCPUS) / ri.WallS, true
}

// BusyReasons says why the machine counts as busy during the run, nil when it was
// quiet or nothing was recorded: a 1-minute load average above the CPU count when the
// run started (other work was queueing for the cores), or other work taking more than
// BusyOtherShare of the machine's CPU time during the run. The load average at the end
// is not a test: it counts the lab's own server and load generator, which keep every
// core busy by design.
func (ri *RunInfo) BusyReasons() []string {
	if ri == nil || ri.CPUs <= 0 {
		return nil
	}
	var why []string
	if len(ri.LoadStart) == 3 && ri.LoadStart[0] > float64(ri.CPUs) {
		why = append(why, fmt.Sprintf("the 1-minute load average was %.2f when the run started, above the %d CPUs", ri.LoadStart[0], ri.CPUs))
	}
	if other, ok := ri.OtherCPUs(); ok && other > BusyOtherShare*float64(ri.CPUs) {
		why = append(why, fmt.Sprintf("other processes used %.2f CPUs on average during the run, %.0f%% of the machine", other, 100*other/float64(ri.CPUs)))
	}
	return why
}
