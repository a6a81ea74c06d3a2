package agent

import (
	"fmt"
	"maps"
	"slices"
)

// group is a PMI-1.2 group barrier among local ranks (NODE:<tag> or an
// explicit rank list); world fences are epochs (epoch.go).
type group struct {
	name    string // "NODE:<tag>", "<ranks>:<tag>"
	members []bool // by local index; nil = every local rank
	entered []struct {
		in bool
		to to
	}
	n int // entries in
}

func (g *group) isMember(rs *rankState) bool { return g.members == nil || g.members[rs.local] }

func (g *group) complete(c *Core) bool {
	if g.members == nil {
		return g.n == len(c.ranks)
	}
	want := 0
	for _, m := range g.members {
		if m {
			want++
		}
	}
	return g.n == want
}

// enterGroup adds rs to a PMI-1.2 group barrier among local ranks. A
// group barrier also makes its members' puts visible on this node; they
// stay pending, since only a world fence carries them to the job's
// other nodes.
func (c *Core) enterGroup(rs *rankState, key string, members []bool, t to) {
	g := c.groups[key]
	if g == nil {
		g = &group{name: key, members: members}
		g.entered = make([]struct {
			in bool
			to to
		}, len(c.ranks))
		c.groups[key] = g
	}
	if !g.isMember(rs) {
		c.reply(t, Reply{Err: fmt.Errorf("rank %d is not a member of barrier group %s", rs.global, key)})
		return
	}
	if g.entered[rs.local].in {
		c.reply(t, Reply{Err: fmt.Errorf("rank %d entered barrier group %s twice", rs.global, key)})
		return
	}
	if err := c.checkGroupPeers(g, rs); err != nil {
		c.reply(t, Reply{Err: err})
		c.failGroup(g, err)
		delete(c.groups, key)
		return
	}
	g.entered[rs.local].in, g.entered[rs.local].to = true, t
	g.n++
	rs.grouped++
	c.grouped++
	if !g.complete(c) {
		c.checkStuck()
		return
	}
	delete(c.groups, key)
	c.commit(c.pendingPuts(g.members))
	for i, e := range g.entered {
		if e.in {
			c.leaveGroup(i)
			c.reply(e.to, Reply{})
		}
	}
}

// leaveGroup counts local rank i out of a group it entered.
func (c *Core) leaveGroup(i int) {
	c.ranks[i].grouped--
	c.grouped--
}

func goneWord(p *rankState) string {
	if p.finalized {
		return "finalized"
	}
	return "exited"
}

// checkGroupPeers fails a barrier that can never complete because a
// member that has not entered it has finalized or gone.
func (c *Core) checkGroupPeers(g *group, joining *rankState) error {
	if c.ended == 0 {
		return nil
	}
	for _, p := range c.ranks {
		if p == joining || !g.isMember(p) || g.entered[p.local].in {
			continue
		}
		if p.gone || p.finalized {
			return fmt.Errorf("%s cannot complete: rank %d has %s", g.name, p.global, goneWord(p))
		}
	}
	return nil
}

func (c *Core) failGroup(g *group, err error) {
	for i := range g.entered {
		if e := &g.entered[i]; e.in {
			c.leaveGroup(i)
			c.reply(e.to, Reply{Err: err})
			e.in = false
		}
	}
	g.n = 0
}

// peerGone fails every collective that waits for rs.
func (c *Core) peerGone(rs *rankState, why string) {
	if !rs.ended {
		rs.ended = true
		c.ended++
	}
	err := fmt.Errorf("rank %d %s", rs.global, why)
	c.failEpochs(func(ec *epochColl) error {
		if ec.entries[rs.local].in || rs.collSeq >= ec.epoch || ec.n == 0 {
			return nil
		}
		return fmt.Errorf("%s cannot complete: %w", ec.kind, err)
	})
	for _, key := range slices.Sorted(maps.Keys(c.groups)) {
		g := c.groups[key]
		if !g.entered[rs.local].in && g.isMember(rs) {
			c.failGroup(g, fmt.Errorf("barrier %s cannot complete: %w", key, err))
			delete(c.groups, key)
		}
	}
	c.ringPeerGone(rs, err)
	c.checkStuck()
}

// failAll fails every collective, barrier, ring and parked request.
func (c *Core) failAll(err error) {
	c.failEpochs(func(*epochColl) error { return err })
	for _, key := range slices.Sorted(maps.Keys(c.groups)) {
		c.failGroup(c.groups[key], err)
		delete(c.groups, key)
	}
	c.failRings(err)
	c.failWaiters(err)
}
