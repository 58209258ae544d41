package report_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/lab/report"
)

func TestReadSamples(t *testing.T) {
	got, err := report.ReadSamples(strings.NewReader(
		"t_s,ops,errors,throughput_ops_s,p50_ms,p99_ms,max_ms\n1,100,0,100.0,1.5,4.25,9\n2,120,1,120.0,1.4,3.5,8\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].T != 1 || got[0].Throughput != 100 || got[0].P99 != 4.25 || got[1].T != 2 || got[1].P99 != 3.5 {
		t.Errorf("samples %+v", got)
	}
	// Columns are matched by name, in any order.
	got, err = report.ReadSamples(strings.NewReader("p99_ms,t_s,throughput_ops_s\n7,3,50\n"))
	if err != nil || len(got) != 1 || got[0].T != 3 || got[0].Throughput != 50 || got[0].P99 != 7 {
		t.Errorf("reordered: %+v, %v", got, err)
	}
	for _, in := range []string{
		"",
		"t_s,ops\n1,2\n",
		"t_s,throughput_ops_s,p99_ms\n",
		"t_s,throughput_ops_s,p99_ms\n1,x,2\n",
		"t_s,throughput_ops_s,p99_ms\n1,2\n",
		"t_s,throughput_ops_s,p99_ms\n1,2,\"3\n",
	} {
		if _, err := report.ReadSamples(strings.NewReader(in)); !errors.Is(err, report.ErrBadSamples) {
			t.Errorf("ReadSamples(%q) err = %v, want ErrBadSamples", in, err)
		}
	}
}

// FuzzReadSamples checks that the sample parser never panics and returns either an
// error or at least one sample.
func FuzzReadSamples(f *testing.F) {
	f.Add("t_s,ops,errors,throughput_ops_s,p50_ms,p99_ms,max_ms\n1,100,0,100.0,1.5,4.25,9\n")
	f.Add("p99_ms,t_s,throughput_ops_s\n7,3,50\n")
	f.Add("t_s,throughput_ops_s,p99_ms\n1,NaN,2\n")
	f.Fuzz(func(t *testing.T, in string) {
		got, err := report.ReadSamples(strings.NewReader(in))
		if err == nil && len(got) == 0 {
			t.Error("no error and no samples")
		}

	})
}
