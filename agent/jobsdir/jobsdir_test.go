package jobsdir

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/tree"
)

// dir holds job p (4 ranks on processes h/1 and h/2), its child p-1 (2
// ranks, one on each of those) and p-2 (1 rank on h/3).
func dir(t *testing.T) *Dir[string] {
	t.Helper()
	d := New[string]("in this test")
	for _, j := range []struct {
		id     string
		nodes  [][]int
		agents []string
	}{
		{"p", [][]int{{0, 1}, {2, 3}}, []string{"h/1", "h/2"}},
		{"p-1", [][]int{{1}, {0}}, []string{"h/2", "h/1"}},
		{"p-2", [][]int{{0}}, []string{"h/3"}},
	} {
		l := agent.Layout{Nodes: j.nodes}
		for i, rs := range j.nodes {
			l.Size += len(rs)
			l.Hosts = append(l.Hosts, fmt.Sprintf("n%d", i))
		}
		if err := d.Add(j.id, Job[string]{Layout: l, Agents: j.agents, Owner: "owner of " + j.id}); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// enter enters process me and returns where its answer lands.
func enter(d *Dir[string], kind string, procs []agent.JobRanks, me, data string) chan string {
	got := make(chan string, 1)
	d.Enter(kind, procs, me, []byte(data), func(all []byte, err error) {
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

// A collective completes once every process hosting a participant
// entered, once each whatever jobs it hosts, with their data in process
// order; the same participants named in any order are one collective,
// another kind over them another.
func TestEnter(t *testing.T) {
	d := dir(t)
	both := []agent.JobRanks{{Job: "p"}, {Job: "p-1"}}
	a := enter(d, agent.JobsFence, both, "h/2", "B")
	if s := answered(a); s != "" {
		t.Fatalf("answered before every process entered: %s", s)
	}
	if s := answered(enter(d, agent.JobsFence, both, "h/2", "again")); !strings.Contains(s, "entered twice") {
		t.Errorf("a process entering twice: %q", s)
	}
	c := enter(d, agent.JobsConnect, both, "h/1", "")
	b := enter(d, agent.JobsFence, []agent.JobRanks{{Job: "p-1"}, {Job: "p"}}, "h/1", "A")
	for i, ch := range []chan string{a, b} {
		if s := answered(ch); s != "data: AB" {
			t.Errorf("entry %d answered %q, want every process's data in order", i, s)
		}
	}
	if s := answered(c); s != "" || d.Pending() != 1 {
		t.Errorf("the connect with half its processes: answered %q, %d under way", s, d.Pending())
	}
	if s := answered(enter(d, agent.JobsConnect, both, "h/2", "")); s != "data: " || answered(c) != "data: " {
		t.Errorf("the connect's last entry: %q", s)
	}
	// Part of a job: the processes hosting those ranks only.
	if s := answered(enter(d, agent.JobsFence, []agent.JobRanks{{Job: "p", Ranks: []int{3, 2}}}, "h/2", "x")); s != "data: x" {
		t.Errorf("a fence of ranks on one process: %q", s)
	}
	if d.Pending() != 0 {
		t.Errorf("%d collectives left under way", d.Pending())
	}
	for _, bad := range []struct {
		procs []agent.JobRanks
		me    string
		data  string
		want  string
	}{
		{[]agent.JobRanks{{Job: "p"}, {Job: "q"}}, "h/1", "", "job q is not running in this test"},
		{[]agent.JobRanks{{Job: "p", Ranks: []int{4}}}, "h/1", "", "rank 4 of job p of 4 ranks"},
		{both, "h/3", "", "agent process h/3 hosts no participant"},
		{nil, "h/1", "", "0 jobs"},
		{both, "h/1", strings.Repeat("x", tree.MaxNodeEntry+1), "bytes of node data"},
	} {
		if s := answered(enter(d, agent.JobsFence, bad.procs, bad.me, bad.data)); !strings.Contains(s, bad.want) {
			t.Errorf("%v from %s: %q, want an error saying %q", bad.procs, bad.me, s, bad.want)
		}
	}
	if d.Pending() != 0 {
		t.Errorf("refused entries left %d collectives under way", d.Pending())
	}
}

// A job that leaves fails the collectives naming it, and only those.
func TestRemove(t *testing.T) {
	d := dir(t)
	e := enter(d, agent.JobsConnect, []agent.JobRanks{{Job: "p"}, {Job: "p-2"}}, "h/3", "")
	f := enter(d, agent.JobsConnect, []agent.JobRanks{{Job: "p"}}, "h/1", "")
	d.Remove("p-2")
	d.Remove("p-2") // twice: nothing
	if s := answered(e); !strings.Contains(s, "job p-2 ended before every participant joined") {
		t.Errorf("a connect with a job that left: %q", s)
	}
	if s := answered(f); s != "" || d.Pending() != 1 {
		t.Errorf("a collective of p alone: answered %q, %d under way", s, d.Pending())
	}
	if _, err := d.Find("p-2"); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Find of a job that left: %v", err)
	}
	if j, err := d.Find("p-1"); err != nil || j.Owner != "owner of p-1" || NodeOf(&j.Layout, 0) != 1 {
		t.Errorf("Find p-1: %+v, %v", j, err)
	}
	if !d.Holds([]agent.JobRanks{{Job: "p"}, {Job: "p-1"}}) || d.Holds([]agent.JobRanks{{Job: "p"}, {Job: "p-2"}}) {
		t.Error("Holds")
	}
	if j, err := d.Find("p"); err != nil || j.Owner != "owner of p" {
		t.Errorf("Find p: %+v, %v", j, err)
	}
}

// An entry withdrawn while its collective is under way goes with its data
// and is never answered; the collective goes with its last entry, and
// the process may enter again. Withdrawn after the collective completed,
// nothing happens.
func TestWithdraw(t *testing.T) {
	d := dir(t)
	both := []agent.JobRanks{{Job: "p"}}
	gone := false
	w1 := d.Enter(agent.JobsFence, both, "h/1", []byte("A"), func([]byte, error) { gone = true })
	if w1 == nil || d.Pending() != 1 {
		t.Fatalf("an entry under way: withdraw %v, %d under way", w1 != nil, d.Pending())
	}
	w1()
	w1() // twice: nothing
	if d.Pending() != 0 {
		t.Fatalf("%d collectives under way after their only entry was withdrawn", d.Pending())
	}
	a := enter(d, agent.JobsFence, both, "h/1", "a")
	b := enter(d, agent.JobsFence, both, "h/2", "b")
	if sa, sb := answered(a), answered(b); sa != "data: ab" || sb != "data: ab" || gone {
		t.Errorf("after a withdrawn entry: answered %q and %q, the withdrawn one called: %v", sa, sb, gone)
	}
	// Two entries, one withdrawn: the other still waits, for a new one.
	c := enter(d, agent.JobsConnect, both, "h/2", "")
	w := d.Enter(agent.JobsConnect, both, "h/1", nil, func([]byte, error) {})
	if w != nil || answered(c) != "data: " {
		t.Fatalf("the connect completed by its last entry: withdraw %v, answered %q", w != nil, answered(c))
	}
	e := enter(d, agent.JobsConnect, both, "h/2", "")
	w = d.Enter(agent.JobsFence, both, "h/1", nil, func([]byte, error) { gone = true })
	w()
	if s := answered(e); s != "" || d.Pending() != 1 || gone {
		t.Errorf("after another collective's entry was withdrawn: answered %q, %d under way", s, d.Pending())
	}
	if s := answered(enter(d, agent.JobsConnect, both, "h/1", "")); s != "data: " || answered(e) != "data: " {
		t.Errorf("the connect, entered by its other process: %q", s)
	}
}

// Jobs that do not describe a job, or take an id in use, are refused.
func TestAddErrors(t *testing.T) {
	d := dir(t)
	ok := agent.Layout{Size: 1, Hosts: []string{"n"}, Nodes: [][]int{{0}}}
	for _, c := range []struct {
		id string
		j  Job[string]
	}{
		{"", Job[string]{Layout: ok, Agents: []string{"h/1"}}},
		{"p", Job[string]{Layout: ok, Agents: []string{"h/1"}}},
		{"q", Job[string]{Layout: ok}},
		{"q", Job[string]{Layout: agent.Layout{Size: 2, Hosts: []string{"n"}, Nodes: [][]int{{0, 0}}}, Agents: []string{"h/1"}}},
	} {
		if err := d.Add(c.id, c.j); err == nil {
			t.Errorf("Add(%q, %+v) accepted", c.id, c.j)
		}
	}
}

// Against a reference: random processes entering random collectives
// over random jobs from many goroutines, each collective completing
// exactly when its last process entered and answering every entry with
// the same data, in process order.
func TestEnterConcurrent(t *testing.T) {
	const nJobs, nProcs = 6, 5
	d := New[int]("here")
	procOf := map[string][]string{} // job -> process of each node
	rng := rand.New(rand.NewPCG(1, 2))
	for j := range nJobs {
		id := fmt.Sprintf("j%d", j)
		nodes := 1 + rng.IntN(3)
		l := agent.Layout{}
		var agents []string
		for n := range nodes {
			l.Nodes = append(l.Nodes, []int{n})
			l.Hosts = append(l.Hosts, fmt.Sprint(n))
			agents = append(agents, fmt.Sprintf("p%d", rng.IntN(nProcs)))
		}
		l.Size = nodes
		if err := d.Add(id, Job[int]{Layout: l, Agents: agents}); err != nil {
			t.Fatal(err)
		}
		procOf[id] = agents
	}
	for round := range 200 {
		// A collective over 1-3 jobs, entered by each of its processes.
		var procs []agent.JobRanks
		var want []string
		for _, j := range rng.Perm(nJobs)[:1+rng.IntN(3)] {
			id := fmt.Sprintf("j%d", j)
			procs = append(procs, agent.JobRanks{Job: id})
			want = append(want, procOf[id]...)
		}
		slices.Sort(want)
		want = slices.Compact(want)
		wantData := strings.Join(want, "")
		got := make(chan string, len(want))
		var wg sync.WaitGroup
		for _, p := range want {
			wg.Go(func() {
				d.Enter(agent.JobsFence, procs, p, []byte(p), func(all []byte, err error) {
					if err != nil {
						got <- err.Error()
						return
					}
					got <- string(all)
				})
			})
		}
		wg.Wait()
		for range want {
			if s := <-got; s != wantData {
				t.Fatalf("round %d: %v answered %q, want %q", round, procs, s, wantData)
			}
		}
		if d.Pending() != 0 {
			t.Fatalf("round %d: %d collectives under way after every process entered", round, d.Pending())
		}
	}
}
