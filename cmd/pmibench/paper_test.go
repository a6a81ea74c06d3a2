package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The research's overlap: the part of the blocking time hidden behind
// the compute, clamped to [0, 100] %.
func TestOverlapPct(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		blocking, work, total time.Duration
		want                  float64
	}{
		{100 * ms, 100 * ms, 100 * ms, 100}, // all hidden
		{100 * ms, 100 * ms, 200 * ms, 0},   // one after the other
		{100 * ms, 100 * ms, 111 * ms, 89},  // the research's 89 % at 16K
		{100 * ms, 50 * ms, 125 * ms, 25},
		{100 * ms, 100 * ms, 90 * ms, 100}, // faster than the compute alone: clamped
		{100 * ms, 100 * ms, 450 * ms, 0},  // slower than both: clamped
	} {
		got, err := overlapPct(c.blocking, c.work, c.total)
		if err != nil || got < c.want-1e-9 || got > c.want+1e-9 {
			t.Errorf("overlapPct(%v, %v, %v) = %v, %v; want %v", c.blocking, c.work, c.total, got, err, c.want)
		}
	}
	for _, bad := range [][3]time.Duration{{0, ms, ms}, {ms, -ms, ms}, {ms, ms, 0}} {
		if _, err := overlapPct(bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("overlapPct%v: no error", bad)
		}
	}
}

func TestParsePaperFlags(t *testing.T) {
	o, err := parsePaperFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.nodes, []int{4, 16, 64}) || !slices.Equal(o.ppns, []int{256}) || !slices.Equal(o.figs, paperFigs) ||
		o.work != 2*time.Millisecond || !slices.Equal(o.backends, []string{"net"}) || o.late != "off" {
		t.Errorf("defaults: nodes %v ppn %v figs %v work %v netio %v late %q", o.nodes, o.ppns, o.figs, o.work, o.backends, o.late)
	}
	if got := o.jobsPerLayout(); got != 11 {
		t.Errorf("%d jobs per layout with every figure, want 11", got)
	}
	o, err = parsePaperFlags([]string{"-figs", "10", "-nodes", "16,2", "-ppn", "8,4", "-work", "5ms"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.jobsPerLayout(); got != 3 {
		t.Errorf("%d jobs per layout for figure 10, want 3", got)
	}
	var ps []int
	for _, l := range o.layouts() {
		ps = append(ps, l.P())
	}
	if !slices.Equal(ps, []int{8, 16, 64, 128}) {
		t.Errorf("layouts of P %v, want by P: 8 16 64 128", ps)
	}
	for _, bad := range [][]string{
		{"-figs", "8"}, {"-figs", "9,x"}, {"-work", "0s"}, {"-work", "2m"}, {"-rounds", "0"},
		{"-netio", "net,uring"}, {"-netio", "tcp"}, {"-nodes", ""}, {"-timeout", "0s"}, {"-max-p", "-1"},
	} {
		if _, err := parsePaperFlags(bad, io.Discard); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// paperResult is a successful job of op at P = nodes × ppn.
func paperResult(op string, nodes, ppn int, median, tail, work time.Duration) scaleResult {
	return scaleResult{scaleConfig: scaleConfig{Op: op, Backend: "net", Nodes: nodes, PPN: ppn, Work: work},
		Rounds: 3, Median: median, TailMed: tail, SpanMed: tail,
		Counters: []nodeCounter{{"bcast.bytes.in": 400, "bcast.bytes.raw": 2048}, {"bcast.bytes.in": 400, "bcast.bytes.raw": 2048}}}
}

// The tables and plots hold the figures the results give: ratios,
// overlaps and bytes per node, "-" where a job failed.
func TestPaperTables(t *testing.T) {
	ms := time.Millisecond
	results := []scaleResult{
		paperResult(opFence, 2, 4, 100*ms, 90*ms, 0),
		paperResult(opAllgather, 2, 4, 50*ms, 40*ms, 0),
		paperResult(opIfence, 2, 4, 110*ms, 95*ms, 0),
		paperResult(opIallgather, 2, 4, 40*ms, 35*ms, 0),
		paperResult(opIfenceSleep, 2, 4, 100*ms, 90*ms, 100*ms),    // 100 %
		paperResult(opIfenceSpin, 2, 4, 150*ms, 90*ms, 100*ms),     // 50 %
		paperResult(opIallgatherSleep, 2, 4, 55*ms, 50*ms, 50*ms),  // 90 %
		paperResult(opIallgatherSpin, 2, 4, 200*ms, 190*ms, 50*ms), // 0 %
		paperResult(opInitFence, 2, 4, 120*ms, 110*ms, 2*ms),       // init 110
		paperResult(opInitAllgather, 2, 4, 60*ms, 55*ms, 2*ms),     // init 55
		paperResult(opInitIallgather, 2, 4, 45*ms, 2200*time.Microsecond, 2*ms),
		// A second size whose fence failed.
		{scaleConfig: scaleConfig{Op: opFence, Backend: "net", Nodes: 4, PPN: 4}, Err: "timed out"},
		paperResult(opAllgather, 4, 4, 80*ms, 70*ms, 0),
	}
	o, err := parsePaperFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	rows := paperRows(results)
	if len(rows) != 2 || rows[0].p != 8 || rows[1].p != 16 {
		t.Fatalf("rows %+v, want P = 8 and 16", rows)
	}
	tables := paperTables(o, rows)
	if len(tables) != 4 {
		t.Fatalf("%d tables, want 4", len(tables))
	}
	want := [][]string{
		{"8", "2×4", "100ms", "50ms", "0.50", "110ms", "1.10", "40ms", "0.80", "100 B / 512 B", "100 B / 512 B"}, // 4 exchanges (3 timed, 1 warm-up),
		{"8", "2×4", "110ms", "55ms", "2.2ms", "45ms", "50.00", "0.50"},
		{"8", "2×4", "100ms", "100ms", "100 %", "150ms", "50 %", "50ms", "55ms", "90 %", "200ms", "0 %"},
		{"8", "2×4", "110ms", "40ms", "2.75", "95ms", "35ms"},
	}
	for i, tb := range tables {
		if len(tb.body) != 2 {
			t.Errorf("%s: %d rows, want 2", tb.title, len(tb.body))
			continue
		}
		if len(tb.header) != len(want[i]) || !slices.Equal(tb.body[0], want[i]) {
			t.Errorf("%s:\n header %q\n got  %q\n want %q", tb.title, tb.header, tb.body[0], want[i])
		}
	}
	// P = 16: no fence, so no fence cell, no ratio, no overlap.
	if got := tables[0].body[1]; got[2] != "-" || got[3] != "80ms" || got[4] != "-" {
		t.Errorf("figure 9 at P = 16 with a failed fence: %q", got)
	}

	var md strings.Builder
	o.markdown = true
	if err := writePaperTables(&md, o, rows); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"Figure 9 / Table II", "Figure 10", "Figure 11", "Figure 12"} {
		if !strings.Contains(md.String(), s) {
			t.Errorf("markdown lacks %q:\n%s", s, md.String())
		}
	}
	if rows := regexp.MustCompile(`(?m)^\| +8 \| +2×4 \|`).FindAllString(md.String(), -1); len(rows) != 4 {
		t.Errorf("markdown has %d rows for P = 8, want one per figure:\n%s", len(rows), md.String())
	}

	dir := t.TempDir()
	files, err := writePaperPlots(dir, o, rows)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []int{9, 10, 11, 12} {
		for _, ext := range []string{".png", ".svg"} {
			name := filepath.Join(dir, "paper-fig"+strconv.Itoa(f)+ext)
			if st, err := os.Stat(name); err != nil || st.Size() == 0 || !slices.Contains(files, name) {
				t.Errorf("%s: %v (listed: %v)", name, err, slices.Contains(files, name))
			}
		}
	}
	// Nothing ran: no figure to draw is an error, not an empty plot.
	if _, err := writePaperPlots(t.TempDir(), o, paperRows(results[11:12])); err == nil {
		t.Errorf("plots of failed jobs only: no error")
	}
}

// A job that computes passes its work to pmirun; the others pass none.
func TestScaleArgvWork(t *testing.T) {
	o, err := parsePaperFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := scaleConfig{Op: opIallgatherSpin, Backend: "net", Nodes: 2, PPN: 4, Work: 1500 * time.Microsecond}
	argv := o.scaleArgv("pmirun", c, "r.json")
	if i := slices.Index(argv, "--virtual-work"); i < 0 || argv[i+1] != "1.5ms" || !slices.Contains(argv, opIallgatherSpin) {
		t.Errorf("argv %q: want --virtual %s --virtual-work 1.5ms", argv, opIallgatherSpin)
	}
	if slices.Contains(argv, "--virtual-late") {
		t.Errorf("argv %q: a paper job is never a late arrival", argv)
	}
	c.Op, c.Work = opAllgather, 0
	if argv := o.scaleArgv("pmirun", c, "r.json"); slices.Contains(argv, "--virtual-work") {
		t.Errorf("argv %q: --virtual-work for a workload that does no work", argv)
	}
}
