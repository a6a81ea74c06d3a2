package launch

import (
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/netio"
)

// jobsCollRun is a run of a parent job of 4 ranks on two agent processes
// and its child of 2 ranks, one on each of those processes (as per-job
// agents and daemons host a run's spawned jobs), and a second child on a
// process of its own.
func jobsCollRun(t *testing.T) (run *multiRun, parent, child, other *rootNode) {
	t.Helper()
	run = newMultiRun(Config{Stdout: io.Discard, Stderr: io.Discard}, []string{"a", "b", "c"}, nil, netio.CodecNone)
	run.nodeNames = []string{"host-a", "host-b", "host-c"}
	mk := func(id string, nodes [][]int, at []int, procs ...int) *rootNode {
		r := &rootNode{run: run, spec: &node.Spec{JobID: id, Size: 0, Nodes: nodes}, at: at, conns: make([]netio.Conn, len(nodes))} // no links: sends go nowhere
		for _, rs := range nodes {
			r.spec.Size += len(rs)
		}
		var hellos []node.Hello
		for _, p := range procs {
			hellos = append(hellos, node.Hello{Host: "h", PID: p})
		}
		run.live[r] = r.spec.Size
		run.joined(r, hellos)
		return r
	}
	return run, mk("p", [][]int{{0, 1}, {2, 3}}, []int{0, 1}, 1, 2), mk("p-1", [][]int{{0}, {1}}, []int{0, 1}, 1, 2), mk("p-2", [][]int{{0}}, []int{2}, 3)
}

// enter enters node i of job r in a collective and returns where its
// answer lands.
func enter(run *multiRun, r *rootNode, i int, kind string, procs []agent.JobRanks, data string) chan string {
	got := make(chan string, 1)
	run.jobsColl(r, i, &node.Name{Op: "jobs", Name: kind, Procs: procs, Data: []byte(data)}, func(all []byte, err error) {
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- "data: " + string(all)
	})
	return got
}

func answered(ch chan string) string {
	select {
	case s := <-ch:
		return s
	default:
		return ""
	}
}

// The run's jobs are in its directory (agent/jobsdir, which tests the
// collectives themselves) as their agents said hello: a node enters as
// its agent process, whichever of its jobs it enters for; a collective
// naming a job of no run is refused at once; a job's layout names its
// nodes as the run does; a job that ends fails what waits for it.
func TestJobsCollective(t *testing.T) {
	run, parent, child, other := jobsCollRun(t)
	both := []agent.JobRanks{{Job: "p"}, {Job: "p-1"}}
	a := enter(run, parent, 1, agent.JobsFence, both, "B")
	if s := answered(a); s != "" {
		t.Fatalf("answered before every process entered: %s", s)
	}
	if s := answered(enter(run, child, 1, agent.JobsFence, both, "again")); !strings.Contains(s, "entered twice") {
		t.Errorf("a process entering twice (for its other job): %q", s)
	}
	b := enter(run, child, 0, agent.JobsFence, both, "A")
	for i, ch := range []chan string{a, b} {
		if s := answered(ch); s != "data: AB" {
			t.Errorf("entry %d answered %q, want every process's data in order", i, s)
		}
	}
	for _, bad := range []struct {
		from  *rootNode
		i     int
		procs []agent.JobRanks
		want  string
	}{
		{parent, 0, []agent.JobRanks{{Job: "p"}, {Job: "q"}}, "job q is not running in this run"},
		{other, 0, both, "agent process h/3 hosts no participant"},
	} {
		if s := answered(enter(run, bad.from, bad.i, agent.JobsFence, bad.procs, "")); !strings.Contains(s, bad.want) {
			t.Errorf("%v from %s node %d: %q, want an error saying %q", bad.procs, bad.from.spec.JobID, bad.i, s, bad.want)
		}
	}
	// Where another job runs, for a node registering its namespace: its
	// nodes named as the run names them (job p-2's one node is the run's
	// third).
	for _, c := range []struct {
		procs  []agent.JobRanks
		layout *agent.Layout
		err    string
	}{
		{[]agent.JobRanks{{Job: "p-1"}}, &agent.Layout{Size: 2, Hosts: []string{"host-a", "host-b"}, Nodes: [][]int{{0}, {1}}}, ""},
		{[]agent.JobRanks{{Job: "p"}}, &agent.Layout{Size: 4, Hosts: []string{"host-a", "host-b"}, Nodes: [][]int{{0, 1}, {2, 3}}}, ""},
		{[]agent.JobRanks{{Job: "p-2"}}, &agent.Layout{Size: 1, Hosts: []string{"host-c"}, Nodes: [][]int{{0}}}, ""},
		{[]agent.JobRanks{{Job: "q"}}, nil, "job q is not running"},
		{[]agent.JobRanks{{Job: "p"}, {Job: "p-1"}}, nil, "want one job"},
	} {
		var l *agent.Layout
		var err error
		run.jobLayout(&node.Name{Op: "joblayout", Procs: c.procs}, func(gl *agent.Layout, gerr error) { l, err = gl, gerr })
		if !reflect.DeepEqual(l, c.layout) || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("layout of %v: %+v, %v; want %+v, %q", c.procs, l, err, c.layout, c.err)
		}
		if l != nil {
			if err := l.Check(); err != nil {
				t.Errorf("layout of %v: %v", c.procs, err)
			}
		}
	}
	// A job that ends fails what waits for it, and only that.
	e := enter(run, parent, 0, agent.JobsConnect, both, "")
	f := enter(run, parent, 0, agent.JobsConnect, []agent.JobRanks{{Job: "p"}}, "")
	run.ended(child)
	if s := answered(e); !strings.Contains(s, "job p-1 ended before every participant joined") {
		t.Errorf("a connect with a job that ended: %q", s)
	}
	if s := answered(f); s != "" || run.dir.Pending() != 1 {
		t.Errorf("a collective of the parent alone: answered %q, %d under way", s, run.dir.Pending())
	}
}

// A rank's data across jobs is asked of the rank's node; an answer from
// another job's node, or a second one, is ignored; a job that ends fails
// what waits for it.
func TestJobRankDataRouting(t *testing.T) {
	run, _, child, other := jobsCollRun(t)
	got := make(chan string, 4)
	ask := func(job string, rank int) {
		run.jobRankData(&node.Name{Op: "rankdata", Procs: []agent.JobRanks{{Job: job, Ranks: []int{rank}}}}, func(blob []byte, found bool, err error) {
			got <- fmt.Sprintf("%q %v %v", blob, found, err)
		})
	}
	ask("p-1", 1)
	ask("p-1", 5)
	if s := answered(got); !strings.Contains(s, "rank 5 of job p-1") {
		t.Errorf("rank 5 of a job of 2: %s", s)
	}
	if len(run.rdWaits) != 1 {
		t.Fatalf("%d requests waiting, want 1", len(run.rdWaits))
	}
	var id uint64
	for k := range run.rdWaits {
		id = k
	}
	run.jobRankDataDone(other, &node.KVSMsg{Op: node.KVSRankVal, ID: id, Blob: []byte("wrong")})
	if s := answered(got); s != "" {
		t.Errorf("another job's node answered: %s", s)
	}
	run.jobRankDataDone(child, &node.KVSMsg{Op: node.KVSRankVal, ID: id, Blob: []byte("card"), Found: true})
	run.jobRankDataDone(child, &node.KVSMsg{Op: node.KVSRankVal, ID: id, Blob: []byte("again"), Found: true})
	if s := answered(got); s != `"card" true <nil>` {
		t.Errorf("answer %s", s)
	}
	if s := answered(got); s != "" {
		t.Errorf("answered twice: %s", s)
	}
	ask("p-1", 0)
	run.ended(child)
	if s := answered(got); !strings.Contains(s, "job p-1 ended") {
		t.Errorf("after the job ended: %s", s)
	}
}
