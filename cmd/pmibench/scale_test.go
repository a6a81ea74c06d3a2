package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/jobreport"
)

// ringReport is pmirun's report of a 2-node ring job of 3 timed rounds
// (--report), read back from the file.
func ringReport(t *testing.T) *jobreport.Report {
	t.Helper()
	us := func(f float64) time.Duration { return time.Duration(f * 1e3) }
	node := func(frames, cpu, rounds, rss int64) map[string]int64 {
		return map[string]int64{"bcast.bytes.in": 300, "bcast.bytes.raw": 500, "net.frames.sent": frames,
			"ring.msgs.recv": 8, "ring.msgs.sent": 8, "stamps.bcast.bytes.in": 300, "stamps.bcast.bytes.raw": 500,
			"stamps.tree.msgs.sent": 1, "tree.msgs.sent": 1, "virtual.cpu.ns": cpu, "virtual.cpu.rank.rounds": rounds,
			"agent.rss.peak.bytes": rss, "segment.resident.bytes": 3 << 19}
	}
	rep := &jobreport.Report{
		Version: jobreport.Version, JobID: "job", Size: 8, Bootstrap: "loopback", NetBackend: "net", Virtual: "ring",
		Nodes: []jobreport.Node{
			{Index: 0, Host: "127.0.0.1", Ranks: 4, Counters: node(30, 90000, 13, 50<<20)},
			{Index: 1, Host: "127.0.0.1", Ranks: 4, Counters: node(28, 30000, 12, 60<<20)},
		},
		RootCounters: map[string]int64{"bcast.bytes.raw": 500, "bcast.bytes.sent": 300},
		Scale: &jobreport.Scale{Op: "ring", P: 8, Local: 4, Rounds: 3,
			Median: us(250), Min: us(120.5), Max: us(400), Mean: us(256.8), Warmup: us(900),
			SpanMedian: us(600), SpanMin: us(450), TailMedian: us(300), TailMin: us(200), TailMax: us(350.5)},
	}
	path := filepath.Join(t.TempDir(), "report.json")
	if err := rep.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	back, err := jobreport.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return back
}

// ringResult is ringReport read into the result of the job it describes.
func ringResult(t *testing.T) scaleResult {
	t.Helper()
	r := scaleResult{scaleConfig: scaleConfig{Op: "ring", Backend: "net", Nodes: 2, PPN: 4}}
	if err := r.fromReport(ringReport(t)); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestScaleFromReport(t *testing.T) {
	us := func(f float64) time.Duration { return time.Duration(f * 1e3) }
	r := ringResult(t)
	for name, got := range map[string][2]time.Duration{
		"median":      {r.Median, us(250)},
		"min":         {r.Min, us(120.5)},
		"max":         {r.Max, us(400)},
		"warmup":      {r.Warmup, us(900)},
		"span median": {r.SpanMed, us(600)},
		"span min":    {r.SpanMin, us(450)},
		"tail median": {r.TailMed, us(300)},
		"tail min":    {r.TailMin, us(200)},
		"tail max":    {r.TailMax, us(350.5)},
		// 120 µs of CPU over 25 rank rounds, both nodes together
		"cpu per rank round": {r.CPURound, us(4.8)},
	} {
		if got[0] != got[1] {
			t.Errorf("%s = %v, want %v", name, got[0], got[1])
		}
	}
	if r.Rounds != 3 || r.LinkedBy != "net" || len(r.Counters) != 2 {
		t.Errorf("rounds %d, linked by %q, %d counter sets", r.Rounds, r.LinkedBy, len(r.Counters))
	}
	// The timestamp exchange was the job's only broadcast.
	if r.RootRaw != 0 || r.RootSent != 0 {
		t.Errorf("root broadcast raw %d sent %d, want 0 without the timestamp exchange", r.RootRaw, r.RootSent)
	}

	// A job whose agents' clocks are on several machines has no span and
	// tail; the rest of its report stands.
	rep := ringReport(t)
	rep.Scale.SpanMedian, rep.Scale.SpanMin, rep.Scale.TailMedian, rep.Scale.TailMin, rep.Scale.TailMax = 0, 0, 0, 0, 0
	rep.Scale.ForeignClocks = 4
	apart := scaleResult{scaleConfig: scaleConfig{Op: "ring", Backend: "net", Nodes: 2, PPN: 4}}
	if err := apart.fromReport(rep); err != nil {
		t.Fatal(err)
	}
	if apart.Median != us(250) || apart.SpanMed != 0 || apart.TailMed != 0 {
		t.Errorf("clocks on several machines: median %v, span %v, tail %v; want 250µs, none, none", apart.Median, apart.SpanMed, apart.TailMed)
	}

	// A report of another job, or without figures or a node's counters,
	// is an error.
	other := scaleResult{scaleConfig: scaleConfig{Op: "fence", Backend: "net", Nodes: 2, PPN: 4}}
	if err := other.fromReport(ringReport(t)); err == nil {
		t.Error("fence job accepted a ring report")
	}
	for name, spoil := range map[string]func(*jobreport.Report){
		"no figures":     func(rep *jobreport.Report) { rep.Scale = nil },
		"node 1 silent":  func(rep *jobreport.Report) { rep.Nodes[1].Counters = nil },
		"a node missing": func(rep *jobreport.Report) { rep.Nodes = rep.Nodes[:1] },
	} {
		rep := ringReport(t)
		spoil(rep)
		r := scaleResult{scaleConfig: scaleConfig{Op: "ring", Backend: "net", Nodes: 2, PPN: 4}}
		if err := r.fromReport(rep); err == nil {
			t.Errorf("%s: report accepted", name)
		}
	}
}

func TestScaleTable(t *testing.T) {
	ok := ringResult(t)
	failed := scaleResult{scaleConfig: scaleConfig{Op: "ring", Backend: "uring", Nodes: 2, PPN: 4}, Err: "exit status 1"}
	ps, rows := scaleTables([]scaleResult{ok, failed})
	if !slices.Equal(ps, []int{8}) || len(rows[8]) != 1 {
		t.Fatalf("tables for P %v with %d rows, want one row for P = 8", ps, len(rows[8]))
	}
	header, body := scaleTable(rows[8], []string{"net", "uring"})
	wantHeader := []string{"op", "K", "ppn", "net median", "net min", "uring median", "uring min",
		"net tail", "uring tail", "net span", "uring span", "net CPU/rank/round", "uring CPU/rank/round",
		"bcast in/node", "bcast raw/node", "in/raw", "tree msgs/node", "ring msgs/node", "kvs msgs/node",
		"frames/node (job)", "agent RSS (peak)", "segment resident"}
	if !slices.Equal(header, wantHeader) {
		t.Errorf("header\n got %q\nwant %q", header, wantHeader)
	}
	// 4 ring operations (3 timed, 1 warm-up): 2 ring messages each and,
	// without the timestamp exchange, no tree or KVS messages or
	// broadcasts.
	wantBody := [][]string{{"ring", "2", "4", "250µs", "121µs", "failed", "-",
		"300µs", "-", "600µs", "-", "4.8µs", "-",
		"0 B", "0 B", "-", "0", "2", "0", "30", "60.00 MiB", "1.50 MiB"}}
	if !slices.EqualFunc(body, wantBody, slices.Equal) {
		t.Errorf("body\n got %q\nwant %q", body, wantBody)
	}

	var md strings.Builder
	if err := writeScaleTables(&md, []scaleResult{ok, failed}, []string{"net", "uring"}, true); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "net tail") || !strings.Contains(md.String(), "uring span") {
		t.Errorf("markdown has no tail and span columns:\n%s", md.String())
	}
}

func TestScaleJSON(t *testing.T) {
	r := ringResult(t)
	path := filepath.Join(t.TempDir(), "scale.json")
	if err := writeScaleJSON(path, scaleOptions{rounds: 3, codec: "auto"}, time.Now(), []scaleResult{r}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 1 {
		t.Fatalf("%d results, want 1", len(rep.Results))
	}
	for k, want := range map[string]float64{
		"median_ns": 250e3, "span_median_ns": 600e3, "span_min_ns": 450e3,
		"tail_median_ns": 300e3, "tail_min_ns": 200e3, "tail_max_ns": 350.5e3,
		"cpu_rank_round_ns": 4.8e3,
	} {
		if got, _ := rep.Results[0][k].(float64); got != want {
			t.Errorf("%s = %v, want %v", k, rep.Results[0][k], want)
		}
	}
}

// -late: off by default, auto grows with P, a duration is passed as is;
// late-arrival jobs are read and shown with the rounds rank 0 entered last.
func TestScaleLate(t *testing.T) {
	for _, bad := range []string{"soon", "-5ms"} {
		if _, err := parseScaleFlags([]string{"-late", bad}, io.Discard); err == nil {
			t.Errorf("-late %s accepted", bad)
		}
	}
	c := scaleConfig{Op: "ring", Backend: "net", Nodes: 2, PPN: 4}
	for late, want := range map[string]string{"off": "", "auto": lateAuto(8).String(), "3ms": "3ms"} {
		o, err := parseScaleFlags([]string{"-late", late}, io.Discard)
		if err != nil {
			t.Fatalf("-late %s: %v", late, err)
		}
		argv := o.scaleArgv("pmirun", c, "report.json")
		if i := slices.Index(argv, "--report"); i < 0 || argv[i+1] != "report.json" {
			t.Errorf("-late %s: pmirun argv %q has no --report report.json", late, argv)
		}
		i := slices.Index(argv, "--virtual-late")
		switch {
		case want == "" && i >= 0:
			t.Errorf("-late %s: pmirun gets --virtual-late %s", late, argv[i+1])
		case want != "" && (i < 0 || argv[i+1] != want):
			t.Errorf("-late %s: pmirun argv %q, want --virtual-late %s", late, argv, want)
		}
	}
	if lateAuto(16384) <= lateAuto(1024) || lateAuto(1) < 20*time.Millisecond {
		t.Errorf("lateAuto: %v at P = 1, %v at 1,024, %v at 16,384: want at least 20ms, growing with P", lateAuto(1), lateAuto(1024), lateAuto(16384))
	}

	rep := ringReport(t)
	rep.Scale.Late, rep.Scale.LateLast, rep.Scale.LateGapMin = 20*time.Millisecond, 2, -12500*time.Nanosecond
	r := scaleResult{scaleConfig: c}
	if err := r.fromReport(rep); err != nil {
		t.Fatal(err)
	}
	if r.Late != 20*time.Millisecond || r.LateLast != 2 || r.LateGap != -12500*time.Nanosecond {
		t.Errorf("late %v, last in %d rounds, gap %v; want 20ms, 2, -12.5µs", r.Late, r.LateLast, r.LateGap)
	}
	_, rows := scaleTables([]scaleResult{r})
	header, body := scaleTable(rows[8], []string{"net"})
	if i := slices.Index(header, "net late last"); i < 0 || body[0][i] != "2/3" {
		t.Errorf("late column: header %q, row %q; want net late last 2/3", header, body)
	}
}

// A job setting pmirun would refuse is refused before any job, naming
// its flag: -compress lz4 ran every job, each failing at once with
// pmirun's own refusal, and printed a table of failed rows (exit 1);
// -tree-width -3 was refused as "-max-p, -tree-width".
func TestScaleFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-compress", "lz4"}, "parse -compress: "},
		{[]string{"-tree-width", "-3"}, "parse -tree-width: -3 is negative"},
		{[]string{"-max-p", "-1"}, "parse -max-p: -1 is negative"},
		{[]string{"-net-timeout", "0s"}, "parse -net-timeout: 0s is not positive"},
		{[]string{"-timeout", "-1s"}, "parse -timeout: -1s is not positive"},
		// Each job ran twice and one result was shown (-netio: in two
		// columns).
		{[]string{"-ops", "fence,fence"}, `parse -ops: "fence" twice`},
		{[]string{"-netio", "net,net"}, `parse -netio: "net" twice`},
	} {
		_, err := parseScaleFlags(c.args, io.Discard)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q...", c.args, err, c.want)
		}
		if _, err := parsePaperFlags(c.args, io.Discard); err == nil {
			t.Errorf("-paper %q: no error", c.args)
		}
	}
}

// A job Ctrl-C ends is no failed job: it was printed as one ('fence K=2
// PPN=2 P=4 net: exit status 1: ...'), kept as a failed row of the table
// and in -json.
func TestScaleInterruptedJobIsNoFailure(t *testing.T) {
	dir := t.TempDir()
	// The "pmirun" interrupts pmibench (this test), then waits to be
	// ended with the job.
	pmirun := filepath.Join(dir, "pmirun")
	if err := os.WriteFile(pmirun, []byte("#!/bin/sh\nkill -INT "+strconv.Itoa(os.Getpid())+"\nexec sleep 30\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"-scale", "-paper"} {
		ctx, stop := signal.NotifyContext(context.Background(), sys.SIGINT)
		path := filepath.Join(dir, mode+".json")
		var stdout, stderr bytes.Buffer
		args := []string{mode, "-pmirun", pmirun, "-nodes", "2", "-ppn", "2", "-netio", "net", "-json", path, "-plot", filepath.Join(dir, mode+"-plots")}
		if mode == "-scale" {
			args = append(args, "-ops", "fence")
		} else {
			args = append(args, "-figs", "9")
		}
		if code := run(ctx, args, &stdout, &stderr); code != 1 {
			t.Errorf("%s: exit %d, want 1", mode, code)
		}
		stop()
		if !strings.Contains(stderr.String(), "stopped early: interrupt signal received") || strings.Contains(stderr.String(), " K=2 PPN=2 P=4 net") {
			t.Errorf("%s: stderr:\n%s\nwant the stop and no failed job", mode, stderr.String())
		}
		if strings.Contains(stdout.String(), "failed") {
			t.Errorf("%s: table:\n%s\nwant no failed job", mode, stdout.String())
		}
		// No figure: nothing said of them (it said "pmibench: wrote ").
		if strings.Contains(stderr.String(), "pmibench: wrote") {
			t.Errorf("%s: stderr:\n%s\nwant no figures said written", mode, stderr.String())
		}
		if b, err := os.ReadFile(path); err != nil || strings.Contains(string(b), `"error"`) {
			t.Errorf("%s: -json: %v\n%s\nwant no failed job", mode, err, b)
		}
	}
}

// -scale's and -paper's -json is written as every other file pmibench
// and pmirun write (jobreport.WriteOut): whole, renamed into place, never
// over the older file in place, so that a write the disk cannot take
// leaves no truncated file. An older file still open keeps its content.
func TestScaleJSONWrittenWhole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.json")
	if err := os.WriteFile(path, []byte("older"), 0o644); err != nil {
		t.Fatal(err)
	}
	older, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Close()
	if err := writeScaleJSON(path, scaleOptions{rounds: 3, codec: "auto"}, time.Now(), nil); err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(older); err != nil || string(b) != "older" {
		t.Errorf("the older file holds %q (%v): written over in place, want it left whole", b, err)
	}
	if b, err := os.ReadFile(path); err != nil || !json.Valid(b) || !strings.Contains(string(b), `"results": []`) {
		t.Errorf("-json: %v\n%s\nwant \"results\": [] (no job: an empty list, never null)", err, b)
	}
}
