package report_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	reportcmd "github.com/shardlab/shardlab/internal/cmd/report"
	"github.com/shardlab/shardlab/lab/report"
)

func TestRun(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile("../../../lab/report/testdata/results.csv")
	if err != nil {
		t.Fatal(err)
	}
	csvPath := filepath.Join(dir, "results.csv")
	if err := os.WriteFile(csvPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "report.md")
	var stdout, stderr bytes.Buffer
	err = reportcmd.Run(context.Background(), []string{"--csv", csvPath, "--out", out, "--run-id", "run-a", "--no-charts"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v; stderr %s", err, stderr.String())
	}
	if want := "wrote " + out + " (run run-a, 3 rows, 0 chart files)\n"; stdout.String() != want {
		t.Errorf("stdout %q, want %q", stdout.String(), want)
	}
	md, err := os.ReadFile(out)
	if err != nil || !bytes.HasPrefix(md, []byte("# shardlab results: run run-a\n")) {
		t.Errorf("report: %v %.40q", err, md)
	}
}

func TestRunErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.csv")
	if err := os.WriteFile(empty, []byte("timestamp,scenario,mode,shards,throughput_ops_s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want error
		msg  string
	}{
		{"help", []string{"-h"}, flag.ErrHelp, ""},
		{"unknown flag", []string{"--bogus"}, reportcmd.ErrUsage, "bogus"},
		{"positional", []string{"results.csv"}, reportcmd.ErrUsage, `unexpected argument "results.csv"`},
		{"missing CSV", []string{"--csv", filepath.Join(dir, "none.csv"), "--out", filepath.Join(dir, "r.md")}, os.ErrNotExist, "none.csv"},
		{"empty CSV", []string{"--csv", empty, "--out", filepath.Join(dir, "r.md")}, report.ErrNoRows, "no rows"},
		{"netlab without --out", []string{"--netlab", empty}, reportcmd.ErrUsage, "--netlab needs --out"},
		{"netlab of a scenario CSV", []string{"--netlab", empty, "--out", filepath.Join(dir, "r.md")}, report.ErrNotNetlab, "empty.csv"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := reportcmd.Run(context.Background(), tc.args, &stdout, &stderr)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("err = %v, want %v containing %q", err, tc.want, tc.msg)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout %q", stdout.String())
			}
		})
	}
}
