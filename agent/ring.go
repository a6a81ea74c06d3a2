package agent

import (
	"fmt"
)

// Ring exchange (PMIX_Ring). A rank's k-th ring request enters epoch k.
// Rank i of the node's n needs only its two neighbours' values: local
// ranks i-1 and i+1, or, at the node's ends, the value the neighbour node
// sends (Upstream.RingEdge). So each rank is answered as soon as both its
// neighbours are known, not when the whole node, let alone the whole job,
// has entered: the last rank to arrive waits for nothing but its own
// neighbours. The node's first rank hands its Left value to the left
// neighbour node the moment it enters, the last rank its Right value to the
// right one: two inter-node messages per node and epoch.
//
// Because nothing waits for the whole node, a rank may be several epochs
// ahead of another (rank i can enter epoch k+1 once ranks i-1 and i+1
// entered epoch k), so several epochs can be in progress; a.rings holds
// them. An epoch is dropped once every local rank was answered.
//
// Positions follow from the job's rank placement without communication:
// every rank counts 1, as PMIX_Ring clients always pass (Slurm's libpmi2
// hard-codes ring-count=1), and another count is refused.

// ringEpoch is one ring exchange on this node. Guarded by Agent.mu.
type ringEpoch struct {
	epoch   uint64
	in      []RingIn   // by local index, valid where state != ringAbsent
	done    []ringDone // by local index, while state == ringWaiting
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

// ringDone completes one rank's ring request, under Agent.mu.
type ringDone func(out *outbox, err error, r ringReply)

// ringReply is a rank's ring result.
type ringReply struct {
	Pos, Size   int
	Left, Right string
}

// enterRingLocked enters rs into its next ring exchange.
func (a *Agent) enterRingLocked(out *outbox, rs *rankState, in RingIn, done ringDone) {
	e := rs.ringSeq + 1
	switch {
	case in.Count != 1:
		done(out, fmt.Errorf("ring-count %d: only 1 is supported (every PMIX_Ring process counts 1)", in.Count), ringReply{})
		return
	case rs.inRing:
		done(out, fmt.Errorf("rank %d entered ring %d twice", rs.global, rs.ringSeq), ringReply{})
		return
	}
	n := len(a.ranks)
	r := a.rings[e]
	if r == nil {
		r = &ringEpoch{epoch: e, in: make([]RingIn, n), done: make([]ringDone, n), state: make([]ringState, n)}
		a.rings[e] = r
	}
	rs.ringSeq = e
	if r.err != nil {
		done(out, r.err, ringReply{})
		a.ringAnsweredLocked(r)
		return
	}
	if err := a.ringPeersLocked(rs, e); err != nil {
		done(out, err, ringReply{})
		a.ringAnsweredLocked(r)
		a.failRingLocked(out, r, err)
		return
	}
	i := rs.local
	r.in[i], r.done[i], r.state[i] = in, done, ringWaiting
	r.waiting++
	rs.inRing = true
	a.ringWaiting++
	if i == 0 {
		a.ringEdgeLater(r, true, in.Left)
	}
	if i == n-1 {
		a.ringEdgeLater(r, false, in.Right)
	}
	for _, j := range [...]int{i - 1, i, i + 1} {
		a.tryRingLocked(out, r, j)
	}
	if r.waiting > 0 {
		a.checkStuckLocked(out)
	}
}

// ringPeersLocked fails an entry into epoch e while a local rank that
// ended before entering e is on the ring: the exchange cannot complete.
func (a *Agent) ringPeersLocked(joining *rankState, e uint64) error {
	if a.ended == 0 {
		return nil // nobody to check: the common case, at every entry
	}
	for _, p := range a.ranks {
		if p != joining && p.ended && p.ringSeq < e {
			return fmt.Errorf("ring cannot complete: rank %d has %s", p.global, goneWord(p))
		}
	}
	return nil
}

// ringEdgeLater sends one of the node's boundary values once the handler
// released a.mu, and feeds the neighbour node's answer back into r.
func (a *Agent) ringEdgeLater(r *ringEpoch, toLeft bool, value string) {
	e := r.epoch
	a.afterUnlock(func() {
		a.cfg.Upstream.RingEdge(e, toLeft, value, func(v string, err error) {
			a.mu.Lock()
			var out outbox
			if r := a.rings[e]; r != nil && r.err == nil {
				switch {
				case err != nil:
					a.failRingLocked(&out, r, err)
				case toLeft:
					r.leftOfFirst, r.haveLeft = v, true
					a.tryRingLocked(&out, r, 0)
				default:
					r.rightOfLast, r.haveRight = v, true
					a.tryRingLocked(&out, r, len(a.ranks)-1)
				}
			}
			a.mu.Unlock()
			out.flush()
		})
	})
}

// tryRingLocked answers local rank j of r if it waits and both its
// neighbours' values are known.
func (a *Agent) tryRingLocked(out *outbox, r *ringEpoch, j int) {
	n := len(a.ranks)
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
	offset, size := a.cfg.Upstream.RingLayout(n)
	done := r.done[j]
	a.ringFinishLocked(r, j)
	done(out, nil, ringReply{Pos: offset + j, Size: size, Left: left, Right: right})
}

// ringFinishLocked marks waiting entry j of r answered.
func (a *Agent) ringFinishLocked(r *ringEpoch, j int) {
	r.state[j], r.done[j] = ringAnswered, nil
	r.waiting--
	a.ringWaiting--
	a.ranks[j].inRing = false
	a.ringAnsweredLocked(r)
}

// ringAnsweredLocked counts one more answered entry of r and drops r once
// every local rank has one.
func (a *Agent) ringAnsweredLocked(r *ringEpoch) {
	r.answered++
	if r.answered < len(a.ranks) {
		return
	}
	delete(a.rings, r.epoch)
	if r.err == nil {
		a.ringSeq++
	}
}

// failRingLocked fails every waiting entry of r, and later entries into it.
func (a *Agent) failRingLocked(out *outbox, r *ringEpoch, err error) {
	if r.err == nil {
		r.err = err
	}
	for j, s := range r.state {
		if s == ringWaiting {
			done := r.done[j]
			a.ringFinishLocked(r, j)
			done(out, err, ringReply{})
		}
	}
}

// failRingsLocked fails every ring exchange in progress.
func (a *Agent) failRingsLocked(out *outbox, err error) {
	for _, r := range a.rings {
		if r.err == nil {
			a.failRingLocked(out, r, err)
		}
	}
}

// ringPeerGoneLocked fails the ring exchanges that wait for rs: those with
// waiting entries that rs has not entered.
func (a *Agent) ringPeerGoneLocked(out *outbox, rs *rankState, err error) {
	for e, r := range a.rings {
		if r.err == nil && r.waiting > 0 && rs.ringSeq < e {
			a.failRingLocked(out, r, fmt.Errorf("ring cannot complete: %w", err))
		}
	}
}

// ringBlockedLocked reports whether rs waits in a ring exchange for a
// local rank (one that may never enter). A rank that waits only for a
// neighbour node's value is progressing elsewhere, unless the ring closes
// on this node.
func (a *Agent) ringBlockedLocked(rs *rankState) bool {
	if !rs.inRing {
		return false
	}
	r := a.rings[rs.ringSeq]
	if r == nil {
		return false
	}
	n, j := len(a.ranks), rs.local
	single := a.cfg.Size == n
	if j > 0 && r.state[j-1] == ringAbsent || j < n-1 && r.state[j+1] == ringAbsent {
		return true
	}
	if !single {
		return false
	}
	// One node: the edges pair the first and the last rank.
	return j == 0 && !r.haveLeft && r.state[n-1] == ringAbsent || j == n-1 && !r.haveRight && r.state[0] == ringAbsent
}
