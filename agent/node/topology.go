package node

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/internal/guard"
)

// The node's topology: MPICH (4.2 and later) asks its launcher for
// PMI_hwloc_xmlfile and, given a file, loads the machine's topology from
// it instead of every rank probing the machine (as Hydra does). A node
// that forks ranks makes the file once, with hwloc's lstopo, when the
// first rank asks (so jobs whose ranks never ask pay nothing); the agent
// holds reads of the attribute until it is made (agent.Config.LateAttrs)
// and answers "unavailable" if lstopo is missing or fails. The file lives
// in a directory of its own, removed with the job (Node.Close).

// topologyTimeout bounds lstopo.
const topologyTimeout = 20 * time.Second

// lstopoPath is hwloc's lstopo, or "" when it is not installed.
func lstopoPath() string {
	p, err := exec.LookPath("lstopo")
	if err != nil {
		return ""
	}
	return p
}

// topology is the making of one node's topology file.
type topology struct {
	lstopo string
	dir    string // made by start; removed by remove
	cancel context.CancelFunc
}

// startTopology starts lstopo on a goroutine the node's waiters own;
// the agent gets the file's path (or "unavailable") when it ends. The
// owner's goroutine calls it (Handle), once: the agent asks once.
func (n *Node) startTopology() {
	t := n.topo
	if t == nil || t.dir != "" {
		return
	}
	val := "unavailable"
	dir, err := os.MkdirTemp("", "fastpmi-topology-")
	if err != nil {
		n.opt.Logger.Warn("no topology file for the ranks", "err", err)
		n.ag.SetJobAttr(agent.AttrHwlocXML, val)
		return
	}
	t.dir = dir
	guard.AddDir(dir) // removed by the guard if this process is killed
	path := filepath.Join(dir, "topology.xml")
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	t.cancel = cancel
	cmd := exec.CommandContext(ctx, t.lstopo, "--of", "xml", "-f", path)
	t0 := time.Now()
	n.waiters.Go(func() {
		defer cancel()
		val := "unavailable"
		if out, err := cmd.CombinedOutput(); err != nil {
			if ctx.Err() != context.Canceled { // the job ended first
				n.opt.Logger.Warn("lstopo failed: ranks probe the topology themselves", "err", err, "output", string(out))
			}
		} else {
			val = path
		}
		n.rec.SpanArg("topology (lstopo)", -1, t0, time.Now(), "", 0)
		n.ag.SetJobAttr(agent.AttrHwlocXML, val)
	})
}

// remove stops lstopo if it still runs and removes the file's directory;
// the node's waiters have ended.
func (t *topology) remove() {
	if t == nil {
		return
	}
	if t.cancel != nil {
		t.cancel()
	}
	if t.dir != "" {
		os.RemoveAll(t.dir)
		guard.RemoveDir(t.dir)
	}
}
