package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/jobreport"
	"github.com/fastpmi/fastpmi/perf"
)

// A pmirun report's marks become the phase stacks: each from the end of
// the one before to the last stamp of its mark, and pmirun's own share is
// the rest of the wall time.
func TestSamplePhases(t *testing.T) {
	ms := time.Millisecond
	rep := &jobreport.Report{Phases: []jobreport.Phase{
		{Name: perf.PhaseRankForked, First: 1 * ms, Last: 10 * ms},
		{Name: perf.PhaseInit, First: 12 * ms, Last: 30 * ms},
		{Name: perf.PhaseFinalize, First: 35 * ms, Last: 50 * ms},
		{Name: perf.PhaseRankExit, First: 40 * ms, Last: 52 * ms},
	}}
	got := samplePhases(rep, 60*ms)
	want := map[string]time.Duration{"fork": 10 * ms, "exec + PMI init": 20 * ms, "PMI exchange": 20 * ms, "exit": 2 * ms, "pmirun": 8 * ms}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("phase %s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	rep.Phases = rep.Phases[:2]
	if got := samplePhases(rep, 60*ms); got != nil {
		t.Errorf("phases of a run without finalize = %v, want nil", got)
	}
}

// -plot's figures are written for every workload, and the scale curves
// for every successful operation.
func TestWritePlots(t *testing.T) {
	dir := t.TempDir()
	ms := time.Millisecond
	var samples []Sample
	phases := map[int]map[string]time.Duration{}
	for _, n := range []int{1, 4, 16} {
		for run := range 3 {
			for _, l := range []string{"pmirun", "hydra"} {
				s := Sample{Seq: len(samples), Workload: "pmi2", N: n, Launcher: l, Run: run, Wall: time.Duration(n+run) * ms}
				if l == "pmirun" {
					phases[s.Seq] = map[string]time.Duration{"fork": ms, "exec + PMI init": ms, "PMI exchange": ms, "exit": ms, "pmirun": ms}
				}
				samples = append(samples, s)
			}
		}
	}
	names := []string{"pmirun", "hydra"}
	files, err := writeLauncherPlots(dir, "", Summarize(samples, names), samples, phases, names)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"startup-pmi2.svg", "startup-pmi2.png", "phases-pmi2.svg", "phases-pmi2.png"} {
		p := filepath.Join(dir, f)
		if st, err := os.Stat(p); err != nil || st.Size() == 0 || !slices.Contains(files, p) {
			t.Errorf("%s: not written (%v), files %v", f, err, files)
		}
	}
	results := []scaleResult{
		{scaleConfig: scaleConfig{Op: "allgather", Backend: "net", Nodes: 4, PPN: 16}, Median: 100 * time.Microsecond},
		{scaleConfig: scaleConfig{Op: "allgather", Backend: "net", Nodes: 16, PPN: 16}, Median: 300 * time.Microsecond},
		{scaleConfig: scaleConfig{Op: "fence", Backend: "net", Nodes: 4, PPN: 16}, Err: "failed"},
	}
	files, err = writeScalePlots(dir, results)
	if err != nil || len(files) != 2 {
		t.Fatalf("scale plots %v: %v", files, err)
	}
	if _, err := writeScalePlots(dir, results[2:]); err == nil {
		t.Error("scale plots of failed jobs only: no error")
	}
	if files, err := writeKVSPlots(dir, results); err != nil || len(files) != 0 {
		t.Errorf("KVS plots without KVS results: %v, %v", files, err)
	}
	kvs := []scaleResult{
		{scaleConfig: scaleConfig{Op: "sparse/current", Backend: "net", Nodes: 4, PPN: 256}, TailMed: 900 * time.Microsecond},
		{scaleConfig: scaleConfig{Op: "sparse/current", Backend: "net", Nodes: 16, PPN: 256}, TailMed: 9 * time.Millisecond},
		{scaleConfig: scaleConfig{Op: "sparse/direct", Backend: "net", Nodes: 4, PPN: 256}, TailMed: 300 * time.Microsecond},
		{scaleConfig: scaleConfig{Op: "sparse/direct", Backend: "net", Nodes: 16, PPN: 256}, TailMed: 310 * time.Microsecond},
	}
	files, err = writeKVSPlots(dir, kvs)
	if err != nil || len(files) != 2 {
		t.Fatalf("KVS plots %v: %v", files, err)
	}
	for _, f := range files {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s: not written (%v)", f, err)
		}
	}
}
