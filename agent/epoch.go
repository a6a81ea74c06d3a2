package agent

import (
	"fmt"
	"maps"
	"slices"

	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/tree"
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
// completes it job-wide (UpFence/UpAllgather, answered by FenceDone/
// AllgatherDone). Epochs are delivered — ranks answered, a Result handed
// to the shared-memory front end — strictly in order.

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

// epochEntry is one local rank's part of a collective.
type epochEntry struct {
	in       bool
	detached bool // the rank went on working (Fence.Detached); waits only from rankState.waitFor on
	val      []byte
	to       to
}

// epochColl is one collective epoch on this node.
type epochColl struct {
	epoch    uint64
	kind     collKind
	entries  []epochEntry // by local index
	n        int          // entries in
	started  bool         // every local rank entered; Upstream is completing it
	finished bool         // Upstream answered (err holds its verdict)
	err      error
	puts     []KV     // a fence's job-wide puts
	values   [][]byte // an allgather's values, by rank
}

// enterEpoch adds rs to its next collective.
func (c *Core) enterEpoch(rs *rankState, kind collKind, val []byte, detached bool, t to) {
	rs.collSeq++
	e := rs.collSeq
	ec := c.colls[e]
	if ec == nil {
		if e <= c.delivered {
			// Only possible after a failure consumed the epoch.
			c.reply(t, Reply{Err: fmt.Errorf("%s %d already ended", kind, e), Epoch: e})
			return
		}
		ec = &epochColl{epoch: e, kind: kind, entries: make([]epochEntry, len(c.ranks))}
		c.colls[e] = ec
	}
	if ec.kind != kind {
		err := fmt.Errorf("rank %d entered %s as collective %d while other ranks entered %s", rs.global, kind, e, ec.kind)
		c.reply(t, Reply{Err: err, Epoch: e})
		c.finishEpoch(ec, err)
		return
	}
	if err := c.checkEpochPeers(ec, rs); err != nil {
		c.reply(t, Reply{Err: err, Epoch: e})
		c.finishEpoch(ec, err)
		return
	}
	ec.entries[rs.local] = epochEntry{in: true, detached: detached, val: val, to: t}
	ec.n++
	if kind == kindFence {
		c.mark(perf.PhaseFenceEnter, rs)
	}
	if ec.n < len(c.ranks) {
		c.checkStuck()
		return
	}
	ec.started = true
	c.contributed = e
	switch kind {
	case kindFence:
		c.up(UpCall{Kind: UpFence, Epoch: e, KVs: c.takePuts()})
	case kindAllgather:
		in := make([]tree.Entry, len(c.ranks))
		for i, p := range c.ranks {
			in[i] = tree.Entry{Rank: uint32(p.global), Value: ec.entries[i].val}
		}
		c.up(UpCall{Kind: UpAllgather, Epoch: e, Values: in})
	}
}

// BlockAll in Block.Until: the rank waits for every collective it entered.
const BlockAll = ^uint64(0)

// block records that rs now waits for its collectives up to until
// (BlockAll: all it entered), or with until 0 for nothing: every entry it
// has in an unfinished collective counts as detached from then on, and
// the gets it left parked are withdrawn. A rank cannot wait for an epoch
// it has not entered: a later one is its last.
func (c *Core) block(rs *rankState, until uint64) {
	if until == 0 {
		rs.waitFor = 0
		for _, ec := range c.colls {
			if e := &ec.entries[rs.local]; e.in {
				e.detached = true
			}
		}
		c.withdraw(rs, fmt.Errorf("rank %d stopped waiting", rs.global))
		return
	}
	rs.waitFor = min(until, rs.collSeq)
	c.checkStuck()
}

// waits reports whether rs waits for its entry in ec.
func (rs *rankState) waits(ec *epochColl) bool {
	e := &ec.entries[rs.local]
	return e.in && (!e.detached || ec.epoch <= rs.waitFor)
}

// checkEpochPeers fails a collective that a local rank can never enter
// because it finalized or is gone.
func (c *Core) checkEpochPeers(ec *epochColl, joining *rankState) error {
	if c.ended == 0 {
		return nil // the common case, at every entry: nobody to check
	}
	for _, p := range c.ranks {
		if p == joining || ec.entries[p.local].in || p.collSeq >= ec.epoch {
			continue
		}
		if p.gone || p.finalized {
			return fmt.Errorf("%s cannot complete: rank %d has %s", ec.kind, p.global, goneWord(p))
		}
	}
	return nil
}

// epochFinished is the Upstream's verdict on epoch e. A verdict for an
// epoch that is not waiting for one (already failed locally) is dropped.
func (c *Core) epochFinished(e uint64, kind collKind, puts []KV, values [][]byte, err error) {
	ec := c.colls[e]
	if ec == nil || !ec.started || ec.finished || ec.kind != kind {
		return
	}
	if err == nil && kind == kindAllgather && len(values) != c.cfg.size {
		err = fmt.Errorf("allgather %d: %d values for a job of %d ranks", e, len(values), c.cfg.size)
	}
	ec.puts, ec.values = puts, values
	c.finishEpoch(ec, err)
}

// finishEpoch records ec's verdict and delivers every epoch that is now
// next in order.
func (c *Core) finishEpoch(ec *epochColl, err error) {
	if ec.finished {
		return
	}
	ec.finished, ec.err = true, err
	c.deliverInOrder()
}

func (c *Core) deliver(ec *epochColl) {
	if ec.err == nil && ec.kind == kindFence {
		c.commit(ec.puts)
		c.fenceSeq++
	}
	if ec.err == nil && ec.kind == kindAllgather {
		c.agSeq++
		c.rd.Marks = append(c.rd.Marks, Mark{perf.PhaseAllgatherDone, -1})
	}
	res := Result{Epoch: ec.epoch, Allgather: ec.kind == kindAllgather, Err: ec.err}
	for i := range ec.entries {
		en := &ec.entries[i]
		if !en.in {
			continue
		}
		res.ShmEntered = res.ShmEntered || en.to.req.Via == ViaShm
		r := Reply{Err: ec.err, Epoch: ec.epoch}
		if ec.err == nil && ec.kind == kindAllgather {
			r.Values = ec.values
		}
		c.reply(en.to, r)
		if ec.err == nil && ec.kind == kindFence {
			c.mark(perf.PhaseFenceDone, c.ranks[i])
		}
	}
	if ec.err == nil {
		res.KVs, res.Values = ec.puts, ec.values
	}
	c.rd.Results = append(c.rd.Results, res)
	// Ranks that never entered a failed epoch skip it on entry.
	if ec.err != nil {
		for i, p := range c.ranks {
			if !ec.entries[i].in && p.collSeq < ec.epoch {
				p.collSeq = ec.epoch
			}
		}
	}
}

// deliverInOrder delivers every finished epoch that is next in order,
// stopping at the first that has not finished.
func (c *Core) deliverInOrder() {
	for {
		n := c.colls[c.delivered+1]
		if n == nil || !n.finished {
			return
		}
		c.delivered++
		delete(c.colls, n.epoch)
		c.deliver(n)
	}
}

// failEpochs fails, in epoch order, every collective that has not started
// to complete job-wide and for which errf returns an error, then delivers
// what is now in order.
func (c *Core) failEpochs(errf func(*epochColl) error) {
	for _, e := range slices.Sorted(maps.Keys(c.colls)) {
		ec := c.colls[e]
		if ec.finished || ec.started {
			continue
		}
		if err := errf(ec); err != nil {
			ec.finished, ec.err = true, err
		}
	}
	c.deliverInOrder()
}
