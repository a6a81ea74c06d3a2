package agent

import (
	"errors"
	"maps"
	"slices"
)

// The name service (publish, unpublish, lookup) belongs to the launcher:
// in a multi-node job the Upstream asks pmirun and may wait for it. So a
// name request is a deferred operation like a fence: the core records it
// and asks for an Upstream call (UpPublish, UpUnpublish, UpLookup with a
// call ID), which the shell makes without holding its lock; the rank is
// answered when NameDone with that ID comes back, from whatever goroutine
// that is. Shutdown answers every request still waiting with an error; an
// answer that comes after that is dropped. Spawn requests (spawn.go) wait
// for their Upstream call the same way, in the same table of calls.

// NameOp is a name-service operation.
type NameOp uint8

const (
	NamePublish NameOp = iota + 1
	NameUnpublish
	NameLookup
)

// name starts a name request; the rank is answered at NameDone.
func (c *Core) name(o Name) {
	t := to{o.Local, o.Req, ReplyName}
	if c.closed {
		c.reply(t, Reply{Err: errors.New("agent shutting down")})
		return
	}
	u := UpCall{ID: c.newCall(t), Name: o.Name}
	switch o.Op {
	case NamePublish:
		u.Kind, u.Port, u.Once = UpPublish, o.Port, o.Once
	case NameUnpublish:
		u.Kind = UpUnpublish
	default:
		u.Kind, u.Linger = UpLookup, min(max(o.Wait, 0), MaxNameWait)
	}
	c.up(u)
}

// newCall records that t waits for an Upstream call and returns the
// call's ID.
func (c *Core) newCall(t to) uint64 {
	c.callSeq++
	c.calls[c.callSeq] = t
	return c.callSeq
}

// takeCall returns the request waiting for call id and forgets it; ok is
// false if Shutdown answered it already.
func (c *Core) takeCall(id uint64) (t to, ok bool) {
	t, ok = c.calls[id]
	delete(c.calls, id)
	return t, ok
}

// nameDone answers the rank of name call o.ID, if it still waits.
func (c *Core) nameDone(o NameDone) {
	t, waiting := c.takeCall(o.ID)
	if !waiting {
		return // answered by Shutdown
	}
	r := Reply{Err: o.Err}
	if o.Err == nil && t.kind == ReplyName {
		r.Val, r.Found = o.Port, o.Port != ""
	}
	c.reply(t, r)
}

// failCalls answers every name and spawn request still waiting for the
// Upstream with err, in call order.
func (c *Core) failCalls(err error) {
	for _, id := range slices.Sorted(maps.Keys(c.calls)) {
		c.reply(c.calls[id], Reply{Err: err})
		delete(c.calls, id)
	}
}
