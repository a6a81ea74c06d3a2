//go:build linux

package sys

import (
	"net"
	"os"
	"testing"
)

// The owner of a loopback connection's client end is this process's user;
// an address no socket has is not found.
func TestTCPPeerUID(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		addr := "127.0.0.1:0"
		if network == "tcp6" {
			addr = "[::1]:0"
		}
		ln, err := net.Listen(network, addr)
		if err != nil {
			t.Logf("%s: %v", network, err)
			continue
		}
		c, err := net.Dial(network, ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		local := s.LocalAddr().(*net.TCPAddr).AddrPort()
		peer := s.RemoteAddr().(*net.TCPAddr).AddrPort()
		uid, err := TCPPeerUID(local, peer)
		if err != nil || uid != os.Getuid() {
			t.Errorf("%s: TCPPeerUID = %d, %v; want %d", network, uid, err, os.Getuid())
		}
		c.Close()
		s.Close()
		ln.Close()
		if uid, err := TCPPeerUID(local, peer); err == nil {
			t.Errorf("%s: closed connection still has owner %d", network, uid)
		}
	}
}
