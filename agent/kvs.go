package agent

import (
	"fmt"
	"sort"
	"strings"
)

// Hint says how a put travels (the research's put hints).
type Hint uint8

const (
	// HintNone: PMI semantics, visible to gets after the next fence.
	HintNone Hint = iota
	// HintDense: like HintNone; the key travels with the fence (gather and
	// broadcast), for keys most ranks will read.
	HintDense
	// HintSparse: the key stays with its owner and is visible to gets at
	// once, fetched on demand; for keys few ranks read.
	HintSparse
)

// waiter is a request parked until something happens: a node attribute or
// a key being put.
type waiter struct {
	rs *rankState
	d  deferred
}

// putLocked stores a put of rs. Sparse keys are visible at once and
// answer parked gets; the others wait for the next fence.
func (a *Agent) putLocked(out *outbox, rs *rankState, key, val string, hint Hint) {
	if hint == HintSparse {
		a.sparse[key] = val
		a.releaseLocked(out, "kvs:"+key, val)
		return
	}
	rs.pending = append(rs.pending, KV{key, val})
}

// lookupLocked finds a key: a job attribute, a fenced key, or a sparse key.
func (a *Agent) lookupLocked(key string) (string, bool) {
	if v, ok := a.jobAttr(key); ok {
		return v, true
	}
	if v, ok := a.kvs[key]; ok {
		return v, true
	}
	v, ok := a.sparse[key]
	return v, ok
}

// commitLocked makes fenced puts visible and answers gets parked on them.
func (a *Agent) commitLocked(out *outbox, kvs []KV) {
	for _, kv := range kvs {
		a.kvs[kv.Key] = kv.Val
	}
	for _, kv := range kvs {
		a.releaseLocked(out, "kvs:"+kv.Key, kv.Val)
	}
}

// parkLocked parks d until key (of namespace "kvs:" or "attr:") appears,
// unless that can never happen because every live rank is then waiting.
func (a *Agent) parkLocked(out *outbox, rs *rankState, key string, d deferred) {
	a.waits[key] = append(a.waits[key], waiter{rs, d})
	a.checkStuckLocked(out)
}

func (a *Agent) releaseLocked(out *outbox, key, val string) {
	for _, w := range a.waits[key] {
		out.complete(w.d, nil, val)
	}
	delete(a.waits, key)
}

// blockedLocked reports what rs waits for, or "" if it is not blocked in
// the agent. A collective that has started (all local ranks in, waiting
// for the rest of the job) does not count: it progresses elsewhere.
func (a *Agent) blockedLocked(rs *rankState) string {
	for _, c := range a.colls {
		if _, in := c.entered[rs]; in && !c.started && !c.finished {
			return c.kind.String()
		}
	}
	for k, g := range a.groups {
		if _, in := g.entered[rs]; in {
			return "barrier " + k
		}
	}
	if a.ringBlockedLocked(rs) {
		return "ring"
	}
	for k, ws := range a.waits {
		for _, w := range ws {
			if w.rs == rs {
				return "get of " + strings.TrimPrefix(strings.TrimPrefix(k, "kvs:"), "attr:")
			}
		}
	}
	return ""
}

// checkStuckLocked ends a deadlock: when every live local rank is blocked
// and nothing is in progress, no put can ever come and no collective can
// complete, so every waiting request fails with a message saying who waits
// for what. In a job that spans nodes, a get may be answered by another
// node, so only node attributes are judged there.
func (a *Agent) checkStuckLocked(out *outbox) {
	// It runs at every entry into a wait: first a bound in the number of
	// collectives and waits, not of ranks. A rank is blocked only as an
	// entry of an unstarted collective, barrier group or ring, or as a
	// waiting get; with fewer entries than live ranks, one still runs.
	entries := 0
	for _, c := range a.colls {
		if !c.started && !c.finished {
			entries += len(c.entered)
		}
	}
	for _, g := range a.groups {
		entries += len(g.entered)
	}
	entries += a.ringWaiting
	for _, ws := range a.waits {
		entries += len(ws)
	}
	if entries < len(a.ranks)-a.ended {
		return
	}
	single := a.cfg.Size == len(a.ranks)
	var stuck []string
	for _, p := range a.ranks {
		if p.gone || p.finalized {
			continue
		}
		what := a.blockedLocked(p)
		if what == "" {
			return
		}
		if !single && !strings.HasPrefix(what, "get of ") {
			return
		}
		stuck = append(stuck, fmt.Sprintf("rank %d in %s", p.global, what))
	}
	if len(stuck) == 0 {
		return
	}
	if !single {
		// Only node-attribute waits can be judged locally.
		for k := range a.waits {
			if strings.HasPrefix(k, "kvs:") {
				return
			}
		}
	}
	sort.Strings(stuck)
	if len(stuck) > 4 {
		stuck = append(stuck[:4], fmt.Sprintf("and %d more", len(stuck)-4))
	}
	err := fmt.Errorf("deadlock: every live rank waits (%s)", strings.Join(stuck, ", "))
	for k, ws := range a.waits {
		for _, w := range ws {
			out.complete(w.d, err, "")
		}
		delete(a.waits, k)
	}
	a.failAllLocked(out, err)
}
