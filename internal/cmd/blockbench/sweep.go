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
// run. Each file is written beside its final name and renamed into place
// when complete, so a refused or failed run leaves earlier results as they
// were. Cancelling ctx stops the current run; the summary rows of finished
// runs stay.
func Sweep(ctx context.Context, cfg SweepConfig, log io.Writer) ([]IngestResult, error) {
	if len(cfg.Thresholds) == 0 {
		return nil, fmt.Errorf("%w: no thresholds to sweep", ErrUsage)
	}
	for _, t := range cfg.Thresholds {
		if t < 0 {
			return nil, fmt.Errorf("%w: threshold %d is negative", ErrUsage, t)
		}
	}
	if cfg.Rounds <= 0 {
		return nil, fmt.Errorf("%w: rounds %d must be positive", ErrUsage, cfg.Rounds)
	}
	probe := cfg.Base
	probe.Dir = cfg.DataRoot
	if err := probe.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.ResultsDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataRoot, 0o755); err != nil {
		return nil, err
	}
	// summary.csv replaces an earlier one only once it holds a row.
	sf, err := createPending(filepath.Join(cfg.ResultsDir, "summary.csv"))
	if err != nil {
		return nil, err
	}
	var results []IngestResult
	defer func() {
		if len(results) > 0 {
			_ = sf.commit() // keep the rows of finished runs
		}
		sf.discard()
	}()
	sw := csv.NewWriter(sf)
	if err := sw.Write(SummaryHeader); err != nil {
		return nil, err
	}
	sw.Flush()

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
	if err := sf.commit(); err != nil {
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
	f, err := createPending(filepath.Join(cfg.ResultsDir, IngestCSVName(threshold, round)))
	if err != nil {
		return IngestResult{}, err
	}
	defer f.discard()
	res, err := Ingest(ctx, run, f)
	if err != nil {
		return res, err
	}
	return res, f.commit()
}
