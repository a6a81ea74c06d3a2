package launch

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/netio"
	"github.com/fastpmi/fastpmi/netio/netiotest"
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
