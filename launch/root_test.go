package launch

import (
	"bytes"
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
