package node

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// PMI_PORT authentication (agent/port.go has the agent's side). Each rank
// gets an unguessable PMI_ID, which a PMI-1 client presents at initack; a
// connection is served only if its peer socket belongs to the node's user,
// which also covers PMI-2 clients that present a rank number. The
// listener is on loopback: ranks are on the agent's machine.

// pmiIDBase keeps PMI_ID tokens above every rank number, so a token is
// never mistaken for a rank (PMI-2 fullinit accepts either).
const pmiIDBase = 1 << 30

// newPMIIDs returns n distinct random tokens in [2^30, 2^31): decimal
// integers, because MPICH reads PMI_ID with atoi.
func newPMIIDs(n int) ([]string, error) {
	ids := make([]string, 0, n)
	seen := make(map[uint32]bool, n)
	var b [4]byte
	for len(ids) < n {
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("make PMI_ID tokens: %w", err)
		}
		v := pmiIDBase | binary.LittleEndian.Uint32(b[:])&(pmiIDBase-1)
		if seen[v] {
			continue
		}
		seen[v] = true
		ids = append(ids, strconv.FormatUint(uint64(v), 10))
	}
	return ids, nil
}

// samePeerUser accepts a PMI_PORT connection only from a socket of this
// process's user (SO_PEERCRED does not work on TCP: the kernel's socket
// tables name the owner).
func samePeerUser(nc net.Conn) error {
	l, lok := nc.LocalAddr().(*net.TCPAddr)
	r, rok := nc.RemoteAddr().(*net.TCPAddr)
	if !lok || !rok {
		return fmt.Errorf("not a TCP connection (%s)", nc.RemoteAddr())
	}
	uid, err := sys.TCPPeerUID(l.AddrPort(), r.AddrPort())
	if err != nil {
		return err
	}
	if me := os.Getuid(); uid != me {
		return fmt.Errorf("peer %s belongs to user %d, not the job's user %d", r, uid, me)
	}
	return nil
}
