package e2e

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/fastpmi/fastpmi/jobreport"
	"github.com/fastpmi/fastpmi/perf"
)

// pmirun --report FILE: at the end of every job, successful or not, the
// job's phases, its nodes' counters and (for --virtual) rank 0's figures
// as one JSON document (package jobreport).

// readReport reads the report job r was told to write to path.
func readReport(t *testing.T, r result, path string) *jobreport.Report {
	t.Helper()
	rep, err := jobreport.ReadFile(path)
	if err != nil {
		t.Fatalf("%v\n%s", err, r)
	}
	return rep
}

// wantPhases fails the test unless rep has every phase in names, each
// first stamped no earlier than the one before it, and counts, where
// given, of each.
func wantPhases(t *testing.T, rep *jobreport.Report, names []string, counts map[string]int) {
	t.Helper()
	var prev jobreport.Phase
	for i, name := range names {
		p, ok := rep.Phase(name)
		switch {
		case !ok:
			t.Errorf("no phase %q in %+v", name, rep.Phases)
			continue
		case p.First < 0 || p.Last < p.First || p.Last > rep.Wall:
			t.Errorf("phase %+v out of the job's %v", p, rep.Wall)
		case i > 0 && p.First < prev.First:
			t.Errorf("phase %q first at %v, before %q at %v", name, p.First, prev.Name, prev.First)
		}
		if c, ok := counts[name]; ok && p.Count != c {
			t.Errorf("phase %q stamped %d times, want %d", name, p.Count, c)
		}
		prev = p
	}
}

func TestReportFork(t *testing.T) {
	const size = 3
	dir := t.TempDir()
	ok := filepath.Join(dir, "ok.json")
	r := run(t, job{args: []string{"-n", n(size), "--report", ok, prog("exit_early"), "ok"}})
	r.wantCode(t, 0)
	rep := readReport(t, r, ok)
	if rep.Version != jobreport.Version || rep.Bootstrap != "fork" || rep.Size != size || rep.NetBackend != "" ||
		rep.ExitCode != 0 || rep.Failure != "" || rep.Wall <= 0 || !strings.HasPrefix(rep.JobID, "fastpmi-") {
		t.Errorf("report %+v\n%s", rep, r)
	}
	wantPhases(t, rep, []string{perf.PhaseRankForked, perf.PhaseInit, perf.PhaseFenceDone, perf.PhaseFinalize, perf.PhaseRankExit},
		map[string]int{perf.PhaseRankForked: size, perf.PhaseInit: size, perf.PhaseFinalize: size, perf.PhaseRankExit: size})
	if len(rep.Nodes) != 1 || rep.Nodes[0].Counters == nil || rep.Nodes[0].Ranks != size || rep.Scale != nil {
		t.Errorf("nodes %+v, scale %+v: want one node of %d ranks with counters, no scale figures", rep.Nodes, rep.Scale, size)
	}

	// A failing job reports its exit code and why.
	bad := filepath.Join(dir, "bad.json")
	r = run(t, job{args: []string{"-n", n(size), "--report", bad, prog("exit_early"), "exit-before-init", "1", "3"}})
	r.wantCode(t, 3)
	rep = readReport(t, r, bad)
	if rep.ExitCode != 3 || rep.Failure == "" {
		t.Errorf("failed job reported exit code %d, failure %q; want 3 and a reason\n%s", rep.ExitCode, rep.Failure, r)
	}
	wantPhases(t, rep, []string{perf.PhaseRankForked, perf.PhaseRankExit}, nil)

	// A job refused before it started still leaves a report.
	refused := filepath.Join(dir, "refused.json")
	r = run(t, job{args: []string{"-n", "2", "--report", refused, "--bootstrap", "loopback", "--nodes", "3", "true"}})
	r.wantCode(t, 2)
	if rep = readReport(t, r, refused); rep.ExitCode != 2 || !strings.Contains(rep.Failure, "at least one rank") {
		t.Errorf("refused job reported exit code %d, failure %q; want 2 and the reason", rep.ExitCode, rep.Failure)
	}
}

func TestReportLoopback(t *testing.T) {
	const nodes, size = 2, 4
	dir := t.TempDir()
	ok := filepath.Join(dir, "ok.json")
	r := run(t, loopbackJob(nodes, "net", "-n", n(size), "--report", ok, prog("exit_early"), "ok"))
	r.wantCode(t, 0)
	rep := readReport(t, r, ok)
	if rep.Bootstrap != "loopback" || rep.NetBackend != "net" || rep.Size != size || rep.ExitCode != 0 || rep.Failure != "" {
		t.Errorf("report %+v\n%s", rep, r)
	}
	// The root stamps a rank's exit when its agent's exit event arrives;
	// an agent may end before it judged every clean exit, so "rank exit"
	// may count fewer than the job's ranks.
	wantPhases(t, rep, []string{"agents started", "agents connected", perf.PhaseInit, perf.PhaseFenceDone, perf.PhaseFinalize, perf.PhaseRankExit},
		map[string]int{perf.PhaseInit: size, perf.PhaseFinalize: size})
	if len(rep.Nodes) != nodes {
		t.Fatalf("%d nodes in the report, want %d", len(rep.Nodes), nodes)
	}
	for i, nd := range rep.Nodes {
		// One fence: each node sends one tree message and, among its
		// frames, that one, its events and its counters.
		if nd.Index != i || nd.Ranks != size/nodes || nd.Counters["tree.msgs.sent"] != 1 || nd.Counters["net.frames.sent"] < 2 {
			t.Errorf("node %d: %+v", i, nd)
		}
	}
	if rep.RootCounters["bcast.bytes.raw"] <= 0 {
		t.Errorf("root counters %v: want the fence's broadcast", rep.RootCounters)
	}

	bad := filepath.Join(dir, "bad.json")
	r = run(t, loopbackJob(nodes, "net", "-n", n(size), "--report", bad, prog("exit_early"), "exit-before-init", "1", "3"))
	r.wantCode(t, 3)
	rep = readReport(t, r, bad)
	if rep.ExitCode != 3 || rep.Failure == "" || len(rep.Nodes) != nodes {
		t.Errorf("failed job reported exit code %d, failure %q, %d nodes; want 3, a reason, %d\n%s", rep.ExitCode, rep.Failure, len(rep.Nodes), nodes, r)
	}
}

// A virtual job's report carries rank 0's figures as fields, and they are
// no longer among its node's counters.
func TestReportVirtual(t *testing.T) {
	const nodes, ppn, rounds = 2, 4, 3
	path := filepath.Join(t.TempDir(), "virtual.json")
	r := run(t, loopbackJob(nodes, "net", "-n", n(nodes*ppn), "--virtual", "allgather", "--virtual-rounds", n(rounds), "--report", path, "true"))
	r.wantCode(t, 0)
	rep := readReport(t, r, path)
	s := rep.Scale
	if s == nil {
		t.Fatalf("no scale figures in %+v\n%s", rep, r)
	}
	if s.Op != "allgather" || s.P != nodes*ppn || s.Local != ppn || s.Rounds != rounds || rep.Virtual != "allgather" {
		t.Errorf("figures %+v: want allgather P=%d local=%d rounds=%d", s, nodes*ppn, ppn, rounds)
	}
	if s.Min <= 0 || s.Min > s.Median || s.Median > s.Max || s.TailMin <= 0 || s.TailMin > s.TailMedian ||
		s.TailMedian > s.TailMax || s.TailMedian > s.SpanMedian || s.SpanMin > s.SpanMedian {
		t.Errorf("figures %+v: want 0 < min ≤ median ≤ max, 0 < tail ≤ span", s)
	}
	for _, nd := range rep.Nodes {
		for k := range nd.Counters {
			if strings.HasPrefix(k, jobreport.ScaleCounterPrefix) {
				t.Errorf("node %d still has counter %s", nd.Index, k)
			}
		}
		if nd.Counters["virtual.cpu.ns"] <= 0 {
			t.Errorf("node %d: no CPU booked: %v", nd.Index, nd.Counters)
		}
	}
	// The figures on standard output agree.
	if ls := lines(r.stdout); len(ls) != 1 || !strings.Contains(ls[0], " rounds="+n(rounds)+" ") {
		t.Errorf("rank 0's line %q", ls)
	}
}
