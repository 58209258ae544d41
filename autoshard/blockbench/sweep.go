package blockbench

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// SweepConfig runs the same ingest for several thresholds.
type SweepConfig struct {
	// Base is the ingest to repeat; its Dir and Store.Threshold are set
	// per run.
	Base IngestConfig
	// Thresholds to compare; 0 is "never split".
	Thresholds []int64
	// Rounds repeats the whole sweep; each round runs the thresholds in a
	// rotated order so that drift on a shared machine hits all of them.
	Rounds int
	// DataRoot holds the per-run stores, each removed after its run.
	DataRoot string
	// ResultsDir gets ingest-T<label>-r<round>.csv, summary.csv and charts.
	ResultsDir string
}

// SummaryHeader is the header of summary.csv.
var SummaryHeader = []string{"threshold", "round", "reached_target", "time_to_target_s", "elapsed_s", "final_blocks", "levels", "shards", "lookup_p50_us", "lookup_p99_us", "miss_p50_us", "miss_p99_us", "cpu_s"}

func summaryRecord(round int, r IngestResult) []string {
	ttt := ""
	if r.ReachedTarget {
		ttt = strconv.FormatFloat(r.TimeToTarget.Seconds(), 'f', 1, 64)
	}
	return []string{
		strconv.FormatInt(r.Threshold, 10), strconv.Itoa(round), strconv.FormatBool(r.ReachedTarget), ttt,
		strconv.FormatFloat(r.Elapsed.Seconds(), 'f', 1, 64), strconv.FormatInt(r.Blocks, 10),
		strconv.Itoa(r.TopLevel + 1), strconv.Itoa(r.Shards),
		strconv.FormatInt(r.HitP50, 10), strconv.FormatInt(r.HitP99, 10),
		strconv.FormatInt(r.MissP50, 10), strconv.FormatInt(r.MissP99, 10),
		strconv.FormatFloat(r.CPU.Seconds(), 'f', 1, 64),
	}
}

// IngestCSVName is the file name of one run's per-batch CSV.
func IngestCSVName(threshold int64, round int) string {
	return fmt.Sprintf("ingest-T%s-r%d.csv", ThresholdLabel(threshold), round)
}

// Sweep runs every threshold Rounds times, writes the CSVs and the summary
// into ResultsDir, then renders the charts. log gets one line per finished
// run. Cancelling ctx stops the current run; summary rows already written
// stay.
func Sweep(ctx context.Context, cfg SweepConfig, log io.Writer) ([]IngestResult, error) {
	if len(cfg.Thresholds) == 0 {
		return nil, fmt.Errorf("blockbench: no thresholds to sweep")
	}
	for _, t := range cfg.Thresholds {
		if t < 0 {
			return nil, fmt.Errorf("blockbench: threshold %d is negative", t)
		}
	}
	if cfg.Rounds <= 0 {
		return nil, fmt.Errorf("blockbench: rounds %d must be positive", cfg.Rounds)
	}
	if err := os.MkdirAll(cfg.ResultsDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataRoot, 0o755); err != nil {
		return nil, err
	}
	sf, err := os.Create(filepath.Join(cfg.ResultsDir, "summary.csv"))
	if err != nil {
		return nil, err
	}
	defer sf.Close()
	sw := csv.NewWriter(sf)
	if err := sw.Write(SummaryHeader); err != nil {
		return nil, err
	}
	sw.Flush()

	var results []IngestResult
	for round := 1; round <= cfg.Rounds; round++ {
		for i := range cfg.Thresholds {
			t := cfg.Thresholds[(i+round-1)%len(cfg.Thresholds)]
			res, err := sweepOne(ctx, cfg, t, round)
			if err != nil {
				return results, fmt.Errorf("threshold %s round %d: %w", ThresholdLabel(t), round, err)
			}
			results = append(results, res)
			if err := sw.Write(summaryRecord(round, res)); err != nil {
				return results, err
			}
			sw.Flush()
			if err := sw.Error(); err != nil {
				return results, err
			}
			fmt.Fprintf(log, "threshold=%s round=%d reached=%v time_to_target=%.1fs cpu=%.1fs blocks=%d levels=%d shards=%d lookup_p50=%dus p99=%dus\n",
				ThresholdLabel(t), round, res.ReachedTarget, res.TimeToTarget.Seconds(), res.CPU.Seconds(), res.Blocks, res.TopLevel+1, res.Shards, res.HitP50, res.HitP99)
		}
	}
	if err := sf.Close(); err != nil {
		return results, err
	}
	return results, RenderCharts(cfg.ResultsDir)
}

func sweepOne(ctx context.Context, cfg SweepConfig, threshold int64, round int) (IngestResult, error) {
	run := cfg.Base
	run.Store.Threshold = threshold
	run.Seed = cfg.Base.Seed + uint64(round)
	run.Dir = filepath.Join(cfg.DataRoot, fmt.Sprintf("T%s-r%d-%d", ThresholdLabel(threshold), round, time.Now().UnixNano()))
	defer os.RemoveAll(run.Dir)
	f, err := os.Create(filepath.Join(cfg.ResultsDir, IngestCSVName(threshold, round)))
	if err != nil {
		return IngestResult{}, err
	}
	defer f.Close()
	res, err := Ingest(ctx, run, f)
	if err != nil {
		return res, err
	}
	return res, f.Close()
}
