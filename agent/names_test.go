package agent

import (
	"fmt"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/shm"
)

// heldNames is an Upstream whose name service answers only when the test
// says so, as pmirun does in a multi-node job: every name call is handed to
// the test on calls, and its done is called by the test, from the test's
// goroutines. The collectives are Local's.
type heldNames struct {
	*Local
	calls chan heldCall
}

// heldCall is one name-service call the agent made.
type heldCall struct {
	op, name, port string
	done           func(port string, err error)
}

func newHeldNames() heldNames {
	return heldNames{Local: NewLocal(), calls: make(chan heldCall, 16)}
}

func (h heldNames) Publish(name, port string, once bool, done func(error)) {
	h.calls <- heldCall{op: "publish", name: name, port: port, done: func(_ string, err error) { done(err) }}
}

func (h heldNames) Unpublish(name string, done func(error)) {
	h.calls <- heldCall{op: "unpublish", name: name, done: func(_ string, err error) { done(err) }}
}

func (h heldNames) Lookup(name string, wait time.Duration, done func(string, error)) {
	h.calls <- heldCall{op: "lookup", name: name, done: done}
}

// next returns the agent's next name call, which must be op of name.
func (h heldNames) next(t *testing.T, op, name string) heldCall {
	t.Helper()
	select {
	case c := <-h.calls:
		if c.op != op || c.name != name {
			t.Fatalf("name call %s %q, want %s %q", c.op, c.name, op, name)
		}
		return c
	case <-time.After(5 * time.Second):
		t.Fatalf("no %s %q call reached the Upstream", op, name)
		panic("unreachable")
	}
}

// release answers c from another goroutine.
func (c heldCall) release(port string, err error) { go c.done(port, err) }

// shmRank is a local rank on shared memory, driven by the test.
type shmRank struct {
	t   *testing.T
	r   *shm.Rank
	seq uint32
}

// attachShm gives a the segment seg and returns its local rank i.
func attachShm(t *testing.T, a *Agent, seg *shm.Segment, i int) *shmRank {
	t.Helper()
	if err := a.AttachSegment(seg); err != nil {
		seg.Close()
		t.Fatal(err)
	}
	return &shmRank{t: t, r: seg.Rank(i)}
}

// heapSegment is a segment in heap memory, so -race sees the agent's and
// the test's accesses to it.
func heapSegment(t *testing.T, local, world int) *shm.Segment {
	t.Helper()
	seg, err := shm.NewHeap(shm.Params{LocalRanks: local, WorldSize: world, FirstEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	seg.SetWaiter(shm.InProcessWaiter())
	return seg
}

// push sends a request and returns its sequence number.
func (s *shmRank) push(op uint16, payload []byte) uint32 {
	s.t.Helper()
	s.seq++
	if err := s.r.Requests().Push(shm.Header{Op: op, Seq: s.seq}, payload); err != nil {
		s.t.Fatalf("push request op %d: %v", op, err)
	}
	return s.seq
}

// expect reads the next response, which must answer request seq of op
// with status and payload.
func (s *shmRank) expect(op uint16, seq uint32, status uint16, payload string) {
	s.t.Helper()
	c := s.r.Responses()
	if err := c.Wait(5 * time.Second); err != nil {
		s.t.Fatalf("wait for the response to request %d (op %d): %v", seq, op, err)
	}
	m, err := c.Peek()
	if err != nil {
		s.t.Fatal(err)
	}
	got := fmt.Sprintf("op=%d seq=%d status=%d payload=%q", m.Op, m.Seq, m.Flags, m.Payload)
	c.Release()
	if want := fmt.Sprintf("op=%d seq=%d status=%d payload=%q", op, seq, status, payload); got != want {
		s.t.Fatalf("shm response\n got: %s\nwant: %s", got, want)
	}
}

// noResponse checks that no response arrives for d.
func (s *shmRank) noResponse(d time.Duration) {
	s.t.Helper()
	if s.r.Responses().Wait(d) == nil {
		s.t.Fatal("unexpected early shm response")
	}
}

// While the Upstream sits on name requests of PMI-1 and PMI-2 ranks, the
// agent serves every other request of every rank, a world fence included,
// and answers each name request when the Upstream does, with the same
// bytes as an Upstream that answers at once.
func TestNameServiceWaitDoesNotStallText(t *testing.T) {
	up := newHeldNames()
	_, cs, _ := newJob(t, 3, func(c *Config) { c.Upstream = up })
	for _, i := range []int{0, 2} {
		cs[i].v1("cmd=init pmi_version=2 pmi_subversion=0")
		cs[i].read()
		cs[i].v2(fmt.Sprintf("cmd=fullinit;pmirank=%d;", i))
		cs[i].read()
	}
	cs[1].v1("cmd=init pmi_version=1 pmi_subversion=1")
	cs[1].read()

	cs[0].v2("cmd=name-lookup;name=svc;thrid=1;")
	lookup := up.next(t, "lookup", "svc")
	cs[0].noReply(30 * time.Millisecond)
	cs[1].v1("cmd=put kvsname=job-1 key=k1 value=v1")
	cs[1].expect("cmd=put_result rc=0")
	cs[2].v2("cmd=kvs-put;key=k2;value=v2;")
	cs[2].expect("cmd=kvs-put-response;rc=0;")
	// A PMI-2 rank may go on while its lookup waits (thrid).
	cs[0].v2("cmd=kvs-put;key=k0;value=v0;thrid=2;")
	cs[0].expect("cmd=kvs-put-response;rc=0;thrid=2;")
	cs[0].v2("cmd=kvs-fence;thrid=3;")
	cs[1].v1("cmd=barrier_in")
	cs[2].v2("cmd=kvs-fence;")
	cs[0].expect("cmd=kvs-fence-response;rc=0;thrid=3;")
	cs[1].expect("cmd=barrier_out rc=0")
	cs[2].expect("cmd=kvs-fence-response;rc=0;")
	cs[1].v1("cmd=get kvsname=job-1 key=k0")
	cs[1].expect("cmd=get_result rc=0 value=v0")

	cs[1].v1("cmd=publish_name service=svc port=p1")
	publish := up.next(t, "publish", "svc")
	if publish.port != "p1" {
		t.Fatalf("publish port %q, want p1", publish.port)
	}
	cs[1].noReply(30 * time.Millisecond)
	cs[2].v2("cmd=kvs-get;key=k1;")
	cs[2].expect("cmd=kvs-get-response;rc=0;found=TRUE;value=v1;")

	publish.release("", nil)
	cs[1].expect("cmd=publish_result rc=0")
	cs[0].noReply(30 * time.Millisecond)
	lookup.release("p1", nil)
	cs[0].expect("cmd=name-lookup-response;rc=0;thrid=1;value=p1;port=p1;")

	cs[2].v2("cmd=name-unpublish;name=nope;")
	up.next(t, "unpublish", "nope").release("", fmt.Errorf("unpublish %q: %w", "nope", ErrNameNotFound))
	cs[2].expect(`cmd=name-unpublish-response;rc=-1;errmsg=unpublish "nope": service name not published;`)
	cs[1].v1("cmd=lookup_name service=svc")
	up.next(t, "lookup", "svc").release("p1", nil)
	cs[1].expect("cmd=lookup_result rc=0 port=p1")
}

// The same over shared memory: a rank's name request waiting for the
// Upstream stalls neither its own later requests, nor the agent's
// shared-memory loop, nor the text ranks.
func TestNameServiceWaitDoesNotStallShm(t *testing.T) {
	up := newHeldNames()
	a, cs, _ := newJob(t, 2, func(c *Config) { c.Upstream = up })
	r0 := attachShm(t, a, heapSegment(t, 2, 2), 0)
	cs[1].v1("cmd=init pmi_version=2 pmi_subversion=0")
	cs[1].read()
	cs[1].v2("cmd=fullinit;pmirank=1;")
	cs[1].read()

	pub := r0.push(shm.OpPublish, shm.AppendPair(nil, "svc", "p0"))
	publish := up.next(t, "publish", "svc")
	if publish.port != "p0" {
		t.Fatalf("publish port %q, want p0", publish.port)
	}
	r0.noResponse(30 * time.Millisecond)
	get := r0.push(shm.OpGet, shm.AppendInt32(nil, -1, "PMI_process_mapping"))
	r0.expect(shm.OpGet, get, shm.StatusOK, "(vector,(0,1,2))")
	cs[1].v2("cmd=kvs-put;key=k;value=v;fastpmi-hint=sparse;")
	cs[1].expect("cmd=kvs-put-response;rc=0;")
	cs[1].v2("cmd=name-lookup;name=svc;")
	lookup := up.next(t, "lookup", "svc")
	get = r0.push(shm.OpGet, shm.AppendInt32(nil, 1, "k"))
	r0.expect(shm.OpGet, get, shm.StatusOK, "v")
	look := r0.push(shm.OpLookup, []byte("gone"))
	shmLookup := up.next(t, "lookup", "gone")

	publish.release("", nil)
	r0.expect(shm.OpPublish, pub, shm.StatusOK, "")
	lookup.release("p0", nil)
	cs[1].expect("cmd=name-lookup-response;rc=0;value=p0;port=p0;")
	shmLookup.release("", fmt.Errorf("lookup %q: %w", "gone", ErrNameNotFound))
	r0.expect(shm.OpLookup, look, shm.StatusNotFound, "")

	unpub := r0.push(shm.OpUnpublish, []byte("svc"))
	up.next(t, "unpublish", "svc").release("", fmt.Errorf("name service: no answer from pmirun"))
	r0.expect(shm.OpUnpublish, unpub, shm.StatusError, "name service: no answer from pmirun")
}

// A rank that goes away while its name request waits does not disturb
// the agent: the late answer goes nowhere, and the other ranks are served.
func TestNameRequestOfDepartedRank(t *testing.T) {
	up := newHeldNames()
	a, cs, ev := newJob(t, 3, func(c *Config) { c.Upstream = up })
	r2 := attachShm(t, a, heapSegment(t, 3, 3), 2)
	initV2(t, cs[:2])
	cs[0].v2("cmd=name-lookup;name=svc;")
	lookup := up.next(t, "lookup", "svc")
	r2.push(shm.OpPublish, shm.AppendPair(nil, "svc2", "p2"))
	publish := up.next(t, "publish", "svc2")

	cs[0].nc.Close()
	ev.waitDisconnects(t, 1, 5*time.Second)
	a.RankGone(0, "exited with code 0")
	a.RankGone(2, "exited with code 0")
	lookup.done("p", nil)
	publish.done("", nil)
	cs[1].v2("cmd=kvs-put;key=k;value=v;fastpmi-hint=sparse;")
	cs[1].expect("cmd=kvs-put-response;rc=0;")
	cs[1].v2("cmd=kvs-get;key=k;")
	cs[1].expect("cmd=kvs-get-response;rc=0;found=TRUE;value=v;")
	closeWithin(t, a, 5*time.Second)
}

// Close answers the name requests still waiting for the Upstream, does not
// wait for the Upstream, and drops the Upstream's answers that come after
// it. The segment is real shared memory, unmapped by Close, so an answer
// pushed after Close would fault.
func TestCloseWithPendingNameRequests(t *testing.T) {
	up := newHeldNames()
	a, cs, _ := newJob(t, 2, func(c *Config) { c.Upstream = up })
	seg, err := shm.Create(shm.Params{LocalRanks: 2, WorldSize: 2, FirstEpoch: 1})
	if err != nil {
		t.Skipf("no shared memory: %v", err)
	}
	r0 := attachShm(t, a, seg, 0)
	initV2(t, cs[1:])
	r0.push(shm.OpLookup, []byte("svc"))
	shmLookup := up.next(t, "lookup", "svc")
	cs[1].v2("cmd=name-publish;name=svc;port=p;thrid=4;")
	publish := up.next(t, "publish", "svc")

	closeWithin(t, a, 5*time.Second)
	cs[1].expect("cmd=name-publish-response;rc=-1;thrid=4;errmsg=agent shutting down;")
	shmLookup.done("p", nil)
	publish.done("", nil)
}

// closeWithin closes a, failing the test if that takes longer than d.
func closeWithin(t *testing.T, a *Agent, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		a.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("Close did not return within %v", d)
	}
}
