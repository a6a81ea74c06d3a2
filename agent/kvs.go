package agent

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/fastpmi/fastpmi/pmiwire"
)

// KV is one key-value pair of the job KVS and the global rank that put it.
type KV struct {
	Key, Val string
	Owner    int
}

// waiter is a request parked until something happens: a node attribute or
// a key being put.
type waiter struct {
	local int    // -1: another node's get (peer)
	to    to     // a local rank's request
	peer  uint64 // another node's: its ServeGet ID
}

// put stores a put of rs. Sparse keys are visible at once, answer parked
// gets and are placed for other nodes (remote.go); dense ones wait for the
// next fence; unhinted ones follow the job's KVSPolicy.
func (c *Core) put(rs *rankState, key, val string, hint pmiwire.Hint) {
	h := c.policyHint(hint)
	if _, fenced := c.kvs[key]; fenced && h != pmiwire.HintDense {
		// A key a fence has carried stays dense: every node holds its
		// fenced value, which only another fence can replace everywhere
		// (a sparse value would be shadowed by it on the other nodes).
		h = pmiwire.HintDense
	}
	switch h {
	case pmiwire.HintSparse:
		c.placeSparse(key, val, rs.global)
	default:
		rs.pending = append(rs.pending, KV{key, val, rs.global})
		rs.auto = append(rs.auto, h == pmiwire.HintNone)
	}
}

// takePuts returns the puts of every local rank since the last world
// fence (pendingPuts) and forgets them: the fence carries them to the
// job's other nodes.
func (c *Core) takePuts() []KV {
	c.takeAuto()
	puts := c.pendingPuts(nil)
	for _, r := range c.ranks {
		r.pending, r.auto = nil, nil
	}
	return puts
}

// pendingPuts returns the puts of ranks (every local rank, or those
// marked) since the last world fence, one per key: a repeated put
// replaces, and of two ranks putting one key the later in local order
// wins. Keys keep the position of their first put.
func (c *Core) pendingPuts(members []bool) []KV {
	n := 0
	for i, r := range c.ranks {
		if members == nil || members[i] {
			n += len(r.pending)
		}
	}
	if n == 0 {
		return nil
	}
	puts := make([]KV, 0, n)
	var at map[string]int // position in puts, once a key repeats might matter
	if n > 1 {
		at = make(map[string]int, n)
	}
	for i, r := range c.ranks {
		if members != nil && !members[i] {
			continue
		}
		for _, kv := range r.pending {
			if j, dup := at[kv.Key]; dup {
				puts[j] = kv
				continue
			}
			if at != nil {
				at[kv.Key] = len(puts)
			}
			puts = append(puts, kv)
		}
	}
	return puts
}

// lookup finds a key: a job attribute, a fenced key, or a sparse key.
func (c *Core) lookup(key string) (string, bool) {
	if v, ok := c.jobAttr(key); ok {
		return v, true
	}
	if v, ok := c.kvs[key]; ok {
		return v, true
	}
	v, ok := c.sparse[key]
	return v, ok
}

func (c *Core) get(rs *rankState, o Get) {
	t := to{o.Local, o.Req, ReplyGet}
	if c.lateWait(o.Key, t) {
		return
	}
	if v, found := c.lookup(o.Key); found {
		c.reply(t, Reply{Found: true, Val: v})
		return
	}
	if _, err := checkPut(o.Key, ""); err != nil {
		// No put can make the key (an empty, long or PMI_ one): it is
		// not found here or anywhere, and never waited for.
		c.reply(t, Reply{})
		return
	}
	if c.multi() {
		src := o.Src
		if src < 0 || src >= c.cfg.size {
			src = -1
		}
		c.remoteGet(t, o.Key, src, o.Wait)
		return
	}
	if !o.Wait {
		c.reply(t, Reply{})
		return
	}
	c.park(rs, "kvs:"+o.Key, t)
}

// commit makes fenced puts visible and answers gets parked on them.
func (c *Core) commit(kvs []KV) {
	for _, kv := range kvs {
		c.kvs[kv.Key] = kv.Val
	}
	for _, kv := range kvs {
		c.release("kvs:"+kv.Key, kv.Val)
	}
}

// park parks t until key (of namespace "kvs:" or "attr:") appears, unless
// that can never happen because every live rank is then waiting.
func (c *Core) park(rs *rankState, key string, t to) {
	c.waits[key] = append(c.waits[key], waiter{local: rs.local, to: t})
	rs.parked++
	c.parkedLocal++
	c.checkStuck()
}

// unpark counts local waiter w out of c.waits (its caller takes it out).
func (c *Core) unpark(w waiter) {
	c.ranks[w.local].parked--
	c.parkedLocal--
}

func (c *Core) release(key, val string) {
	for _, w := range c.waits[key] {
		if w.local < 0 {
			c.answer(w.peer, true, val, nil)
			continue
		}
		c.unpark(w)
		c.reply(w.to, Reply{Found: true, Val: val})
	}
	delete(c.waits, key)
	if k, ok := strings.CutPrefix(key, "kvs:"); ok {
		c.releaseFetches(k, val)
	}
}

// failWaiters answers every request of a local rank parked here with
// err, in key order. Other nodes' gets waiting here stay: a put another
// node places here may still answer them, after this node's own ranks
// are done; they end with their own nodes.
func (c *Core) failWaiters(err error) {
	for _, k := range slices.Sorted(maps.Keys(c.waits)) {
		var peers []waiter
		for _, w := range c.waits[k] {
			if w.local < 0 {
				peers = append(peers, w)
				continue
			}
			c.unpark(w)
			c.reply(w.to, Reply{Err: err})
		}
		if peers != nil {
			c.waits[k] = peers
		} else {
			delete(c.waits, k)
		}
	}
}

// withdraw answers every get and node-attribute read of rs parked here,
// or fetched from another node, with err and forgets it: rs stopped
// waiting for them (its call was cut short), so they no longer make it
// stuck, and a value put later answers nobody of rs.
func (c *Core) withdraw(rs *rankState, err error) {
	for _, k := range slices.Sorted(maps.Keys(c.waits)) {
		if rs.parked == 0 {
			break
		}
		kept := c.waits[k][:0]
		for _, w := range c.waits[k] {
			if w.local == rs.local {
				c.unpark(w)
				c.reply(w.to, Reply{Err: err})
				continue
			}
			kept = append(kept, w)
		}
		if len(kept) == 0 {
			delete(c.waits, k)
		} else {
			c.waits[k] = kept
		}
	}
	for _, id := range slices.Sorted(maps.Keys(c.fetchByID)) {
		f := c.fetchByID[id]
		kept := f.ranks[:0]
		for _, t := range f.ranks {
			if t.local == rs.local {
				c.reply(t, Reply{Err: err})
				continue
			}
			kept = append(kept, t)
		}
		f.ranks = kept
	}
}

// blocked reports what rs waits for, or "" if it is not blocked in the
// agent. A collective that has started (all local ranks in, waiting for
// the rest of the job) does not count: it progresses elsewhere; nor does
// one the rank entered detached and does not wait for yet (it may still
// put what another rank waits for).
func (c *Core) blocked(rs *rankState) string {
	if b, _ := c.blockedIn(rs); !b {
		return ""
	}
	for _, e := range c.colls {
		if rs.waits(e) && !e.started && !e.finished {
			return e.kind.String()
		}
	}
	if rs.grouped > 0 {
		for k, g := range c.groups {
			if g.entered[rs.local].in {
				return "barrier " + k
			}
		}
	}
	if c.ringBlocked(rs) {
		return "ring"
	}
	if rs.parked > 0 {
		for k, ws := range c.waits {
			for _, w := range ws {
				if w.local == rs.local {
					return "get of " + strings.TrimPrefix(strings.TrimPrefix(k, "kvs:"), "attr:")
				}
			}
		}
	}
	return ""
}

// blockedIn is blocked without the name: whether rs is blocked in the
// agent and, if so, whether in a get (not a collective, barrier or ring).
// It reads counts and the few unfinished collectives and rings, not the
// parked requests: checkStuck asks it of every rank at every entry into
// a wait, and names what the ranks wait for only for a deadlock.
func (c *Core) blockedIn(rs *rankState) (blocked, inGet bool) {
	for _, e := range c.colls {
		if rs.waits(e) && !e.started && !e.finished {
			return true, false
		}
	}
	if rs.grouped > 0 || c.ringBlocked(rs) {
		return true, false
	}
	return rs.parked > 0, rs.parked > 0
}

// checkStuck ends a deadlock: when every live local rank is blocked and
// nothing is in progress, no put can ever come and no collective can
// complete, so every waiting request fails with a message saying who waits
// for what. In a job that spans nodes, a get may be answered by another
// node, so only node attributes are judged there.
func (c *Core) checkStuck() {
	// It runs at every entry into a wait: first a bound in the number of
	// collectives and waits, not of ranks. A rank is blocked only as an
	// entry of an unstarted collective, barrier group or ring, or as a
	// waiting get; with fewer entries than live ranks, one still runs.
	entries := 0
	for _, e := range c.colls {
		if !e.started && !e.finished {
			entries += e.n
		}
	}
	entries += c.grouped + c.ringWaiting + c.parkedLocal
	if entries < len(c.ranks)-c.ended {
		return
	}
	single := c.cfg.size == len(c.ranks)
	live := 0
	for _, p := range c.ranks {
		if p.gone || p.finalized {
			continue
		}
		blocked, inGet := c.blockedIn(p)
		if !blocked || (!single && !inGet) {
			return
		}
		live++
	}
	if live == 0 {
		return
	}
	if !single {
		// Only node-attribute waits can be judged locally.
		for k := range c.waits {
			if strings.HasPrefix(k, "kvs:") {
				return
			}
		}
	}
	var stuck []string
	for _, p := range c.ranks {
		if !p.gone && !p.finalized {
			stuck = append(stuck, fmt.Sprintf("rank %d in %s", p.global, c.blocked(p)))
		}
	}
	slices.Sort(stuck)
	if len(stuck) > 4 {
		stuck = append(stuck[:4], fmt.Sprintf("and %d more", len(stuck)-4))
	}
	err := fmt.Errorf("deadlock: every live rank waits (%s)", strings.Join(stuck, ", "))
	c.failWaiters(err)
	c.failAll(err)
}
