package agent

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/pmiwire"
)

// Limits the agent enforces on what ranks send, the same on every front
// end (PMI-1, PMI-2, shared memory). A request over a limit is refused
// with rc≠0 on the text protocol; on shared memory a put has no reply, so
// a put over a quota ends the job as a protocol error naming the rank.
// docs/security.md lists them.
const (
	// MaxPutsPerRank and MaxPutBytesPerRank bound one rank's put volume
	// over the job's life (every put counts, repeated keys included):
	// MPI libraries put a few keys per rank.
	MaxPutsPerRank     = 1 << 16
	MaxPutBytesPerRank = 16 << 20
	// MaxPutsPerNode and MaxPutBytesPerNode bound the put volume of all
	// the job's ranks on one agent.
	MaxPutsPerNode     = 1 << 20
	MaxPutBytesPerNode = 256 << 20
	// MaxPendingPerConn bounds the requests one text connection, or one
	// rank on shared memory, may have waiting for an answer (waiting
	// gets, collectives, names).
	MaxPendingPerConn = 4096
	// MaxNameLen and MaxPortLen bound published service names and ports.
	MaxNameLen = pmiwire.KVSNameMax
	MaxPortLen = pmiwire.ValLenMax
	// MaxNamesPerJob bounds the names a job (with the jobs it spawned,
	// which share its name service) has published at once; on daemons,
	// the names of one run. It also bounds the lookups waiting for a
	// name at once (PMIx's PMIX_WAIT), in the same way.
	MaxNamesPerJob = 4096
	// MaxNameWait bounds how long a lookup waits for a name to be
	// published (PMIx's PMIX_WAIT; Open MPI's connect/accept asks for
	// 600 s); then it fails as a name not found.
	MaxNameWait = time.Hour
	// MaxNodeAttrs and MaxNodeAttrBytes bound the node attributes the
	// job's ranks on one agent hold (key + value bytes; a put of a key
	// already there replaces it): MPI libraries put a few per node.
	MaxNodeAttrs     = 1 << 16
	MaxNodeAttrBytes = 16 << 20
)

// ErrQuota is returned (wrapped) for a request over a quota.
var ErrQuota = errors.New("quota exceeded")

// checkBytes rejects a key, value, name or port holding a NUL byte: C
// clients cannot represent it, and the text protocols would cut it.
func checkBytes(what, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("%s holds a NUL byte", what)
	}
	return nil
}

// checkName enforces the name service's limits on a name and a port ("" if
// none).
func checkName(name, port string) error {
	switch {
	case len(name) > MaxNameLen:
		return fmt.Errorf("service name longer than %d bytes", MaxNameLen)
	case len(port) > MaxPortLen:
		return fmt.Errorf("port longer than %d bytes", MaxPortLen)
	}
	if err := checkBytes("service name", name); err != nil {
		return err
	}
	return checkBytes("port", port)
}

// chargeNodeAttr counts a node attribute put against the node's quota,
// or refuses it; a put of a key already there replaces its value.
func (c *Core) chargeNodeAttr(key, val string) error {
	n := len(key) + len(val)
	old, had := c.nodeAttr[key]
	if had {
		n -= len(key) + len(old)
	}
	if !had && len(c.nodeAttr) >= MaxNodeAttrs || c.attrBytes+n > MaxNodeAttrBytes {
		return fmt.Errorf("%w: the job's ranks on this node hold %d node attributes (%d bytes); the limit is %d or %d bytes",
			ErrQuota, len(c.nodeAttr), c.attrBytes, MaxNodeAttrs, MaxNodeAttrBytes)
	}
	c.attrBytes += n
	return nil
}

// chargePut counts a put against its rank's and the node's quotas, or
// refuses it. Under the core's caller's lock, like every Core method.
func (c *Core) chargePut(rs *rankState, key, val string) error {
	n := len(key) + len(val)
	switch {
	case rs.puts >= MaxPutsPerRank || rs.putBytes+n > MaxPutBytesPerRank:
		return fmt.Errorf("%w: rank %d put more than %d keys or %d bytes", ErrQuota, rs.global, MaxPutsPerRank, MaxPutBytesPerRank)
	case c.puts >= MaxPutsPerNode || c.putBytes+n > MaxPutBytesPerNode:
		return fmt.Errorf("%w: the job's ranks on this node put more than %d keys or %d bytes", ErrQuota, MaxPutsPerNode, MaxPutBytesPerNode)
	}
	rs.puts++
	rs.putBytes += n
	c.puts++
	c.putBytes += n
	return nil
}
