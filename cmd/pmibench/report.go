package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/fastpmi/fastpmi/perf"
)

// Cell is the statistics of one launcher at one (workload, N).
type Cell struct {
	Launcher string
	Stats    perf.Stats // of the successful runs only
	Failed   int
}

// Row is one (workload, N) with a Cell per launcher, in launcher order.
type Row struct {
	Workload string
	N        int
	Cells    []Cell
}

// Ratio is the median of the first launcher over that of the second
// (pmirun/hydra), or 0 when there are fewer than two launchers or either
// has no successful run.
func (r Row) Ratio() float64 { return r.RatioTo(1) }

// RatioTo is the median of the first launcher over that of launcher i,
// or 0 when either has no successful run.
func (r Row) RatioTo(i int) float64 {
	if i < 1 || i >= len(r.Cells) || r.Cells[0].Stats.N == 0 || r.Cells[i].Stats.N == 0 {
		return 0
	}
	return float64(r.Cells[0].Stats.Median) / float64(r.Cells[i].Stats.Median)
}

// Summarize groups samples into rows, one per (workload, N), ordered by
// workload as they first appear and then by N, with one cell per launcher
// in the given order.
func Summarize(samples []Sample, launchers []string) []Row {
	type key struct {
		w string
		n int
	}
	var order []key
	walls := make(map[key]map[string][]time.Duration)
	failed := make(map[key]map[string]int)
	for _, s := range samples {
		k := key{s.Workload, s.N}
		if walls[k] == nil {
			order = append(order, k)
			walls[k] = make(map[string][]time.Duration)
			failed[k] = make(map[string]int)
		}
		if s.OK() {
			walls[k][s.Launcher] = append(walls[k][s.Launcher], s.Wall)
		} else {
			failed[k][s.Launcher]++
		}
	}
	// Group by workload (in order of first appearance), then N ascending.
	wIndex := make(map[string]int)
	for _, k := range order {
		if _, ok := wIndex[k.w]; !ok {
			wIndex[k.w] = len(wIndex)
		}
	}
	slices.SortStableFunc(order, func(a, b key) int {
		if c := cmp.Compare(wIndex[a.w], wIndex[b.w]); c != 0 {
			return c
		}
		return cmp.Compare(a.n, b.n)
	})
	rows := make([]Row, 0, len(order))
	for _, k := range order {
		row := Row{Workload: k.w, N: k.n}
		for _, l := range launchers {
			row.Cells = append(row.Cells, Cell{Launcher: l, Stats: perf.Describe(walls[k][l]), Failed: failed[k][l]})
		}
		rows = append(rows, row)
	}
	return rows
}

// Table lays rows out as a header and cells: workload, N, each launcher's
// median, the ratio of the first launcher's median to each other's (one
// column per peer, side by side), each launcher's min and max, and the
// number of failed runs.
func Table(rows []Row, launchers []string) (header []string, body [][]string) {
	header = []string{"workload", "N"}
	for _, l := range launchers {
		header = append(header, l+" median")
	}
	for _, l := range launchers[min(1, len(launchers)):] {
		header = append(header, launchers[0]+"/"+l)
	}
	for _, l := range launchers {
		header = append(header, l+" min", l+" max")
	}
	header = append(header, "failed")
	for _, r := range rows {
		line := []string{r.Workload, strconv.Itoa(r.N)}
		failed := 0
		for _, c := range r.Cells {
			line = append(line, perf.FormatDuration(c.Stats.Median))
			failed += c.Failed
		}
		for i := 1; i < len(r.Cells); i++ {
			ratio := "-"
			if q := r.RatioTo(i); q > 0 {
				ratio = fmt.Sprintf("%.2fx", q)
			}
			line = append(line, ratio)
		}
		for _, c := range r.Cells {
			line = append(line, perf.FormatDuration(c.Stats.Min), perf.FormatDuration(c.Stats.Max))
		}
		body = append(body, append(line, strconv.Itoa(failed)))
	}
	return header, body
}

// WriteTable writes the table as markdown or as aligned plain text.
func WriteTable(w io.Writer, rows []Row, launchers []string, markdown bool) error {
	header, body := Table(rows, launchers)
	if markdown {
		if _, err := io.WriteString(w, perf.MarkdownTable(header, body)); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, line := range append([][]string{header}, body...) {
		for _, c := range line {
			fmt.Fprintf(tw, "%s\t", c)
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// Report is the -json output: what ran and every raw sample.
type Report struct {
	Started   time.Time        `json:"started"`
	Host      string           `json:"host,omitempty"`
	CPUs      int              `json:"cpus"`
	Runs      int              `json:"runs"`
	Warmup    int              `json:"warmup"`
	TimeoutNS time.Duration    `json:"timeout_ns"`
	Launchers []reportLauncher `json:"launchers"`
	Workloads []Workload       `json:"workloads"`
	Notes     []string         `json:"notes,omitempty"`
	Samples   []Sample         `json:"samples"`
	// Phases, with -plot, holds pmirun's start-up phases of each of its
	// runs (by the sample's Seq), from its --report: how long each
	// phase stack took (plot.go).
	Phases map[int]map[string]time.Duration `json:"pmirun_phases_ns,omitempty"`
}

type reportLauncher struct {
	Name string   `json:"name"`
	Path string   `json:"path"`
	Args []string `json:"args,omitempty"`
	Prog string   `json:"prog,omitempty"` // instead of the workload's
	Only string   `json:"only,omitempty"` // the one workload it runs
}

// WriteJSON writes rep as indented JSON.
func WriteJSON(w io.Writer, rep Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fmt.Errorf("encode samples: %w", err)
	}
	return nil
}
