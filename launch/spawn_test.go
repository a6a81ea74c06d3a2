package launch

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/syncbuf"
	"github.com/fastpmi/fastpmi/pmiwire"
)

// A parent spawning two hundred one-process jobs in a row leaks nothing:
// while it holds on after its storm, pmirun's descriptors (sockets,
// pipes, memfd segments), goroutines and child processes are those of a
// storm of ten — pmirun's input an open pipe, as a terminal would be,
// that no spawned job reads. With per-job agents (loopback) the agents
// host the spawned jobs, and what each agent holds at the end (--verbose:
// its goroutines, descriptors, memfds) is that of a storm of ten too, and
// they ran every spawned job's node: no agent started for one. (Threads
// are logged, not compared: Go keeps the threads it once needed.)
func TestSpawnStormLeaksNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a spawning program")
	}
	prog := buildProg(t, "spawnprog", "github.com/fastpmi/fastpmi/tests/e2e/spawnprog")
	pmid := buildProg(t, "pmid", "github.com/fastpmi/fastpmi/cmd/pmid")
	type held struct{ fds, goroutines, children int }
	type sample struct {
		held
		agents []agentHeld // loopback: what each agent held at the end
	}
	now := func() held {
		return held{fds: countFDs(t), goroutines: runtime.NumGoroutine(), children: countChildren()}
	}
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"fork", Config{Size: 1}},
		{"loopback", Config{Size: 2, Bootstrap: "loopback", Nodes: 2, PmidPath: pmid, Verbose: true, NetTimeout: 15 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storm := func(k int) sample {
				var stdout, stderr syncbuf.Buffer
				done := make(chan error, 1)
				cfg := tc.cfg
				const hold = 5 * time.Second
				cfg.Prog, cfg.Args = prog, []string{"-storm", strconv.Itoa(k), "-hold", hold.String()}
				cfg.Stdout, cfg.Stderr, cfg.Timeout = &stdout, &stderr, 90*time.Second
				pr, pw, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				// Nothing comes; the readers of the first job's input end
				// at the end of the test.
				t.Cleanup(func() { pw.Close(); pr.Close() })
				cfg.Stdin = pr
				go func() { done <- Run(context.Background(), cfg) }()
				// Sample once the parent has said its storm is over (it then
				// holds): once the last children are reaped — pmirun's own
				// children are then the first job's ranks (fork) or agents
				// (loopback) — and two samples 100 ms apart agree, or just
				// before the hold ends on a loaded machine.
				deadline := time.Now().Add(80 * time.Second)
				for !strings.Contains(stdout.String(), "storm ok") {
					if time.Now().After(deadline) {
						t.Fatalf("storm of %d did not end\nstderr: %s", k, stderr.String())
					}
					time.Sleep(20 * time.Millisecond)
				}
				first := cfg.Size
				if cfg.Bootstrap == "loopback" {
					first = cfg.Nodes
				}
				var s sample
				for by := time.Now().Add(hold - time.Second); ; {
					time.Sleep(100 * time.Millisecond)
					h := now()
					if h == s.held && h.children <= first || time.Now().After(by) {
						s.held = h
						break
					}
					s.held = h
				}
				if err := <-done; err != nil {
					t.Fatalf("storm of %d: %v\nstderr: %s", k, err, stderr.String())
				}
				if cfg.Bootstrap == "loopback" {
					s.agents = agentsHeld(t, stderr.String(), cfg.Nodes)
					if got := s.agents[0].hosted + s.agents[1].hosted; got != k {
						t.Errorf("the agents hosted %d spawned jobs' nodes, want all %d\nstderr: %s", got, k, stderr.String())
					}
				}
				return s
			}
			small, big := storm(10), storm(200)
			t.Logf("after 10 spawns: %+v; after 200: %+v", small, big)
			if big.fds > small.fds+8 || big.goroutines > small.goroutines+16 || big.children > small.children {
				t.Errorf("200 spawns hold %+v, 10 hold %+v: finished jobs' resources are not released", big, small)
			}
			for i := range big.agents {
				b, s := big.agents[i], small.agents[i]
				if b.goroutines > s.goroutines+4 || b.fds > s.fds+4 || b.memfds > s.memfds {
					t.Errorf("agent of node %d after 200 spawns holds %+v, after 10 %+v: hosted jobs' resources are not released", i, b, s)
				}
			}
		})
	}
}

// agentHeld is what an agent said it held at the end of a run (pmirun
// --verbose).
type agentHeld struct{ hosted, goroutines, threads, fds, memfds int }

// agentsHeld reads the agents' lines from pmirun's --verbose stderr.
func agentsHeld(t *testing.T, stderr string, nodes int) []agentHeld {
	t.Helper()
	rx := regexp.MustCompile(`(?m)^pmirun: node (\d+) agent \(pid \d+\) hosted (\d+) spawned jobs' nodes, holds 0 jobs, (\d+) goroutines, (\d+) threads, (\d+) descriptors, (\d+) memfds$`)
	held := make([]agentHeld, nodes)
	ms := rx.FindAllStringSubmatch(stderr, -1)
	if len(ms) != nodes {
		t.Fatalf("%d agents said what they held at the end, want %d\nstderr: %s", len(ms), nodes, stderr)
	}
	for _, m := range ms {
		v := make([]int, len(m))
		for j := 1; j < len(m); j++ {
			v[j], _ = strconv.Atoi(m[j])
		}
		if v[1] >= nodes {
			t.Fatalf("agent line of node %d: the run has %d", v[1], nodes)
		}
		held[v[1]] = agentHeld{hosted: v[2], goroutines: v[3], threads: v[4], fds: v[5], memfds: v[6]}
	}
	return held
}

// buildProg builds package pkg into the test's directory.
func buildProg(t *testing.T, name, pkg string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	build := exec.Command("go", "build", "-ldflags=-checklinkname=0", "-o", out, pkg)
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, b)
	}
	return out
}

// The root's side of a multi-node spawn, in this process (so that the
// race detector sees it): a parent on two loopback agents spawns two
// commands over both nodes; the jobs' output, fate and names meet in one
// run.
func TestSpawnMultiNode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs agents and a spawning program")
	}
	prog := buildProg(t, "spawnprog", "github.com/fastpmi/fastpmi/tests/e2e/spawnprog")
	pmid := buildProg(t, "pmid", "github.com/fastpmi/fastpmi/cmd/pmid")
	var stdout, stderr syncbuf.Buffer
	err := Run(context.Background(), Config{
		Size: 2, Prog: prog, Args: []string{"-multi", "-n", "3"}, Bootstrap: "loopback", Nodes: 2, PmidPath: pmid,
		Stdout: &stdout, Stderr: &stderr, Timeout: 60 * time.Second, NetTimeout: 15 * time.Second,
	})
	if err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"parent ok rank 0 children 4 over shm", "parent ok rank 1", "child ok rank 3 size 4 appnum 1 over shm"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the output:\n%s\nstderr: %s", want, out, stderr.String())
		}
	}
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// countChildren counts the processes whose parent is this one.
func countChildren() int {
	me := strconv.Itoa(os.Getpid())
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(stat)
		if i := strings.LastIndexByte(s, ')'); i >= 0 {
			if f := strings.Fields(s[i+1:]); len(f) > 1 && f[1] == me {
				n++
			}
		}
	}
	return n
}

// Spawns that jobs of a run ask for at once do not together overfill
// the universe: each admitted one counts from its admission, before its
// job is made. 100 spawns of one process at once within --usize 10 (the
// running jobs' 4 processes and 6 more): 6 admitted. Each used to be
// checked against the jobs made so far only, and 14 of 16 spawns asked
// for at once by the jobs of a run within room for 4 were admitted.
func TestSpawnAdmitReserves(t *testing.T) {
	run := &multiRun{cfg: Config{UniverseSize: 10}, hosts: []string{"a"}, live: map[*rootNode]int{{}: 3, {}: 1}}
	req := &pmiwire.Spawn{Cmds: []pmiwire.SpawnCmd{{Exe: "x", MaxProcs: 1}}}
	var admitted atomic.Int32
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			sr, err := newSpawnReq(req, nil, []int{0}, "")
			if err != nil {
				t.Error(err)
				return
			}
			if _, _, err := run.admit(sr); err == nil {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 6 {
		t.Errorf("%d spawns of one process admitted with 4 running in a universe of 10, want 6", n)
	}
	run.release(6)
	if run.reserved != 0 {
		t.Errorf("%d processes reserved after release", run.reserved)
	}
}

// A spawn's host names a node of the run by its bootstrap name or by the
// name its ranks know it by (PMIX_HOSTNAME): nodes that share a bootstrap
// name, as the loopback bootstrap's do, are told apart by the latter
// (nodeNames made them vm-0, vm-1).
func TestSpawnHostIndex(t *testing.T) {
	run := &multiRun{hosts: []string{"127.0.0.1", "127.0.0.1", "c"}, nodeNames: nodeNames(
		[]node.Hello{{Host: "vm"}, {Host: "vm"}, {Host: "c.example"}}, []string{"127.0.0.1", "127.0.0.1", "c"})}
	for h, want := range map[string]string{
		"vm-1": "[1]", "VM-0": "[0]", "127.0.0.1": "[0 1]", "c": "[2]", "c.example": "[2]", "vm": "[]", "nosuchhost": "[]",
	} {
		if got := fmt.Sprint(run.hostIndex(h)); got != want {
			t.Errorf("host %q: nodes %s, want %s (node names %q)", h, got, want, run.nodeNames)
		}
	}
}

// Children are placed round robin over the run's nodes, command after
// command, within the nodes a command's host keys allow (fastpmi_nodes:
// the spawning job's one node); with loads, least loaded first. Their
// PMI_process_mapping describes any such placement (round robin over
// several nodes used to read "", which MPICH takes for no mapping at all).
func TestSpawnPlacement(t *testing.T) {
	hosts := []string{"a", "b", "c"}
	index := func(h string) []int {
		for i, n := range hosts {
			if n == h {
				return []int{i}
			}
		}
		return nil
	}
	req := func(cmds ...pmiwire.SpawnCmd) *pmiwire.Spawn { return &pmiwire.Spawn{Cmds: cmds} }
	hf := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hf, []byte("# the spawn's nodes\nc:2\n\na\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// mapping is the children's PMI_process_mapping (nodes without
	// children are not the child job's).
	for _, tc := range []struct {
		name    string
		req     *pmiwire.Spawn
		load    []int
		want    string
		mapping string
	}{
		{"round robin", req(pmiwire.SpawnCmd{Exe: "x", MaxProcs: 4}), nil, "[[0 3] [1] [2]]", "(vector,(0,3,1),(0,1,1))"},
		{"commands continue", req(pmiwire.SpawnCmd{Exe: "x", MaxProcs: 2}, pmiwire.SpawnCmd{Exe: "y", MaxProcs: 2}), nil, "[[0 3] [1] [2]]", "(vector,(0,3,1),(0,1,1))"},
		{"host key", req(pmiwire.SpawnCmd{Exe: "x", MaxProcs: 3, Info: []pmiwire.Pair{{Key: "host", Val: "b"}}}), nil, "[[] [0 1 2] []]", "(vector,(0,1,3))"},
		{"hosts key", req(pmiwire.SpawnCmd{Exe: "x", MaxProcs: 3, Info: []pmiwire.Pair{{Key: "hosts", Val: "c,a"}}}), nil, "[[1] [] [0 2]]", "(vector,(1,1,1),(0,2,1))"},
		{"hostfile key", req(pmiwire.SpawnCmd{Exe: "x", MaxProcs: 3, Info: []pmiwire.Pair{{Key: "hostfile", Val: hf}}}), nil, "[[1] [] [0 2]]", "(vector,(1,1,1),(0,2,1))"},
		{"least loaded", req(pmiwire.SpawnCmd{Exe: "x", MaxProcs: 2}), []int{5, 0, 3}, "[[] [0] [1]]", "(vector,(0,2,1))"},
		// The spawning job runs on node 1.
		{"parent's node", req(pmiwire.SpawnCmd{Exe: "x", MaxProcs: 3, Info: []pmiwire.Pair{{Key: "fastpmi_nodes", Val: "node"}}}), nil, "[[] [0 1 2] []]", "(vector,(0,1,3))"},
		{"parent's node among hosts", req(pmiwire.SpawnCmd{Exe: "x", MaxProcs: 2, Info: []pmiwire.Pair{{Key: "hosts", Val: "c,b"}, {Key: "fastpmi_nodes", Val: "node"}}}), nil, "[[] [0 1] []]", "(vector,(0,1,2))"},
	} {
		sr, err := newSpawnReq(tc.req, index, []int{1}, "")
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		nodes := sr.place(len(hosts), tc.load)
		if got := fmt.Sprint(nodes); got != tc.want {
			t.Errorf("%s: placed %s, want %s", tc.name, got, tc.want)
		}
		spec, _ := sr.childSpec(&node.Spec{JobID: "j", Mapping: "(vector,(0,3,9))"}, "j", 0, 1, nodes)
		if spec.Mapping != tc.mapping {
			t.Errorf("%s: children's PMI_process_mapping %q, want %q", tc.name, spec.Mapping, tc.mapping)
		}
	}
	for _, bad := range []*pmiwire.Spawn{
		nil,
		req(),
		req(pmiwire.SpawnCmd{Exe: "x", MaxProcs: 0}),
		req(pmiwire.SpawnCmd{Exe: "x", MaxProcs: 1, Info: []pmiwire.Pair{{Key: "host", Val: "nosuchhost"}}}),
		req(pmiwire.SpawnCmd{Exe: "x", MaxProcs: 1, Info: []pmiwire.Pair{{Key: "hostfile", Val: "/nonexistent/hostfile"}}}),
		req(pmiwire.SpawnCmd{Exe: "x", MaxProcs: 1, Info: []pmiwire.Pair{{Key: "host", Val: "c"}, {Key: "fastpmi_nodes", Val: "node"}}}),
		req(pmiwire.SpawnCmd{Exe: "x", MaxProcs: 1, Info: []pmiwire.Pair{{Key: "fastpmi_nodes", Val: "all"}}}),
	} {
		if _, err := newSpawnReq(bad, index, []int{1}, ""); err == nil {
			t.Errorf("spawn request %+v accepted", bad)
		}
	}
	// fastpmi_nodes=node from a job on two nodes: refused, saying why.
	onNode := req(pmiwire.SpawnCmd{Exe: "x", MaxProcs: 1, Info: []pmiwire.Pair{{Key: "fastpmi_nodes", Val: "node"}}})
	if _, err := newSpawnReq(onNode, index, []int{0, 1}, ""); err == nil || !strings.Contains(err.Error(), "asks for the spawning job's node, and it runs on 2") {
		t.Errorf("fastpmi_nodes=node from a job on 2 nodes: %v", err)
	}
}

// A spawn's hostfile names IPv6 addresses as -f does: alone, with
// slots=N or in brackets with :SLOTS (its hosts were cut at the first
// colon: fd00::2 became fd00).
func TestSpawnHostfileIPv6(t *testing.T) {
	hf := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hf, []byte("fd00::1\nfd00::2 slots=2\n[fd00::3]:4\nn1:2\nn2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hosts, err := readHostfile(hf, "")
	if want := []string{"fd00::1", "fd00::2", "fd00::3", "n1", "n2"}; err != nil || strings.Join(hosts, " ") != strings.Join(want, " ") {
		t.Errorf("hosts %q, %v; want %q", hosts, err, want)
	}
}
