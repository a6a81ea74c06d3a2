package launch

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/netio"
	"github.com/fastpmi/fastpmi/netio/netiotest"
	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/tree"
)

// A node whose link is gone logs the first failed send only: pmirun
// sends a lost node a heartbeat four times a second while it waits for
// the rest of the job (or for its reader to take its output).
func TestRootSendFailuresLoggedOnce(t *testing.T) {
	c := netiotest.ClosedConn(t) // every send on it fails
	var logged bytes.Buffer
	r := &rootNode{cfg: Config{Logger: slog.New(slog.NewTextHandler(&logged, nil)), NetTimeout: time.Second},
		conns: []netio.Conn{c}}
	for range 20 {
		r.send(0, netio.Frame{Type: 1})
	}
	if n := strings.Count(logged.String(), "level=WARN"); n != 1 {
		t.Errorf("20 failed sends to node 0: %d logged, want 1. Log:\n%s", n, logged.String())
	}
}

// The answer to a spawn that comes after the spawner's job has ended
// (its rank aborted meanwhile) finds the job's links closed by
// closeLinks: nothing to log. pmirun printed 'level=WARN msg="send to
// agent ..." err="use of closed connection ..."' after the abort.
func TestRootSendAfterCloseNotLogged(t *testing.T) {
	var logged bytes.Buffer
	r := &rootNode{cfg: Config{Logger: slog.New(slog.NewTextHandler(&logged, nil)), NetTimeout: time.Second},
		conns: []netio.Conn{netiotest.ClosedConn(t)}}
	r.closeLinks()
	r.send(0, netio.Frame{Type: 1})
	if logged.Len() > 0 {
		t.Errorf("a send on the links closeLinks closed was logged:\n%s", logged.String())
	}
}

// An agent that reports why it ends (its rank could not start) and exits
// fails the job with its reason, whichever of its exit and its last
// frames the root learns of first: the frames it sent before it exited
// come before its link's end. The exit, when first, was said instead
// ('node 1 (h1) lost: agent exit status 1') and the reason came after it
// as "also".
func TestAgentExitAfterItsReason(t *testing.T) {
	var stderr bytes.Buffer
	run := newMultiRun(Config{Stderr: &stderr, Stdout: io.Discard}, []string{"h0", "h1"}, nil, 0)
	r := &rootNode{run: run, spec: &node.Spec{JobID: "j"}, hosts: []string{"h0", "h1"}, at: []int{0, 1},
		conns: []netio.Conn{nil, netiotest.ClosedConn(t)}, in: make(chan node.FrameIn, 4),
		done: make([]bool, 2), gone: make([]bool, 2), lost: make([]bool, 2), ended: make([]bool, 2),
		lastRx: make([]time.Time, 2), rec: perf.NewRecorder()}
	failed := agent.Event{Kind: agent.EventStartFailed, Rank: 1, Code: 2, Msg: "create shared memory: file too large"}
	r.in <- node.FrameIn{From: 1, Frame: netio.Frame{Type: node.FrameEvent, Payload: node.Encode(failed)}}
	r.in <- node.FrameIn{From: 1, Err: io.EOF}
	r.agentExited(bootExit{1, errors.New("exit status 1")}) // the exit taken first
	e := run.jobError()
	if e == nil || !strings.Contains(e.Msg, "file too large") || strings.Contains(e.Msg, "lost") {
		t.Fatalf("job failure %+v, want the agent's reason, not its loss", e)
	}
	if !r.ended[1] || !r.gone[1] {
		t.Errorf("node 1: link ended %v, process gone %v; want both", r.ended[1], r.gone[1])
	}
}

// A broadcast larger than a link's frames fails the job, naming the node
// and the limit: the send is refused before anything goes out, the link
// stays up, and the node would wait for the result for ever.
func TestRootBroadcastOverFrameLimitFails(t *testing.T) {
	c, _ := smallFramePair(t)
	topo, err := tree.NewTopology(2, 2)
	if err != nil {
		t.Fatal(err)
	}
	lim := tree.JobLimits(1)
	tn, err := tree.NewNode(tree.Config{Topology: topo, Node: 0, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	run := newMultiRun(Config{Stderr: &stderr, Stdout: io.Discard}, []string{"h0"}, nil, netio.CodecNone)
	r := &rootNode{run: run, cfg: Config{Logger: slog.New(slog.DiscardHandler), NetTimeout: time.Second},
		spec: &node.Spec{JobID: "j"}, hosts: []string{"h0"}, at: []int{0},
		conns: []netio.Conn{c}, done: make([]bool, 1), gone: make([]bool, 1), lost: make([]bool, 1), ended: make([]bool, 1),
		lastRx: make([]time.Time, 1), rec: perf.NewRecorder(), tnode: tn, lim: lim, codec: netio.CodecNone}
	puts, _ := tree.AppendKVs(nil, []tree.KV{{Key: []byte("big"), Value: bytes.Repeat([]byte("x"), 1000)}})
	up := tree.AppendMsg(nil, tree.Msg{Kind: tree.Fence, Type: tree.Up, Epoch: 1, From: 1, To: 0, Payload: puts})
	r.frame(node.FrameIn{From: 0, Frame: netio.Frame{Type: node.FrameTree, Epoch: 1, Payload: up}})
	e := run.jobError()
	if e == nil || !strings.Contains(e.Msg, "fence epoch 1: the result, ") || !strings.Contains(e.Msg, "cannot go to node 0 (h0)") ||
		!strings.Contains(e.Msg, netio.ErrFrameTooLarge.Error()) {
		t.Fatalf("job failure %+v, want the fence's result too large for node 0's link", e)
	}
	t.Log(e.Msg)
}

// A tree message is taken as its link's node's: one that claims another
// node fails the job naming the node that sent it. It was taken as the
// other node's contribution, and the real one then failed the job as a
// duplicate, naming no one.
func TestRootTreeMessageFromAnotherNode(t *testing.T) {
	topo, err := tree.NewTopology(3, 2)
	if err != nil {
		t.Fatal(err)
	}
	lim := tree.JobLimits(2)
	tn, err := tree.NewNode(tree.Config{Topology: topo, Node: 0, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	run := newMultiRun(Config{Stderr: &stderr, Stdout: io.Discard}, []string{"h0", "h1"}, nil, netio.CodecNone)
	r := &rootNode{run: run, cfg: Config{Logger: slog.New(slog.DiscardHandler), NetTimeout: time.Second},
		spec: &node.Spec{JobID: "j"}, hosts: []string{"h0", "h1"}, at: []int{0, 1},
		conns: []netio.Conn{nil, nil}, done: make([]bool, 2), gone: make([]bool, 2), lost: make([]bool, 2), ended: make([]bool, 2),
		lastRx: make([]time.Time, 2), rec: perf.NewRecorder(), tnode: tn, lim: lim, codec: netio.CodecNone}
	puts, _ := tree.AppendKVs(nil, nil)
	forged := tree.AppendMsg(nil, tree.Msg{Kind: tree.Fence, Type: tree.Up, Epoch: 1, From: 1, To: 0, Payload: puts})
	r.frame(node.FrameIn{From: 1, Frame: netio.Frame{Type: node.FrameTree, Epoch: 1, Payload: forged}})
	e := run.jobError()
	if e == nil || !strings.HasPrefix(e.Msg, "node 1 (h1) sent a bad tree message: it claims to come from tree node 1, not 2") {
		t.Fatalf("job failure %+v, want node 1's bad tree message", e)
	}
}

// A KVS message pmirun refuses fails the job naming its node: it is
// never answered, and the node's place held its fences (or its get
// waited) for ever while pmirun only logged it.
func TestRootBadKVSMessage(t *testing.T) {
	var stderr bytes.Buffer
	run := newMultiRun(Config{Stderr: &stderr, Stdout: io.Discard}, []string{"h0"}, nil, netio.CodecNone)
	r := &rootNode{run: run, cfg: Config{Logger: slog.New(slog.DiscardHandler), NetTimeout: time.Second},
		spec: &node.Spec{JobID: "j", Size: 1}, hosts: []string{"h0"}, at: []int{0},
		conns: []netio.Conn{nil}, done: make([]bool, 1), gone: make([]bool, 1), lost: make([]bool, 1), ended: make([]bool, 1),
		lastRx: make([]time.Time, 1), rec: perf.NewRecorder()}
	bad := node.Encode(node.KVSMsg{Op: node.KVSPlace, ID: 1, Puts: []node.KVSPut{{Key: "k", Val: "v", Owner: 5}}})
	r.frame(node.FrameIn{From: 0, Frame: netio.Frame{Type: node.FrameKVS, Payload: bad}})
	e := run.jobError()
	if e == nil || !strings.HasPrefix(e.Msg, "node 0 (h0) sent a bad KVS message: KVS place: rank 5 outside the job's 1") {
		t.Fatalf("job failure %+v, want node 0's bad KVS message", e)
	}
}

// smallFramePair returns two ends of a link whose frames carry at most
// 1000 bytes: c for pmirun, peer for the node.
func smallFramePair(t *testing.T) (c, peer netio.Conn) {
	t.Helper()
	return netiotest.Pair(t, netio.Config{Backend: netio.BackendNet, Secret: bytes.Repeat([]byte{7}, 32), MaxFrameSize: 1000})
}

// An answer to a name request too large for the link reaches the node as
// an error saying so: it was refused before anything went out, logged,
// and the node waited until the request's deadline (an hour for a
// collective across jobs) to say pmirun did not answer.
func TestRootNameAnswerOverFrameLimit(t *testing.T) {
	c, peer := smallFramePair(t)
	r := &rootNode{cfg: Config{Logger: slog.New(slog.DiscardHandler), NetTimeout: time.Second},
		hosts: []string{"h0"}, at: []int{0}, conns: []netio.Conn{c}}
	r.answerName(0, node.Name{ID: 7, Data: bytes.Repeat([]byte("d"), 2000)})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f, err := peer.Recv(ctx)
	if err != nil {
		t.Fatalf("the node got no answer: %v", err)
	}
	var m node.Name
	if err := node.Decode(f.Payload, &m); err != nil {
		t.Fatal(err)
	}
	if m.ID != 7 || !strings.Contains(m.Err, "pmirun's answer, ") || !strings.Contains(m.Err, "cannot go to node 0 (h0)") {
		t.Fatalf("answer %+v, want request 7's failure", m)
	}
}
