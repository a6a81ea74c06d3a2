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
