package main

// Paper mode: the research's figures reproduced ("Non-blocking PMI
// Extensions for Fast MPI Startup", figures 9-12 and Table II).
//
//	pmibench -paper [-nodes 4,16,64] [-ppn 256] [-rounds 10] [-work 2ms]
//	         [-figs 9,10,11,12] [-netio net] [-compress auto] [-tree-width 8]
//	         [-max-p 0] [-net-timeout 60s] [-timeout 300s] [-pmirun PATH]
//	         [-markdown] [-json FILE] [-plot DIR] [-v]
//
// It runs scale jobs (scale.go: K loopback agents of PPN goroutine
// ranks each, the real shared-memory client) of the paper-* workloads
// (internal/virtual), the ranks exchanging the research's MVAPICH2-like
// 9-byte key and 18-byte value, and for every job size P, in this order:
//
//   - figures 9 and 12 and Table II: paper-fence (put, Fence, get),
//     paper-allgather, paper-ifence and paper-iallgather (the
//     non-blocking ones waited for at once);
//   - figure 11: paper-ifence-sleep and -spin with a compute C of the
//     median of paper-fence measured just before at that P, and
//     paper-iallgather-sleep and -spin with C = paper-allgather's median;
//     each rank starts the exchange, sleeps or busy-spins for C, then
//     waits. Overlap = (T_blocking + C − T_total) / T_blocking, clamped
//     to [0, 100] % (overlapPct);
//   - figure 10: an MPI_Init-style start-up with local work W (-work,
//     sleeping): paper-init-fence (W, put, Fence, get), paper-init-allgather
//     (W, Allgather), paper-init-iallgather (Iallgather, W, init returns,
//     Wait deferred).
//
// Times are global rank 0's medians over the timed rounds (rounds back
// to back, as the research's benchmark repeats its operation), except
// that figure 10's init time is the median tail: from the last rank's
// entry into "MPI_Init" to the last rank's return from it, every rank's
// stamps on the machine's clock; for paper-init-iallgather rank 0's own
// median is the time until its Wait returned. Figure 12's compute for a
// perfect overlap is the non-blocking exchange's completion time from
// its start, paper-ifence's and paper-iallgather's medians.
//
// It prints one table per figure (-markdown for markdown), writes every
// job's results with -json, and with -plot DIR draws paper-fig9,
// paper-fig10, paper-fig11 and paper-fig12 (SVG and PNG).

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/benchplot"
	"github.com/fastpmi/fastpmi/internal/virtual"
	"github.com/fastpmi/fastpmi/perf"
)

// paperOptions are paper mode's parsed command line: the scale options
// it shares (one backend, no late arrival) and its own.
type paperOptions struct {
	scaleOptions
	work time.Duration // -work: figure 10's local init work W
	figs []int         // figures to run: 9, 10, 11, 12
}

// paperFigs are the figures -figs may name.
var paperFigs = []int{9, 10, 11, 12}

func parsePaperFlags(args []string, stderr io.Writer) (paperOptions, error) {
	o := paperOptions{scaleOptions: scaleOptions{late: "off"}}
	fs := flag.NewFlagSet("pmibench -paper", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nodes := fs.String("nodes", "4,16,64", "comma-separated agent counts K")
	ppns := fs.String("ppn", "256", "comma-separated ranks per agent")
	figs := fs.String("figs", "9,10,11,12", "comma-separated figures of the research to reproduce")
	backend := fs.String("netio", "net", "agent-link backend: net, uring, auto")
	fs.DurationVar(&o.work, "work", 2*time.Millisecond, "figure 10: each rank's local init work (sleeping)")
	o.jobFlags(fs, "draw the figures (SVG and PNG) into this `DIR`")
	if err := parseFlagSet(fs, args, "pmibench -paper [options]",
		"Reproduces the research's figures 9-12 and Table II (Fence vs Allgather, overlap, MPI_Init) with goroutine ranks on loopback agents."); err != nil {
		return o, err
	}
	var err error
	if o.nodes, err = parseInts(*nodes); err != nil {
		return o, fmt.Errorf("parse -nodes: %w", err)
	}
	if o.ppns, err = parseInts(*ppns); err != nil {
		return o, fmt.Errorf("parse -ppn: %w", err)
	}
	if o.figs, err = parseInts(*figs); err != nil {
		return o, fmt.Errorf("parse -figs: %w", err)
	}
	for _, f := range o.figs {
		if !slices.Contains(paperFigs, f) {
			return o, fmt.Errorf("parse -figs: no figure %d (want 9, 10, 11 or 12)", f)
		}
	}
	if o.backends, err = parseNames(*backend, []string{"net", "uring", "auto"}); err != nil {
		return o, fmt.Errorf("parse -netio: %w", err)
	}
	switch {
	case len(o.backends) != 1:
		return o, fmt.Errorf("parse -netio: %q: want one backend", *backend)
	case o.work <= 0 || o.work > node.MaxVirtualWork:
		return o, fmt.Errorf("parse -work: %v: want more than 0 and at most %v", o.work, node.MaxVirtualWork)
	}
	return o, o.checkJobFlags()
}

func (o paperOptions) fig(n int) bool { return slices.Contains(o.figs, n) }

// The workloads of each figure (node.VirtualWorkloads).
const (
	opFence      = "paper-fence"
	opAllgather  = "paper-allgather"
	opIfence     = "paper-ifence"
	opIallgather = "paper-iallgather"

	opIfenceSleep     = "paper-ifence-sleep"
	opIfenceSpin      = "paper-ifence-spin"
	opIallgatherSleep = "paper-iallgather-sleep"
	opIallgatherSpin  = "paper-iallgather-spin"

	opInitFence      = "paper-init-fence"
	opInitAllgather  = "paper-init-allgather"
	opInitIallgather = "paper-init-iallgather"
)

// overlapPairs are figure 11's non-blocking compute workloads and the
// blocking workload whose median is their compute.
var overlapPairs = []struct{ op, blocking string }{
	{opIfenceSleep, opFence}, {opIfenceSpin, opFence},
	{opIallgatherSleep, opAllgather}, {opIallgatherSpin, opAllgather},
}

// layouts are the (K, PPN) of the run, by P.
func (o paperOptions) layouts() []scaleConfig {
	var out []scaleConfig
	for _, k := range o.nodes {
		for _, ppn := range o.ppns {
			out = append(out, scaleConfig{Backend: o.backends[0], Nodes: k, PPN: ppn})
		}
	}
	slices.SortStableFunc(out, func(a, b scaleConfig) int { return a.P() - b.P() })
	return out
}

// jobsPerLayout is how many jobs the run has per layout.
func (o paperOptions) jobsPerLayout() int {
	n := 0
	if o.fig(9) || o.fig(11) || o.fig(12) {
		n += 4
	}
	if o.fig(11) {
		n += len(overlapPairs)
	}
	if o.fig(10) {
		n += 3
	}
	return n
}

func runPaper(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parsePaperFlags(args, stderr)
	root, code, done := start(err, stderr, o.jsonPath, o.plotDir)
	if done {
		return code
	}
	h, code, ok := newScaleRunner(o.scaleOptions, root, stderr)
	if !ok {
		return code
	}
	defer h.close()
	layouts := o.layouts()
	h.total = len(layouts) * o.jobsPerLayout()
	fmt.Fprintf(stderr, "pmibench: paper: pmirun = %s; %d CPUs, %s available; figures %v; %d jobs of %d timed rounds (+%d warm-up); netio %s; compression %s\n",
		h.pmirun, runtime.NumCPU(), mib(h.avail), o.figs, h.total, o.rounds, virtual.WarmupRounds, o.backends[0], o.codec)
	started := time.Now()
	var results []scaleResult
	code = 0
	for _, l := range layouts {
		got := map[string]scaleResult{}
		job := func(op string, work time.Duration) {
			if ctx.Err() != nil {
				return
			}
			c := l
			c.Op, c.Work = op, work
			r := h.run(ctx, c)
			if r.cut {
				return // the stop is said after the layout
			}
			if r.Err != "" {
				code = 1
			}
			got[op] = r
			results = append(results, r)
		}
		if o.fig(9) || o.fig(11) || o.fig(12) {
			for _, op := range []string{opFence, opAllgather, opIfence, opIallgather} {
				job(op, 0)
			}
		}
		if o.fig(11) {
			for _, p := range overlapPairs {
				b := got[p.blocking]
				if !b.ok() {
					c := l
					c.Op = p.op
					results = append(results, scaleResult{scaleConfig: c, Skipped: p.blocking + " gave no time to compute for"})
					h.jobs++
					continue
				}
				job(p.op, min(b.Median, node.MaxVirtualWork))
			}
		}
		if o.fig(10) {
			for _, op := range []string{opInitFence, opInitAllgather, opInitIallgather} {
				job(op, o.work)
			}
		}
		if ctx.Err() != nil {
			fmt.Fprintf(stderr, "pmibench: stopped early: %v\n", context.Cause(ctx))
			code = 1
			break
		}
	}
	rows := paperRows(results)
	if err := writePaperTables(stdout, o, rows); err != nil {
		fmt.Fprintf(stderr, "pmibench: %v\n", err)
		code = 1
	}
	if o.jsonPath != "" {
		if err := writeScaleJSON(o.jsonPath, o.scaleOptions, started, results); err != nil {
			fmt.Fprintf(stderr, "pmibench: %v\n", err)
			code = 1
		}
	}
	if o.plotDir != "" {
		files, err := writePaperPlots(o.plotDir, o, rows)
		if err != nil {
			fmt.Fprintf(stderr, "pmibench: %v\n", err)
			code = 1
		}
		sayWritten(stderr, files)
	}
	return code
}

// ok reports whether r ran and timed its rounds.
func (r scaleResult) ok() bool { return r.Err == "" && r.Skipped == "" && r.Median > 0 }

// overlapPct is the research's overlap of a non-blocking exchange with
// compute: of the blocking exchange's time, the part hidden behind the
// compute, (blocking + work − total) / blocking, in percent and clamped
// to [0, 100]: 100 when the exchange plus compute took only the compute,
// 0 when they took as long as both one after the other (or longer).
func overlapPct(blocking, work, total time.Duration) (float64, error) {
	if blocking <= 0 || work < 0 || total <= 0 {
		return 0, fmt.Errorf("overlap of %v of compute with a %v exchange in %v: want positive times", work, blocking, total)
	}
	p := 100 * float64(blocking+work-total) / float64(blocking)
	return min(max(p, 0), 100), nil
}

// paperRow is one job size's results by workload.
type paperRow struct {
	p, nodes, ppn int
	by            map[string]scaleResult
}

// paperRows groups results by P (the first layout of each P), in P order.
func paperRows(results []scaleResult) []paperRow {
	var rows []paperRow
	for _, r := range results {
		i := slices.IndexFunc(rows, func(x paperRow) bool { return x.p == r.P() })
		if i < 0 {
			rows = append(rows, paperRow{p: r.P(), nodes: r.Nodes, ppn: r.PPN, by: map[string]scaleResult{}})
			i = len(rows) - 1
		}
		if x := rows[i]; x.nodes == r.Nodes && x.ppn == r.PPN {
			x.by[r.Op] = r
		}
	}
	slices.SortStableFunc(rows, func(a, b paperRow) int { return a.p - b.p })
	return rows
}

// median is op's median time (global rank 0's), if it ran.
func (row paperRow) median(op string) (time.Duration, bool) {
	r, ok := row.by[op]
	return r.Median, ok && r.ok()
}

// tail is op's median tail (job-wide: last entry to last completion).
func (row paperRow) tail(op string) (time.Duration, bool) {
	r, ok := row.by[op]
	return r.TailMed, ok && r.ok() && r.TailMed > 0
}

// overlap is figure 11's overlap of op, with its compute and total time.
func (row paperRow) overlap(op, blocking string) (pct float64, work, total time.Duration, ok bool) {
	b, okb := row.median(blocking)
	r, okr := row.by[op]
	if !okb || !okr || !r.ok() {
		return 0, 0, 0, false
	}
	pct, err := overlapPct(b, r.Work, r.Median)
	return pct, r.Work, r.Median, err == nil
}

// bytesPerNode is what a node received per exchange of op: the
// broadcast bytes before ("in") and after decompression ("raw"), least
// node.
func (row paperRow) bytesPerNode(op string) (in, raw float64, ok bool) {
	r, okr := row.by[op]
	if !okr || !r.ok() {
		return 0, 0, false
	}
	in, _, ok1 := r.perNode("bcast.bytes.in")
	raw, _, ok2 := r.perNode("bcast.bytes.raw")
	return in, raw, ok1 && ok2
}

func durCell(d time.Duration, ok bool) string {
	if !ok {
		return "-"
	}
	return perf.FormatDuration(d)
}

func ratioCell(a, b time.Duration, okA, okB bool) string {
	if !okA || !okB || b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(a)/float64(b))
}

func pctCell(p float64, ok bool) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.0f %%", p)
}

// paperTable is one figure's table.
type paperTable struct {
	title  string
	header []string
	body   [][]string
}

// paperTables lays out the figures the run made.
func paperTables(o paperOptions, rows []paperRow) []paperTable {
	var out []paperTable
	pcell := func(row paperRow) []string {
		return []string{strconv.Itoa(row.p), fmt.Sprintf("%d×%d", row.nodes, row.ppn)}
	}
	if o.fig(9) {
		t := paperTable{title: "Figure 9 / Table II: Fence vs Allgather, and the non-blocking ones waited for at once (rank 0's median per exchange; bytes a node received per exchange)",
			header: []string{"P", "K×ppn", "Fence", "Allgather", "Allgather/Fence", "Ifence+Wait", "Ifence/Fence", "Iallgather+Wait", "Iallgather/Allgather",
				"Fence bcast in/raw per node", "Allgather bcast in/raw per node"}}
		for _, row := range rows {
			f, okf := row.median(opFence)
			a, oka := row.median(opAllgather)
			fi, okfi := row.median(opIfence)
			ai, okai := row.median(opIallgather)
			line := append(pcell(row), durCell(f, okf), durCell(a, oka), ratioCell(a, f, oka, okf),
				durCell(fi, okfi), ratioCell(fi, f, okfi, okf), durCell(ai, okai), ratioCell(ai, a, okai, oka))
			for _, op := range []string{opFence, opAllgather} {
				cell := "-"
				if in, raw, ok := row.bytesPerNode(op); ok {
					cell = bytesCell(in) + " / " + bytesCell(raw)
				}
				line = append(line, cell)
			}
			t.body = append(t.body, line)
		}
		out = append(out, t)
	}
	if o.fig(10) {
		t := paperTable{title: fmt.Sprintf("Figure 10: MPI_Init-style start-up, %v of local work (median init time: last rank's start to last rank's return)", o.work),
			header: []string{"P", "K×ppn", "Fence init", "Allgather init", "Iallgather init", "Iallgather: rank 0 until Wait returned", "Fence/Iallgather init", "Allgather/Fence init"}}
		for _, row := range rows {
			f, okf := row.tail(opInitFence)
			a, oka := row.tail(opInitAllgather)
			i, oki := row.tail(opInitIallgather)
			w, okw := row.median(opInitIallgather)
			t.body = append(t.body, append(pcell(row), durCell(f, okf), durCell(a, oka), durCell(i, oki), durCell(w, okw),
				ratioCell(f, i, okf, oki), ratioCell(a, f, oka, okf)))
		}
		out = append(out, t)
	}
	if o.fig(11) {
		t := paperTable{title: "Figure 11: overlap of the non-blocking exchange with compute C = the blocking exchange's median at that P (rank 0's median total; overlap = (T_blocking + C − T_total) / T_blocking, clamped to 0-100 %)",
			header: []string{"P", "K×ppn", "C (Fence)", "Ifence+sleep", "overlap", "Ifence+spin", "overlap", "C (Allgather)", "Iallgather+sleep", "overlap", "Iallgather+spin", "overlap"}}
		for _, row := range rows {
			line := pcell(row)
			for i, pr := range overlapPairs {
				pct, work, total, ok := row.overlap(pr.op, pr.blocking)
				if i%2 == 0 {
					line = append(line, durCell(work, ok))
				}
				line = append(line, durCell(total, ok), pctCell(pct, ok))
			}
			t.body = append(t.body, line)
		}
		out = append(out, t)
	}
	if o.fig(12) {
		t := paperTable{title: "Figure 12: compute needed for a perfect overlap: the non-blocking exchange's completion time from its start (rank 0's median; tail: after the last rank started)",
			header: []string{"P", "K×ppn", "Ifence", "Iallgather", "Ifence/Iallgather", "Ifence tail", "Iallgather tail"}}
		for _, row := range rows {
			f, okf := row.median(opIfence)
			a, oka := row.median(opIallgather)
			ft, okft := row.tail(opIfence)
			at, okat := row.tail(opIallgather)
			t.body = append(t.body, append(pcell(row), durCell(f, okf), durCell(a, oka), ratioCell(f, a, okf, oka), durCell(ft, okft), durCell(at, okat)))
		}
		out = append(out, t)
	}
	return out
}

func writePaperTables(w io.Writer, o paperOptions, rows []paperRow) error {
	for i, t := range paperTables(o, rows) {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if o.markdown {
			fmt.Fprintf(w, "%s\n\n", t.title)
			if _, err := io.WriteString(w, perf.MarkdownTable(t.header, t.body)); err != nil {
				return fmt.Errorf("write table: %w", err)
			}
			continue
		}
		fmt.Fprintln(w, t.title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		for _, line := range append([][]string{t.header}, t.body...) {
			fmt.Fprintln(tw, strings.Join(line, "\t")+"\t")
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
	}
	return nil
}

// paperSeries is one line of a figure: y(row) over P where ok.
func paperSeries(name string, rows []paperRow, y func(paperRow) (float64, bool)) benchplot.Series {
	s := benchplot.Series{Name: name}
	for _, row := range rows {
		if v, ok := y(row); ok {
			s.X = append(s.X, float64(row.p))
			s.Y = append(s.Y, v)
		}
	}
	return s
}

// writePaperPlots draws each figure the run made into dir
// (paper-figN.{svg,png}) and returns the files written.
func writePaperPlots(dir string, o paperOptions, rows []paperRow) ([]string, error) {
	msOf := func(d time.Duration, ok bool) (float64, bool) { return ms(d), ok }
	median := func(op string) func(paperRow) (float64, bool) {
		return func(row paperRow) (float64, bool) { return msOf(row.median(op)) }
	}
	tail := func(op string) func(paperRow) (float64, bool) {
		return func(row paperRow) (float64, bool) { return msOf(row.tail(op)) }
	}
	type figure struct {
		n      int
		ax     benchplot.Axes
		series []benchplot.Series
	}
	var figs []figure
	if o.fig(9) {
		figs = append(figs, figure{9, benchplot.Axes{Title: "Fig. 9: Fence vs Allgather (rank 0's median per exchange)", X: "processes (P)", Y: "time (ms)", LogX: true, LogY: true},
			[]benchplot.Series{paperSeries("Fence", rows, median(opFence)), paperSeries("Allgather", rows, median(opAllgather)),
				paperSeries("Ifence+Wait", rows, median(opIfence)), paperSeries("Iallgather+Wait", rows, median(opIallgather))}})
	}
	if o.fig(10) {
		figs = append(figs, figure{10, benchplot.Axes{Title: fmt.Sprintf("Fig. 10: MPI_Init-style start-up with %v of local work (median init time)", o.work), X: "processes (P)", Y: "time (ms)", LogX: true, YFromZero: true},
			[]benchplot.Series{paperSeries("Fence", rows, tail(opInitFence)), paperSeries("Allgather", rows, tail(opInitAllgather)),
				paperSeries("Iallgather", rows, tail(opInitIallgather)), paperSeries("Iallgather until Wait (rank 0)", rows, median(opInitIallgather))}})
	}
	if o.fig(11) {
		var series []benchplot.Series
		for _, pr := range overlapPairs {
			name := strings.TrimPrefix(pr.op, "paper-")
			series = append(series, paperSeries(name, rows, func(row paperRow) (float64, bool) {
				pct, _, _, ok := row.overlap(pr.op, pr.blocking)
				return pct, ok
			}))
		}
		figs = append(figs, figure{11, benchplot.Axes{Title: "Fig. 11: overlap with compute C = the blocking exchange's time", X: "processes (P)", Y: "overlap (%)", LogX: true, YFromZero: true, LegendBottom: true}, series})
	}
	if o.fig(12) {
		figs = append(figs, figure{12, benchplot.Axes{Title: "Fig. 12: compute needed for a perfect overlap (completion time from the start)", X: "processes (P)", Y: "time (ms)", LogX: true, LogY: true},
			[]benchplot.Series{paperSeries("Ifence", rows, median(opIfence)), paperSeries("Iallgather", rows, median(opIallgather))}})
	}
	var files []string
	for _, f := range figs {
		if !slices.ContainsFunc(f.series, func(s benchplot.Series) bool { return len(s.X) > 0 }) {
			return files, fmt.Errorf("plot figure %d: no successful job", f.n)
		}
		p, err := benchplot.Lines(f.ax, f.series)
		if err != nil {
			return files, err
		}
		got, err := benchplot.Save(p, dir, fmt.Sprintf("paper-fig%d", f.n))
		files = append(files, got...)
		if err != nil {
			return files, err
		}
	}
	return files, nil
}
