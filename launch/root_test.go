package launch

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/netio"
)

// A node whose link is gone logs the first failed send only: pmirun
// sends a lost node a heartbeat four times a second while it waits for
// the rest of the job (or for its reader to take its output).
func TestRootSendFailuresLoggedOnce(t *testing.T) {
	tr, err := netio.New(netio.Config{Backend: netio.BackendNet, Secret: []byte("0123456789abcdef0123")})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ln, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	accepted := make(chan netio.Conn, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	c, err := tr.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if pc := <-accepted; pc != nil {
		pc.Close()
	}
	c.Close() // every send on it fails
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
