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
// answer that comes after that is dropped.

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
	c.nameSeq++
	id := c.nameSeq
	c.names[id] = t
	u := UpCall{ID: id, Name: o.Name}
	switch o.Op {
	case NamePublish:
		u.Kind, u.Port = UpPublish, o.Port
	case NameUnpublish:
		u.Kind = UpUnpublish
	default:
		u.Kind = UpLookup
	}
	c.up(u)
}

// nameDone answers the rank of name call o.ID, if it still waits.
func (c *Core) nameDone(o NameDone) {
	t, waiting := c.names[o.ID]
	if !waiting {
		return // answered by Shutdown
	}
	delete(c.names, o.ID)
	r := Reply{Err: o.Err}
	if o.Err == nil && t.kind == ReplyName {
		r.Val, r.Found = o.Port, o.Port != ""
	}
	c.reply(t, r)
}

// failNames answers every name request still waiting for the Upstream
// with err, in call order.
func (c *Core) failNames(err error) {
	for _, id := range slices.Sorted(maps.Keys(c.names)) {
		c.reply(c.names[id], Reply{Err: err})
		delete(c.names, id)
	}
}
