package report

import (
	"fmt"
	"strings"
)

// The scenarios of scripts/scenarios.conf that the seed's lessons are read from.
const (
	ScenarioReadHeavy       = "read_heavy_cachelike"
	ScenarioReadOneConn     = "read_heavy_one_conn"
	ScenarioReadRollback    = "read_heavy_rollback"
	ScenarioWriteIngest     = "write_heavy_ingest"
	ScenarioWriteSyncFull   = "write_sync_full"
	ScenarioWriteGroup      = "write_sync_full_group"
	ScenarioShardScaling    = "shard_scaling_base"
	seedReadGain            = "+95% with 3 shards"
	seedWriteGain           = "+8% with 3 shards"
	seedScalingObservation  = "5 shards slower than single (and than 3)"
	lessonNotMeasured       = "not measured in this run"
	lessonHeldPrefix        = "**held**"
	lessonNotHeldPrefix     = "**did not hold**"
	lessonUndecidedPrefix   = "**undecided**"
	lessonPartlyHeldPrefix  = "**held only"
	groupCommitAcrossTrials = "one shard with group commit carries"
)

// Lesson is one of the seed's three lessons, checked against this run's findings.
type Lesson struct {
	Claim   string // the seed's lesson and its number
	Verdict string // held, did not hold, or undecided, and why, from the numbers
}

// Lessons reads the seed's three lessons (reads scale with shards, write-heavy loads only
// move the bottleneck, too many shards hurt) off the run's findings, for the scenarios of
// scripts/scenarios.conf that the run measured. It returns nil when the run measured none
// of them.
func (a *Analysis) Lessons() []Lesson {
	var out []Lesson
	if l, ok := a.readLesson(); ok {
		out = append(out, l)
	}
	if l, ok := a.writeLesson(); ok {
		out = append(out, l)
	}
	if l, ok := a.scalingLesson(); ok {
		out = append(out, l)
	}
	return out
}

// finding returns the run's configuration of scenario at shards (1 is single), or nil.
func (a *Analysis) finding(scenario string, shards int) *Finding {
	for _, f := range a.Findings {
		if f.Scenario == scenario && f.Shards == shards && (shards == 1) == (f.Mode == "single") {
			return f
		}
	}
	return nil
}

// sharded returns the run's 3-shard configuration of scenario, or nil.
func (a *Analysis) sharded(scenario string) *Finding { return a.finding(scenario, 3) }

// brief states a finding's ratio to single and its verdict in a few words.
func brief(f *Finding) string {
	if f == nil {
		return lessonNotMeasured
	}
	if f.Ratio.N == 0 {
		return fmt.Sprintf("%s ops/s (%s)", thousands(f.Throughput.Median), f.Verdict)
	}
	return fmt.Sprintf("%s single (%s)", ratio(f.Ratio.Median), f.Verdict)
}

func (a *Analysis) readLesson() (Lesson, bool) {
	wal, one, rollback := a.sharded(ScenarioReadHeavy), a.sharded(ScenarioReadOneConn), a.sharded(ScenarioReadRollback)
	if wal == nil && one == nil && rollback == nil {
		return Lesson{}, false
	}
	l := Lesson{Claim: "Reads scale with shards (seed: " + seedReadGain + " on read_heavy_cachelike)."}
	var s strings.Builder
	fmt.Fprintf(&s, "3 shards against single: WAL with a read pool (%s) %s", ScenarioReadHeavy, brief(wal))
	fmt.Fprintf(&s, "; one connection per shard (%s) %s", ScenarioReadOneConn, brief(one))
	fmt.Fprintf(&s, "; rollback journal, one connection (%s) %s. ", ScenarioReadRollback, brief(rollback))
	naiveFaster := (one != nil && one.Kind == KindFaster) || (rollback != nil && rollback.Kind == KindFaster)
	switch {
	case wal != nil && wal.Kind == KindFaster:
		s.WriteString(lessonHeldPrefix + " on the baseline itself: this machine has spare capacity that one database file did not use.")
	case naiveFaster && wal != nil && (wal.Kind == KindNoDifference || wal.Kind == KindSlower):
		s.WriteString(lessonPartlyHeldPrefix + " where each shard serializes its accesses**: there, N shards give N queues " +
			"instead of one, and sharding buys throughput in proportion to the time requests spent waiting in that one queue. " +
			"What makes a queue long is a lock held across the disk (the rollback journal locks the readers out for the " +
			"whole of each commit), not one connection as such: a read holds it for microseconds. A database that already " +
			"reads concurrently (WAL and a pool of read connections) gains nothing from shards until the machine, not a " +
			"lock, is the limit, and on this machine the CPU that the server shares with the load generator is that limit.")
	case naiveFaster:
		s.WriteString(lessonPartlyHeldPrefix + " where each shard serializes its accesses**; the baseline's own comparison did not decide.")
	case isUndecided(wal) || isUndecided(one) || isUndecided(rollback):
		s.WriteString(lessonUndecidedPrefix + ": too few or too short trials for the test to decide.")
	default:
		s.WriteString(lessonNotHeldPrefix + " in any variant measured: reads did not get faster with shards.")
	}
	l.Verdict = s.String()
	return l, true
}

func isUndecided(f *Finding) bool {
	return f != nil && (f.Kind == KindTooFew || f.Kind == KindTooShort || f.Kind == KindNoPairs)
}

func (a *Analysis) writeLesson() (Lesson, bool) {
	ingest, full, group := a.sharded(ScenarioWriteIngest), a.sharded(ScenarioWriteSyncFull), a.sharded(ScenarioWriteGroup)
	if ingest == nil && full == nil && group == nil {
		return Lesson{}, false
	}
	l := Lesson{Claim: "Write-heavy loads only move the bottleneck (seed: " + seedWriteGain + " on write_heavy_ingest)."}
	var s strings.Builder
	fmt.Fprintf(&s, "3 shards against single: %s %s; every commit on disk (%s) %s; the same with group commit (%s) %s. ",
		ScenarioWriteIngest, brief(ingest), ScenarioWriteSyncFull, brief(full), ScenarioWriteGroup, brief(group))
	if gs, fs := a.finding(ScenarioWriteGroup, 1), a.finding(ScenarioWriteSyncFull, 1); gs != nil && fs != nil {
		if r, ok := pairedMedianRatio(gs, fs); ok {
			fmt.Fprintf(&s, "Across scenarios, %s %.2fx the writes of one shard without it (median of paired trials). ",
				groupCommitAcrossTrials, r)
		}
	}
	switch {
	case full != nil && full.Kind == KindFaster:
		s.WriteString(lessonHeldPrefix + ", and it names the bottleneck: SQLite has one writer per file, so N files commit N " +
			"at a time; the gain is largest when each commit waits for the disk, and group commit, which puts many writes " +
			"into one commit, buys more on one file than shards do.")
	case ingest != nil && ingest.Kind == KindFaster:
		s.WriteString(lessonHeldPrefix + ": shards help writes modestly, since each file has a single writer.")
	case isUndecided(ingest) || isUndecided(full):
		s.WriteString(lessonUndecidedPrefix + ": too few or too short trials for the test to decide.")
	default:
		s.WriteString(lessonNotHeldPrefix + " as stated: writes did not get faster with shards in this run.")
	}
	l.Verdict = s.String()
	return l, true
}

// pairedMedianRatio is the median over trial numbers of f's throughput over base's.
func pairedMedianRatio(f, base *Finding) (float64, bool) {
	ratios, _ := pairRatios(f.Trials, base.Trials)
	if len(ratios) == 0 {
		return 0, false
	}
	return newStat(ratios).Median, true
}

func (a *Analysis) scalingLesson() (Lesson, bool) {
	three, five := a.finding(ScenarioShardScaling, 3), a.finding(ScenarioShardScaling, 5)
	if three == nil && five == nil {
		return Lesson{}, false
	}
	l := Lesson{Claim: "Too many shards hurt (seed: " + seedScalingObservation + " on shard_scaling_base)."}
	var s strings.Builder
	fmt.Fprintf(&s, "Against single: 3 shards %s; 5 shards %s. ", brief(three), brief(five))
	switch {
	case five != nil && five.Kind == KindSlower:
		s.WriteString(lessonHeldPrefix + ": 5 shards were slower than one.")
	case isUndecided(five):
		s.WriteString(lessonUndecidedPrefix + ": too few or too short trials for the test to decide.")
	case five != nil:
		s.WriteString(lessonNotHeldPrefix + " as a decline: 5 shards were not slower than one. Its practical half stands: " +
			"when no shard count beats one, the bottleneck is elsewhere (here the CPU), and shards add cost without gain.")
	default:
		s.WriteString(lessonNotMeasured + " at 5 shards.")
	}
	l.Verdict = s.String()
	return l, true
}
