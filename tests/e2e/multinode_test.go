package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/netns"
	"github.com/fastpmi/fastpmi/internal/netns/netnstest"
	"github.com/fastpmi/fastpmi/internal/sys"
)

// Multi-node jobs: pmirun as the root of a tree of pmid agents, one per
// node. The netns bootstrap runs each agent in its own network namespace
// (test hosts joined by a virtual switch, package netns), so every
// inter-node message crosses a real TCP link; pmirun runs inside the
// first host, as it would on a login node of the cluster. The loopback
// bootstrap runs the same protocol over 127.0.0.1 without namespaces.
//
// As root these tests run (netnstest fails, never skips, when test hosts
// cannot be made); the C and Go ranks check their own results and the
// tests check what every rank printed and pmirun's --verbose counters.

// hostCount is the number of test hosts of the multi-node tests.
const hostCount = 4

// backends are the agent-link transports every multi-node job runs over.
var backends = []string{"uring", "net"}

// cluster is one set of test hosts and the pmirun arguments that use them.
type cluster struct {
	c     *netns.Cluster
	names []string // namespace of each host
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	return newClusterOf(t, hostCount)
}

// newClusterOf makes a cluster of hosts test hosts.
func newClusterOf(t *testing.T, hosts int) *cluster {
	t.Helper()
	start := time.Now()
	c := netnstest.New(t, hosts)
	cl := &cluster{c: c}
	for _, h := range c.Hosts {
		cl.names = append(cl.names, h.Name)
	}
	t.Logf("made %d test hosts in %v", hosts, time.Since(start).Round(time.Millisecond))
	return cl
}

// job returns a job that runs pmirun inside host 0 with the netns
// bootstrap over every host, on backend, then args.
func (cl *cluster) job(backend string, args ...string) job {
	a := []string{"--bootstrap", "netns", "--hosts", strings.Join(cl.names, ","),
		"--root-addr", cl.c.Hosts[0].Addr, "--netio", backend}
	return job{
		args:       append(a, args...),
		wrap:       []string{"ip", "netns", "exec", cl.names[0]},
		markAgents: true,
		timeout:    40 * time.Second,
	}
}

// loopbackJob returns a job with the loopback bootstrap: nodes agents on
// this machine, on backend.
func loopbackJob(nodes int, backend string, args ...string) job {
	a := []string{"--bootstrap", "loopback", "--nodes", n(nodes), "--netio", backend}
	return job{args: append(a, args...), markAgents: true, timeout: 40 * time.Second}
}

// counters are the per-node counters pmirun prints with --verbose.
func (r result) counters(t *testing.T, nodes int) []map[string]int64 {
	t.Helper()
	rx := regexp.MustCompile(`^pmirun: node (\d+) counters:(.*)$`)
	out := make([]map[string]int64, nodes)
	for _, l := range r.pmirunLines() {
		m := rx.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		i, _ := strconv.Atoi(m[1])
		if i < 0 || i >= nodes || out[i] != nil {
			t.Errorf("counters line for node %d: out of range or repeated\n%s", i, r)
			continue
		}
		out[i] = map[string]int64{}
		for _, kv := range strings.Fields(m[2]) {
			k, v, ok := strings.Cut(kv, "=")
			x, err := strconv.ParseInt(v, 10, 64)
			if !ok || err != nil {
				t.Errorf("node %d counter %q is not key=integer\n%s", i, kv, r)
				continue
			}
			out[i][k] = x
		}
	}
	for i, c := range out {
		if c == nil {
			t.Errorf("no counters line for node %d\n%s", i, r)
		}
	}
	return out
}

// wantRingMsgs checks the ring's message count: every node sends exactly
// two ring messages (one to each neighbour node) per ring exchange.
func (r result) wantRingMsgs(t *testing.T, nodes, rings int) {
	t.Helper()
	for i, c := range r.counters(t, nodes) {
		if c == nil {
			continue
		}
		if got := c["ring.msgs.sent"]; got != int64(2*rings) {
			t.Errorf("node %d sent %d ring messages for %d ring exchanges, want %d\n%s", i, got, rings, 2*rings, r)
		}
		if got := c["ring.msgs.recv"]; got != int64(2*rings) {
			t.Errorf("node %d received %d ring messages for %d ring exchanges, want %d\n%s", i, got, rings, 2*rings, r)
		}
	}
}

// broadcastBytes returns the job's broadcast bytes before and after
// compression, from pmirun's --verbose summary.
func (r result) broadcastBytes(t *testing.T) (raw, sent int64) {
	t.Helper()
	rx := regexp.MustCompile(`^pmirun: broadcast bytes raw (\d+), sent (\d+)\b`)
	for _, l := range r.pmirunLines() {
		if m := rx.FindStringSubmatch(l); m != nil {
			raw, _ = strconv.ParseInt(m[1], 10, 64)
			sent, _ = strconv.ParseInt(m[2], 10, 64)
			return raw, sent
		}
	}
	t.Fatalf("no broadcast bytes line from pmirun\n%s", r)
	return 0, 0
}

// pmi2Line is pmi2_test's report of one rank.
var pmi2Line = regexp.MustCompile(`^pmi2 ok rank (\d+) size (\d+) node (\d+) local (\d+)/(\d+) ring (\d+) usize (-?\d+)$`)

// wantPMI2 checks that every rank of a pmi2_test job of size ranks on
// nodes nodes reported, on the node its placement (block or cyclic) puts
// it, with a consistent local rank.
func (r result) wantPMI2(t *testing.T, size, nodes int, cyclic bool) {
	t.Helper()
	ppn := (size + nodes - 1) / nodes
	seen := make([]bool, size)
	for _, l := range lines(r.stdout) {
		m := pmi2Line.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("unexpected stdout line %q\n%s", l, r)
			continue
		}
		var v [7]int
		for i := range v {
			v[i], _ = strconv.Atoi(m[i+1])
		}
		rank, sz, node, local, nlocal := v[0], v[1], v[2], v[3], v[4]
		if rank < 0 || rank >= size || seen[rank] {
			t.Errorf("rank %d reported twice or out of range\n%s", rank, r)
			continue
		}
		seen[rank] = true
		wantNode, wantLocal := rank/ppn, rank%ppn
		if cyclic {
			wantNode, wantLocal = rank%nodes, rank/nodes
		}
		if sz != size || node != wantNode || local != wantLocal || nlocal != ppn {
			t.Errorf("rank %d reported %q, want size %d, node %d, local rank %d of %d", rank, l, size, wantNode, wantLocal, ppn)
		}
	}
	for rank, ok := range seen {
		if !ok {
			t.Errorf("rank %d did not report\n%s", rank, r)
		}
	}
}

// wantAllreduce checks mpi_allreduce's output for size ranks.
func (r result) wantAllreduce(t *testing.T, size int) {
	t.Helper()
	want := map[string]int{fmt.Sprintf("allreduce ok N=%d sum=%d", size, size*(size+1)/2): 1}
	for rank := range size {
		want[fmt.Sprintf("ok rank %d of %d", rank, size)] = 1
	}
	r.wantLines(t, want)
}

// wantOneLine checks that stdout is one line matching re.
func (r result) wantOneLine(t *testing.T, re string) {
	t.Helper()
	ls := lines(r.stdout)
	if len(ls) != 1 || !regexp.MustCompile(re).MatchString(ls[0]) {
		t.Errorf("stdout is not one line matching %q\n%s", re, r)
	}
}

const (
	helloLine     = `^hello: 8 ranks over shm verified allgather, ring, iallgather, put/fence/get; `
	multiprogLine = `^multiprog ok: 8 ranks, 200 rounds, 3 rings in `
)

// Real programs on 4 test hosts, over both agent-link backends: MPICH
// (PMI-1) with 4 ranks per host, libpmi2 (PMI-2, PMIX_Ring) block and
// cyclic, the Go example, and many back-to-back non-blocking collectives.
func TestNetnsJobs(t *testing.T) {
	cl := newCluster(t)
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			t.Run("mpi_allreduce", func(t *testing.T) {
				r := run(t, cl.job(be, "--ppn", "4", "-n", "16", prog("mpi_allreduce")))
				r.wantCode(t, 0)
				r.wantAllreduce(t, 16)
			})
			for _, cyclic := range []bool{false, true} {
				name, args, placement := "pmi2_test/block", []string{"--verbose"}, "block"
				if cyclic {
					name, args, placement = "pmi2_test/cyclic", append(args, "--cyclic"), "cyclic"
				}
				t.Run(name, func(t *testing.T) {
					j := cl.job(be, append(args, "-n", "8", prog("pmi2_test"))...)
					j.env = []string{"EXPECT_NNODES=4", "EXPECT_PLACEMENT=" + placement, "PMI2_TEST_ALARM=30"}
					r := run(t, j)
					r.wantCode(t, 0)
					r.wantPMI2(t, 8, hostCount, cyclic)
					r.wantRingMsgs(t, hostCount, 1)
					r.wantMessage(t, `agent links over `+be+` `)
				})
			}
			t.Run("hello", func(t *testing.T) {
				// Block placement: hello's ring check assumes ring
				// positions follow rank order.
				r := run(t, cl.job(be, "--verbose", "-n", "8", prog("hello")))
				r.wantCode(t, 0)
				r.wantOneLine(t, helloLine)
				r.wantRingMsgs(t, hostCount, 1)
			})
			t.Run("multiprog", func(t *testing.T) {
				r := run(t, cl.job(be, "--verbose", "--cyclic", "-n", "8", prog("multiprog"), "-rounds", "200", "-rings", "3"))
				r.wantCode(t, 0)
				r.wantOneLine(t, multiprogLine)
				r.wantRingMsgs(t, hostCount, 3)
			})
		})
	}
}

// The same protocol over loopback agents: no namespaces needed.
func TestLoopbackJobs(t *testing.T) {
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			t.Run("mpi_allreduce", func(t *testing.T) {
				r := run(t, loopbackJob(hostCount, be, "-n", "16", prog("mpi_allreduce")))
				r.wantCode(t, 0)
				r.wantAllreduce(t, 16)
			})
			t.Run("hello", func(t *testing.T) {
				r := run(t, loopbackJob(hostCount, be, "--verbose", "-n", "8", prog("hello")))
				r.wantCode(t, 0)
				r.wantOneLine(t, helloLine)
				r.wantRingMsgs(t, hostCount, 1)
			})
			t.Run("multiprog", func(t *testing.T) {
				r := run(t, loopbackJob(hostCount, be, "--verbose", "-n", "8", prog("multiprog"), "-rounds", "200", "-rings", "3"))
				r.wantCode(t, 0)
				r.wantOneLine(t, multiprogLine)
				r.wantRingMsgs(t, hostCount, 3)
			})
		})
	}
}

// Nodes whose ranks are all done stay linked until the job ends: rank 0
// uses the name service (through its agent's link to pmirun) well after
// every other node's ranks finalized and exited.
func TestLoopbackNodesStayUntilJobEnds(t *testing.T) {
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			r := run(t, loopbackJob(hostCount, be, "-n", "8", prog("multiprog"), "-late", "1500ms"))
			r.wantCode(t, 0)
			r.wantOneLine(t, `^multiprog late names ok: 8 ranks$`)
		})
	}
}

// A node that forks its ranks for longer than --net-timeout (thousands
// of ranks on two CPUs: 1,500 running ranks a node take 1.5-2 s to fork
// here) keeps its links alive meanwhile; before, pmirun took it for lost
// ("no message for 1s") and ended the job.
func TestLoopbackForkOutlastsNetTimeout(t *testing.T) {
	r := run(t, job{args: []string{"--bootstrap", "loopback", "--nodes", "2", "--net-timeout", "1s", "-n", "3000", "sleep", "1"},
		timeout: 90 * time.Second})
	r.wantCode(t, 0)
}

// The root compresses each gathered fence once: MPICH-style business
// cards of 32 ranks on 4 hosts shrink to at most half with s2, and
// --compress none sends them as they are.
func TestNetnsBroadcastCompression(t *testing.T) {
	cl := newCluster(t)
	for _, tc := range []struct {
		codec string
		ok    func(raw, sent int64) bool
		want  string
	}{
		{"s2", func(raw, sent int64) bool { return 2*sent <= raw }, "sent <= raw/2"},
		{"none", func(raw, sent int64) bool { return sent >= raw }, "sent >= raw"},
	} {
		t.Run(tc.codec, func(t *testing.T) {
			r := run(t, cl.job("auto", "--verbose", "--compress", tc.codec, "-n", "32", prog("pmi2_bench")))
			r.wantCode(t, 0)
			r.wantMessage(t, `compression `+tc.codec+`$`)
			raw, sent := r.broadcastBytes(t)
			t.Logf("--compress %s: broadcast bytes raw %d, sent %d", tc.codec, raw, sent)
			// 32 cards of ~45 bytes: the fence's gathered KVS alone is
			// over a kilobyte.
			if raw < 32*40 {
				t.Errorf("broadcast raw bytes %d: too few for 32 business cards\n%s", raw, r)
			}
			if !tc.ok(raw, sent) {
				t.Errorf("--compress %s: broadcast raw %d, sent %d; want %s\n%s", tc.codec, raw, sent, tc.want, r)
			}
		})
	}
}

// sleepJob is a job whose 8 ranks init PMI, print "ready rank R" and
// sleep: the state in which the fault tests break a node.
func sleepArgs() []string {
	return []string{"-n", "8", prog("exit_early"), "sleep-after-init", "-1", "100"}
}

// waitReady waits until all 8 ranks of a sleepArgs job said they are
// ready.
func (r *running) waitReady() {
	r.t.Helper()
	r.waitStdout(20*time.Second, func(ls []string) bool {
		k := 0
		for _, l := range ls {
			if strings.HasPrefix(l, "ready rank ") {
				k++
			}
		}
		return k == 8
	})
}

// agentPIDs returns the pid of each node's pmid among the processes of
// the job (markAgents), by its command line "pmid --node I".
func agentPIDs(t *testing.T, marker string, nodes int) []int {
	t.Helper()
	pids := make([]int, nodes)
	for _, pid := range marked(marker) {
		args := cmdline(pid)
		if len(args) < 3 || !strings.HasSuffix(args[0], "/pmid") {
			continue
		}
		i := slices.Index(args, "--node")
		if i < 0 || i+1 >= len(args) {
			continue
		}
		node, err := strconv.Atoi(args[i+1])
		if err != nil || node < 0 || node >= nodes {
			t.Fatalf("pmid pid %d with node %q", pid, args[i+1])
		}
		if pids[node] != 0 {
			t.Fatalf("two agents for node %d: pids %d and %d", node, pids[node], pid)
		}
		pids[node] = pid
	}
	for i, pid := range pids {
		if pid == 0 {
			t.Fatalf("no pmid process for node %d among the job's: %s", i, describe(marked(marker)))
		}
	}
	return pids
}

func cmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// wantAgentsInHosts checks that the agent of node i runs in host i's
// network namespace, as `ip netns pids` sees it.
func (cl *cluster) wantAgentsInHosts(t *testing.T, pids []int) {
	t.Helper()
	for i, pid := range pids {
		out, err := exec.Command("ip", "netns", "pids", cl.names[i]).Output()
		if err != nil {
			t.Fatalf("ip netns pids %s: %v", cl.names[i], err)
		}
		if !slices.Contains(strings.Fields(string(out)), strconv.Itoa(pid)) {
			t.Errorf("agent of node %d (pid %d) is not in namespace %s (it holds %s)", i, pid, cl.names[i], strings.Fields(string(out)))
		}
	}
}

// A node's agent killed mid-job ends the job at once, naming the node;
// nothing of the job survives.
func TestNetnsAgentKilled(t *testing.T) {
	cl := newCluster(t)
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			j := cl.job(be, sleepArgs()...)
			j.env = []string{"EXIT_EARLY_ALARM=30"}
			r := start(t, j)
			r.waitReady()
			pids := agentPIDs(t, r.marker, hostCount)
			cl.wantAgentsInHosts(t, pids)
			killed := time.Now()
			if err := sys.SignalProcess(pids[2], sys.SIGKILL); err != nil {
				t.Fatalf("kill agent of node 2: %v", err)
			}
			res := r.wait()
			took := res.elapsed - killed.Sub(r.start)
			t.Logf("pmirun ended %v after node 2's agent was killed: exit %d", took.Round(time.Millisecond), res.code)
			if res.code == 0 {
				t.Errorf("exit code 0 after an agent was killed\n%s", res)
			}
			res.wantMessage(t, `\bnode 2\b.*\blost\b`)
			if took > 2*time.Second {
				t.Errorf("pmirun ended %v after node 2's agent was killed, want under 2s\n%s", took, res)
			}
		})
	}
}

// A node cut off from the network (its link down) is declared lost after
// --net-timeout, naming the node; the job ends and nothing of it survives.
func TestNetnsLinkDown(t *testing.T) {
	const netTimeout, slack = 2 * time.Second, 3 * time.Second
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			cl := newCluster(t) // the link stays down: a cluster per case
			j := cl.job(be, append([]string{"--net-timeout", netTimeout.String()}, sleepArgs()...)...)
			j.env = []string{"EXIT_EARLY_ALARM=30"}
			r := start(t, j)
			r.waitReady()
			down := time.Now()
			if err := cl.c.SetLink(3, false); err != nil {
				t.Fatal(err)
			}
			res := r.wait()
			took := res.elapsed - down.Sub(r.start)
			t.Logf("pmirun ended %v after node 3's link went down: exit %d", took.Round(time.Millisecond), res.code)
			if res.code == 0 {
				t.Errorf("exit code 0 after a node was cut off\n%s", res)
			}
			res.wantMessage(t, `\bnode 3\b.*\blost\b`)
			for _, l := range res.pmirunLines() {
				if regexp.MustCompile(`\bnode [012]\b.*\blost\b`).MatchString(l) {
					t.Errorf("pmirun blames a node that kept its link: %q\n%s", l, res)
				}
			}
			if took > netTimeout+slack {
				t.Errorf("pmirun ended %v after node 3's link went down, want under %v (--net-timeout %v + %v)\n%s",
					took.Round(time.Millisecond), netTimeout+slack, netTimeout, slack, res)
			}
		})
	}
}

// The loopback bootstrap's agents are found, killed and reported the same
// way.
func TestLoopbackAgentKilled(t *testing.T) {
	j := loopbackJob(hostCount, "auto", sleepArgs()...)
	j.env = []string{"EXIT_EARLY_ALARM=30"}
	r := start(t, j)
	r.waitReady()
	pids := agentPIDs(t, r.marker, hostCount)
	killed := time.Now()
	if err := sys.SignalProcess(pids[2], sys.SIGKILL); err != nil {
		t.Fatalf("kill agent of node 2: %v", err)
	}
	res := r.wait()
	took := res.elapsed - killed.Sub(r.start)
	if res.code == 0 {
		t.Errorf("exit code 0 after an agent was killed\n%s", res)
	}
	res.wantMessage(t, `\bnode 2\b.*\blost\b`)
	if took > 2*time.Second {
		t.Errorf("pmirun ended %v after node 2's agent was killed, want under 2s\n%s", took, res)
	}
}

// An agent that hangs (stopped with SIGSTOP: it neither answers nor
// ends) is declared lost after --net-timeout, and the job ends then: it
// is not waited for again (it took three times --net-timeout).
func TestLoopbackAgentStopped(t *testing.T) {
	const netTimeout, slack = 2 * time.Second, 3 * time.Second
	j := loopbackJob(hostCount, "auto", append([]string{"--net-timeout", netTimeout.String()}, sleepArgs()...)...)
	j.env = []string{"EXIT_EARLY_ALARM=30"}
	r := start(t, j)
	r.waitReady()
	pids := agentPIDs(t, r.marker, hostCount)
	stopped := time.Now()
	if out, err := exec.Command("kill", "-STOP", strconv.Itoa(pids[1])).CombinedOutput(); err != nil {
		t.Fatalf("stop agent of node 1: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = sys.SignalProcess(pids[1], sys.SIGKILL) })
	res := r.wait()
	took := res.elapsed - stopped.Sub(r.start)
	if res.code == 0 {
		t.Errorf("exit code 0 after an agent hung\n%s", res)
	}
	res.wantMessage(t, `\bnode 1\b.*\blost: no message for 2s`)
	if took > netTimeout+slack {
		t.Errorf("pmirun ended %v after node 1's agent stopped, want under %v (--net-timeout %v + %v)\n%s",
			took.Round(time.Millisecond), netTimeout+slack, netTimeout, slack, res)
	}
}
