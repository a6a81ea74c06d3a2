package e2e

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/perf/perftest"
)

// readTrace reads the Chrome trace at path and checks it against the
// trace format (well-formed events, timestamps in order and slices
// nested on every track).
func readTrace(t *testing.T, path string, r result) *perftest.Trace {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("no trace file: %v\n%s", err, r)
	}
	tr, err := perftest.Check(data)
	if err != nil {
		t.Fatalf("trace fails the Chrome trace format check: %v", err)
	}
	return tr
}

// slicesOn returns the complete events of one track by name.
func slicesOn(tr *perftest.Trace, pid, tid int) map[string][]perftest.Event {
	out := map[string][]perftest.Event{}
	for _, e := range tr.On(pid, tid) {
		if e.Ph == "X" {
			out[e.Name] = append(out[e.Name], e)
		}
	}
	return out
}

func dumpTrack(t *testing.T, tr *perftest.Trace, pid, tid int) {
	t.Helper()
	for _, e := range tr.On(pid, tid) {
		t.Logf("%s %s [%v, %v]", e.Ph, e.Name, e.Ts, e.End())
	}
}

// within reports whether inner lies inside outer (to a nanosecond).
func within(inner, outer perftest.Event) bool {
	return inner.Ts >= outer.Ts-1e-3 && inner.End() <= outer.End()+1e-3
}

// wantRankTrack checks rank's track (pid, tid): its life slice holds exec
// and PMI, PMI holds every PMI-2 request pmi2_test makes, and a fence
// that waited holds its waiting part. It returns how many of the rank's
// fences waited.
func wantRankTrack(t *testing.T, tr *perftest.Trace, pid, rank int) (waited int) {
	t.Helper()
	tid := rank + 1
	if name := tr.Threads[perftest.Track{Pid: pid, Tid: tid}]; name != "rank "+strconv.Itoa(rank) {
		t.Errorf("track %d/%d is named %q, want rank %d", pid, tid, name, rank)
		return 0
	}
	s := slicesOn(tr, pid, tid)
	life := s["rank "+strconv.Itoa(rank)]
	if len(life) != 1 || len(s["exec"]) != 1 || len(s["PMI"]) != 1 {
		t.Errorf("rank %d: want one life, exec and PMI slice, got %d, %d, %d", rank, len(life), len(s["exec"]), len(s["PMI"]))
		return 0
	}
	pmi := s["PMI"][0]
	if !within(s["exec"][0], life[0]) || !within(pmi, life[0]) || s["exec"][0].End() > pmi.Ts+1e-3 {
		t.Errorf("rank %d: exec %v and PMI %v not in order inside the life %v", rank, s["exec"][0], pmi, life[0])
	}
	for _, req := range []string{"fullinit", "kvs-put", "kvs-fence", "kvs-get", "info-getjobattr", "ring", "finalize"} {
		if len(s[req]) == 0 {
			t.Errorf("rank %d: no %s request slice", rank, req)
		}
		for _, e := range s[req] {
			if !within(e, pmi) || e.Cat != "request" {
				t.Errorf("rank %d: request %s [%v, %v] (category %s) outside PMI [%v, %v]", rank, e.Name, e.Ts, e.End(), e.Cat, pmi.Ts, pmi.End())
				dumpTrack(t, tr, pid, tid)
				return 0
			}
		}
	}
	// A rank waits in a fence, a ring, a waiting get — or, in a job over
	// several nodes, a get of a key its node does not hold, answered by
	// another node (the on-demand KVS: pmi2_test's get of a missing key).
	for _, w := range s["waiting"] {
		held := false
		for _, f := range append(append(append(s["kvs-fence"], s["ring"]...), s["info-getnodeattr"]...), s["kvs-get"]...) {
			if within(w, f) && w.Ts == f.Ts {
				held = true
			}
		}
		if !held {
			t.Errorf("rank %d: waiting slice %v starts no fence, ring or get", rank, w)
		}
		waited++
	}
	return waited
}

// A single-node job's trace: one process (the node in pmirun), a track
// per rank with its life, its requests and their waiting, the agent's
// track with one fork slice per rank.
func TestTraceSlices(t *testing.T) {
	const size = 4
	path := filepath.Join(t.TempDir(), "trace.json")
	j := job{args: []string{"-n", n(size), "--trace", path, prog("pmi2_test")}}
	j.env = []string{"PMI2_TEST_ALARM=30"}
	r := run(t, j)
	r.wantCode(t, 0)
	tr := readTrace(t, path, r)
	const pid = 2 // node 0
	if tr.Processes[pid] != "node 0 (in pmirun)" {
		t.Errorf("processes %v, want node 0 (in pmirun) as pid 2", tr.Processes)
	}
	waited := 0
	for rank := range size {
		waited += wantRankTrack(t, tr, pid, rank)
	}
	// Every fence but the one its last rank completes waits: of the two
	// fences of 4 ranks, at least 2×3 requests waited.
	if waited < 6 {
		t.Errorf("%d waiting slices, want at least 6 (two fences of 4 ranks)", waited)
	}
	// Each rank's fork is on its own track, ending where its life begins
	// (forks run several at once, so the agent's track could not nest them).
	for rank := range size {
		s := slicesOn(tr, pid, rank+1)
		forks, life := s["fork"], s["rank "+strconv.Itoa(rank)]
		if len(forks) != 1 || len(life) != 1 || forks[0].End() > life[0].Ts+1e-3 {
			t.Errorf("rank %d: fork slices %v, life %v: want one fork, ending as the life begins", rank, forks, life)
		}
	}
}

// A job whose program cannot start still writes its trace (what pmirun
// did before it gave up): a file already at that path is replaced, never
// left to pass for this job's.
func TestTraceOfAJobThatCannotStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.json")
	if err := os.WriteFile(path, []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := run(t, job{args: []string{"-n", "2", "--trace", path, "./fastpmi-no-such-program"}})
	r.wantCode(t, 127)
	readTrace(t, path, r)
}

// The jobs a job spawns are in its trace: each node of a spawned job is
// a process of its own, "job J node N", with a track for each of its
// ranks, beside the spawning job's nodes, which keep their pids. They
// were left out: the trace showed the parent's spawn request and no
// child.
func TestTraceSpawn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		procs map[int]string // pid: process name
	}{
		{"fork", nil, map[int]string{2: "node 0 (in pmirun)", 3: "job 1 node 0 (in pmirun)"}},
		{"loopback", []string{"--bootstrap", "loopback", "--nodes", "2"}, map[int]string{
			1: "pmirun", 2: "node 0 127.0.0.1", 3: "node 1 127.0.0.1", 4: "job 1 node 0 127.0.0.1", 5: "job 1 node 1 127.0.0.1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "trace.json")
			args := append(append([]string{}, tc.args...), "-n", "2", "--trace", path, prog("pmi2_spawn"))
			r := run(t, job{args: args, env: []string{"SPAWN_N=2"}})
			r.wantCode(t, 0)
			tr := readTrace(t, path, r)
			for pid, name := range tc.procs {
				if tr.Processes[pid] != name {
					t.Errorf("process %d is %q, want %q (processes %v)", pid, tr.Processes[pid], name, tr.Processes)
				}
			}
			// The three children (two of command A, one of B), each with
			// its life and its PMI requests, on the spawned job's nodes.
			children := 0
			for tk, name := range tr.Threads {
				if !strings.HasPrefix(tr.Processes[tk.Pid], "job 1 ") || tk.Tid == 0 {
					continue
				}
				children++
				s := slicesOn(tr, tk.Pid, tk.Tid)
				if len(s[name]) != 1 || len(s["fullinit"]) != 1 || len(s["finalize"]) != 1 {
					t.Errorf("child track %s of %s: %d life, %d fullinit, %d finalize slices, want 1 each",
						name, tr.Processes[tk.Pid], len(s[name]), len(s["fullinit"]), len(s["finalize"]))
				}
			}
			if children != 3 {
				t.Errorf("%d child rank tracks, want 3 (threads %v)", children, tr.Threads)
			}
		})
	}
}

// A node whose agent is killed mid-job is in the trace all the same,
// labelled lost, beside the nodes that sent their events: it was left
// out, as if the job had one node fewer.
func TestTraceNodeLost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.json")
	j := loopbackJob(hostCount, "auto", append([]string{"--trace", path}, sleepArgs()...)...)
	j.env = []string{"EXIT_EARLY_ALARM=30"}
	r := start(t, j)
	r.waitReady()
	pids := agentPIDs(t, r.marker, hostCount)
	if err := sys.SignalProcess(pids[2], sys.SIGKILL); err != nil {
		t.Fatalf("kill agent of node 2: %v", err)
	}
	res := r.wait()
	res.wantMessage(t, `\bnode 2\b.*\blost\b`)
	tr := readTrace(t, path, res)
	for node := range hostCount {
		pid := node + 2
		if want := "node " + strconv.Itoa(node) + " 127.0.0.1"; tr.Processes[pid] != want {
			t.Errorf("process %d is %q, want %q (processes %v)", pid, tr.Processes[pid], want, tr.Processes)
		}
		label, _ := tr.Labels[pid]["labels"].(string)
		if lost := strings.HasPrefix(label, "lost: "); lost != (node == 2) {
			t.Errorf("node %d is labelled %q: want lost for node 2 alone", node, label)
		}
	}
}

// A trace the disk cannot take whole (here the file size limit, as a
// full disk would) is said, and leaves no file: written where it goes, it
// left the first 10 KiB, which no trace viewer opens, and neither an
// older trace at that path, which would pass for this job's.
func TestTraceCutShort(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.json")
	if err := os.WriteFile(path, []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := run(t, job{
		wrap: ulimit("-f", 10),
		args: []string{"--no-shm", "-n", "8", "--trace", path, prog("pmi2_test")},
		env:  []string{"PMI2_TEST_ALARM=30"},
	})
	r.wantCode(t, 0)
	r.wantMessage(t, `^pmirun: write trace .*/trace\.json: file too large$`)
	if ents, err := os.ReadDir(filepath.Dir(path)); err != nil || len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("after a trace cut short its directory holds %v (%v), want nothing", names, err)
	}
}

// Ranks on shared memory (libfastpmi over the segment) get request slices
// too: one per request the agent reads from a rank's ring, named after
// its operation, inside the rank's PMI slice, the fences that waited
// holding their waiting part.
func TestTraceShmSlices(t *testing.T) {
	const size = 4
	path := filepath.Join(t.TempDir(), "trace.json")
	args := append(libArgs(t, false, "shm"), "-n", n(size), "--trace", path, prog("pmi2_test"))
	r := run(t, job{args: args, env: []string{"PMI2_TEST_ALARM=30"}})
	r.wantCode(t, 0)
	tr := readTrace(t, path, r)
	const pid = 2 // node 0
	waited := 0
	for rank := range size {
		tid := rank + 1
		s := slicesOn(tr, pid, tid)
		if len(s["PMI"]) != 1 {
			t.Fatalf("rank %d: %d PMI slices, want 1", rank, len(s["PMI"]))
		}
		pmi := s["PMI"][0]
		for _, req := range []string{"hello", "put", "fence", "ring", "finalize"} {
			if len(s[req]) == 0 {
				t.Errorf("rank %d: no %s request slice", rank, req)
				dumpTrack(t, tr, pid, tid)
			}
			for _, e := range s[req] {
				if !within(e, pmi) || e.Cat != "request" {
					t.Errorf("rank %d: request %s [%v, %v] (category %s) outside PMI [%v, %v]", rank, e.Name, e.Ts, e.End(), e.Cat, pmi.Ts, pmi.End())
				}
			}
		}
		for _, w := range s["waiting"] {
			held := false
			for _, f := range append(append(append(s["fence"], s["ring"]...), s["getnodeattr"]...), s["get"]...) {
				held = held || (within(w, f) && w.Ts == f.Ts)
			}
			if !held {
				t.Errorf("rank %d: waiting slice %v starts no fence, ring or get", rank, w)
			}
			waited++
		}
	}
	// As over the text protocol: of the two fences of 4 ranks, at least
	// 2×3 requests waited for the last rank.
	if waited < 6 {
		t.Errorf("%d waiting slices, want at least 6 (two fences of 4 ranks)", waited)
	}
}

// A multi-node job's trace holds every node: each agent's events merged
// at the root on its own process, shifted by a clock offset estimated
// over the control link, with the estimate's error in the process label.
// On test hosts of one machine the agents share pmirun's
// CLOCK_MONOTONIC, so the estimate is checked against the true offset.
func TestNetnsTrace(t *testing.T) {
	cl := newCluster(t)
	const size = 8
	path := filepath.Join(t.TempDir(), "trace.json")
	j := cl.job("net", "--trace", path, "-n", n(size), prog("pmi2_test"))
	j.env = []string{"EXPECT_NNODES=" + n(hostCount), "EXPECT_PLACEMENT=block", "PMI2_TEST_ALARM=30"}
	r := run(t, j)
	r.wantCode(t, 0)
	tr := readTrace(t, path, r)
	if tr.Processes[1] != "pmirun" {
		t.Errorf("process 1 is %q, want pmirun", tr.Processes[1])
	}
	if len(slicesOn(tr, 1, 0)["compress"]) == 0 {
		t.Error("pmirun's track has no compress slice")
	}
	ppn := size / hostCount
	for node := range hostCount {
		pid := node + 2
		if tr.Processes[pid] == "" {
			t.Errorf("no process for node %d: %v", node, tr.Processes)
			continue
		}
		l := tr.Labels[pid]
		off, _ := l["clock_offset_us"].(float64)
		errUS, _ := l["clock_err_us"].(float64)
		truth, ok := l["clock_true_us"].(float64)
		switch {
		case !ok:
			t.Errorf("node %d: no true offset in the label %v (test hosts share the clock)", node, l)
		case errUS <= 0:
			t.Errorf("node %d: clock error %v µs, want > 0", node, errUS)
		case math.Abs(off-truth) > errUS+500:
			// The bound holds up to the skew of reading two clocks at t0
			// (a few µs); 0.5 ms of slack on a loaded machine.
			t.Errorf("node %d: clock offset %.1f µs ± %.1f, true %.1f µs", node, off, errUS, truth)
		}
		s := slicesOn(tr, pid, 0)
		var forks []perftest.Event
		for rank := node * ppn; rank < (node+1)*ppn; rank++ {
			forks = append(forks, slicesOn(tr, pid, rank+1)["fork"]...)
		}
		if len(forks) != ppn || len(s["fence (tree)"]) == 0 || len(s["decompress"]) == 0 {
			t.Errorf("node %d: %d forks on its ranks' tracks (want %d), %d fence (tree), %d decompress slices on its agent's",
				node, len(forks), ppn, len(s["fence (tree)"]), len(s["decompress"]))
		}
		for _, rank := range []int{node * ppn, node*ppn + ppn - 1} {
			wantRankTrack(t, tr, pid, rank)
		}
		// A rank is forked by its agent after pmirun started the agents.
		started := tr.Named("agents started")
		for _, f := range forks {
			if len(started) == 1 && f.Ts < started[0].Ts-errUS-500 {
				t.Errorf("node %d forked at %v µs, before pmirun started the agents at %v µs", node, f.Ts, started[0].Ts)
			}
		}
	}
	bytes := 0
	for _, e := range tr.Named("net.bytes.sent") {
		if e.Ph == "C" && e.Pid >= 2 {
			bytes++
		}
	}
	if bytes < hostCount {
		t.Errorf("%d net.bytes.sent counter samples on the nodes, want a track on each of %d", bytes, hostCount)
	}
}
