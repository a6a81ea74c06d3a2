//go:build !linux

package sys

import (
	"fmt"
	"net/netip"
)

// TCPPeerUID is Linux-only: elsewhere no socket owner is known.
func TCPPeerUID(local, peer netip.AddrPort) (int, error) {
	return -1, fmt.Errorf("find the owner of TCP socket %s: %w", peer, ErrNotSupported)
}
