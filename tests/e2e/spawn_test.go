package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Spawn through Slurm's libpmi2 (PMI2_Job_Spawn of two commands at once,
// pre-put key, wdir/path/unknown info keys) on one node: the children
// form their own job (size, appnum, job id, PMI_SPAWNED, the pre-put key
// before any fence, their own KVS) and reach the parent through the name
// service; their output is labelled "[job,rank]".
func TestSpawnPMI2(t *testing.T) {
	for _, tc := range []struct {
		name    string
		parents int
		nkids   int
		args    []string
	}{
		{"shm/1+2", 1, 2, nil},
		{"shm/3+4", 3, 4, nil},
		{"noshm/2+2", 2, 2, []string{"--no-shm"}},
		{"pmiport/1+3", 1, 3, []string{"--pmi-port"}},
		{"libfastpmi/2+2", 2, 2, nil}, // the same program on libfastpmi, over shared memory
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.HasPrefix(tc.name, "libfastpmi") {
				tc.args = libArgs(t, false, "shm")
			}
			wdir := t.TempDir()
			args := append([]string{"-n", n(tc.parents), "--label"}, tc.args...)
			r := run(t, job{
				args: append(args, prog("pmi2_spawn")),
				env:  []string{fmt.Sprintf("SPAWN_N=%d", tc.nkids), "SPAWN_WDIR=" + wdir},
			})
			r.wantCode(t, 0)
			r.wantSpawn(t, tc.parents, tc.nkids)
		})
	}
}

// A spawn that cannot start (a missing program, no room in the universe)
// fails with rc≠0 and a message on pmirun's stderr; the parent job keeps
// running and ends well.
func TestSpawnRefused(t *testing.T) {
	r := run(t, job{args: []string{"-n", "2", prog("pmi2_spawn")}, env: []string{"SPAWN_MODE=missing"}})
	r.wantCode(t, 0)
	r.wantMessage(t, `^pmirun: spawn requested by job 0 failed: cannot run "\./fastpmi-no-such-program"`)
	r.wantLines(t, map[string]int{"parent ok rank 0 spawn refused": 1, "parent ok rank 1": 1})

	// A working directory (the wdir info key) that is not one: refused
	// the same way, on one node and on per-job agents.
	for _, args := range [][]string{nil, {"--bootstrap", "loopback", "--nodes", "2"}} {
		r = run(t, job{args: append(args, "-n", "2", prog("pmi2_spawn")), env: []string{"SPAWN_MODE=badwdir"}})
		r.wantCode(t, 0)
		r.wantMessage(t, `^pmirun: spawn requested by job 0 failed: .*cannot run ".*pmi2_spawn": working directory /fastpmi-no-such-dir is not a directory here$`)
		r.wantLines(t, map[string]int{"parent ok rank 0 spawn refused": 1, "parent ok rank 1": 1})
	}

	// Processes that have ended leave room: the command line's job's
	// one rank (and on loopback agents two) spawns a child and exits,
	// and the child then spawns another within --usize 2 (3), once they
	// have (a spawn refused meanwhile is tried again). Their
	// processes used to count until the run was over ("1 more processes
	// do not fit the universe size 2 (2 running)").
	for _, args := range [][]string{{"-n", "1", "--usize", "2"}, {"--bootstrap", "loopback", "--nodes", "2", "-n", "2", "--usize", "3"}} {
		r = run(t, job{args: append(args, prog("spawnprog"), "-nest", "2", "-late")})
		r.wantCode(t, 0)
		if !strings.Contains(r.stdout, "nest 0 job ") {
			t.Errorf("the second job's spawn was refused for 10 s\n%s", r)
		}
	}

	// Two parents and three children do not fit a universe of four.
	r = run(t, job{args: []string{"-n", "2", "--usize", "4", prog("pmi2_spawn")}})
	r.wantCode(t, 1)
	r.wantMessage(t, `^pmirun: spawn requested by job 0 failed: 3 more processes do not fit the universe size 4 \(2 running\)$`)
	r.wantMessage(t, `^pmirun: rank 0 exited with code 1`)
}

// A parent spawning live jobs until pmirun, or the daemon that runs them,
// is out of descriptors (RLIMIT_NOFILE 200 or 300 here: 20 to 40 one-
// process jobs) gets a refused spawn, with the reason on stderr, instead
// of a rank that cannot be forked ending the run; the parent then ends
// well, and so does the run.
func TestSpawnRefusedOutOfDescriptors(t *testing.T) {
	for _, tc := range []struct {
		name string
		job  func(t *testing.T) job
		msg  string
	}{
		{"fork", func(*testing.T) job {
			return job{wrap: ulimit("-n", 200), args: []string{"-n", "1"}}
		}, `^pmirun: spawn requested by job 0 failed: 1 more processes: pmirun would hold about \d+ descriptors for its \d+ live jobs, .*RLIMIT_NOFILE 200`},
		{"daemon", func(t *testing.T) job {
			secret := newSecret(t)
			d := startDaemon(t, ulimit("-n", 300), "127.0.0.1:0", secret, "--max-jobs", "1000")
			return job{args: []string{"--daemons", d.addr, "--secret-file", secret, "-n", "1"}}
		}, `^pmirun: spawn of job \d+ failed: .*daemon refused the job: no descriptors for 1 more ranks: .*RLIMIT_NOFILE 300`},
		// pmirun's own descriptors, with daemons that have room: the
		// child job's listener or submission fails as it is made (which
		// one runs out first varies).
		{"pmirun-on-daemons", func(t *testing.T) job {
			secret := newSecret(t)
			d := startDaemon(t, nil, "127.0.0.1:0", secret, "--max-jobs", "1000")
			return job{wrap: ulimit("-n", 300), args: []string{"--daemons", d.addr, "--secret-file", secret, "-n", "1"}}
		}, `^pmirun: spawn (of|requested by) job \d+ failed: .*too many open files$`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := tc.job(t)
			j.args = append(j.args, prog("pmi2_spawnbench"), "rate", "3")
			r := run(t, j)
			r.wantCode(t, 0)
			r.wantMessage(t, tc.msg)
			m := regexp.MustCompile(`(?m)^spawn_rate (\d+) [0-9.]+ refused$`).FindStringSubmatch(r.stdout)
			if m == nil {
				t.Fatalf("no refused spawn rate line\n%s", r)
			}
			if n, _ := strconv.Atoi(m[1]); n < 5 {
				t.Errorf("%d spawns before the refusal, want the ~20 that fit\n%s", n, r)
			}
		})
	}
}

// The jobs of a spawn storm that sit idle (one-process children sleeping
// until the end) hold no thread each in pmirun: their agents, once idle,
// sleep together on a few threads (shm.Sleeper), where each used to hold
// one in its own futex wait.
func TestSpawnIdleJobsHoldNoThreads(t *testing.T) {
	const jobs = 300
	j := start(t, job{args: []string{"-n", "1", prog("pmi2_spawnbench"), "rate", "8"}, timeout: 60 * time.Second})
	deadline := time.Now().Add(30 * time.Second)
	for len(marked(j.marker)) < jobs+1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d processes of the run after 30 s, want %d spawned jobs", len(marked(j.marker)), jobs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // the first jobs' agents have been idle long enough to park
	live := len(marked(j.marker)) - 1
	threads := j.threadsThenTerm()
	if threads < 1 || threads > live/3 {
		t.Errorf("pmirun has %d threads with %d live spawned jobs, want at most %d", threads, live, live/3)
	}
}

// A child that fails or aborts ends every job, the parent waiting for it
// included, naming the child's job and rank; no process survives.
func TestSpawnChildFails(t *testing.T) {
	for _, tc := range []struct{ mode, msg string }{
		{"childfail", `^pmirun: job 1 rank 0 exited with code 7 after PMI init, before finalize$`},
		{"childabort", `^pmirun: job 1 rank 0 called abort with exit code \d+: child gives up$`},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			r := run(t, job{
				args:    []string{"-n", "2", prog("pmi2_spawn")},
				env:     []string{"SPAWN_MODE=" + tc.mode},
				timeout: 30 * time.Second,
			})
			if r.code == 0 {
				t.Fatalf("a failed child left the run successful\n%s", r)
			}
			r.wantMessage(t, tc.msg)
			r.wantFaster(t, 10*time.Second)
		})
	}
}

// The Go client spawns over shared memory and over the text protocol:
// Spawn and SpawnMultiple, Appnum per command, the info key wdir, the
// pre-put key before any fence, names across jobs. A request the
// launcher cannot read (an empty info key) is refused on both; over
// shared memory it used to end the job ("rank 0 broke the PMI
// protocol").
func TestSpawnGoClient(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		prog      []string
		kids      int
		transport string
	}{
		{"shm/spawn", nil, []string{"-n", "3"}, 3, "shm"},
		{"shm/multiple", nil, []string{"-n", "2", "-multi"}, 3, "shm"},
		{"text/multiple", []string{"--no-shm"}, []string{"-n", "1", "-multi"}, 2, "pmi2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"-n", "2"}, tc.args...)
			args = append(append(args, prog("spawnprog")), tc.prog...)
			r := run(t, job{args: args})
			r.wantCode(t, 0)
			want := map[string]int{
				"parent ok rank 1": 1,
				fmt.Sprintf("parent ok rank 0 children %d over %s", tc.kids, tc.transport): 1,
			}
			firstKids := tc.kids
			if strings.Contains(tc.name, "multiple") {
				firstKids--
			}
			for c := 0; c < tc.kids; c++ {
				app := 0
				if c >= firstKids {
					app = 1
				}
				want[fmt.Sprintf("child ok rank %d size %d appnum %d over %s", c, tc.kids, app, tc.transport)]++
			}
			r.wantLines(t, want)
		})
	}
}

// A raw client replays the spawn conversations MPICH 4.3 had with its
// Hydra, PMI-1 (one mcmd=spawn block) and PMI-2, parent and children:
// every answer fastpmi gives is the one MPICH got, the children see the
// parent's PARENT_ROOT_PORT_NAME before any fence, their process mapping,
// size, rank and the arguments of the spawn request.
func TestSpawnTraceReplay(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"pmi1", "pmi2"} {
		t.Run(v, func(t *testing.T) {
			trace := filepath.Join(root, "pmiwire", "testdata", "traces", "mpich432-spawn-"+v+"-hydra432.txt")
			r := run(t, job{args: []string{"-n", "1", "--label", prog("tracerank")}, env: []string{"TRACERANK_TRACE=" + trace}})
			r.wantCode(t, 0)
			r.wantLines(t, map[string]int{"[0] replay ok conv 0": 1, "[1,0] replay ok conv 1": 1, "[1,1] replay ok conv 2": 1})
		})
	}
}

// spawnLines is pmi2_spawn's output when parents parent ranks spawn kids
// (+1) children, labelled.
func spawnLines(parents, kids int) map[string]int {
	want := map[string]int{}
	for p := 1; p < parents; p++ {
		want[fmt.Sprintf("[%d] parent ok rank %d", p, p)]++
	}
	for c := 0; c <= kids; c++ {
		app := 0
		if c == kids {
			app = 1
		}
		want[fmt.Sprintf("[1,%d] child ok rank %d size %d appnum %d", c, c, kids+1, app)]++
	}
	return want
}

// wantSpawn checks pmi2_spawn's output: spawnLines and the parent rank 0
// line naming job <id>-1.
func (r result) wantSpawn(t *testing.T, parents, kids int) {
	t.Helper()
	want := spawnLines(parents, kids)
	line := regexp.MustCompile(fmt.Sprintf(`^\[0\] parent ok rank 0 children %d jobid \S+-1$`, kids+1))
	for _, l := range lines(r.stdout) {
		if line.MatchString(l) {
			want[l]++
		}
	}
	if len(want) != len(spawnLines(parents, kids))+1 {
		t.Fatalf("parent rank 0 did not report its spawn\n%s", r)
	}
	r.wantLines(t, want)
}

// Spawn across test hosts: the children are spread over every host (two
// per host and one more), started by the agents already there (no agent
// starts for the spawn); both link backends.
func TestSpawnNetns(t *testing.T) {
	for _, hosts := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("hosts=%d", hosts), func(t *testing.T) {
			cl := newClusterOf(t, hosts)
			for _, be := range backends {
				t.Run(be, func(t *testing.T) {
					j := cl.job(be, "--verbose", "--label", "-n", n(hosts), prog("pmi2_spawn"))
					kids := 2 * hosts
					j.env = []string{"SPAWN_N=" + n(kids)}
					r := run(t, j)
					r.wantCode(t, 0)
					r.wantSpawn(t, hosts, kids)
					r.wantHosted(t, hosts, 1)
				})
			}
			t.Run("refused", func(t *testing.T) {
				j := cl.job("net", "-n", n(hosts), prog("pmi2_spawn"))
				j.env = []string{"SPAWN_MODE=missing"}
				r := run(t, j)
				r.wantCode(t, 0)
				r.wantMessage(t, `^pmirun: spawn requested by job 0 failed: command 0: cannot run "\./fastpmi-no-such-program"`)
			})
			t.Run("childfail", func(t *testing.T) {
				j := cl.job("net", "-n", n(hosts), prog("pmi2_spawn"))
				j.env = []string{"SPAWN_MODE=childfail"}
				r := run(t, j)
				r.wantCode(t, 7)
				r.wantMessage(t, `^pmirun: job 1 rank 0 on node \d+ \(\S+\) exited with code 7`)
			})
		})
	}
}

// wantHosted checks pmirun's --verbose lines: each of the run's nodes
// was brought up once by the command line's job's agents and once more
// for each of the jobs spawned (every node of this run's spawned jobs
// came up in a process of those agents: the spawns started no agent),
// and at the end those agents had run spawned jobs' nodes and held none.
func (r result) wantHosted(t *testing.T, nodes, spawned int) {
	t.Helper()
	up := regexp.MustCompile(`^pmirun: node (\d+) \(.*, pid (\d+)\) up at `)
	var pids []string // in the order the nodes came up: the first job's first
	for _, l := range r.pmirunLines() {
		if m := up.FindStringSubmatch(l); m != nil {
			pids = append(pids, m[2])
		}
	}
	if len(pids) <= nodes {
		t.Fatalf("%d nodes came up, want the first job's %d and its spawned jobs'\n%s", len(pids), nodes, r)
	}
	agents := map[string]bool{}
	for _, p := range pids[:nodes] {
		agents[p] = true
	}
	for _, p := range pids[nodes:] {
		if !agents[p] {
			t.Errorf("a spawned job's node came up in pid %s, not in one of the run's agents %v: the spawn started an agent\n%s", p, pids[:nodes], r)
			break
		}
	}
	host := regexp.MustCompile(`^pmirun: node (\d+) agent \(pid (\d+)\) hosted (\d+) spawned jobs' nodes, holds 0 jobs,`)
	hosted, lines := 0, 0
	for _, l := range r.pmirunLines() {
		if m := host.FindStringSubmatch(l); m != nil {
			lines++
			k, _ := strconv.Atoi(m[3])
			hosted += k
			if !agents[m[2]] {
				t.Errorf("node %s's host has pid %s, not one of the first job's agents %v", m[1], m[2], pids[:nodes])
			}
		}
	}
	if lines != nodes || hosted < spawned || hosted != len(pids)-nodes {
		t.Errorf("%d agents say they hosted %d spawned jobs' nodes; want %d agents, %d nodes (of at least %d jobs)\n%s",
			lines, hosted, nodes, len(pids)-nodes, spawned, r)
	}
}

// With per-job agents (loopback and netns bootstraps), the agents of the
// command line's job run its spawned jobs: while a parent spawns
// one-process children that sleep until the end, the run has as many
// agent processes as nodes, however many jobs run; at the end every
// spawned job's node came up in one of them.
func TestSpawnStartsNoAgent(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes int
		job   func(t *testing.T) job
	}{
		{"loopback", 2, func(*testing.T) job { return loopbackJob(2, "net", "--verbose", "-n", "2") }},
		{"netns", 2, func(t *testing.T) job { return newClusterOf(t, 2).job("net", "--verbose", "-n", "2") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := tc.job(t)
			j.args = append(j.args, prog("pmi2_spawnbench"), "rate", "3")
			rj := start(t, j)
			// Sample while the children of several spawns sleep: pmirun,
			// the agents, their guards and the parent ranks are 8.
			deadline := time.Now().Add(20 * time.Second)
			for len(marked(rj.marker)) < 12 {
				if time.Now().After(deadline) {
					t.Fatalf("only %d processes of the run after 20 s: the spawns do not run", len(marked(rj.marker)))
				}
				time.Sleep(20 * time.Millisecond)
			}
			var agents []int
			for _, pid := range marked(rj.marker) {
				if cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); bytes.Contains(cl, []byte("\x00--node\x00")) {
					agents = append(agents, pid)
				}
			}
			// A rank an agent is forking shows the agent's command line
			// until it execs: it is no agent of its own.
			agents = slices.DeleteFunc(agents, func(p int) bool { return slices.Contains(agents, ppid(p)) })
			r := rj.wait()
			r.wantCode(t, 0)
			if len(agents) != tc.nodes {
				t.Errorf("%d agent processes while spawned jobs ran, want the run's %d:%s", len(agents), tc.nodes, describe(agents))
			}
			m := regexp.MustCompile(`(?m)^spawn_rate (\d+) `).FindStringSubmatch(r.stdout)
			if m == nil {
				t.Fatalf("no spawn rate line\n%s", r)
			}
			spawns, _ := strconv.Atoi(m[1])
			r.wantHosted(t, tc.nodes, spawns)
		})
	}
}

// With daemons, a spawn is one more submission to the daemons already
// running: the children start there, and names cross jobs.
func TestSpawnDaemons(t *testing.T) {
	p := newDaemonPair(t)
	j := p.job("--label", "-n", "2", prog("pmi2_spawn"))
	j.env = []string{"SPAWN_N=3"}
	r := run(t, j)
	r.wantCode(t, 0)
	r.wantSpawn(t, 2, 3)
	r = run(t, p.job("-n", "2", prog("spawnprog"), "-multi", "-n", "3"))
	r.wantCode(t, 0)
}

// pmibench -spawn measures spawn latency (every size, both ways, one node
// and several) and spawn rate, with a real libpmi2 parent.
func TestPmibenchSpawn(t *testing.T) {
	cmd := exec.Command(prog("pmibench"), "-spawn", "-pmirun", pmirun(), "-prog", prog("pmi2_spawnbench"),
		"-sizes", "1,3", "-count", "3", "-rounds", "1", "-rate-time", "1s", "-nodes", "2")
	cmd.Env = callerEnv(nil)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pmibench -spawn: %v\n%s", err, out)
	}
	spawnRow := regexp.MustCompile(`(?m)^(1|2)\t(per-job|daemon)\tspawn ms \(median\)\t[0-9.]+ \([0-9.]+–[0-9.]+\)\t[0-9.]+ \([0-9.]+–[0-9.]+\)$`)
	rateRow := regexp.MustCompile(`(?m)^(1|2)\t(per-job|daemon)\t[1-9][0-9]*\t[0-9.]+\t[0-9.]+\t`)
	if got := len(spawnRow.FindAllString(string(out), -1)); got != 4 {
		t.Errorf("%d spawn latency rows, want 4 (1 and 2 nodes, per-job and daemon)\n%s", got, out)
	}
	if got := len(rateRow.FindAllString(string(out), -1)); got != 4 {
		t.Errorf("%d spawn rate rows with spawns, want 4\n%s", got, out)
	}
}

// SIGKILL of pmirun while spawned jobs run leaves none of their processes
// alive, on one node and with per-job loopback agents.
func TestSpawnPmirunKilled(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"fork", []string{"-n", "1"}},
		{"loopback", []string{"--bootstrap", "loopback", "--nodes", "2", "-n", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := start(t, job{args: append(tc.args, prog("pmi2_spawnbench"), "rate", "20"), markAgents: true, timeout: 40 * time.Second})
			deadline := time.Now().Add(20 * time.Second)
			for len(marked(j.marker)) < 8 {
				if time.Now().After(deadline) {
					t.Fatalf("only %d processes of the run after 20 s: the spawns do not run", len(marked(j.marker)))
				}
				time.Sleep(50 * time.Millisecond)
			}
			if left := j.sigkill(); len(left) > 0 {
				t.Errorf("%d processes survive pmirun's SIGKILL by 2 s: %s", len(left), describe(left))
			}
		})
	}
}

// Two jobs launched separately on the same daemons meet by name, as an
// MPI_Comm_accept server and an MPI_Comm_connect client do; the server's
// name is gone once its run has ended.
func TestDaemonNamesAcrossRuns(t *testing.T) {
	p := newDaemonPair(t)
	name := "svc-" + newMarker()
	server := start(t, p.job("-n", "2", prog("spawnprog"), "-serve", name))
	client := run(t, p.job("-n", "2", prog("spawnprog"), "-connect", name))
	client.wantCode(t, 0)
	sr := server.wait()
	sr.wantCode(t, 0)
	sr.wantLines(t, map[string]int{"serve ok": 1})
	port := regexp.MustCompile(`^connect ok port-of-\S+$`)
	if ls := lines(client.stdout); len(ls) != 1 || !port.MatchString(ls[0]) {
		t.Errorf("client printed %q, want one line %q\n%s", ls, port, client)
	}
	// The client's NAME-ack left with the client's run: a new server run
	// does not find it at once (it waits), so it is killed by its timeout.
	j := p.job("--timeout", "2s", "-n", "2", prog("spawnprog"), "-serve", name)
	j.timeout = 30 * time.Second
	again := run(t, j)
	again.wantCode(t, 124)
}

// --spawn-placement: round robin starts at the first node; leastload
// picks the node running the fewest processes (here the second: the
// parent's 3 ranks sit 2 and 1 on two daemons).
func TestSpawnPlacementOption(t *testing.T) {
	p := newDaemonPair(t)
	for _, tc := range []struct {
		placement string
		daemon    int
	}{{"roundrobin", 0}, {"leastload", 1}} {
		t.Run(tc.placement, func(t *testing.T) {
			r := run(t, p.job("--ppn", "2", "--spawn-placement", tc.placement, "-n", "3", prog("spawnprog"), "-where"))
			r.wantCode(t, 0)
			r.wantLines(t, map[string]int{"child under pid " + n(p.d[tc.daemon].cmd.Process.Pid): 1})
		})
	}
}

// -outfile-pattern: a spawned job's ranks write files of their own
// (%r reads "job,rank"), never the parent's.
func TestSpawnOutputFiles(t *testing.T) {
	dir := t.TempDir()
	r := run(t, job{args: []string{"-n", "1", "-outfile-pattern", filepath.Join(dir, "out.%r"), prog("pmi2_spawn")},
		env: []string{"SPAWN_N=1"}})
	r.wantCode(t, 0)
	for name, want := range map[string]string{
		"out.0":   "parent ok rank 0 children 2 jobid ",
		"out.1,0": "child ok rank 0 size 2 appnum 0\n",
		"out.1,1": "child ok rank 1 size 2 appnum 1\n",
	} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !strings.HasPrefix(string(b), want) {
			t.Errorf("%s holds %q (%v), want it to start with %q\n%s", name, b, err, want, r)
		}
	}
}

// Jobs spawned by spawned jobs (a chain of three under the command
// line's job) are named and numbered by the run alike on one node and on
// several: job ids <run's id>-<n>, output files out.<n>,<rank>, labels
// [n,rank]. On several nodes each used to extend its spawner's instead
// (job 2 was <id>-1-2 and wrote out.1,2,0, job 3 out.1,2,3,0).
func TestSpawnNested(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ranks int
		args  []string
	}{
		{"fork", 1, []string{"-n", "1"}},
		{"loopback", 2, []string{"--bootstrap", "loopback", "--nodes", "2", "-n", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			args := append(slices.Clone(tc.args), "--label", "-outfile-pattern", filepath.Join(dir, "out.%r"), prog("spawnprog"), "-nest", "3")
			r := run(t, job{args: args})
			r.wantCode(t, 0)
			first := ""
			for d := 3; d >= 0; d-- {
				jobno := 3 - d
				name := fmt.Sprintf("out.%d,0", jobno)
				if jobno == 0 {
					name = "out.0"
				}
				b, err := os.ReadFile(filepath.Join(dir, name))
				m := regexp.MustCompile(fmt.Sprintf(`^nest %d job (\S+)\n$`, d)).FindSubmatch(b)
				if err != nil || m == nil {
					files, _ := os.ReadDir(dir)
					t.Fatalf("%s holds %q (%v), want \"nest %d job ID\"; files: %v\n%s", name, b, err, d, files, r)
				}
				if jobno == 0 {
					first = string(m[1])
				} else if want := fmt.Sprintf("%s-%d", first, jobno); string(m[1]) != want {
					t.Errorf("job %d has id %s, want %s", jobno, m[1], want)
				}
			}

			// A program spawned by its bare name is looked up on the
			// PATH the ranks get (--env's), as the command line's is;
			// on several nodes pmirun used to look it up on its own
			// ('command 0: cannot run "spawnprog": ... not found in
			// $PATH').
			path := "PATH=" + binDir + string(filepath.ListSeparator) + os.Getenv("PATH")
			r = run(t, job{args: append(slices.Clone(tc.args), "--env", path, prog("spawnprog"), "-nest", "1", "-bare")})
			r.wantCode(t, 0)
			r.wantLines(t, map[string]int{fmt.Sprintf("nest 1 job %s", jobOf(r.stdout)): tc.ranks, fmt.Sprintf("nest 0 job %s-1", jobOf(r.stdout)): 1})
		})
	}
}

// jobOf is the job id of the first "nest N job ID" line of out.
func jobOf(out string) string {
	m := regexp.MustCompile(`(?m)^nest \d+ job (\S+)$`).FindStringSubmatch(out)
	if m == nil {
		return "?"
	}
	return m[1]
}

// A spawned job's node is named as the run names it: its children all
// on the run's node 1 (leastload: node 0 runs two of the parent's three
// ranks), a child's failure was said to be on "node 0", the spawned
// job's own first node.
func TestSpawnFailureNamesRunNode(t *testing.T) {
	r := run(t, job{
		args: []string{"--bootstrap", "loopback", "--nodes", "2", "-n", "3", "--spawn-placement", "leastload", prog("pmi2_spawn")},
		env:  []string{"SPAWN_MODE=childfail", "SPAWN_N=1"},
	})
	r.wantCode(t, 7)
	r.wantMessage(t, `^pmirun: job 1 rank 0 on node 1 \(127\.0\.0\.1\) exited with code 7 `)
}
