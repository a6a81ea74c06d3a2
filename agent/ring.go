package agent

import (
	"fmt"
	"maps"
	"slices"
)

// Ring exchange (PMIX_Ring). A rank's k-th ring request enters epoch k.
// Rank i of the node's n needs only its two neighbours' values: local
// ranks i-1 and i+1, or, at the node's ends, the value the neighbour node
// sends (an UpRingEdge call, answered by RingEdgeDone). So each rank is
// answered as soon as both its neighbours are known, not when the whole node, let alone the whole job,
// has entered: the last rank to arrive waits for nothing but its own
// neighbours. The node's first rank hands its Left value to the left
// neighbour node the moment it enters, the last rank its Right value to the
// right one: two inter-node messages per node and epoch.
//
// Because nothing waits for the whole node, a rank may be several epochs
// ahead of another (rank i can enter epoch k+1 once ranks i-1 and i+1
// entered epoch k), so several epochs can be in progress; Core.rings
// holds them. An epoch is dropped once every local rank was answered.
//
// Positions follow from the job's rank placement without communication:
// every rank counts 1, as PMIX_Ring clients always pass (Slurm's libpmi2
// hard-codes ring-count=1), and another count is refused.

// ringEpoch is one ring exchange on this node.
type ringEpoch struct {
	epoch   uint64
	in      []RingIn // by local index, valid where state != ringAbsent
	to      []to     // by local index, while state == ringWaiting
	state   []ringState
	waiting int // entries in ringWaiting

	leftOfFirst, rightOfLast string // from the neighbour nodes
	haveLeft, haveRight      bool

	answered int   // entries answered (successfully or not)
	err      error // the epoch failed: later entries fail at once
}

type ringState uint8

const (
	ringAbsent   ringState = iota // not entered yet
	ringWaiting                   // entered, not answered
	ringAnswered                  // answered
)

// enterRing enters rs into its next ring exchange.
func (c *Core) enterRing(rs *rankState, in RingIn, t to) {
	e := rs.ringSeq + 1
	switch {
	case in.Count != 1:
		c.reply(t, Reply{Err: fmt.Errorf("ring-count %d: only 1 is supported (every PMIX_Ring process counts 1)", in.Count)})
		return
	case rs.inRing:
		c.reply(t, Reply{Err: fmt.Errorf("rank %d entered ring %d twice", rs.global, rs.ringSeq)})
		return
	}
	n := len(c.ranks)
	r := c.rings[e]
	if r == nil {
		r = &ringEpoch{epoch: e, in: make([]RingIn, n), to: make([]to, n), state: make([]ringState, n)}
		c.rings[e] = r
	}
	rs.ringSeq = e
	if r.err != nil {
		c.reply(t, Reply{Err: r.err})
		c.ringAnswered(r)
		return
	}
	if err := c.ringPeers(rs, e); err != nil {
		c.reply(t, Reply{Err: err})
		c.ringAnswered(r)
		c.failRing(r, err)
		return
	}
	i := rs.local
	r.in[i], r.to[i], r.state[i] = in, t, ringWaiting
	r.waiting++
	rs.inRing = true
	c.ringWaiting++
	if i == 0 {
		c.up(UpCall{Kind: UpRingEdge, Epoch: e, ToLeft: true, Value: in.Left})
	}
	if i == n-1 {
		c.up(UpCall{Kind: UpRingEdge, Epoch: e, ToLeft: false, Value: in.Right})
	}
	for _, j := range [...]int{i - 1, i, i + 1} {
		c.tryRing(r, j)
	}
	if r.waiting > 0 {
		c.checkStuck()
	}
}

// ringPeers fails an entry into epoch e while a local rank that ended
// before entering e is on the ring: the exchange cannot complete.
func (c *Core) ringPeers(joining *rankState, e uint64) error {
	if c.ended == 0 {
		return nil // nobody to check: the common case, at every entry
	}
	for _, p := range c.ranks {
		if p != joining && p.ended && p.ringSeq < e {
			return fmt.Errorf("ring cannot complete: rank %d has %s", p.global, goneWord(p))
		}
	}
	return nil
}

// ringEdgeDone feeds the neighbour node's answer into its epoch.
func (c *Core) ringEdgeDone(o RingEdgeDone) {
	r := c.rings[o.Epoch]
	if r == nil || r.err != nil {
		return
	}
	switch {
	case o.Err != nil:
		c.failRing(r, o.Err)
	case o.ToLeft:
		r.leftOfFirst, r.haveLeft = o.Value, true
		c.tryRing(r, 0)
	default:
		r.rightOfLast, r.haveRight = o.Value, true
		c.tryRing(r, len(c.ranks)-1)
	}
}

// tryRing answers local rank j of r if it waits and both its neighbours'
// values are known.
func (c *Core) tryRing(r *ringEpoch, j int) {
	n := len(c.ranks)
	if j < 0 || j >= n || r.state[j] != ringWaiting {
		return
	}
	var left, right string
	switch {
	case j > 0 && r.state[j-1] != ringAbsent:
		left = r.in[j-1].Right
	case j == 0 && r.haveLeft:
		left = r.leftOfFirst
	default:
		return
	}
	switch {
	case j < n-1 && r.state[j+1] != ringAbsent:
		right = r.in[j+1].Left
	case j == n-1 && r.haveRight:
		right = r.rightOfLast
	default:
		return
	}
	t := r.to[j]
	c.ringFinish(r, j)
	c.reply(t, Reply{Ring: RingResult{Pos: c.cfg.ringOff + j, Size: c.cfg.ringLen, Left: left, Right: right}})
}

// ringFinish marks waiting entry j of r answered.
func (c *Core) ringFinish(r *ringEpoch, j int) {
	r.state[j], r.to[j] = ringAnswered, to{}
	r.waiting--
	c.ringWaiting--
	c.ranks[j].inRing = false
	c.ringAnswered(r)
}

// ringAnswered counts one more answered entry of r and drops r once every
// local rank has one.
func (c *Core) ringAnswered(r *ringEpoch) {
	r.answered++
	if r.answered < len(c.ranks) {
		return
	}
	delete(c.rings, r.epoch)
	if r.err == nil {
		c.ringSeq++
	}
}

// failRing fails every waiting entry of r, and later entries into it.
func (c *Core) failRing(r *ringEpoch, err error) {
	if r.err == nil {
		r.err = err
	}
	for j, s := range r.state {
		if s == ringWaiting {
			t := r.to[j]
			c.ringFinish(r, j)
			c.reply(t, Reply{Err: err})
		}
	}
}

// failRings fails every ring exchange in progress, in epoch order.
func (c *Core) failRings(err error) {
	for _, e := range slices.Sorted(maps.Keys(c.rings)) {
		if r := c.rings[e]; r != nil && r.err == nil {
			c.failRing(r, err)
		}
	}
}

// ringPeerGone fails the ring exchanges that wait for rs: those with
// waiting entries that rs has not entered.
func (c *Core) ringPeerGone(rs *rankState, err error) {
	for _, e := range slices.Sorted(maps.Keys(c.rings)) {
		if r := c.rings[e]; r != nil && r.err == nil && r.waiting > 0 && rs.ringSeq < e {
			c.failRing(r, fmt.Errorf("ring cannot complete: %w", err))
		}
	}
}

// ringBlocked reports whether rs waits in a ring exchange for a local rank
// (one that may never enter). A rank that waits only for a neighbour
// node's value is progressing elsewhere, unless the ring closes on this
// node.
func (c *Core) ringBlocked(rs *rankState) bool {
	if !rs.inRing {
		return false
	}
	r := c.rings[rs.ringSeq]
	if r == nil {
		return false
	}
	n, j := len(c.ranks), rs.local
	single := c.cfg.size == n
	if j > 0 && r.state[j-1] == ringAbsent || j < n-1 && r.state[j+1] == ringAbsent {
		return true
	}
	if !single {
		return false
	}
	// One node: the edges pair the first and the last rank.
	return j == 0 && !r.haveLeft && r.state[n-1] == ringAbsent || j == n-1 && !r.haveRight && r.state[0] == ringAbsent
}
