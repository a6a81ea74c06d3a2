//go:build linux

package sys

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// TCPPeerUID returns the user id owning the local TCP socket at peer that
// is connected to local: the other end of a connection accepted on this
// machine (local is the accepted socket's own address, peer its remote
// address). SO_PEERCRED works only on Unix sockets; for TCP the kernel's
// socket tables (/proc/net/tcp and tcp6) name each socket's owner. A peer
// on another machine, or one whose socket is gone, is not found (error).
func TCPPeerUID(local, peer netip.AddrPort) (int, error) {
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		uid, ok, err := findTCPOwner(f, peer, local)
		if err != nil {
			return -1, err
		}
		if ok {
			return uid, nil
		}
	}
	return -1, fmt.Errorf("find the owner of TCP socket %s: not a socket of this machine", peer)
}

// tcpEstablished is the state column of a connected socket (a socket
// closing, in TIME_WAIT, has lost its owner).
const tcpEstablished = "01"

// findTCPOwner scans one socket table for the socket whose local address
// is src and remote address dst.
func findTCPOwner(path string, src, dst netip.AddrPort) (uid int, ok bool, err error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return -1, false, nil
	}
	if err != nil {
		return -1, false, fmt.Errorf("find the owner of TCP socket %s: %w", src, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header line
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid ...
		if len(fs) < 8 || fs[3] != tcpEstablished {
			continue
		}
		l, lok := parseProcAddr(fs[1])
		r, rok := parseProcAddr(fs[2])
		if !lok || !rok || l != src || r != dst {
			continue
		}
		u, err := strconv.Atoi(fs[7])
		if err != nil {
			return -1, false, fmt.Errorf("find the owner of TCP socket %s: bad uid %q in %s", src, fs[7], path)
		}
		return u, true, nil
	}
	if err := sc.Err(); err != nil {
		return -1, false, fmt.Errorf("find the owner of TCP socket %s: %w", src, err)
	}
	return -1, false, nil
}

// parseProcAddr reads an address of /proc/net/tcp{,6}: the IP as 4-byte
// words in host (little-endian) order, ':', the port in hex. IPv4-mapped
// IPv6 addresses are unmapped, as netip.AddrPort.Addr().Unmap() does.
func parseProcAddr(s string) (netip.AddrPort, bool) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, false
	}
	raw, err := hex.DecodeString(a)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, false
	}
	for i := 0; i < len(raw); i += 4 {
		binary.BigEndian.PutUint32(raw[i:], binary.LittleEndian.Uint32(raw[i:]))
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	ip, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(ip.Unmap(), uint16(port)), true
}
