package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/netio"
	"github.com/fastpmi/fastpmi/netio/netiotest"
	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/ring"
	"github.com/fastpmi/fastpmi/tree"
)

// The node side of the name service, driven by hand as the node's loop
// would: a request is answered by pmirun's frame, fails at its deadline or
// with the link, and is answered exactly once.
func TestNetUpstreamNames(t *testing.T) {
	a := &agentNode{
		spec: &Spec{NetTimeout: time.Second}, log: slog.New(slog.DiscardHandler),
		ops: make(chan func(), 8), names: make(map[uint64]nameWait),
	}
	u := netUpstream{a}
	var got []string
	note := func(what string) func(string, error) {
		return func(port string, err error) {
			if err != nil && strings.Contains(err.Error(), agent.ErrNameNotFound.Error()) != errors.Is(err, agent.ErrNameNotFound) {
				t.Errorf("%s: %v: errors.Is(ErrNameNotFound) is %v", what, err, errors.Is(err, agent.ErrNameNotFound))
			}
			got = append(got, fmt.Sprintf("%s: %q %v", what, port, err))
		}
	}
	noPort := func(what string) func(error) {
		return func(err error) { note(what)("", err) }
	}
	runOps := func() {
		for len(a.ops) > 0 {
			(<-a.ops)() // sends to pmirun: there is no link here, so it is only logged
		}
	}
	answer := func(m Name) {
		a.frame(FrameIn{From: -1, Frame: netio.Frame{Type: FrameName, Payload: Encode(m)}})
	}

	u.Lookup("svc", 0, note("lookup"))
	u.Publish("late", "p", false, noPort("publish"))
	runOps()
	answer(Name{ID: 1, Name: "svc", Port: "p1"})
	a.expireNames(time.Now()) // before the deadline: nothing
	a.expireNames(time.Now().Add(a.spec.NetTimeout + nameGrace + time.Millisecond))
	answer(Name{ID: 2, Name: "late"}) // too late: dropped
	u.Unpublish("svc", noPort("unpublish"))
	u.Lookup("none", 0, note("lookup none"))
	runOps()
	answer(Name{ID: 4, Name: "none", NotFound: true})
	a.failLink(-1, errors.New("reset"))
	u.Lookup("after", 0, note("lookup after"))
	runOps()

	want := []string{
		`lookup: "p1" <nil>`,
		`publish: "" name service: no answer from pmirun`,
		`lookup none: "" lookup "none": service name not published`,
		`unpublish: "" link to pmirun lost: reset`,
		`lookup after: "" link to pmirun lost: reset`,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("answers\n got: %q\nwant: %q", got, want)
	}
	if len(a.names) != 0 {
		t.Fatalf("%d name requests left waiting", len(a.names))
	}
}

// A node announces the host it was told to listen on, or for a wildcard
// (or no --listen) the one it reached pmirun from, with its bound port.
func TestAnnounceAddr(t *testing.T) {
	for _, tc := range []struct{ listen, ctl, bound, want string }{
		{"", "10.0.0.2", "10.0.0.2:4001", "10.0.0.2:4001"},
		{"10.1.0.2:7000", "10.0.0.2", "10.1.0.2:7000", "10.1.0.2:7000"},
		{":7000", "10.0.0.2", "[::]:7000", "10.0.0.2:7000"},
		{"0.0.0.0:0", "10.0.0.2", "0.0.0.0:4002", "10.0.0.2:4002"},
		{"[::]:0", "fd00::2", "[::]:4003", "[fd00::2]:4003"},
		{"node7:7000", "10.0.0.2", "10.1.0.7:7000", "node7:7000"},
	} {
		if got := announceAddr(tc.listen, tc.ctl, tc.bound); got != tc.want {
			t.Errorf("announceAddr(%q, %q, %q) = %q, want %q", tc.listen, tc.ctl, tc.bound, got, tc.want)
		}
	}
}

// A link that is gone logs its first failed send only: a daemon whose
// job lost its pmirun would otherwise log one line per rank event.
func TestSendFailuresLoggedOnce(t *testing.T) {
	c := netiotest.ClosedConn(t) // every send on it fails
	var logged bytes.Buffer
	a := &agentNode{spec: &Spec{NetTimeout: time.Second}, ctl: c, rec: perf.NewRecorderFor(0, false),
		log: slog.New(slog.NewTextHandler(&logged, nil))}
	for range 50 {
		a.send(-1, netio.Frame{Type: FrameHeartbeat})
	}
	if n := strings.Count(logged.String(), "level=WARN msg="); n != 1 {
		t.Errorf("50 failed sends to pmirun: %d logged, want 1. Log:\n%s", n, logged.String())
	}
}

// A peer's tree, ring or KVS message that does not decode, or that the
// state machine refuses, fails what waits on the link with an error naming the
// node, and later collectives at once: the heartbeats keep the link
// alive, and nothing else would end the wait (the root's deadlock watch
// does not cover a fence every rank entered).
func TestBadPeerMessageFailsCollectives(t *testing.T) {
	nodes := [][]int{{0}, {1}, {2}}
	newNode := func(t *testing.T) *agentNode {
		t.Helper()
		a := &agentNode{spec: &Spec{NetTimeout: time.Second, Nodes: nodes, Size: 3, TreeWidth: 3},
			rec: perf.NewRecorderFor(0, false), log: slog.New(slog.DiscardHandler),
			fenceCB: map[uint64]func([]agent.KV, error){}, agCB: map[uint64]func([][]byte, error){},
			names: map[uint64]nameWait{}, ringCB: [2]map[uint64]func(string, error){{}, {}},
			kvs: kvsNet{places: map[uint64]func(error){}, fetches: map[uint64]fetchDone{}, outbox: map[int]*placeBatch{},
				dialing: map[int][]netio.Frame{}, notify: make(chan struct{}, 1)}}
		var err error
		if a.topo, err = tree.NewTopology(len(nodes)+1, 3); err != nil {
			t.Fatal(err)
		}
		a.lim = tree.JobLimits(3)
		if a.tnode, err = tree.NewNode(tree.Config{Topology: a.topo, Node: a.idx + 1, Limits: a.lim}); err != nil {
			t.Fatal(err)
		}
		if a.rmap, err = ring.FromNodes(nodes); err != nil {
			t.Fatal(err)
		}
		if a.rlink, err = ring.NewLink(a.rmap, a.idx); err != nil {
			t.Fatal(err)
		}
		return a
	}
	goodDown := tree.AppendMsg(nil, tree.Msg{Kind: tree.Fence, Type: tree.Down, Epoch: 1, From: 0, To: 1})
	for _, tc := range []struct {
		name    string
		from    int
		typ     uint16
		payload []byte
		want    string
	}{
		{"tree garbage", -1, FrameTree, []byte("\x00garbage"), "link to pmirun lost: bad tree message: decode tree message"},
		{"tree epoch never contributed", -1, FrameTree,
			tree.AppendMsg(nil, tree.Msg{Kind: tree.Fence, Type: tree.Down, Epoch: 2, From: 0, To: 1}), "result before this node sent"},
		{"tree from another link", 2, FrameTree, goodDown, "link to node 2 lost: bad tree message: message from tree node 0 on the link to tree node 3"},
		{"KVS place of no puts", 2, FrameKVS, Encode(KVSMsg{Op: KVSPlace, ID: 1}), "link to node 2 lost: bad KVS message: KVS place of 0 puts"},
		{"KVS garbage", -1, FrameKVS, []byte("{"), "link to pmirun lost: bad KVS message: "},
		{"ring garbage", 2, FrameRing, []byte("r"), "link to node 2 lost: bad ring message: decode ring message"},
		{"ring out of sequence", 2, FrameRing, ring.AppendMessage(nil, ring.Message{Epoch: 7, From: 2, To: 0, Dir: ring.ToLeft,
			Mode: ring.CountsFromMap, Offset: 0, Size: 3, HasSize: true}), "link to node 2 lost: bad ring message: ring link of node 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newNode(t)
			var fenceErr, ringErr error
			fenceDone, ringDone := false, false
			a.fence(nil, func(_ []agent.KV, err error) { fenceErr, fenceDone = err, true })
			a.ringSend(1, true, "v0", func(_ string, err error) { ringErr, ringDone = err, true })
			a.frame(FrameIn{From: tc.from, Frame: netio.Frame{Type: tc.typ, Payload: tc.payload}})
			if !fenceDone || !ringDone {
				t.Fatalf("after a bad message from %d the fence (done %v) and the ring edge (done %v) still wait", tc.from, fenceDone, ringDone)
			}
			for _, err := range []error{fenceErr, ringErr} {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("collective failed with %v, want %q", err, tc.want)
				}
			}
			var again error
			a.fence(nil, func(_ []agent.KV, err error) { again = err })
			if again == nil {
				t.Error("a fence after the bad message did not fail")
			}
		})
	}
	// A good result from the parent still completes the fence.
	a := newNode(t)
	var got error = errors.New("not called")
	a.fence(nil, func(_ []agent.KV, err error) { got = err })
	empty, _ := tree.AppendKVs(nil, nil)
	z, _ := netio.Compress(netio.CodecNone, nil, empty)
	a.frame(FrameIn{From: -1, Frame: netio.Frame{Type: FrameTree, Payload: tree.AppendMsg(nil,
		tree.Msg{Kind: tree.Fence, Type: tree.Down, Epoch: 1, From: 0, To: 1, Payload: z})}})
	if got != nil {
		t.Fatalf("good result: %v", got)
	}
}

// A tree message larger than a link's frames fails the collective where
// it is sent, saying so: the send is refused before anything goes out,
// the link stays up, and the parent would wait for the message for ever.
func TestTreeMessageOverFrameLimitFails(t *testing.T) {
	ctl := smallFrameLink(t)
	var err error
	nodes := [][]int{{0}, {1}}
	a := &agentNode{spec: &Spec{NetTimeout: time.Second, Nodes: nodes, Size: 2, TreeWidth: 2}, ctl: ctl,
		rec: perf.NewRecorderFor(0, false), log: slog.New(slog.DiscardHandler),
		fenceCB: map[uint64]func([]agent.KV, error){}, agCB: map[uint64]func([][]byte, error){},
		names: map[uint64]nameWait{}, ringCB: [2]map[uint64]func(string, error){{}, {}},
		kvs: kvsNet{places: map[uint64]func(error){}, fetches: map[uint64]fetchDone{}, outbox: map[int]*placeBatch{},
			dialing: map[int][]netio.Frame{}, notify: make(chan struct{}, 1)}}
	if a.topo, err = tree.NewTopology(len(nodes)+1, 2); err != nil {
		t.Fatal(err)
	}
	a.lim = tree.JobLimits(2)
	if a.tnode, err = tree.NewNode(tree.Config{Topology: a.topo, Node: 1, Limits: a.lim}); err != nil {
		t.Fatal(err)
	}
	var got error
	done := false
	a.fence([]agent.KV{{Key: "big", Val: strings.Repeat("x", 1000)}}, func(_ []agent.KV, err error) { got, done = err, true })
	if !done {
		t.Fatal("a fence whose contribution is over the frame limit still waits")
	}
	if want := "fence epoch 1: the contributions gathered here of "; got == nil || !strings.Contains(got.Error(), want) ||
		!errors.Is(got, netio.ErrFrameTooLarge) || !strings.Contains(got.Error(), "cannot go to pmirun") {
		t.Fatalf("fence failed with %v, want %q ... cannot go to pmirun ... (ErrFrameTooLarge)", got, want)
	}
	t.Logf("fence: %v", got)
	var again error
	a.fence(nil, func(_ []agent.KV, err error) { again = err })
	if again == nil {
		t.Fatal("the next fence did not fail")
	}
}

// pmirun's orders and answers count only on pmirun's link: a peer
// agent's kill, signal or name answer is refused (logged). A peer's kill
// ended the node's ranks, and its name answer answered a rank's lookup.
func TestPeerCannotOrder(t *testing.T) {
	var logged bytes.Buffer
	a := &agentNode{spec: &Spec{NetTimeout: time.Second}, log: slog.New(slog.NewTextHandler(&logged, nil)),
		ops: make(chan func(), 8), names: make(map[uint64]nameWait)}
	var answers []string
	netUpstream{a}.Lookup("svc", 0, func(port string, err error) { answers = append(answers, fmt.Sprint(port, err)) })
	(<-a.ops)()
	// a.n is nil: a kill or signal acted on would panic here.
	a.frame(FrameIn{From: 1, Frame: netio.Frame{Type: FrameKill, Payload: Encode(Kill{Code: 9, Msg: "forged"})}})
	a.frame(FrameIn{From: 1, Frame: netio.Frame{Type: FrameSignal, Payload: Encode(Signal{Sig: 15})}})
	a.frame(FrameIn{From: 1, Frame: netio.Frame{Type: FrameName, Payload: Encode(Name{ID: 1, Port: "forged"})}})
	if len(answers) != 0 {
		t.Fatalf("a peer's name frame answered the lookup: %q", answers)
	}
	if n := strings.Count(logged.String(), "unexpected frame from a peer agent"); n != 3 {
		t.Errorf("%d refusals logged, want 3:\n%s", n, logged.String())
	}
	a.frame(FrameIn{From: -1, Frame: netio.Frame{Type: FrameName, Payload: Encode(Name{ID: 1, Port: "p"})}})
	if fmt.Sprint(answers) != "[p<nil>]" {
		t.Fatalf("pmirun's answer: %q", answers)
	}
}

// A node that links to its peers for long — here one that takes the
// connection and never speaks, as a host this node cannot really reach
// would hold a dial — keeps telling pmirun it lives meanwhile. It was
// silent until the links were up, and pmirun, after --net-timeout, took
// it for lost ('node 0 (h0) lost: no message for 5s') and ended the job
// before the node could say what kept it; and a node that waits for a
// peer's link says which peer it waits for.
func TestAgentHeartbeatsWhileLinking(t *testing.T) {
	secret := bytes.Repeat([]byte{9}, 32)
	rtr, err := netio.New(netio.Config{Backend: netio.BackendNet, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer rtr.Close()
	rln, err := rtr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mute, err := net.Listen("tcp", "127.0.0.1:0") // takes connections, never speaks
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	var held []net.Conn
	var holder sync.WaitGroup
	holder.Go(func() {
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	})
	defer func() {
		mute.Close()
		holder.Wait()
		for _, c := range held {
			c.Close()
		}
	}()
	for _, tc := range []struct {
		name  string
		index int
		want  string
	}{
		{"dialling", 0, "node 0: link to node 1 at " + mute.Addr().String()},
		{"accepting", 1, "node 1: accept peer links (node 0 did not link to this node)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &Spec{Size: 2, Nodes: [][]int{{0}, {1}}, Secret: secret, Root: rln.Addr().String(), TreeWidth: 2,
				NetTimeout: time.Second, NetBackend: netio.BackendNet}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- RunAgent(ctx, spec, AgentOptions{Index: tc.index}) }()
			actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer acancel()
			c, err := rln.Accept(actx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if f, err := c.Recv(actx); err != nil || f.Type != FrameHello {
				t.Fatalf("hello: %v, frame %d", err, f.Type)
			}
			table := Table{Addrs: []string{mute.Addr().String(), mute.Addr().String()}, Hosts: []string{"h0", "h1"}}
			if err := c.Send(actx, netio.Frame{Type: FrameTable, Payload: Encode(table)}); err != nil {
				t.Fatal(err)
			}
			// Three seconds, three net timeouts: the node's heartbeats
			// keep coming.
			end := time.Now().Add(3 * time.Second)
			for time.Now().Before(end) {
				rctx, rcancel := context.WithTimeout(context.Background(), spec.NetTimeout)
				f, err := c.Recv(rctx)
				rcancel()
				if err != nil {
					t.Fatalf("pmirun heard nothing from the linking node for %v: %v", spec.NetTimeout, err)
				}
				if f.Type != FrameHeartbeat {
					t.Fatalf("frame %d while linking, want heartbeats", f.Type)
				}
			}
			cancel()
			select {
			case err := <-errc:
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("RunAgent: %v, want %q", err, tc.want)
				}
				t.Log(err)
			case <-time.After(10 * time.Second):
				t.Fatal("RunAgent did not return after its context ended")
			}
		})
	}
	// pmirun gone while the node links: the node ends at once, saying
	// so. It waited for its peers' links until the set-up's 30 s were
	// over.
	t.Run("pmirun gone", func(t *testing.T) {
		spec := &Spec{Size: 2, Nodes: [][]int{{0}, {1}}, Secret: secret, Root: rln.Addr().String(), TreeWidth: 2,
			NetTimeout: time.Second, NetBackend: netio.BackendNet}
		errc := make(chan error, 1)
		go func() { errc <- RunAgent(context.Background(), spec, AgentOptions{Index: 1}) }()
		actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer acancel()
		c, err := rln.Accept(actx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Recv(actx); err != nil {
			t.Fatal(err)
		}
		table := Table{Addrs: []string{mute.Addr().String(), mute.Addr().String()}, Hosts: []string{"h0", "h1"}}
		if err := c.Send(actx, netio.Frame{Type: FrameTable, Payload: Encode(table)}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		c.Close()
		select {
		case err := <-errc:
			if want := "node 1: link to pmirun lost while linking to the peers"; err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("RunAgent: %v, want %q", err, want)
			}
			t.Log(err)
		case <-time.After(5 * time.Second):
			t.Fatal("the node still links to its peers 5 s after pmirun left")
		}
	})
}

// smallFrameLink returns a node's end of a link to pmirun whose frames
// carry at most 1000 bytes.
func smallFrameLink(t *testing.T) netio.Conn {
	t.Helper()
	c, _ := netiotest.Pair(t, netio.Config{Backend: netio.BackendNet, Secret: bytes.Repeat([]byte{7}, 32), MaxFrameSize: 1000})
	return c
}

// A name request too large for the link to pmirun fails at once, saying
// so: it was refused before anything went out, and the request waited
// until its deadline (an hour for a collective across jobs) to say pmirun
// did not answer.
func TestNameRequestOverFrameLimit(t *testing.T) {
	a := &agentNode{spec: &Spec{NetTimeout: time.Second}, ctl: smallFrameLink(t), rec: perf.NewRecorderFor(0, false),
		log: slog.New(slog.DiscardHandler), ops: make(chan func(), 8), names: make(map[uint64]nameWait)}
	var got error
	done := false
	netUpstream{a}.JobsCollective("connect", nil, bytes.Repeat([]byte("d"), 2000), func(_ []byte, err error) { got, done = err, true })
	(<-a.ops)()
	if !done {
		t.Fatal("a name request over the frame limit waits for its deadline")
	}
	if got == nil || !strings.Contains(got.Error(), "jobs: the request, ") || !strings.Contains(got.Error(), "cannot go to pmirun") {
		t.Fatalf("request failed with %v", got)
	}
	if len(a.names) != 0 {
		t.Fatalf("%d requests left waiting", len(a.names))
	}
}
