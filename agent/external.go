package agent

import (
	"errors"
	"fmt"
)

// An external front end serves ranks over a protocol this package does
// not speak (agent/pmix: OpenPMIx's server library, whose host callbacks
// it turns into operations). It steps the core with typed operations like
// text.go and shm.go do, naming its requests Req{Via: ViaExternal, ID:
// its own}, and gets the replies to them through the External it
// attached. One agent has at most one external front end.

// External is an external front end, as the agent calls it. Both methods
// are called while a turn is carried out: they must not block and must
// not call the Agent.
type External interface {
	// Reply gets every Reply to a request with Req.Via ViaExternal, once,
	// in order, while the turn that made it publishes its shared-memory
	// part (under the agent's publishing lock): it must copy what it
	// keeps of Reply.Values (views of buffers reused once the turn ends).
	Reply(Reply)
	// AskRankData asks for the data the front end holds for local rank
	// (global) rank, for this node's GetRankData or another node's
	// (rankdata.go): the front end answers, once, by stepping
	// RankDataDone{ID: id} (StepExternal), when it has the data or knows
	// there is none. It is called after the turn published, without agent
	// locks.
	AskRankData(id uint64, rank int)
}

// ViaExternal is Req.Via for requests of the external front end.
const ViaExternal uint8 = ViaShm + 1

// ErrNoExternal is returned by StepExternal before AttachExternal.
var ErrNoExternal = errors.New("agent: no external front end attached")

// AttachExternal makes ext the agent's external front end: the receiver
// of every Reply to a request with Req.Via ViaExternal, and of the
// agent's requests for rank data.
func (a *Agent) AttachExternal(ext External) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ext != nil {
		return errors.New("agent: an external front end is already attached")
	}
	if a.closed {
		return ErrClosed
	}
	a.ext = ext
	return nil
}

// StepExternal applies ops in one turn of the agent, as the external
// front end's requests, and carries the turn out (replies, events for
// the launcher, Upstream calls) before it returns: an event an operation
// makes (init, finalize, abort) has been reported by then. An operation
// the core refuses stops the batch; the operations before it stand.
func (a *Agent) StepExternal(ops ...Op) error {
	a.mu.Lock()
	if a.ext == nil {
		a.mu.Unlock()
		return ErrNoExternal
	}
	var err error
	for _, op := range ops {
		if err = a.core.Step(op); err != nil {
			err = fmt.Errorf("external %T: %w", op, err)
			break
		}
	}
	a.finishLocked(newTurn())
	return err
}

// LocalIndex returns the local index of global rank g, or -1 if g is not
// served here.
func (a *Agent) LocalIndex(g int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.core.LocalOf(g)
}

// CheckName applies the name service's limits (length, bytes) to a name
// and a port ("" if none), as the agent's own front ends do before they
// step a Name operation.
func CheckName(name, port string) error { return checkName(name, port) }

// A fence with data collected per node (PMIx's fence_nb: the server
// library gathers its local clients' data and hands the host one blob per
// node) is an allgather epoch that every local rank enters, the first
// carrying the node's data and the others nothing. The first rank's
// Reply then holds every node's data in rank order (NodeData). A fence
// without data is the same with data nil, so every node takes one path
// whatever it collected.

// NodeAllgather returns the operations of a fence of the n local ranks
// with the node's collected data, all under req.
func NodeAllgather(n int, req Req, data []byte) []Op {
	ops := make([]Op, n)
	for i := range ops {
		var v []byte
		if i == 0 {
			v = data
		}
		ops[i] = Allgather{Local: i, Req: req, Value: v}
	}
	return ops
}

// NodeData returns whether rp is the reply that completes a
// NodeAllgather (the first local rank's; the others' are redundant) and,
// if it succeeded, a copy of every node's data concatenated in rank
// order: Reply.Values are views the front end must not keep.
func NodeData(rp Reply) (data []byte, completes bool) {
	if rp.Kind != ReplyAllgather || rp.Local != 0 {
		return nil, false
	}
	if rp.Err != nil {
		return nil, true
	}
	n := 0
	for _, v := range rp.Values {
		n += len(v)
	}
	data = make([]byte, 0, n)
	for _, v := range rp.Values {
		data = append(data, v...)
	}
	return data, true
}
