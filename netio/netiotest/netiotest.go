// Package netiotest holds helpers for tests of netio's users.
package netiotest

import (
	"context"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/netio"
)

// Pair returns the two ends of a link over loopback on a transport made
// with cfg: the one dialled and the one accepted. The transport (and with
// it the listener and both ends) closes when the test ends.
func Pair(tb testing.TB, cfg netio.Config) (dialled, accepted netio.Conn) {
	tb.Helper()
	tr, err := netio.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tr.Close() })
	ln, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acc := make(chan netio.Conn, 1)
	go func() {
		defer close(acc)
		if c, err := ln.Accept(ctx); err == nil {
			acc <- c
		}
	}()
	dialled, err = tr.Dial(ctx, ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	if accepted = <-acc; accepted == nil {
		tb.Fatal("accept failed")
	}
	return dialled, accepted
}

// ClosedConn returns a connection of the portable backend, dialled over
// loopback and then closed, with its peer: every Send on it fails, as on
// a link that is gone. Its transport closes when the test ends.
func ClosedConn(tb testing.TB) netio.Conn {
	tb.Helper()
	c, peer := Pair(tb, netio.Config{Backend: netio.BackendNet, Secret: []byte("0123456789abcdef0123")})
	peer.Close()
	c.Close()
	return c
}
