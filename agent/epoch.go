package agent

import (
	"fmt"

	"github.com/fastpmi/fastpmi/perf"
)

// Epoch-numbered collectives. Fences (PMI-1 barrier, PMI-2 kvs-fence) and
// allgathers share one sequence: a rank's k-th fence-or-allgather is epoch
// k, whichever path the rank uses, because every rank issues its
// collectives in the same order. Numbering them this way lets a rank on
// shared memory know the epoch of each of its requests in advance (its
// allgather slot and the result buffer are chosen by epoch parity, and the
// agent publishes completion by storing the epoch), lets several
// non-blocking collectives be outstanding at once, and catches ranks that
// disagree about which collective comes next.
//
// An epoch starts when every local rank has entered it; the Upstream then
// completes it job-wide. Epochs are delivered — results written, waiters
// answered, the epoch published — strictly in order.

type collKind uint8

const (
	kindFence collKind = iota + 1
	kindAllgather
)

func (k collKind) String() string {
	if k == kindFence {
		return "fence"
	}
	return "allgather"
}

// epochDone completes one rank's part of a collective, under Agent.mu. On
// success c.values holds an allgather's result.
type epochDone func(out *outbox, err error, c *epochColl)

type epochEntry struct {
	val  []byte
	done epochDone
}

// epochColl is one collective epoch on this node. Guarded by Agent.mu.
type epochColl struct {
	epoch    uint64
	kind     collKind
	entered  map[*rankState]epochEntry
	started  bool // every local rank entered; Upstream is completing it
	finished bool // Upstream answered (err holds its verdict)
	err      error
	puts     []KV     // a fence's job-wide puts
	values   [][]byte // an allgather's values, by rank
}

// EpochSink receives each delivered epoch, in order, under the agent's
// lock: the shared-memory server writes an allgather's values into the
// result array and publishes the epoch to its ranks. err is the epoch's
// failure, if any.
type EpochSink func(epoch uint64, allgather bool, values [][]byte, err error)

// enterEpochLocked adds rs to its next collective.
func (a *Agent) enterEpochLocked(out *outbox, rs *rankState, kind collKind, val []byte, done epochDone) {
	rs.collSeq++
	e := rs.collSeq
	c := a.colls[e]
	if c == nil {
		if e <= a.delivered {
			// Only possible after a failure consumed the epoch.
			done(out, fmt.Errorf("%s %d already ended", kind, e), &epochColl{epoch: e, kind: kind})
			return
		}
		c = &epochColl{epoch: e, kind: kind, entered: make(map[*rankState]epochEntry)}
		a.colls[e] = c
	}
	if c.kind != kind {
		err := fmt.Errorf("rank %d entered %s as collective %d while other ranks entered %s", rs.global, kind, e, c.kind)
		done(out, err, c)
		a.finishEpochLocked(out, c, err)
		return
	}
	if err := a.checkEpochPeersLocked(c, rs); err != nil {
		done(out, err, c)
		a.finishEpochLocked(out, c, err)
		return
	}
	c.entered[rs] = epochEntry{val: val, done: done}
	if kind == kindFence && a.rec != nil {
		a.rec.Mark(perf.PhaseFenceEnter, rs.global)
	}
	if len(c.entered) < len(a.ranks) {
		a.checkStuckLocked(out)
		return
	}
	c.started = true
	switch kind {
	case kindFence:
		var puts []KV
		for _, r := range a.ranks {
			puts = append(puts, r.pending...)
			r.pending = nil
		}
		a.afterUnlock(func() {
			a.cfg.Upstream.Fence(e, puts, func(all []KV, err error) { a.epochFinished(c, all, nil, err) })
		})
	case kindAllgather:
		in := make([]RankValue, 0, len(a.ranks))
		for _, p := range a.ranks {
			in = append(in, RankValue{Rank: p.global, Value: c.entered[p].val})
		}
		a.afterUnlock(func() {
			a.cfg.Upstream.Allgather(e, in, func(all [][]byte, err error) { a.epochFinished(c, nil, all, err) })
		})
	}
}

// checkEpochPeersLocked fails a collective that a local rank can never
// enter because it finalized or is gone.
func (a *Agent) checkEpochPeersLocked(c *epochColl, joining *rankState) error {
	if a.ended == 0 {
		return nil // the common case, at every entry: nobody to check
	}
	for _, p := range a.ranks {
		if p == joining {
			continue
		}
		if _, in := c.entered[p]; in || p.collSeq >= c.epoch {
			continue
		}
		if p.gone || p.finalized {
			return fmt.Errorf("%s cannot complete: rank %d has %s", c.kind, p.global, goneWord(p))
		}
	}
	return nil
}

func (a *Agent) epochFinished(c *epochColl, puts []KV, values [][]byte, err error) {
	a.mu.Lock()
	var out outbox
	if err == nil && c.kind == kindAllgather && len(values) != a.cfg.Size {
		err = fmt.Errorf("allgather %d: %d values for a job of %d ranks", c.epoch, len(values), a.cfg.Size)
	}
	c.puts, c.values = puts, values
	a.finishEpochLocked(&out, c, err)
	a.mu.Unlock()
	out.flush()
}

// finishEpochLocked records c's verdict and delivers every epoch that is
// now next in order.
func (a *Agent) finishEpochLocked(out *outbox, c *epochColl, err error) {
	if c.finished {
		return
	}
	c.finished, c.err = true, err
	a.deliverInOrderLocked(out)
}

func (a *Agent) deliverLocked(out *outbox, c *epochColl) {
	if c.err == nil && c.kind == kindFence {
		a.commitLocked(out, c.puts)
		a.fenceSeq++
		if a.seg != nil {
			// The node KVS in shared memory: ranks read fenced keys in
			// place once the epoch is published. A key that does not fit
			// (table full, too long) is still served by the agent.
			sa := a.seg.Agent()
			for _, kv := range c.puts {
				if err := sa.KVSReplace([]byte(kv.Key), []byte(kv.Val), uint32(c.epoch)); err != nil {
					a.rec.Add("shm.kvs.skipped", 1)
				}
			}
		}
	}
	if c.err == nil && c.kind == kindAllgather {
		a.agSeq++
	}
	// Answer the ranks before publishing: an allgather's values may be
	// views into the shared-memory input slots, which a rank may reuse as
	// soon as the epoch is published.
	for rs, e := range c.entered {
		e.done(out, c.err, c)
		if c.err == nil && c.kind == kindFence && a.rec != nil {
			a.rec.Mark(perf.PhaseFenceDone, rs.global)
		}
	}
	if a.epochSink != nil {
		a.epochSink(c.epoch, c.kind == kindAllgather, c.values, c.err)
	}
	c.values = nil
	// Ranks that never entered a failed epoch skip it on entry.
	if c.err != nil {
		for _, p := range a.ranks {
			if _, in := c.entered[p]; !in && p.collSeq < c.epoch {
				p.collSeq = c.epoch
			}
		}
	}
}

// deliverInOrderLocked delivers every finished epoch that is next in
// order, stopping at the first that has not finished.
func (a *Agent) deliverInOrderLocked(out *outbox) {
	for {
		n := a.colls[a.delivered+1]
		if n == nil || !n.finished {
			return
		}
		a.delivered++
		delete(a.colls, n.epoch)
		a.deliverLocked(out, n)
	}
}

// failEpochsLocked fails every collective that has not started to
// complete job-wide and for which errf returns an error, then delivers what
// is now in order.
func (a *Agent) failEpochsLocked(out *outbox, errf func(*epochColl) error) {
	for _, c := range a.colls {
		if c.finished || c.started {
			continue
		}
		if err := errf(c); err != nil {
			c.finished, c.err = true, err
		}
	}
	a.deliverInOrderLocked(out)
}
