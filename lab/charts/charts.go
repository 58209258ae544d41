// Package charts renders the lab's charts headlessly with gonum.org/v1/plot, as PNG (for
// markdown) and SVG. Each chart is a plain-data struct with a Render method, so callers
// need not know gonum: a ScalingChart (throughput against shard count with min-max bars,
// a fitted curve and its peak), a LatencyChart (response-time percentiles, one panel per
// scenario, one bar per configuration) and a TimelineChart (throughput and p99 of a run
// second by second).
package charts

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Format is an output image format.
type Format string

// The formats Render writes.
const (
	PNG Format = "png"
	SVG Format = "svg"
)

// ErrUnknownFormat is returned for a format (or file extension) other than png and svg.
var ErrUnknownFormat = errors.New("charts: unknown image format (want .png or .svg)")

// ErrNoData is returned when a chart has nothing to draw.
var ErrNoData = errors.New("charts: no data to draw")

// Chart is anything this package can render.
type Chart interface {
	Render(w io.Writer, f Format) error
}

// FormatOf returns the format named by path's extension.
func FormatOf(path string) (Format, error) {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".png":
		return PNG, nil
	case ".svg":
		return SVG, nil
	}
	return "", fmt.Errorf("%w: %s", ErrUnknownFormat, path)
}

// Save renders c into each of paths, choosing the format from the extension. A file is
// only left behind when it was rendered completely.
func Save(c Chart, paths ...string) error {
	for _, path := range paths {
		f, err := FormatOf(path)
		if err != nil {
			return err
		}
		if err := saveOne(c, f, path); err != nil {
			return err
		}
	}
	return nil
}

func saveOne(c Chart, f Format, path string) error {
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("charts: %w", err)
	}
	if err := c.Render(out, f); err != nil {
		out.Close()
		os.Remove(path)
		return fmt.Errorf("charts: render %s: %w", path, err)
	}
	if err := out.Close(); err != nil {
		os.Remove(path)
		return fmt.Errorf("charts: %w", err)
	}
	return nil
}

// Palette is the Okabe-Ito palette, whose colours stay distinct for readers with the
// common forms of colour blindness; charts use it in this order (yellow, which is faint
// on white, and black come last).
var Palette = []color.Color{
	color.NRGBA{R: 0x00, G: 0x72, B: 0xB2, A: 0xFF}, // blue
	color.NRGBA{R: 0xD5, G: 0x5E, B: 0x00, A: 0xFF}, // vermillion
	color.NRGBA{R: 0x00, G: 0x9E, B: 0x73, A: 0xFF}, // bluish green
	color.NRGBA{R: 0xCC, G: 0x79, B: 0xA7, A: 0xFF}, // reddish purple
	color.NRGBA{R: 0xE6, G: 0x9F, B: 0x00, A: 0xFF}, // orange
	color.NRGBA{R: 0x56, G: 0xB4, B: 0xE9, A: 0xFF}, // sky blue
	color.NRGBA{R: 0xF0, G: 0xE4, B: 0x42, A: 0xFF}, // yellow
	color.NRGBA{R: 0x00, G: 0x00, B: 0x00, A: 0xFF}, // black
}

// Color is the i-th colour of Palette, cycling.
func Color(i int) color.Color { return Palette[i%len(Palette)] }

// Faded is c at the given opacity (0..1), for lines that sit behind a bold one.
func Faded(c color.Color, opacity float64) color.Color {
	n := color.NRGBAModel.Convert(c).(color.NRGBA)
	n.A = uint8(opacity * 255)
	return n
}

// IntegerTicks labels an axis at whole numbers only, for counts such as shards: at
// every integer when few fit, else every 2nd, 5th, 10th, 20th ... so that at most about
// ten are labelled.
type IntegerTicks struct{}

// Ticks implements plot.Ticker.
func (IntegerTicks) Ticks(lo, hi float64) []plot.Tick {
	step := 1.0
	for i := 0; (hi-lo)/step > 10; i++ {
		step *= []float64{2, 2.5, 2}[i%3] // 1, 2, 5, 10, 20, 50, 100, ...
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', 0, 64)})
	}
	return ticks
}

// PlainTicks are gonum's default tick positions with labels that carry no needless
// decimals: "25000", not "25000.00".
type PlainTicks struct{}

// Ticks implements plot.Ticker.
func (PlainTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i, t := range ticks {
		if t.Label != "" {
			ticks[i].Label = strconv.FormatFloat(t.Value, 'f', -1, 64)
		}
	}
	return ticks
}

// SavePlot writes a gonum plot built elsewhere (the block store's and the counters'
// charts) to each of paths, with the lab's layout: the legend outside the data, to the
// right. It leaves p as it found it.
func SavePlot(p *plot.Plot, w, h vg.Length, paths ...string) error {
	return Save(plotChart{p: p, w: w, h: h}, paths...)
}

// plotChart renders one prebuilt plot.
type plotChart struct {
	p    *plot.Plot
	w, h vg.Length
}

func (c plotChart) Render(out io.Writer, f Format) error { return render(out, f, c.w, c.h, c.p) }

// legendGap separates the data area from the legend beside it.
const legendGap = 3 * vg.Millimeter

// render draws a column of plots, one above the other, into a w×h image. Legends go in
// a strip on the right, beside their plot and outside its data, where they can hide
// nothing; the strip is as wide as the widest legend, so the plots' x axes stay aligned.
func render(out io.Writer, f Format, w, h vg.Length, plots ...*plot.Plot) error {
	var canvas vg.CanvasWriterTo
	switch f {
	case PNG:
		img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(96), vgimg.UseBackgroundColor(color.White))
		canvas = vgimg.PngCanvas{Canvas: img}
	case SVG:
		canvas = vgsvg.New(w, h)
	default:
		return fmt.Errorf("%w: %q", ErrUnknownFormat, f)
	}
	dc := draw.New(canvas)
	var strip vg.Length
	for _, p := range plots {
		r := p.Legend.Rectangle(dc)
		if width := r.Max.X - r.Min.X; r.Max.Y > r.Min.Y && width > 0 {
			strip = max(strip, width+legendGap+2*vg.Millimeter)
		}
	}
	grid := make([][]*plot.Plot, len(plots))
	for i, p := range plots {
		grid[i] = []*plot.Plot{p}
	}
	tiles := draw.Tiles{
		Rows: len(plots), Cols: 1,
		PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter,
		PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter,
	}
	canvases := plot.Align(grid, tiles, draw.Crop(dc, 0, -strip, 0, 0))
	for i, p := range plots {
		c := canvases[i][0]
		legend := p.Legend
		p.Legend = plot.NewLegend() // drawn below, outside the data
		p.Draw(c)
		p.Legend = legend
		if strip == 0 {
			continue
		}
		area := draw.Canvas{Canvas: c.Canvas, Rectangle: vg.Rectangle{
			Min: vg.Point{X: c.Max.X + legendGap, Y: c.Min.Y},
			Max: vg.Point{X: dc.Max.X - vg.Millimeter, Y: c.Max.Y - 6*vg.Millimeter}, // below the title
		}}
		legend.Top, legend.Left = true, true
		legend.Draw(area)
	}
	if _, err := canvas.WriteTo(out); err != nil {
		return err
	}
	return nil
}

// newPlot returns a plot with the lab's common styling.
func newPlot(title, xlabel, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.Y.Tick.Marker = PlainTicks{}
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	return p
}
