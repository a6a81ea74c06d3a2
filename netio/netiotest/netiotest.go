// Package netiotest holds helpers for tests of netio's users.
package netiotest

import (
	"context"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/netio"
)

// ClosedConn returns a connection of the portable backend, dialled over
// loopback and then closed, with its peer: every Send on it fails, as on
// a link that is gone. Its transport closes when the test ends.
func ClosedConn(tb testing.TB) netio.Conn {
	tb.Helper()
	tr, err := netio.New(netio.Config{Backend: netio.BackendNet, Secret: []byte("0123456789abcdef0123")})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tr.Close() })
	ln, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	accepted := make(chan netio.Conn, 1)
	go func() {
		defer close(accepted)
		if c, err := ln.Accept(ctx); err == nil {
			accepted <- c
		}
	}()
	c, err := tr.Dial(ctx, ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	if pc := <-accepted; pc != nil {
		pc.Close()
	}
	c.Close()
	return c
}
