package node

import (
	"slices"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// Binding units come from the topology: hwthreads of a core together,
// cores of a socket, socket-major order with -map-by socket.
func TestBindSets(t *testing.T) {
	// 2 sockets × 2 cores × 2 threads; CPU numbers interleaved as Linux
	// numbers siblings.
	var places []sys.CPUPlace
	for cpu := range 8 {
		places = append(places, sys.CPUPlace{CPU: cpu, Socket: cpu % 4 / 2, Core: cpu % 2})
	}
	for _, c := range []struct {
		unit, mapBy string
		n           int
		want        [][]int
	}{
		{"hwthread", "", 3, [][]int{{0}, {4}, {1}}},
		{"core", "", 5, [][]int{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {0, 4}}},
		{"core", "socket", 4, [][]int{{0, 4}, {2, 6}, {1, 5}, {3, 7}}},
		{"socket", "", 3, [][]int{{0, 1, 4, 5}, {2, 3, 6, 7}, {0, 1, 4, 5}}},
	} {
		got := bindSets(places, c.unit, c.mapBy, c.n)
		if !slicesEqual(got, c.want) {
			t.Errorf("bind %s map %s: %v, want %v", c.unit, c.mapBy, got, c.want)
		}
	}
}

func slicesEqual(a, b [][]int) bool {
	return slices.EqualFunc(a, b, func(x, y []int) bool { return slices.Equal(x, y) })
}

// CheckPattern accepts only the verbs given; Expand fills them.
func TestPatterns(t *testing.T) {
	for p, ok := range map[string]bool{"": true, "[%r] ": true, "%h%%%t": true, "%x": false, "50%": false} {
		if err := CheckPattern(p, "rht"); (err == nil) != ok {
			t.Errorf("CheckPattern(%q) = %v, want ok %v", p, err, ok)
		}
	}
	if got := Expand("out.%r.%h.%%", 3, "n1", time.Time{}); got != "out.3.n1.%" {
		t.Errorf("Expand = %q", got)
	}
}
