package charts_test

import (
	"bytes"
	"encoding/xml"
	"errors"
	"image"
	_ "image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/charts"
)

// checkPNG fails unless b is a non-empty PNG image of a plausible size.
func checkPNG(t *testing.T, b []byte) {
	t.Helper()
	img, format, err := image.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("decode PNG: %v", err)
	}
	if format != "png" {
		t.Fatalf("format %q, want png", format)
	}
	if r := img.Bounds(); r.Dx() < 300 || r.Dy() < 200 {
		t.Fatalf("image is %v, too small", r)
	}
	// A chart is not a blank canvas: it has more than one colour.
	first := img.At(0, 0)
	for y := 0; y < img.Bounds().Dy(); y += 3 {
		for x := 0; x < img.Bounds().Dx(); x += 3 {
			if img.At(x, y) != first {
				return
			}
		}
	}
	t.Fatal("image is a single colour")
}

// checkSVG fails unless b is a well-formed SVG document containing text.
func checkSVG(t *testing.T, b []byte, wantText ...string) {
	t.Helper()
	s := string(b)
	if !strings.HasPrefix(s, "<?xml") && !strings.HasPrefix(s, "<svg") {
		t.Fatalf("SVG starts with %q", s[:min(len(s), 40)])
	}
	dec := xml.NewDecoder(bytes.NewReader(b))
	sawSVG := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG does not parse as XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "svg" {
			sawSVG = true
		}
	}
	if !sawSVG {
		t.Fatal("no <svg> element")
	}
	for _, w := range wantText {
		if !strings.Contains(s, w) {
			t.Errorf("SVG lacks %q", w)
		}
	}
}

func renderBoth(t *testing.T, c charts.Chart, wantText ...string) {
	t.Helper()
	var png, svg bytes.Buffer
	if err := c.Render(&png, charts.PNG); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, png.Bytes())
	if err := c.Render(&svg, charts.SVG); err != nil {
		t.Fatal(err)
	}
	checkSVG(t, svg.Bytes(), wantText...)
}

func usl(n float64) float64 { return 1000 * n / (1 + 0.05*(n-1) + 0.02*n*(n-1)) }

func scalingPoints() []charts.Spread {
	var pts []charts.Spread
	for _, n := range []float64{1, 2, 3, 4, 5, 6, 8} {
		y := usl(n)
		pts = append(pts, charts.Spread{N: n, Median: y, Min: y * 0.95, Max: y * 1.04})
	}
	return pts
}

func TestScalingChart(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    charts.ScalingChart
		want []string
	}{
		{"fit and peak", charts.ScalingChart{Title: "read_heavy", Points: scalingPoints(), Curve: usl, CurveLabel: "USL fit", PeakN: 6}, []string{"USL fit", "N* = 6", "read_heavy"}},
		{"peak beyond", charts.ScalingChart{Points: scalingPoints(), Curve: usl, PeakN: 96}, []string{"beyond the chart"}},
		{"points only", charts.ScalingChart{Points: scalingPoints()[:2]}, []string{"measured median"}},
	} {
		t.Run(tc.name, func(t *testing.T) { renderBoth(t, tc.c, tc.want...) })
	}
}

func TestLatencyChart(t *testing.T) {
	c := charts.LatencyChart{Title: "latency", Groups: []charts.LatencyGroup{
		{Name: "read_heavy", Series: []charts.LatencySeries{
			{Label: "single", P50: 5, P95: 9, P99: 14, P999: 30},
			{Label: "sharded x3", P50: 3, P95: 6, P99: 9, P999: 22},
		}},
		{Name: "write_heavy", Series: []charts.LatencySeries{
			{Label: "single", P50: 7, P95: 12, P99: 20, P999: 40},
		}},
	}}
	renderBoth(t, c, "sharded x3", "p99.9", "write_heavy")
}

func TestTimelineChart(t *testing.T) {
	var a, b []charts.Sample
	for s := range 30 {
		a = append(a, charts.Sample{T: float64(s + 1), Throughput: 5000 + float64(s%5)*50, P99: 12 + float64(s%3)})
		b = append(b, charts.Sample{T: float64(s + 1), Throughput: 9000 - float64(s%4)*70, P99: 8 + float64(s%2)})
	}
	c := charts.TimelineChart{Title: "read_heavy over time", Series: []charts.Timeline{{Label: "single", Samples: a}, {Label: "sharded x3", Samples: b}}}
	renderBoth(t, c, "p99 (ms)", "sharded x3")
}

func TestNoData(t *testing.T) {
	for _, c := range []charts.Chart{
		charts.ScalingChart{},
		charts.LatencyChart{},
		charts.LatencyChart{Groups: []charts.LatencyGroup{{Name: "empty"}}},
		charts.TimelineChart{},
		charts.TimelineChart{Series: []charts.Timeline{{Label: "no samples"}}},
	} {
		if err := c.Render(io.Discard, charts.PNG); !errors.Is(err, charts.ErrNoData) {
			t.Errorf("%T: err = %v, want ErrNoData", c, err)
		}
	}
}

func TestSave(t *testing.T) {
	dir := t.TempDir()
	c := charts.ScalingChart{Points: scalingPoints(), Curve: usl, PeakN: 6}
	png, svg := filepath.Join(dir, "s.png"), filepath.Join(dir, "s.svg")
	if err := charts.Save(c, png, svg); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(png)
	if err != nil {
		t.Fatal(err)
	}
	checkPNG(t, b)
	if b, err = os.ReadFile(svg); err != nil {
		t.Fatal(err)
	}
	checkSVG(t, b)

	bad := filepath.Join(dir, "s.gif")
	if err := charts.Save(c, bad); !errors.Is(err, charts.ErrUnknownFormat) {
		t.Errorf("Save(.gif) err = %v, want ErrUnknownFormat", err)
	}
	// A failed render leaves no file behind.
	empty := filepath.Join(dir, "empty.png")
	if err := charts.Save(charts.ScalingChart{}, empty); !errors.Is(err, charts.ErrNoData) {
		t.Errorf("err = %v, want ErrNoData", err)
	}
	if _, err := os.Stat(empty); !os.IsNotExist(err) {
		t.Errorf("empty.png exists after a failed render: %v", err)
	}
	if err := (charts.ScalingChart{Points: scalingPoints()}).Render(io.Discard, "bmp"); !errors.Is(err, charts.ErrUnknownFormat) {
		t.Errorf("Render(bmp) err = %v", err)
	}
}
