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
	"os"
	"path/filepath"
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

// render draws a column of plots, one above the other, into a w×h image.
func render(out io.Writer, f Format, w, h vg.Length, plots ...*plot.Plot) error {
	var (
		canvas vg.CanvasWriterTo
	)
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
	canvases := plot.Align(grid, tiles, dc)
	for i, p := range plots {
		p.Draw(canvases[i][0])
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
	p.Legend.Top = true
	p.Legend.Left = true
	return p
}
