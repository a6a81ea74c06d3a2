package agent

import (
	"fmt"
)

// collective is a PMI-1.2 group barrier among local ranks (NODE:<tag> or
// an explicit rank list); world fences are epochs (epoch.go). Guarded by
// Agent.mu.
type collective struct {
	name    string              // "NODE:<tag>", "<ranks>:<tag>"
	members map[*rankState]bool // nil = every local rank
	entered map[*rankState]deferred
}

func (c *collective) isMember(rs *rankState) bool { return c.members == nil || c.members[rs] }

func (c *collective) complete(a *Agent) bool {
	if c.members == nil {
		return len(c.entered) == len(a.ranks)
	}
	return len(c.entered) == len(c.members)
}

// enterGroupLocked adds rs to a PMI-1.2 group barrier among local ranks.
// A group barrier also commits its members' puts.
func (a *Agent) enterGroupLocked(out *outbox, rs *rankState, key string, members map[*rankState]bool, d deferred) {
	g := a.groups[key]
	if g == nil {
		g = &collective{name: key, members: members, entered: make(map[*rankState]deferred)}
		a.groups[key] = g
	}
	if !g.isMember(rs) {
		out.complete(d, fmt.Errorf("rank %d is not a member of barrier group %s", rs.global, key), "")
		return
	}
	if _, dup := g.entered[rs]; dup {
		out.complete(d, fmt.Errorf("rank %d entered barrier group %s twice", rs.global, key), "")
		return
	}
	if err := a.checkPeersLocked(g, rs); err != nil {
		out.complete(d, err, "")
		a.failCollectiveLocked(out, g, err)
		delete(a.groups, key)
		return
	}
	g.entered[rs] = d
	if !g.complete(a) {
		a.checkStuckLocked(out)
		return
	}
	delete(a.groups, key)
	for m, md := range g.entered {
		a.commitLocked(out, m.pending)
		m.pending = nil
		out.complete(md, nil, "")
	}
}

func goneWord(p *rankState) string {
	if p.finalized {
		return "finalized"
	}
	return "exited"
}

// checkPeersLocked fails a collective that can never complete because a
// member that has not entered it has finalized or gone.
func (a *Agent) checkPeersLocked(c *collective, joining *rankState) error {
	if a.ended == 0 {
		return nil
	}
	for _, p := range a.ranks {
		if p == joining || !c.isMember(p) {
			continue
		}
		if _, in := c.entered[p]; in {
			continue
		}
		if p.gone || p.finalized {
			return fmt.Errorf("%s cannot complete: rank %d has %s", c.name, p.global, goneWord(p))
		}
	}
	return nil
}

func (a *Agent) failCollectiveLocked(out *outbox, c *collective, err error) {
	for _, d := range c.entered {
		out.complete(d, err, "")
	}
	c.entered = map[*rankState]deferred{}
}

// peerGoneLocked fails every collective that waits for rs.
func (a *Agent) peerGoneLocked(out *outbox, rs *rankState, why string) {
	if !rs.ended {
		rs.ended = true
		a.ended++
	}
	err := fmt.Errorf("rank %d %s", rs.global, why)
	a.failEpochsLocked(out, func(c *epochColl) error {
		if _, in := c.entered[rs]; in || rs.collSeq >= c.epoch || len(c.entered) == 0 {
			return nil
		}
		return fmt.Errorf("%s cannot complete: %w", c.kind, err)
	})
	for key, g := range a.groups {
		if _, in := g.entered[rs]; !in && g.isMember(rs) {
			a.failCollectiveLocked(out, g, fmt.Errorf("barrier %s cannot complete: %w", key, err))
			delete(a.groups, key)
		}
	}
	a.ringPeerGoneLocked(out, rs, err)
	a.checkStuckLocked(out)
}

func (a *Agent) failWaitersLocked(out *outbox, err error) {
	for k, ws := range a.waits {
		for _, w := range ws {
			out.complete(w.d, err, "")
		}
		delete(a.waits, k)
	}
}

func (a *Agent) failAllLocked(out *outbox, err error) {
	a.failEpochsLocked(out, func(*epochColl) error { return err })
	for k, g := range a.groups {
		a.failCollectiveLocked(out, g, err)
		delete(a.groups, k)
	}
	a.failRingsLocked(out, err)
	a.failWaitersLocked(out, err)
}

// afterUnlock queues f to run once the current request's handler has
// released a.mu. Only request handlers (which run under mu on a
// connection goroutine) call it.
func (a *Agent) afterUnlock(f func()) { a.later = append(a.later, f) }

// unlockAndRun ends a request handler's turn under a.mu: it takes the
// work queued by afterUnlock, releases a.mu, sends out's messages, then
// runs events and the queued work, in that order.
func (a *Agent) unlockAndRun(out *outbox, events []func()) {
	later := a.later
	a.later = nil
	a.mu.Unlock()
	out.flush()
	for _, f := range events {
		f()
	}
	for _, f := range later {
		f()
	}
}
