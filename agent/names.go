package agent

import "errors"

// The name service (publish, unpublish, lookup) belongs to the launcher:
// in a multi-node job the Upstream asks pmirun and may wait for it. So a
// name request is a deferred operation like a fence: the handler records
// it under Agent.mu, the Upstream is called once the handler has released
// mu (afterUnlock), and the rank is answered when the Upstream's done
// fires, from whatever goroutine that is. Close answers every request
// still waiting with an error; an answer that comes after that is dropped.

// nameOp is a name-service operation.
type nameOp uint8

const (
	namePublish nameOp = iota + 1
	nameUnpublish
	nameLookup
)

// nameReq is one name-service request of a rank.
type nameReq struct {
	op         nameOp
	name, port string // port: publish only
}

// nameCall is a name request handed to the Upstream and not yet answered.
// It is in Agent.names until answered.
type nameCall struct {
	reply nameReply
}

// nameReply answers the rank, under Agent.mu: port is a lookup's answer.
type nameReply func(out *outbox, port string, err error)

// nameLocked starts req; reply answers the rank once the Upstream has.
func (a *Agent) nameLocked(out *outbox, req nameReq, reply nameReply) {
	if a.closed {
		reply(out, "", errors.New("agent shutting down"))
		return
	}
	nc := &nameCall{reply: reply}
	a.names[nc] = struct{}{}
	a.afterUnlock(func() {
		up := a.cfg.Upstream
		switch req.op {
		case namePublish:
			up.Publish(req.name, req.port, func(err error) { a.nameDone(nc, "", err) })
		case nameUnpublish:
			up.Unpublish(req.name, func(err error) { a.nameDone(nc, "", err) })
		case nameLookup:
			up.Lookup(req.name, func(port string, err error) { a.nameDone(nc, port, err) })
		}
	})
}

// nameDone is the Upstream's answer to nc. It runs without agent locks
// held, on any goroutine, possibly inside the Upstream call.
func (a *Agent) nameDone(nc *nameCall, port string, err error) {
	a.mu.Lock()
	if _, waiting := a.names[nc]; !waiting || a.closed {
		// Answered by Close, whose connections and segment are gone.
		a.mu.Unlock()
		return
	}
	delete(a.names, nc)
	var out outbox
	nc.reply(&out, port, err)
	a.mu.Unlock()
	out.flush()
}

// failNamesLocked answers every name request still waiting for the
// Upstream with err.
func (a *Agent) failNamesLocked(out *outbox, err error) {
	for nc := range a.names {
		delete(a.names, nc)
		nc.reply(out, "", err)
	}
}
