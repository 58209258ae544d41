package usl_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"image"
	_ "image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	uslcmd "github.com/shardlab/shardlab/internal/cmd/usl"
	"github.com/shardlab/shardlab/lab/usl"
)

func run(t *testing.T, stdin string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := uslcmd.Run(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestRunSPECSDM91(t *testing.T) {
	dir := t.TempDir()
	png, svg := filepath.Join(dir, "c.png"), filepath.Join(dir, "c.svg")
	out, _, err := run(t, "", "../../../lab/usl/testdata/specsdm91.csv", "--chart", png+","+svg)
	if err != nil {
		t.Fatal(err)
	}
	if want := "sigma=0.0277285 kappa=0.000104365 lambda=89.9952 nstar=96 r2=0.9896\n"; out != want {
		t.Errorf("output %q, want %q", out, want)
	}
	f, err := os.Open(png)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, _, err := image.Decode(f); err != nil {
		t.Errorf("chart is not a PNG: %v", err)
	}
	b, err := os.ReadFile(svg)
	if err != nil || !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("N* = 96")) {
		t.Errorf("SVG chart: %v, %.60q", err, b)
	}
}

func TestRunStdinNoPeak(t *testing.T) {
	in, err := os.ReadFile("../../../lab/usl/testdata/raytracer.csv")
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := run(t, string(in), "-")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "sigma=0.05777") || !strings.Contains(out, " kappa=0 ") || !strings.Contains(out, "nstar=none") {
		t.Errorf("output %q", out)
	}
}

// TestRunLowR2Warns: a fit that does not describe the points still prints its
// coefficients, warns on stderr and marks no N* on the chart.
func TestRunLowR2Warns(t *testing.T) {
	dir := t.TempDir()
	svg := filepath.Join(dir, "c.svg")
	out, errOut, err := run(t, "n,throughput\n1,100\n2,80\n3,120\n4,90\n5,115\n6,85\n7,110\n8,95\n", "-", "--chart", svg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "sigma=") || strings.Count(out, "\n") != 1 {
		t.Errorf("stdout %q, want the coefficients line", out)
	}
	if !strings.Contains(errOut, "warning") || !strings.Contains(errOut, "does not describe") {
		t.Errorf("stderr %q, want a warning", errOut)
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("N* =")) {
		t.Error("chart marks N* for a fit that does not describe the points")
	}
}

// TestRunGoodFitNoWarning: a good fit writes nothing on stderr.
func TestRunGoodFitNoWarning(t *testing.T) {
	_, errOut, err := run(t, "", "../../../lab/usl/testdata/specsdm91.csv")
	if err != nil || errOut != "" {
		t.Errorf("err %v, stderr %q", err, errOut)
	}
}

// TestRunFlatNote: points within a few percent of a flat curve give a low R² but no
// warning, only a note that the flat curve is the finding (as the report reads it).
func TestRunFlatNote(t *testing.T) {
	out, errOut, err := run(t, "n,throughput\n1,1000\n2,1010\n3,990\n4,1005\n5,995\n6,1008\n8,992\n", "-")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "sigma=") {
		t.Errorf("stdout %q", out)
	}
	if strings.Contains(errOut, "warning") || !strings.Contains(errOut, "usl: note: standard input: R² = ") ||
		!strings.Contains(errOut, "the flat curve is the finding") {
		t.Errorf("stderr %q, want a note and no warning", errOut)
	}
}

func TestRunErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	few := write("few.csv", "n,throughput\n1,10\n2,19\n3,27\n4,34\n5,40\n")
	for _, tc := range []struct {
		name string
		args []string
		want error
		msg  string
	}{
		{"no file argument", nil, uslcmd.ErrUsage, "exactly one input file"},
		{"two files", []string{"a", "b"}, uslcmd.ErrUsage, "got 2"},
		{"unknown flag", []string{"--nope", "x"}, uslcmd.ErrUsage, "nope"},
		{"bad chart extension", []string{"--chart", "x.gif", few}, uslcmd.ErrUsage, "x.gif"},
		{"missing file", []string{filepath.Join(dir, "missing.csv")}, os.ErrNotExist, "missing.csv"},
		{"bad header", []string{write("h.csv", "shards,ops\n1,2\n")}, usl.ErrBadHeader, "h.csv"},
		{"bad number", []string{write("b.csv", "n,throughput\n1,abc\n")}, usl.ErrBadNumber, "line 2"},
		{"too few points", []string{few}, usl.ErrTooFewPoints, "at least 6 distinct values of n, got 5"},
		{"help", []string{"--help"}, flag.ErrHelp, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := run(t, "", tc.args...)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("err = %v, want %v containing %q", err, tc.want, tc.msg)
			}
			if out != "" {
				t.Errorf("stdout %q on error", out)
			}
		})
	}
}

func TestSpreads(t *testing.T) {
	got := usl.Spreads([]usl.Point{{N: 2, X: 5}, {N: 1, X: 3}, {N: 2, X: 9}, {N: 2, X: 7}, {N: 1, X: 4}})
	if len(got) != 2 || got[0].N != 1 || got[0].Median != 3.5 || got[0].Min != 3 || got[0].Max != 4 ||
		got[1].N != 2 || got[1].Median != 7 || got[1].Min != 5 || got[1].Max != 9 {
		t.Errorf("Spreads = %+v", got)
	}
}
