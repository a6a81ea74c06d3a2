package main

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/internal/benchplot"
	"github.com/fastpmi/fastpmi/jobreport"
	"github.com/fastpmi/fastpmi/perf"
)

// pmirun's start-up phases, as the stacks of the phase figure: each ends
// at the last stamp of its mark in pmirun's --report (offsets from
// pmirun's start), and "pmirun" is the rest of the run's wall time
// (pmirun's own start before its recorder, and its end after the last
// rank was reaped).
var phaseStacks = []struct{ name, mark string }{
	{"fork", perf.PhaseRankForked},
	{"exec + PMI init", perf.PhaseInit},
	{"PMI exchange", perf.PhaseFinalize},
	{"exit", perf.PhaseRankExit},
}

const phasePmirun = "pmirun"

// samplePhases reduces a pmirun report to the duration of each phase
// stack, or nil if a phase is missing (a failed run).
func samplePhases(rep *jobreport.Report, wall time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	var prev time.Duration
	for _, s := range phaseStacks {
		p, ok := rep.Phase(s.mark)
		if !ok {
			return nil
		}
		end := max(p.Last, prev)
		out[s.name] = end - prev
		prev = end
	}
	out[phasePmirun] = max(wall-prev, 0)
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// writeLauncherPlots draws, into dir, per workload: the median start-up
// time over N of every launcher (min–max as error bars), and pmirun's
// phases at each N (the median of each phase over its runs). It returns
// the files written.
func writeLauncherPlots(dir, prefix string, rows []Row, samples []Sample, phases map[int]map[string]time.Duration, launchers []string) ([]string, error) {
	var files []string
	var workloads []string
	for _, r := range rows {
		if !slices.Contains(workloads, r.Workload) {
			workloads = append(workloads, r.Workload)
		}
	}
	for _, w := range workloads {
		var series []benchplot.Series
		for li, l := range launchers {
			s := benchplot.Series{Name: l, Lo: []float64{}, Hi: []float64{}}
			for _, r := range rows {
				if c := r.Cells[li]; r.Workload == w && c.Stats.N > 0 {
					s.X = append(s.X, float64(r.N))
					s.Y = append(s.Y, ms(c.Stats.Median))
					s.Lo = append(s.Lo, ms(c.Stats.Min))
					s.Hi = append(s.Hi, ms(c.Stats.Max))
				}
			}
			series = append(series, s)
		}
		p, err := benchplot.Lines(benchplot.Axes{
			Title: "start-up and end of a job: " + w + " (median, min–max)", X: "ranks (N)", Y: "wall time (ms)",
			LogX: true, YFromZero: true,
		}, series)
		if errors.Is(err, benchplot.ErrNoPoints) {
			continue // every run of the workload failed: nothing to draw
		}
		if err != nil {
			return files, err
		}
		got, err := benchplot.Save(p, dir, "startup-"+prefix+w)
		files = append(files, got...)
		if err != nil {
			return files, err
		}

		// pmirun's phases, median over its runs at each N.
		var cats []string
		stacks := make([]benchplot.Stack, len(phaseStacks)+1)
		for i, s := range phaseStacks {
			stacks[i].Name = s.name
		}
		stacks[len(phaseStacks)].Name = phasePmirun
		for _, r := range rows {
			if r.Workload != w {
				continue
			}
			per := map[string][]time.Duration{}
			for _, s := range samples {
				if ph := phases[s.Seq]; s.Workload == w && s.N == r.N && s.Launcher == "pmirun" && ph != nil {
					for k, v := range ph {
						per[k] = append(per[k], v)
					}
				}
			}
			if len(per) == 0 {
				continue
			}
			cats = append(cats, strconv.Itoa(r.N))
			for i := range stacks {
				stacks[i].Values = append(stacks[i].Values, ms(perf.Median(per[stacks[i].Name])))
			}
		}
		if len(cats) == 0 {
			continue
		}
		p, err = benchplot.StackedBars(benchplot.Axes{
			Title: "pmirun's phases: " + w + " (median of each)", X: "ranks (N)", Y: "ms",
		}, cats, stacks)
		if err != nil {
			return files, err
		}
		got, err = benchplot.Save(p, dir, "phases-"+prefix+w)
		files = append(files, got...)
		if err != nil {
			return files, err
		}
	}
	return files, nil
}

// writeScalePlots draws the scale benchmark's curves into dir: the
// median time of each collective over P, per operation and backend (log
// both ways), and the bytes the root broadcast per operation.
func writeScalePlots(dir string, results []scaleResult) ([]string, error) {
	type key struct{ op, be string }
	var order []key
	by := map[key]*benchplot.Series{}
	for _, r := range results {
		if r.Err != "" || r.Skipped != "" || r.Median <= 0 {
			continue
		}
		k := key{r.Op, r.Backend}
		s := by[k]
		if s == nil {
			s = &benchplot.Series{Name: r.Op + " (" + r.Backend + ")"}
			by[k] = s
			order = append(order, k)
		}
		s.X = append(s.X, float64(r.P()))
		s.Y = append(s.Y, float64(r.Median)/float64(time.Microsecond))
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("plot scale: no successful job")
	}
	var series []benchplot.Series
	for _, k := range order {
		s := by[k]
		// One point per P: the fastest layout (K × PPN) of that size.
		best := map[float64]float64{}
		for i, x := range s.X {
			if y, ok := best[x]; !ok || s.Y[i] < y {
				best[x] = s.Y[i]
			}
		}
		xs := make([]float64, 0, len(best))
		for x := range best {
			xs = append(xs, x)
		}
		slices.Sort(xs)
		ys := make([]float64, len(xs))
		for i, x := range xs {
			ys[i] = best[x]
		}
		series = append(series, benchplot.Series{Name: s.Name, X: xs, Y: ys})
	}
	p, err := benchplot.Lines(benchplot.Axes{
		Title: "one collective over P ranks (median, fastest layout of each P)", X: "ranks (P)", Y: "time per operation (µs)",
		LogX: true, LogY: true,
	}, series)
	if err != nil {
		return nil, err
	}
	return benchplot.Save(p, dir, "scale")
}

// writeKVSPlots draws, for each KVS pattern among the results (dense,
// sparse: the research's figure 7), the median tail after the last
// arrival over P of every design (Current, Tree, DKVS, Direct), log both
// ways, into kvs-PATTERN.{svg,png}. Results of other operations are left
// out; with none of these patterns it draws nothing.
func writeKVSPlots(dir string, results []scaleResult) ([]string, error) {
	var files []string
	for _, pattern := range []string{"dense", "sparse"} {
		var series []benchplot.Series
		for _, op := range kvsOps {
			pat, design, _ := strings.Cut(op, "/")
			if pat != pattern {
				continue
			}
			s := benchplot.Series{Name: design}
			for _, r := range results {
				if r.Op == op && r.Err == "" && r.Skipped == "" && r.TailMed > 0 {
					s.X = append(s.X, float64(r.P()))
					s.Y = append(s.Y, float64(r.TailMed)/float64(time.Microsecond))
				}
			}
			if len(s.X) > 0 {
				series = append(series, s)
			}
		}
		if len(series) == 0 {
			continue
		}
		title := map[string]string{
			"dense":  "dense key: one put, every rank gets it (median tail after the last arrival)",
			"sparse": "sparse keys: every rank puts one, gets its 2 neighbours' (median tail after the last arrival)",
		}[pattern]
		p, err := benchplot.Lines(benchplot.Axes{Title: title, X: "ranks (P)", Y: "tail (µs)", LogX: true, LogY: true}, series)
		if err != nil {
			return files, err
		}
		got, err := benchplot.Save(p, dir, "kvs-"+pattern)
		files = append(files, got...)
		if err != nil {
			return files, err
		}
	}
	return files, nil
}
