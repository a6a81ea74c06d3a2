package node

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/netio"
	"github.com/fastpmi/fastpmi/netio/netiotest"
	"github.com/fastpmi/fastpmi/perf"
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
