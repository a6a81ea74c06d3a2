// Package benchplot draws pmibench's figures with gonum/plot: lines of a
// measure over a size (one series per launcher or operation, with min–max
// error bars) and stacked bars of phases. It holds no benchmark logic:
// pmibench gives it numbers and a directory, and Save writes each figure
// as SVG and PNG. Only pmibench imports it, so pmirun and pmid do not
// link the plotting library (internal/importrules checks it).
package benchplot

import (
	"errors"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Series is one line: Y over X, with Lo and Hi (both nil, or as long as
// X) drawn as error bars, for example a launcher's median start-up time
// over N with its min and max.
type Series struct {
	Name   string
	X, Y   []float64
	Lo, Hi []float64
}

func (s Series) check() error {
	switch {
	case len(s.X) != len(s.Y):
		return fmt.Errorf("series %q: %d x for %d y", s.Name, len(s.X), len(s.Y))
	case (s.Lo == nil) != (s.Hi == nil), s.Lo != nil && (len(s.Lo) != len(s.X) || len(s.Hi) != len(s.X)):
		return fmt.Errorf("series %q: error bars do not match its %d points", s.Name, len(s.X))
	}
	return nil
}

// Axes names a figure's title and axes; Log draws an axis on a log scale.
type Axes struct {
	Title, X, Y  string
	LogX, LogY   bool
	YFromZero    bool // start the y axis at 0 (linear axes only)
	LegendBottom bool // legend at the bottom right instead of the top left
}

// ErrNoPoints: none of a figure's series has a point (every run failed,
// say); there is nothing to draw.
var ErrNoPoints = errors.New("no points to draw")

// Lines draws series over shared axes. An axis asked for on a log scale
// is drawn linear when the points do not span it: one value (a single N),
// or a value not above zero.
func Lines(ax Axes, series []Series) (*plot.Plot, error) {
	if len(series) == 0 {
		return nil, errors.New("plot lines: no series")
	}
	var xs, ys []float64
	for _, s := range series {
		xs, ys = append(xs, s.X...), append(ys, s.Y...)
	}
	if len(xs) == 0 {
		return nil, fmt.Errorf("plot %q: %w", ax.Title, ErrNoPoints)
	}
	ax.LogX = ax.LogX && spansLog(xs)
	ax.LogY = ax.LogY && spansLog(ys)
	p := newPlot(ax)
	for i, s := range series {
		if err := s.check(); err != nil {
			return nil, fmt.Errorf("plot %q: %w", ax.Title, err)
		}
		if len(s.X) == 0 {
			continue
		}
		pts := make(plotter.XYs, len(s.X))
		for j := range s.X {
			pts[j].X, pts[j].Y = s.X[j], s.Y[j]
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, fmt.Errorf("plot %q, series %q: %w", ax.Title, s.Name, err)
		}
		c := plotutil.Color(i)
		l.Color, sc.Color, sc.Shape = c, c, plotutil.Shape(i)
		l.Dashes = plotutil.Dashes(i)
		p.Add(l, sc)
		p.Legend.Add(s.Name, l, sc)
		if s.Lo != nil {
			e := errBars{pts: pts, lo: s.Lo, hi: s.Hi}
			bars, err := plotter.NewYErrorBars(e)
			if err != nil {
				return nil, fmt.Errorf("plot %q, series %q: %w", ax.Title, s.Name, err)
			}
			bars.Color = c
			p.Add(bars)
		}
	}
	return p, nil
}

// spansLog reports whether vs can be drawn on a log scale: all above
// zero, and not all one value.
func spansLog(vs []float64) bool {
	for _, v := range vs {
		if v <= 0 {
			return false
		}
	}
	return slices.Min(vs) < slices.Max(vs)
}

// errBars gives plotter.NewYErrorBars the points and their min and max.
type errBars struct {
	pts    plotter.XYs
	lo, hi []float64
}

func (e errBars) Len() int                    { return len(e.pts) }
func (e errBars) XY(i int) (float64, float64) { return e.pts[i].X, e.pts[i].Y }
func (e errBars) YError(i int) (float64, float64) {
	return max(e.pts[i].Y-e.lo[i], 0), max(e.hi[i]-e.pts[i].Y, 0)
}

// Stack is one layer of stacked bars: its value in each category.
type Stack struct {
	Name   string
	Values []float64
}

// StackedBars draws one bar per category, made of the stacks in order
// from the bottom, for example the phases of a start-up at each N.
func StackedBars(ax Axes, categories []string, stacks []Stack) (*plot.Plot, error) {
	if len(categories) == 0 || len(stacks) == 0 {
		return nil, errors.New("plot bars: no categories or no stacks")
	}
	ax.LogX, ax.LogY = false, false
	p := newPlot(ax)
	w := vg.Points(min(40, 360/float64(len(categories))))
	var below *plotter.BarChart
	for i, s := range stacks {
		if len(s.Values) != len(categories) {
			return nil, fmt.Errorf("plot %q: stack %q has %d values for %d categories", ax.Title, s.Name, len(s.Values), len(categories))
		}
		b, err := plotter.NewBarChart(plotter.Values(s.Values), w)
		if err != nil {
			return nil, fmt.Errorf("plot %q, stack %q: %w", ax.Title, s.Name, err)
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		if below != nil {
			b.StackOn(below)
		}
		below = b
		p.Add(b)
		p.Legend.Add(s.Name, b)
	}
	p.NominalX(categories...)
	return p, nil
}

func newPlot(ax Axes) *plot.Plot {
	p := plot.New()
	p.Title.Text = ax.Title
	p.X.Label.Text, p.Y.Label.Text = ax.X, ax.Y
	p.Add(plotter.NewGrid())
	p.BackgroundColor = color.White
	p.Legend.Top = !ax.LegendBottom
	p.Legend.Left = !ax.LegendBottom
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(4), vg.Points(-4)
	if ax.LegendBottom {
		p.Legend.YOffs = vg.Points(4)
		p.Legend.XOffs = vg.Points(-4)
	}
	if ax.LogX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	if ax.LogY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	} else if ax.YFromZero {
		p.Y.Min = 0
	}
	return p
}

// Figure size.
const (
	Width  = 16 * vg.Centimeter
	Height = 10 * vg.Centimeter
)

// Save writes p as dir/name.svg and dir/name.png (creating dir) and
// returns the two paths.
func Save(p *plot.Plot, dir, name string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("save plot: %w", err)
	}
	var out []string
	for _, ext := range []string{".svg", ".png"} {
		path := filepath.Join(dir, name+ext)
		if err := saveOne(p, path); err != nil {
			return out, fmt.Errorf("save plot %s: %w", path, err)
		}
		out = append(out, path)
	}
	return out, nil
}

// saveOne writes p to path. The plotting library panics on data it
// cannot draw: that is an error here, and no partial file is left.
func saveOne(p *plot.Plot, path string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cannot draw: %v", r)
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	return p.Save(Width, Height, path)
}
