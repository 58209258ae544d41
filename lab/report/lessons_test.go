package report_test

import (
	"strings"
	"testing"

	"github.com/shardlab/shardlab/lab/report"
	"github.com/shardlab/shardlab/lab/resultscsv"
)

// TestLessons reads the seed's lessons off a run shaped like the lab's: reads scale only
// where each shard serializes, writes scale with shards and more with group commit, and
// 5 shards are no slower than one.
func TestLessons(t *testing.T) {
	var rows []resultscsv.Row
	add := func(scenario string, shards int, tput ...float64) {
		mode := "single"
		if shards > 1 {
			mode = "sharded"
		}
		for i, x := range tput {
			rows = append(rows, row("r", scenario, mode, shards, i+1, x))
		}
	}
	base := []float64{100, 104, 98, 101, 103, 99}
	add(report.ScenarioReadHeavy, 1, base...)
	add(report.ScenarioReadHeavy, 3, 102, 97, 105, 100, 99, 103)
	add(report.ScenarioReadOneConn, 1, base...)
	add(report.ScenarioReadOneConn, 3, 290, 300, 310, 295, 305, 299)
	add(report.ScenarioWriteSyncFull, 1, base...)
	add(report.ScenarioWriteSyncFull, 3, 150, 151, 149, 152, 148, 150)
	add(report.ScenarioWriteGroup, 1, 400, 416, 392, 404, 412, 396)
	add(report.ScenarioShardScaling, 1, base...)
	add(report.ScenarioShardScaling, 5, 102, 97, 105, 100, 99, 103)
	a, err := report.Analyze(rows, "r")
	if err != nil {
		t.Fatal(err)
	}
	lessons := a.Lessons()
	if len(lessons) != 3 {
		t.Fatalf("%d lessons, want 3: %+v", len(lessons), lessons)
	}
	for i, want := range []string{
		"**held only where each shard serializes its accesses**",
		"one shard with group commit carries 4.00x the writes",
		"**did not hold** as a decline",
	} {
		if !strings.Contains(lessons[i].Verdict, want) {
			t.Errorf("lesson %d: %q lacks %q", i+1, lessons[i].Verdict, want)
		}
	}
	if !strings.Contains(lessons[1].Verdict, "**held**") || !strings.Contains(lessons[0].Verdict, "read_heavy_rollback) not measured in this run") {
		t.Errorf("verdicts: %q / %q", lessons[1].Verdict, lessons[0].Verdict)
	}

	// A run without the lab's scenarios has no lessons.
	other, err := report.Analyze([]resultscsv.Row{row("o", "adhoc", "single", 1, 1, 10)}, "o")
	if err != nil {
		t.Fatal(err)
	}
	if l := other.Lessons(); l != nil {
		t.Errorf("lessons of an ad hoc run: %+v", l)
	}
}
