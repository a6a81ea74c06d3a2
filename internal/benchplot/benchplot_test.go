package benchplot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"image/png"
	"os"
	"strings"
	"testing"

	"gonum.org/v1/plot"
)

// Save writes an SVG that is XML with an <svg> root and a PNG that
// decodes to the figure's size, for lines and for stacked bars.
func TestSave(t *testing.T) {
	dir := t.TempDir()
	lines, err := Lines(Axes{Title: "start-up", X: "N", Y: "ms", LogX: true, YFromZero: true}, []Series{
		{Name: "pmirun", X: []float64{1, 4, 16, 64}, Y: []float64{5, 7, 12, 40}, Lo: []float64{4, 6, 11, 35}, Hi: []float64{6, 9, 15, 50}},
		{Name: "hydra", X: []float64{1, 4, 16, 64}, Y: []float64{20, 25, 40, 90}},
	})
	if err != nil {
		t.Fatal(err)
	}
	bars, err := StackedBars(Axes{Title: "phases", Y: "ms"}, []string{"1", "4", "16"}, []Stack{
		{Name: "fork", Values: []float64{1, 2, 8}}, {Name: "PMI", Values: []float64{2, 3, 5}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]*plot.Plot{"lines": lines, "bars": bars} {
		paths, err := Save(p, dir, name)
		if err != nil || len(paths) != 2 {
			t.Fatalf("%s: saved %v: %v", name, paths, err)
		}
		svg, err := os.ReadFile(paths[0])
		if err != nil {
			t.Fatal(err)
		}
		var root struct{ XMLName xml.Name }
		if err := xml.Unmarshal(svg, &root); err != nil || root.XMLName.Local != "svg" {
			t.Errorf("%s: %s is not an SVG document (%v, root %q)", name, paths[0], err, root.XMLName.Local)
		}
		if !strings.Contains(string(svg), "pmirun") && name == "lines" {
			t.Errorf("%s: the SVG has no legend entry pmirun", name)
		}
		b, err := os.ReadFile(paths[1])
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %s is not a PNG: %v", name, paths[1], err)
		}
		if r := img.Bounds(); r.Dx() < 300 || r.Dy() < 200 {
			t.Errorf("%s: PNG of %v, want a figure of some size", name, r)
		}
	}
}

func TestBadInput(t *testing.T) {
	if _, err := Lines(Axes{}, nil); err == nil {
		t.Error("no series accepted")
	}
	if _, err := Lines(Axes{}, []Series{{Name: "a", X: []float64{1, 2}, Y: []float64{1}}}); err == nil {
		t.Error("x and y of different lengths accepted")
	}
	if _, err := Lines(Axes{}, []Series{{Name: "a", X: []float64{1}, Y: []float64{1}, Lo: []float64{1}}}); err == nil {
		t.Error("half error bars accepted")
	}
	if _, err := StackedBars(Axes{}, []string{"a", "b"}, []Stack{{Name: "s", Values: []float64{1}}}); err == nil {
		t.Error("a stack with too few values accepted")
	}
}

// A log axis the points do not span (one N; a value not above zero) is
// drawn linear: the figure is saved, where the plotting library panicked;
// series without a point are ErrNoPoints, nothing to draw.
func TestLogAxisWithoutSpan(t *testing.T) {
	dir := t.TempDir()
	for i, s := range []Series{
		{Name: "one N", X: []float64{1}, Y: []float64{5}, Lo: []float64{4}, Hi: []float64{6}},
		{Name: "zero", X: []float64{0, 4}, Y: []float64{0, 2}},
	} {
		p, err := Lines(Axes{Title: s.Name, LogX: true, LogY: true}, []Series{s, {Name: "empty"}})
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		if _, err := Save(p, dir, fmt.Sprint("fig", i)); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
	}
	if _, err := Lines(Axes{LogX: true}, []Series{{Name: "a"}, {Name: "b"}}); !errors.Is(err, ErrNoPoints) {
		t.Errorf("series without points: %v, want ErrNoPoints", err)
	}
}
