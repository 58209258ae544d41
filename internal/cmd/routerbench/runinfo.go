package routerbench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/shardlab/shardlab/lab/report"
)

// The run directory's run.txt records what ran, from which commit, and how loaded the
// machine was, in the lab scripts' format (report.RunInfo reads it; scripts/promote.sh
// requires its command and finished lines). It does not record CPU times: the
// PostgreSQL server's backends do this benchmark's work, so "other processes" could not
// be told apart from the run itself.

// startRunInfo writes run.txt's head and returns when the run started.
func startRunInfo(cfg Config) (time.Time, error) {
	now := time.Now()
	command := cfg.Command
	if command == "" {
		command = strings.Join(append([]string{"routerbench"}, os.Args[1:]...), " ")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "run_id: %s\n", filepath.Base(cfg.Out))
	fmt.Fprintf(&b, "command: %s\n", command)
	fmt.Fprintf(&b, "git_commit: %s\n", gitCommit())
	fmt.Fprintf(&b, "started: %s\n", now.UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "cpus: %d\n", runtime.NumCPU())
	fmt.Fprintf(&b, "cpu_model: %s\n", cpuModel())
	fmt.Fprintf(&b, "go: %s\n", runtime.Version())
	fmt.Fprintf(&b, "loadavg_start: %s\n", loadavg())
	return now, os.WriteFile(filepath.Join(cfg.Out, report.RunInfoName), []byte(b.String()), 0o644)
}

// finishRunInfo appends the end of the run to run.txt.
func finishRunInfo(cfg Config, started time.Time) error {
	f, err := os.OpenFile(filepath.Join(cfg.Out, report.RunInfoName), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "finished: %s\nloadavg_end: %s\nwall_s: %.2f\n",
		time.Now().UTC().Format(time.RFC3339), loadavg(), time.Since(started).Seconds())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// readRunInfo reads the run's run.txt; nil when it cannot.
func readRunInfo(cfg Config) *report.RunInfo {
	info, err := report.ReadRunInfo(filepath.Join(cfg.Out, report.RunInfoName))
	if err != nil {
		return nil
	}
	return info
}

// gitCommit is the commit the binary was built from, as the go command stamped it, or
// else the commit of the git checkout it runs in (as the lab scripts record it), with
// "-dirty" when tracked files outside results/ had changes; "unknown" when neither
// says.
func gitCommit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" {
			if len(rev) > 12 {
				rev = rev[:12]
			}
			if dirty {
				rev += "-dirty"
			}
			return rev
		}
	}
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	rev := strings.TrimSpace(string(out))
	status, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results").Output()
	if err == nil && len(strings.TrimSpace(string(status))) > 0 {
		rev += "-dirty"
	}
	return rev
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}
