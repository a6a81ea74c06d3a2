package daemon

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/netio"
)

// testSession is a run's name session with a daemon, read by a goroutine
// of its own onto in.
type testSession struct {
	t  *testing.T
	c  netio.Conn
	in chan node.Name
}

func openSession(t *testing.T, tr netio.Transport, addr string) *testSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := tr.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &testSession{t: t, c: c, in: make(chan node.Name, 16)}
	go func() { // ends when the connection closes
		defer close(s.in)
		for {
			f, err := c.Recv(context.Background())
			var m node.Name
			if err != nil || f.Type != FrameName || node.Decode(f.Payload, &m) != nil {
				return
			}
			s.in <- m
		}
	}()
	s.send(node.Name{ID: 1, Op: "open"})
	if m := s.next(); m.ID != 1 || m.Err != "" {
		t.Fatalf("open: %+v", m)
	}
	return s
}

func (s *testSession) send(m node.Name) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.c.Send(ctx, netio.Frame{Type: FrameName, Payload: node.Encode(m)}); err != nil {
		s.t.Fatal(err)
	}
}

// next is the next frame the daemon sent.
func (s *testSession) next() node.Name {
	s.t.Helper()
	select {
	case m, ok := <-s.in:
		if !ok {
			s.t.Fatal("the daemon closed the session")
		}
		return m
	case <-time.After(10 * time.Second):
		s.t.Fatal("no frame from the daemon")
	}
	return node.Name{}
}

// quiet checks that the daemon sent nothing more for a while.
func (s *testSession) quiet() {
	s.t.Helper()
	select {
	case m := <-s.in:
		s.t.Errorf("unexpected frame %+v", m)
	case <-time.After(100 * time.Millisecond):
	}
}

// call sends m and returns the daemon's answer.
func (s *testSession) call(m node.Name) node.Name {
	s.t.Helper()
	s.send(m)
	r := s.next()
	if r.ID != m.ID {
		s.t.Fatalf("answer %+v to request %d", r, m.ID)
	}
	return r
}

// serveDaemon starts a daemon on loopback, served until the test ends,
// and a transport to reach it with its secret.
func serveDaemon(t *testing.T) (*Server, netio.Transport) {
	t.Helper()
	secret := []byte("0123456789abcdef0123456789abcdef")
	s, err := New(Config{Listen: "127.0.0.1:0", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error)
	go func() { served <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-served
	})
	tr, err := NewTransport(secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return s, tr
}

func oneNode(host string) *agent.Layout {
	return &agent.Layout{Size: 1, Hosts: []string{host}, Nodes: [][]int{{0}}}
}

// Two runs' sessions register their jobs; a collective over both is
// completed once each run's process entered, a job's layout and a rank's
// data (asked of the run that registered it) are served to the other;
// the end of a session withdraws its jobs and fails what waits for them.
func TestDaemonJobs(t *testing.T) {
	s, tr := serveDaemon(t)
	a, b := openSession(t, tr, s.Addr().String()), openSession(t, tr, s.Addr().String())

	if r := a.call(node.Name{ID: 2, Op: "jobreg", Name: "ja", Layout: oneNode("n1"), Agents: []string{"h/1"}}); r.Err != "" {
		t.Fatalf("register ja: %s", r.Err)
	}
	if r := b.call(node.Name{ID: 2, Op: "jobreg", Name: "jb", Layout: oneNode("n2"), Agents: []string{"h/2"}}); r.Err != "" {
		t.Fatalf("register jb: %s", r.Err)
	}
	for _, bad := range []node.Name{
		{ID: 3, Op: "jobreg", Name: "ja", Layout: oneNode("n1"), Agents: []string{"h/1"}}, // taken
		{ID: 3, Op: "jobreg", Name: "jc", Agents: []string{"h/1"}},                        // no layout
		{ID: 3, Op: "jobreg", Name: "jc", Layout: oneNode("n1")},                          // no agent
		{ID: 3, Op: "jobreg", Name: "jc", Layout: &agent.Layout{Size: 1 << 40, Hosts: []string{"n"}, Nodes: [][]int{{0}}}, Agents: []string{"h/1"}},
		{ID: 3, Op: "jobs", Name: agent.JobsConnect, Procs: []agent.JobRanks{{Job: "ja"}}},
		{ID: 3, Op: "jobs", Name: agent.JobsConnect, Procs: []agent.JobRanks{{Job: "ja"}, {Job: "jq"}}, Agents: []string{"h/1"}},
		{ID: 3, Op: "joblayout", Procs: []agent.JobRanks{{Job: "jq"}}},
		{ID: 3, Op: "rankdata", Procs: []agent.JobRanks{{Job: "jb"}}},
		{ID: 3, Op: "rankdata", Procs: []agent.JobRanks{{Job: "jq", Ranks: []int{0}}}},
	} {
		if r := b.call(bad); r.Err == "" {
			t.Errorf("%+v accepted: %+v", bad, r)
		}
	}
	// A connect over both jobs: each run's process enters.
	both := []agent.JobRanks{{Job: "jb"}, {Job: "ja"}}
	a.send(node.Name{ID: 4, Op: "jobs", Name: agent.JobsFence, Procs: both, Agents: []string{"h/1"}, Data: []byte("A")})
	a.quiet()
	b.send(node.Name{ID: 5, Op: "jobs", Name: agent.JobsFence, Procs: both, Agents: []string{"h/2"}, Data: []byte("B")})
	if r := a.next(); r.ID != 4 || string(r.Data) != "AB" || r.Err != "" {
		t.Errorf("a's entry answered %+v", r)
	}
	if r := b.next(); r.ID != 5 || string(r.Data) != "AB" || r.Err != "" {
		t.Errorf("b's entry answered %+v", r)
	}
	if r := a.call(node.Name{ID: 6, Op: "joblayout", Procs: []agent.JobRanks{{Job: "jb"}}}); r.Err != "" || r.Layout == nil || r.Layout.Hosts[0] != "n2" {
		t.Errorf("jb's layout: %+v", r)
	}
	// Rank data of jb: asked of b's run, handed to a.
	a.send(node.Name{ID: 7, Op: "rankdata", Procs: []agent.JobRanks{{Job: "jb", Ranks: []int{0}}}})
	q := b.next()
	if q.Op != "rankdata" || len(q.Procs) != 1 || q.Procs[0].Job != "jb" {
		t.Fatalf("b was asked %+v", q)
	}
	a.quiet()
	b.send(node.Name{ID: q.ID, Op: OpAnswer, Data: []byte("card")})
	if r := a.next(); r.ID != 7 || string(r.Data) != "card" || r.NotFound || r.Err != "" {
		t.Errorf("rank data: %+v", r)
	}
	b.send(node.Name{ID: q.ID, Op: OpAnswer, Data: []byte("again")}) // answered already: dropped
	a.quiet()
	// A withdraws only its own jobs.
	if r := a.call(node.Name{ID: 8, Op: "jobunreg", Name: "jb"}); r.Err != "" {
		t.Errorf("unregister: %+v", r)
	}
	if r := a.call(node.Name{ID: 9, Op: "joblayout", Procs: []agent.JobRanks{{Job: "jb"}}}); r.Err != "" {
		t.Errorf("jb withdrawn by a run that does not run it: %+v", r)
	}
	// b's session ends: what waits for its job fails, and the job goes.
	a.send(node.Name{ID: 10, Op: "jobs", Name: agent.JobsConnect, Procs: both, Agents: []string{"h/1"}})
	a.send(node.Name{ID: 11, Op: "rankdata", Procs: []agent.JobRanks{{Job: "jb", Ranks: []int{0}}}})
	if q := b.next(); q.Op != "rankdata" {
		t.Fatalf("b was asked %+v", q)
	}
	b.c.Close()
	got := map[uint64]string{}
	for range 2 {
		r := a.next()
		got[r.ID] = r.Err
	}
	if !strings.Contains(got[10], "job jb ended") || !strings.Contains(got[11], "ended") {
		t.Errorf("after jb's run ended: %v", got)
	}
	if r := a.call(node.Name{ID: 12, Op: "joblayout", Procs: []agent.JobRanks{{Job: "jb"}}}); !strings.Contains(r.Err, "not running on this daemon") {
		t.Errorf("jb after its run ended: %+v", r)
	}
	a.c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for _, id := range []string{"ja", "jb"} {
		_, err := s.dir.Find(id)
		for err == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			_, err = s.dir.Find(id)
		}
		if err == nil {
			t.Errorf("job %s left after every session ended", id)
		}
	}
}

// One run's requests waiting for other runs are bounded: rank-data
// requests its owner does not answer, and entries in collectives across
// jobs that no other process joins, in number and in the data they hold.
// One over is refused at once, naming the quota; the run may ask again
// once one is answered, and the other run is not held up meanwhile.
func TestDaemonJobsBounds(t *testing.T) {
	s, tr := serveDaemon(t)
	a, b := openSession(t, tr, s.Addr().String()), openSession(t, tr, s.Addr().String())
	// jb runs on two nodes of b's run, one rank each... and then some:
	// a collective over rank i of each node waits for both processes.
	const half = maxSessionWaiting + 16
	nodes := [][]int{make([]int, half), make([]int, half)}
	for i := range half {
		nodes[0][i], nodes[1][i] = i, half+i
	}
	jb := &agent.Layout{Size: 2 * half, Hosts: []string{"n1", "n2"}, Nodes: nodes}
	if r := b.call(node.Name{ID: 2, Op: "jobreg", Name: "jb", Layout: jb, Agents: []string{"h/1", "h/2"}}); r.Err != "" {
		t.Fatalf("register jb: %s", r.Err)
	}
	quota := func(what string, r node.Name) {
		t.Helper()
		if !strings.Contains(r.Err, agent.ErrQuota.Error()) || !strings.Contains(r.Err, "waiting for other runs") {
			t.Fatalf("%s over the bound answered %+v", what, r)
		}
	}

	// Rank data: b's run never answers.
	asked := make(chan node.Name, maxSessionWaiting)
	go func() {
		for range maxSessionWaiting {
			asked <- b.next()
		}
	}()
	rank0 := []agent.JobRanks{{Job: "jb", Ranks: []int{0}}}
	for i := range maxSessionWaiting {
		a.send(node.Name{ID: uint64(100 + i), Op: "rankdata", Procs: rank0})
	}
	var first node.Name
	for i := range maxSessionWaiting {
		q := <-asked
		if q.Op != "rankdata" {
			t.Fatalf("b was asked %+v", q)
		}
		if i == 0 {
			first = q
		}
	}
	quota("a rank-data request", a.call(node.Name{ID: 50, Op: "rankdata", Procs: rank0}))
	// b's own requests still go through.
	if r := b.call(node.Name{ID: 3, Op: "joblayout", Procs: []agent.JobRanks{{Job: "jb"}}}); r.Err != "" {
		t.Errorf("b held up by a's requests: %+v", r)
	}
	// One answered: a may ask again.
	b.send(node.Name{ID: first.ID, Op: OpAnswer, Data: []byte("card")})
	if r := a.next(); string(r.Data) != "card" || r.Err != "" {
		t.Fatalf("answer: %+v", r)
	}
	a.send(node.Name{ID: 51, Op: "rankdata", Procs: rank0})
	if q := b.next(); q.Op != "rankdata" {
		t.Fatalf("b was asked %+v", q)
	}
	quota("a rank-data request", a.call(node.Name{ID: 52, Op: "rankdata", Procs: rank0}))
	// a's session ends: b's run is no longer asked to answer it.
	j, err := s.dir.Find("jb")
	if err != nil {
		t.Fatal(err)
	}
	asks := func() int {
		j.Owner.mu.Lock()
		defer j.Owner.mu.Unlock()
		return len(j.Owner.asks)
	}
	if n := asks(); n != maxSessionWaiting {
		t.Fatalf("b's run has %d requests to answer, want %d", n, maxSessionWaiting)
	}
	a.c.Close()
	eventually(t, "b's requests to answer forgotten", func() bool { return asks() == 0 })

	// Collectives across jobs: b's process h/1 enters, h/2 never does.
	c := openSession(t, tr, s.Addr().String())
	pair := func(i int) []agent.JobRanks { return []agent.JobRanks{{Job: "jb", Ranks: []int{i, half + i}}} }
	for i := range maxSessionWaiting {
		c.send(node.Name{ID: uint64(100 + i), Op: "jobs", Name: agent.JobsFence, Procs: pair(i), Agents: []string{"h/1"}})
	}
	quota("a collective entry", c.call(node.Name{ID: 50, Op: "jobs", Name: agent.JobsFence, Procs: pair(maxSessionWaiting), Agents: []string{"h/1"}}))
	if n := s.dir.Pending(); n != maxSessionWaiting {
		t.Fatalf("%d collectives under way, want %d", n, maxSessionWaiting)
	}
	// c's session ends: its entries go, with the data they held.
	c.c.Close()
	eventually(t, "c's entries withdrawn", func() bool { return s.dir.Pending() == 0 })

	// ... and the data they hold.
	d := openSession(t, tr, s.Addr().String())
	big := make([]byte, 11<<20) // base64 in a frame of at most MaxFrame
	n := maxSessionWaitingBytes / len(big)
	for i := range n {
		d.send(node.Name{ID: uint64(100 + i), Op: "jobs", Name: agent.JobsFence, Procs: pair(i), Agents: []string{"h/1"}, Data: big})
	}
	quota("a collective entry's data", d.call(node.Name{ID: 50, Op: "jobs", Name: agent.JobsFence, Procs: pair(n), Agents: []string{"h/1"}, Data: big}))
	// A small one still fits: it waits (no answer) instead of being refused.
	d.send(node.Name{ID: 51, Op: "jobs", Name: agent.JobsFence, Procs: pair(n + 1), Agents: []string{"h/1"}, Data: []byte("small")})
	d.quiet()
	// The other process enters them: they complete, and the room is back.
	for i := range n + 1 {
		if i == n {
			i++ // pair(n) was refused
		}
		b.send(node.Name{ID: uint64(200 + i), Op: "jobs", Name: agent.JobsFence, Procs: pair(i), Agents: []string{"h/2"}})
	}
	for range n + 1 {
		if r := d.next(); r.Err != "" {
			t.Fatalf("entry answered %+v", r)
		}
		b.next()
	}
	d.send(node.Name{ID: 52, Op: "jobs", Name: agent.JobsFence, Procs: pair(n), Agents: []string{"h/1"}, Data: big})
	d.quiet()
}

// eventually waits up to 5 s for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 5 s", what)
		}
	}
}

// Runs share the daemon's name service but withdraw only their own
// names: a run cannot unpublish another's name, and a run that ends does
// not take with it a name another run published after the run's own had
// gone (published once, taken by a lookup).
func TestDaemonNamesOwned(t *testing.T) {
	s, tr := serveDaemon(t)
	a := openSession(t, tr, s.Addr().String())
	b := openSession(t, tr, s.Addr().String())
	c := openSession(t, tr, s.Addr().String())
	if r := a.call(node.Name{ID: 2, Op: "publish", Name: "svc", Port: "from-a"}); r.Err != "" || r.NotFound {
		t.Fatalf("a publishes svc: %+v", r)
	}
	if r := b.call(node.Name{ID: 2, Op: "unpublish", Name: "svc"}); !r.NotFound {
		t.Errorf("b unpublishes a's svc: %+v, want not found", r)
	}
	if r := b.call(node.Name{ID: 3, Op: "lookup", Name: "svc"}); r.Port != "from-a" {
		t.Errorf("lookup of svc after b's unpublish: %+v, want a's port", r)
	}
	if r := a.call(node.Name{ID: 4, Op: "publish", Name: "a-only", Port: "from-a"}); r.Err != "" {
		t.Fatalf("a publishes a-only: %+v", r)
	}
	if r := a.call(node.Name{ID: 3, Op: "publish", Name: "once", Port: "from-a", Once: true}); r.Err != "" {
		t.Fatalf("a publishes once: %+v", r)
	}
	if r := b.call(node.Name{ID: 4, Op: "lookup", Name: "once"}); r.Port != "from-a" {
		t.Fatalf("b's lookup of once: %+v, want a's port", r)
	}
	if r := c.call(node.Name{ID: 2, Op: "publish", Name: "once", Port: "from-c"}); r.Err != "" || r.NotFound {
		t.Fatalf("c publishes once after a's went: %+v", r)
	}
	a.c.Close() // a's run ends: its names are withdrawn
	eventually(t, "a's names withdrawn", func() bool {
		return b.call(node.Name{ID: 5, Op: "lookup", Name: "a-only"}).NotFound
	})
	if r := b.call(node.Name{ID: 7, Op: "lookup", Name: "svc"}); !r.NotFound {
		t.Errorf("lookup of a's svc after a's run ended: %+v, want not found", r)
	}
	if r := b.call(node.Name{ID: 6, Op: "lookup", Name: "once"}); r.Port != "from-c" {
		t.Errorf("lookup of c's once after a's run ended: %+v, want c's port", r)
	}
	if r := c.call(node.Name{ID: 3, Op: "unpublish", Name: "once"}); r.Err != "" || r.NotFound {
		t.Errorf("c unpublishes its once: %+v", r)
	}
}

// A run that publishes names once, each taken by a lookup of another
// run, is never over its quota of names: those it published and that
// are gone do not count.
func TestDaemonOnceNamesQuota(t *testing.T) {
	s, tr := serveDaemon(t)
	a := openSession(t, tr, s.Addr().String())
	b := openSession(t, tr, s.Addr().String())
	for i := range agent.MaxNamesPerJob + 10 {
		name := fmt.Sprintf("once-%d", i)
		if r := a.call(node.Name{ID: uint64(2 + i), Op: "publish", Name: name, Port: "p", Once: true}); r.Err != "" || r.NotFound {
			t.Fatalf("publish %d of a name published once, each taken: %+v", i, r)
		}
		if r := b.call(node.Name{ID: uint64(2 + i), Op: "lookup", Name: name}); r.Port != "p" {
			t.Fatalf("lookup %d: %+v", i, r)
		}
	}
}
