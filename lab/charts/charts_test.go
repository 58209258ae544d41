package charts_test

import (
	"bytes"
	"encoding/xml"
	"errors"
	"image"
	"image/color"
	_ "image/png"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/lab/charts"
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
		{"points only", charts.ScalingChart{Points: scalingPoints()[:2]}, []string{"measured: median"}},
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
	c := charts.TimelineChart{Title: "read_heavy over time", Series: []charts.Timeline{
		{Label: "single\n(2 trials)", Trials: [][]charts.Sample{a, b[:10]}}, {Label: "sharded x3", Trials: [][]charts.Sample{b}},
	}}
	renderBoth(t, c, "p99 (ms)", "sharded x3", "single", "(2 trials)")
}

func TestLinesChart(t *testing.T) {
	c := charts.LinesChart{Title: "tail", XLabel: "shards", YLabel: "latency (ms)", IntegerX: true, Lines: []charts.Line{
		{Label: "p99 measured", Points: []charts.Spread{{N: 1, Median: 2, Min: 1.8, Max: 2.3}, {N: 8, Median: 4, Min: 3.5, Max: 4.4}}},
		{Label: "p99 model", Model: true, Color: 1, Points: []charts.Spread{{N: 1, Median: 2.1}, {N: 8, Median: 3.9}}},
	}}
	renderBoth(t, c, "p99 measured", "p99 model", "shards")
}

func TestNoData(t *testing.T) {
	for _, c := range []charts.Chart{
		charts.ScalingChart{},
		charts.LinesChart{},
		charts.LinesChart{Lines: []charts.Line{{Label: "empty"}}},
		charts.LatencyChart{},
		charts.LatencyChart{Groups: []charts.LatencyGroup{{Name: "empty"}}},
		charts.TimelineChart{},
		charts.TimelineChart{Series: []charts.Timeline{{Label: "no samples"}}},
		charts.TimelineChart{Series: []charts.Timeline{{Label: "empty trials", Trials: [][]charts.Sample{nil, {}}}}},
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

func TestIntegerTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		want   string
	}{
		{0, 8.4, "0 1 2 3 4 5 6 7 8"},
		{0.5, 3.2, "1 2 3"},
		{0, 25, "0 5 10 15 20 25"},
		{0, 210, "0 50 100 150 200"},
		{0, 1000, "0 100 200 300 400 500 600 700 800 900 1000"},
	} {
		var got []string
		for _, tick := range (charts.IntegerTicks{}).Ticks(tc.lo, tc.hi) {
			got = append(got, tick.Label)
		}
		if s := strings.Join(got, " "); s != tc.want {
			t.Errorf("Ticks(%g, %g) = %s, want %s", tc.lo, tc.hi, s, tc.want)
		}
	}
}

// svgTexts returns the x coordinate of each SVG text element, by its text.
func svgTexts(t *testing.T, svg []byte) map[string]float64 {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	texts := map[string]float64{}
	var x float64
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return texts
		}
		if err != nil {
			t.Fatal(err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			for _, a := range e.Attr {
				if e.Name.Local == "text" && a.Name.Local == "x" {
					if x, err = strconv.ParseFloat(a.Value, 64); err != nil {
						t.Fatal(err)
					}
				}
			}
		case xml.CharData:
			if s := strings.TrimSpace(string(e)); s != "" {
				texts[s] = x
			}
		}
	}
}

// TestLegendOutsideTheData: every legend entry lies right of every tick label, that is
// outside the area where the data are drawn, so it can hide none of them.
func TestLegendOutsideTheData(t *testing.T) {
	var samples []charts.Sample
	for s := range 20 {
		samples = append(samples, charts.Sample{T: float64(s), Throughput: 1000, P99: 5})
	}
	for _, tc := range []struct {
		name   string
		c      charts.Chart
		legend []string
	}{
		{"scaling", charts.ScalingChart{Points: scalingPoints(), Curve: usl, CurveLabel: "USL fit", PeakN: 6}, []string{"USL fit", "N* = 6"}},
		{"timeline", charts.TimelineChart{Series: []charts.Timeline{{Label: "sharded x3", Trials: [][]charts.Sample{samples}}}}, []string{"sharded x3"}},
		{"latency", charts.LatencyChart{Groups: []charts.LatencyGroup{{Name: "g", Series: []charts.LatencySeries{{Label: "single", P50: 1, P95: 2, P99: 3, P999: 4}}}}}, []string{"single"}},
	} {
		var svg bytes.Buffer
		if err := tc.c.Render(&svg, charts.SVG); err != nil {
			t.Fatal(err)
		}
		texts := svgTexts(t, svg.Bytes())
		for _, key := range tc.legend {
			lx, ok := texts[key]
			if !ok {
				t.Fatalf("%s: no legend entry %q", tc.name, key)
			}
			for text, x := range texts {
				if _, err := strconv.ParseFloat(text, 64); (err == nil || strings.HasPrefix(text, "p")) && x >= lx {
					t.Errorf("%s: legend %q at x=%g is not right of tick label %q at x=%g", tc.name, key, lx, text, x)
				}
			}
		}
	}
}

// TestPaletteIsOkabeIto: the measured points are drawn in the palette's first colour,
// and nothing in gonum's default red, which colour-blind readers confuse with green.
func TestPaletteIsOkabeIto(t *testing.T) {
	var b bytes.Buffer
	if err := (charts.ScalingChart{Points: scalingPoints(), Curve: usl, PeakN: 6}).Render(&b, charts.PNG); err != nil {
		t.Fatal(err)
	}
	img, _, err := image.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	want := color.NRGBAModel.Convert(charts.Palette[0]).(color.NRGBA)
	red := color.NRGBA{R: 0xF1, G: 0x5A, B: 0x60, A: 0xFF}
	sawWant := false
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y++ {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x++ {
			c := color.NRGBAModel.Convert(img.At(x, y)).(color.NRGBA)
			sawWant = sawWant || c == want
			if c == red {
				t.Fatalf("pixel (%d, %d) is gonum's default red", x, y)
			}
		}
	}
	if !sawWant {
		t.Error("no pixel in the palette's first colour")
	}
}

func TestPlainTicks(t *testing.T) {
	for _, tick := range (charts.PlainTicks{}).Ticks(0, 27500) {
		if strings.Contains(tick.Label, ".") {
			t.Errorf("tick %g labelled %q", tick.Value, tick.Label)
		}
	}
	labelled := 0
	for _, tick := range (charts.PlainTicks{}).Ticks(0, 0.25) {
		if tick.Label != "" {
			labelled++
			if v, err := strconv.ParseFloat(tick.Label, 64); err != nil || v != tick.Value {
				t.Errorf("tick %g labelled %q", tick.Value, tick.Label)
			}
		}
	}
	if labelled < 2 {
		t.Errorf("%d labelled ticks from 0 to 0.25", labelled)
	}
}
