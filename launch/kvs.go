package launch

import (
	"fmt"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/netio"
)

// rootKVS is pmirun's part of a job's on-demand KVS under the Tree get
// strategy (node.StrategyTree): the top of the agent tree, where every
// sparse put ends up and where a get that no agent on its way could
// answer is answered — or waits for its key's put. Only its job's
// goroutine touches it.
type rootKVS struct {
	vals  map[string]string
	waits map[string][]kvsWaiter // gets waiting for their key, by key
	bytes int                    // keys' and values' bytes held, at most agent.MaxPutBytesPerNode
}

// kvsWaiter is a get waiting at the root: node's request id.
type kvsWaiter struct {
	node int
	id   uint64
}

// frame handles a node.FrameKVS from node i.
func (k *rootKVS) frame(r *rootNode, i int, payload []byte) {
	var m node.KVSMsg
	err := node.Decode(payload, &m)
	if err == nil {
		err = m.Check(r.spec.Size)
	}
	if err != nil {
		// Refused, it is never answered: the node's place would hold its
		// fences, or its get wait, for ever.
		r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("%s sent a bad KVS message: %v", r.nodeName(i), err)})
		return
	}
	if k.vals == nil {
		k.vals, k.waits = make(map[string]string), make(map[string][]kvsWaiter)
	}
	send := func(to int, a node.KVSMsg) {
		r.send(to, netio.Frame{Type: node.FrameKVS, Payload: node.Encode(a)})
	}
	switch m.Op {
	case node.KVSPlace:
		ack := node.KVSMsg{Op: node.KVSAck, ID: m.ID}
		for _, p := range m.Puts {
			old, had := k.vals[p.Key]
			n := len(p.Key) + len(p.Val)
			if had {
				n -= len(p.Key) + len(old)
			}
			if k.bytes+n > agent.MaxPutBytesPerNode {
				ack.Err = "pmirun holds the most sparse keys it keeps for a job"
				break
			}
			k.bytes += n
			k.vals[p.Key] = p.Val
			for _, w := range k.waits[p.Key] {
				send(w.node, node.KVSMsg{Op: node.KVSVal, ID: w.id, Key: p.Key, Val: p.Val, Found: true})
			}
			delete(k.waits, p.Key)
		}
		send(i, ack)
	case node.KVSGet:
		if v, ok := k.vals[m.Key]; ok {
			send(i, node.KVSMsg{Op: node.KVSVal, ID: m.ID, Key: m.Key, Val: v, Found: true})
		} else if m.Wait {
			k.waits[m.Key] = append(k.waits[m.Key], kvsWaiter{i, m.ID})
		} else {
			send(i, node.KVSMsg{Op: node.KVSVal, ID: m.ID, Key: m.Key})
		}
	case node.KVSRankVal: // a rank's data for another job (jobscoll.go)
		r.run.jobRankDataDone(r, &m)
	default:
		r.cfg.Logger.Warn("unexpected KVS message", "node", i, "op", m.Op)
	}
}
