package agent

import (
	"fmt"
)

// allgatherColl is an allgather among all ranks: each rank contributes one
// value and receives every rank's value, indexed by rank. Ranks on shared
// memory and on the text protocol take part in the same allgather.
// Guarded by Agent.mu.
type allgatherColl struct {
	epoch   uint64
	entered map[*rankState]agEntry
	started bool
}

// agDone completes one rank's allgather request, under Agent.mu; on
// success the result is Agent.agValues.
type agDone func(out *outbox, err error, epoch uint64)

type agEntry struct {
	val  []byte
	done agDone
}

// enterAllgatherLocked adds rs's value to the allgather in progress.
func (a *Agent) enterAllgatherLocked(out *outbox, rs *rankState, val []byte, done agDone) {
	if a.ag == nil {
		a.ag = &allgatherColl{epoch: a.agSeq + 1, entered: make(map[*rankState]agEntry)}
	}
	g := a.ag
	if _, dup := g.entered[rs]; dup || g.started {
		done(out, fmt.Errorf("rank %d entered allgather %d twice", rs.global, g.epoch), 0)
		return
	}
	for _, p := range a.ranks {
		if _, in := g.entered[p]; !in && p != rs && (p.gone || p.finalized) {
			err := fmt.Errorf("allgather cannot complete: rank %d has %s", p.global, goneWord(p))
			done(out, err, 0)
			a.failAllgatherLocked(out, err)
			return
		}
	}
	g.entered[rs] = agEntry{val: val, done: done}
	if len(g.entered) < len(a.ranks) {
		a.checkStuckLocked(out)
		return
	}
	g.started = true
	in := make([]RankValue, 0, len(a.ranks))
	for _, p := range a.ranks {
		in = append(in, RankValue{Rank: p.global, Value: g.entered[p].val})
	}
	a.afterUnlock(func() {
		a.cfg.Upstream.Allgather(g.epoch, in, func(all [][]byte, err error) { a.allgatherFinished(g, all, err) })
	})
}

func (a *Agent) allgatherFinished(g *allgatherColl, all [][]byte, err error) {
	a.mu.Lock()
	var out outbox
	if a.ag == g {
		a.ag = nil
		if err == nil && len(all) != a.cfg.Size {
			err = fmt.Errorf("allgather %d: %d values for a job of %d ranks", g.epoch, len(all), a.cfg.Size)
		}
		if err == nil {
			a.agSeq = g.epoch
			a.agValues = all
			if a.agSink != nil {
				err = a.agSink(g.epoch, all)
			}
		}
		for _, e := range g.entered {
			e.done(&out, err, g.epoch)
		}
	}
	a.mu.Unlock()
	out.flush()
}

func (a *Agent) failAllgatherLocked(out *outbox, err error) {
	if a.ag == nil {
		return
	}
	for _, e := range a.ag.entered {
		e.done(out, err, 0)
	}
	a.ag = nil
}
