package report

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/shardlab/shardlab/lab/resultscsv"
)

// defaultDataSize is loadgen's bytes of data per write, the only size
// scripts/run_scenario.sh runs.
const defaultDataSize = 100

// rerunCommand is how to run a run again.
type rerunCommand struct {
	Lines []string // shell lines, in order
	// Exact is false when the rows predate the columns that record what a run was asked
	// to do, so Lines are a best-effort guess.
	Exact bool
	// Verbatim is set when Lines is the command recorded in the rows.
	Verbatim bool
	Notes    []string // what the lines cannot reproduce
}

// isRecorded reports whether r carries what its run was asked to do: every row written
// since those columns exist asks for a request count or a duration.
func isRecorded(r resultscsv.Row) bool { return r.RequestedOps > 0 || r.RequestedDurationS > 0 }

// buildRerun works out the command that reruns rows (one run, in file order). When every
// row recorded the same script command line, that is the answer. Otherwise it writes one
// scripts/run_scenario.sh line per configuration from the row fields; when every
// configuration was measured over the same trials (as run_all_scenarios.sh and sweep.sh
// do), the lines sit in a loop over the trials, which keeps their interleaving; else
// there is one line per configuration, seed and run of consecutive trials.
func buildRerun(rows []resultscsv.Row) rerunCommand {
	if c := rows[0].Command; c != "" && !slices.ContainsFunc(rows, func(r resultscsv.Row) bool { return r.Command != c }) {
		return rerunCommand{Lines: []string{c}, Exact: true, Verbatim: true}
	}
	rc := rerunCommand{Exact: !slices.ContainsFunc(rows, func(r resultscsv.Row) bool { return !isRecorded(r) })}

	// Old rows: the request count asked for is unknown; the largest count a trial of the
	// configuration recorded comes closest.
	type config struct {
		scenario, mode string
		shards         int
		backend        string
	}
	maxOps := map[config]int64{}
	for _, r := range rows {
		k := config{r.Scenario, r.Mode, r.Shards, r.Backend}
		maxOps[k] = max(maxOps[k], r.Ops)
	}
	notes := map[string]bool{}
	note := func(s string) {
		if !notes[s] {
			notes[s] = true
			rc.Notes = append(rc.Notes, s)
		}
	}
	// args renders r's options except the seed and the trial numbering.
	args := func(r resultscsv.Row) string {
		a := []string{"scripts/run_scenario.sh", "--scenario", shellQuote(r.Scenario)}
		switch {
		case r.RequestedDurationS > 0:
			a = append(a, "--duration", seconds(r.RequestedDurationS))
		case r.RequestedOps > 0:
			a = append(a, "--ops", strconv.FormatInt(r.RequestedOps, 10))
		default:
			a = append(a, "--ops", strconv.FormatInt(maxOps[config{r.Scenario, r.Mode, r.Shards, r.Backend}], 10))
		}
		shards := r.Shards
		if r.Mode == "single" {
			shards = 1
		} else if shards == 1 {
			note("run_scenario.sh runs --shards 1 as single mode: a sharded x1 configuration cannot be rerun with it.")
		}
		a = append(a, "--concurrency", strconv.Itoa(r.Concurrency),
			"--writeRatio", strconv.FormatFloat(r.WriteRatio, 'f', -1, 64),
			"--keys", strconv.Itoa(r.Keys), "--dist", shellQuote(r.Dist), "--shards", strconv.Itoa(shards))
		if r.Preload {
			a = append(a, "--preload")
		}
		if r.WarmupS > 0 {
			a = append(a, "--warmup", seconds(r.WarmupS))
		}
		if r.Rate > 0 {
			a = append(a, "--rate", strconv.FormatFloat(r.Rate, 'f', -1, 64))
			if r.Arrival != "" {
				a = append(a, "--arrival", shellQuote(r.Arrival))
			}
		}
		if r.Sync != "" {
			a = append(a, "--sync", shellQuote(r.Sync))
		}
		if r.Router != "" {
			a = append(a, "--router", shellQuote(r.Router))
		}
		if r.Backend != "" {
			a = append(a, "--backend", shellQuote(r.Backend))
		}
		if r.Backend == "postgres" {
			a = append(a, `--dsn "$SHARDLAB_PG_DSN"`, "--create")
			note("The rows do not record PostgreSQL DSNs: the lines use SHARDLAB_PG_DSN with --create, as run_all_scenarios.sh does.")
		}
		if r.DataSize != 0 && r.DataSize != defaultDataSize {
			note(fmt.Sprintf("Writes carried %d bytes of data; run_scenario.sh has no option for that and writes %d.", r.DataSize, defaultDataSize))
		}
		return strings.Join(a, " ")
	}

	// Configurations in order of first appearance, with their trials and seeds.
	var order []string
	trials := map[string][]int{}
	seeds := map[string]map[int64]bool{}
	seedIsTrial := map[string]bool{}
	for _, r := range rows {
		a := args(r)
		if _, ok := trials[a]; !ok {
			order = append(order, a)
			seeds[a] = map[int64]bool{}
			seedIsTrial[a] = true
		}
		trials[a] = append(trials[a], r.Trial)
		seeds[a][r.Seed] = true
		seedIsTrial[a] = seedIsTrial[a] && r.Seed == int64(r.Trial)
	}
	// A loop over the trials reproduces the interleaving when every configuration ran
	// the same trials, each at seed = trial or all at one seed.
	loop := len(trials[order[0]]) > 1
	for _, a := range order {
		slices.Sort(trials[a])
		loop = loop && slices.Equal(trials[a], trials[order[0]]) && !hasDuplicates(trials[a]) &&
			(seedIsTrial[a] || len(seeds[a]) == 1)
	}
	runID := ""
	if len(rows) > 1 {
		runID = ` --run-id "$run_id"`
		rc.Lines = append(rc.Lines, "run_id=rerun-$(date -u +%Y%m%dT%H%M%SZ)")
	}
	if loop {
		nums := make([]string, len(trials[order[0]]))
		for i, t := range trials[order[0]] {
			nums[i] = strconv.Itoa(t)
		}
		rc.Lines = append(rc.Lines, "for trial in "+strings.Join(nums, " ")+"; do")
		for _, a := range order {
			seed := `"$trial"`
			if !seedIsTrial[a] {
				for s := range seeds[a] {
					seed = strconv.FormatInt(s, 10)
				}
			}
			rc.Lines = append(rc.Lines, "\t"+a+" --seed "+seed+` --first-trial "$trial"`+runID)
		}
		rc.Lines = append(rc.Lines, "done")
		return rc
	}
	// Otherwise one line per configuration, seed and consecutive trials; run_scenario.sh
	// repeats a trial with the same seed.
	type group struct {
		args  string
		seed  int64
		trial []int
	}
	var groups []*group
	index := map[string]*group{}
	for _, r := range rows {
		k := fmt.Sprintf("%s\x00%d", args(r), r.Seed)
		g := index[k]
		if g == nil {
			g = &group{args: args(r), seed: r.Seed}
			index[k] = g
			groups = append(groups, g)
		}
		g.trial = append(g.trial, r.Trial)
	}
	for _, g := range groups {
		slices.Sort(g.trial)
		for i := 0; i < len(g.trial); {
			j := i + 1
			for j < len(g.trial) && g.trial[j] == g.trial[j-1]+1 {
				j++
			}
			line := fmt.Sprintf("%s --seed %d", g.args, g.seed)
			if first := g.trial[i]; first > 1 {
				line += fmt.Sprintf(" --first-trial %d", first)
			}
			if n := j - i; n > 1 {
				line += fmt.Sprintf(" --trials %d", n)
			}
			rc.Lines = append(rc.Lines, line+runID)
			i = j
		}
	}
	return rc
}

func hasDuplicates(sorted []int) bool {
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return true
		}
	}
	return false
}

// seconds renders a duration in seconds as run_scenario.sh takes it: "30s", "0.5s".
func seconds(s float64) string { return strconv.FormatFloat(s, 'f', -1, 64) + "s" }

// shellQuote quotes s for a POSIX shell unless it is made of safe characters only; the
// values come from a CSV, which anybody may have edited.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_.,:/=+-", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
