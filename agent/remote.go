package agent

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fastpmi/fastpmi/pmiwire"
)

// On-demand KVS: the core's half of the research's enhanced get (issue
// "on-demand KVS"; docs/kvs.md). In a job that spans nodes a key is
// either dense — carried to every node by the fence that follows its put
// (gather and one compressed broadcast) — or sparse: it stays on the node
// of the rank that put it, is placed where the job's get strategy will
// look for it (Upstream.Place: the key's hash owner, or every ancestor up
// the tree), and is fetched on demand (Upstream.Fetch) by a node whose
// rank asks for it. Where a key lives and how a request reaches it is the
// shell's business (agent/node); the core decides what is dense, answers
// gets from what it holds, parks what has to wait, coalesces fetches and
// caches what they bring.
//
// Requests from other nodes come in as ServeGet (a get routed here) and
// PlaceKV (a put placed here); ServeGet is answered through an UpAnswer
// call naming the request's ID, which the agent maps back to its done
// callback.
//
// Consistency, as in the research: a fetched value is cached with the
// fence epoch it was fetched in and never served after a later fence (a
// key put again after a fence is fetched again); a get for a key that is
// not yet put waits where the put will arrive (a callback list there, no
// polling), when the rank asked to wait.

// KVSPolicy says what happens to keys put without a hint.
type KVSPolicy uint8

const (
	// PolicyAuto: unhinted keys travel with the fence, unless a node's
	// unhinted puts of one fence exceed AutoDenseMax bytes: those stay
	// sparse and are fetched on demand. The default.
	PolicyAuto KVSPolicy = iota
	// PolicyDense: unhinted keys travel with the fence (as every PMI).
	PolicyDense
	// PolicySparse: unhinted keys are sparse; a fence carries no values.
	PolicySparse
)

var policyNames = [...]string{"auto", "dense", "sparse"}

func (p KVSPolicy) String() string { return policyNames[p] }

// ParseKVSPolicy parses --kvs: "auto", "dense" or "sparse" ("" is auto).
func ParseKVSPolicy(s string) (KVSPolicy, error) {
	if s == "" {
		return PolicyAuto, nil
	}
	if i := slices.Index(policyNames[:], s); i >= 0 {
		return KVSPolicy(i), nil
	}
	return 0, fmt.Errorf("kvs policy %q: want auto, dense or sparse", s)
}

// AutoDenseMax is how many bytes of unhinted puts (keys and values) one
// node may send with one fence under PolicyAuto; past it they stay
// sparse. Every node then receives every node's share, so the budget is
// per node: an MPI library's business cards (~100-200 bytes per rank,
// read by every rank) stay dense up to hundreds of ranks per node, while
// bulk values that few ranks read stop being broadcast.
const AutoDenseMax = 64 << 10

// MaxRemoteCacheBytes bounds the values a node keeps from fetches
// (keys and values); past it fetched values are served but not cached
// (Stats.CacheBytes counts what is kept).
const MaxRemoteCacheBytes = 64 << 20

// Remote operations: requests from other nodes, and fetch answers.
type (
	// ServeGet is a get another node routed here (ID: the shell's handle
	// for the answer, echoed in UpAnswer). Final says this node is where
	// the key is placed for the request's route: a miss is then answered
	// "not found" (or waits, with Wait); otherwise the node fetches the key
	// itself (Tree: up to its parent) and answers when that returns.
	ServeGet struct {
		ID    uint64
		Key   string
		Src   int // the rank that put the key, or -1
		Wait  bool
		Final bool
	}
	// PlaceKV is a sparse put another node placed here.
	PlaceKV struct {
		Key, Val string
		Owner    int
	}
	// FetchDone is the Upstream's answer to UpFetch call ID.
	FetchDone struct {
		ID    uint64
		Found bool
		Val   string
		Err   error
	}
)

func (ServeGet) isOp()  {}
func (PlaceKV) isOp()   {}
func (FetchDone) isOp() {}

// cached is a value fetched from another node, valid until the next
// fence.
type cached struct {
	val   string
	fence uint64 // c.fenceSeq when it was fetched
}

// fetch is one outstanding remote get for a key: the requests queued
// behind it, local ranks and other nodes alike (node coalescing: one
// remote request per key, wait flag and source at a time).
type fetch struct {
	id    uint64
	key   fetchKey
	ranks []to     // local ranks' gets
	peers []uint64 // ServeGet IDs of other nodes' gets routed through here
}

type fetchKey struct {
	key  string
	wait bool
	src  int
}

// multi reports whether the job spans more than this node.
func (c *Core) multi() bool { return c.cfg.size != len(c.ranks) }

// policyHint is hint h of a put under the job's policy: HintNone becomes
// dense or sparse, except under PolicyAuto where it stays HintNone until
// the fence decides (takeAuto).
func (c *Core) policyHint(h pmiwire.Hint) pmiwire.Hint {
	if h != pmiwire.HintNone {
		return h
	}
	switch c.cfg.policy {
	case PolicyDense:
		return pmiwire.HintDense
	case PolicySparse:
		return pmiwire.HintSparse
	}
	return pmiwire.HintNone
}

// placeSparse stores a sparse put of this node and places it for the
// job's other nodes.
func (c *Core) placeSparse(key, val string, owner int) {
	c.sparse[key] = val
	c.release("kvs:"+key, val)
	if c.multi() {
		c.up(UpCall{Kind: UpPlace, Name: key, Port: val, Owner: owner})
	}
}

// takeAuto decides, at a world fence, what this node's unhinted puts
// since the last one are: dense (left with the fence's puts) when they
// fit AutoDenseMax, otherwise sparse (taken out and placed now).
func (c *Core) takeAuto() {
	if !c.multi() {
		return
	}
	n := 0
	for _, r := range c.ranks {
		for i, kv := range r.pending {
			if r.auto[i] {
				n += len(kv.Key) + len(kv.Val)
			}
		}
	}
	if n <= AutoDenseMax {
		return
	}
	c.autoSparse++
	for _, r := range c.ranks {
		keep, auto := r.pending[:0], r.auto[:0]
		for i, kv := range r.pending {
			if r.auto[i] {
				c.placeSparse(kv.Key, kv.Val, kv.Owner)
				continue
			}
			keep, auto = append(keep, kv), append(auto, false)
		}
		r.pending, r.auto = keep, auto
	}
}

// remoteGet answers local get t of key after a local miss in a job that
// spans nodes: from the cache, or by a fetch.
func (c *Core) remoteGet(t to, key string, src int, wait bool) {
	if v, ok := c.fresh(key); ok {
		c.reply(t, Reply{Found: true, Val: v})
		return
	}
	f := c.fetchFor(fetchKey{key, wait, src})
	f.ranks = append(f.ranks, t)
}

// fresh returns key's cached value if it was fetched since the last fence.
func (c *Core) fresh(key string) (string, bool) {
	e, ok := c.remote[key]
	if !ok {
		return "", false
	}
	if e.fence != c.fenceSeq {
		delete(c.remote, key)
		c.cacheBytes -= len(key) + len(e.val)
		return "", false
	}
	return e.val, true
}

// fetchFor returns the outstanding fetch for k, starting one if none is.
func (c *Core) fetchFor(k fetchKey) *fetch {
	if f := c.fetches[k]; f != nil {
		c.coalesced++
		return f
	}
	c.callSeq++
	f := &fetch{id: c.callSeq, key: k}
	c.fetches[k] = f
	c.fetchByID[f.id] = f
	c.fetchesSent++
	c.up(UpCall{Kind: UpFetch, ID: f.id, Name: k.key, Src: k.src, Wait: k.wait})
	return f
}

// serveGet answers a get another node routed here.
func (c *Core) serveGet(o ServeGet) {
	c.served++
	if v, ok := c.kvs[o.Key]; ok {
		c.answer(o.ID, true, v, nil)
		return
	}
	if v, ok := c.sparse[o.Key]; ok {
		c.answer(o.ID, true, v, nil)
		return
	}
	if v, ok := c.fresh(o.Key); ok && !o.Final {
		c.answer(o.ID, true, v, nil)
		return
	}
	switch {
	case !o.Final:
		f := c.fetchFor(fetchKey{o.Key, o.Wait, o.Src})
		f.peers = append(f.peers, o.ID)
	case o.Wait:
		c.waits["kvs:"+o.Key] = append(c.waits["kvs:"+o.Key], waiter{local: -1, peer: o.ID})
	default:
		c.answer(o.ID, false, "", nil)
	}
}

// answer answers ServeGet id.
func (c *Core) answer(id uint64, found bool, val string, err error) {
	c.up(UpCall{Kind: UpAnswer, ID: id, Found: found, Port: val, Err: err})
}

// placeKV stores a sparse put another node placed here, or refuses it
// over the node's quota (the placing node's fence then fails with it).
func (c *Core) placeKV(o PlaceKV) error {
	n := len(o.Key) + len(o.Val)
	if old, ok := c.sparse[o.Key]; ok {
		n -= len(o.Key) + len(old)
	}
	if c.placedBytes+n > MaxPutBytesPerNode {
		c.placeRefused++
		return fmt.Errorf("%w: the keys other nodes placed on this node pass %d bytes", ErrQuota, MaxPutBytesPerNode)
	}
	c.placedBytes += n
	c.sparse[o.Key] = o.Val
	c.release("kvs:"+o.Key, o.Val)
	return nil
}

// fetchDone delivers a fetch's answer to everything queued behind it.
func (c *Core) fetchDone(o FetchDone) {
	f := c.fetchByID[o.ID]
	if f == nil {
		return // answered already by a put or fence that brought the key here
	}
	c.dropFetch(f)
	if o.Err == nil && o.Found {
		c.cache(f.key.key, o.Val)
	}
	for _, t := range f.ranks {
		c.reply(t, Reply{Found: o.Found && o.Err == nil, Val: o.Val, Err: o.Err})
	}
	for _, id := range f.peers {
		c.answer(id, o.Found, o.Val, o.Err)
	}
}

func (c *Core) dropFetch(f *fetch) {
	delete(c.fetches, f.key)
	delete(c.fetchByID, f.id)
}

// cache keeps a fetched value for this fence epoch, within
// MaxRemoteCacheBytes.
func (c *Core) cache(key, val string) {
	if old, ok := c.remote[key]; ok {
		c.cacheBytes -= len(key) + len(old.val)
	}
	n := len(key) + len(val)
	if c.cacheBytes+n > MaxRemoteCacheBytes {
		delete(c.remote, key)
		return
	}
	c.remote[key] = cached{val, c.fenceSeq}
	c.cacheBytes += n
}

// releaseFetches answers, with val, every fetch of key: the key arrived
// here (a local put, a placed put or a fence) before the fetch returned.
// The fetch's own answer is then dropped.
func (c *Core) releaseFetches(key, val string) {
	if len(c.fetches) == 0 {
		return
	}
	var hit []*fetch
	for k, f := range c.fetches {
		if k.key == key {
			hit = append(hit, f)
		}
	}
	slices.SortFunc(hit, func(a, b *fetch) int { return int(a.id - b.id) })
	for _, f := range hit {
		c.dropFetch(f)
		for _, t := range f.ranks {
			c.reply(t, Reply{Found: true, Val: val})
		}
		for _, id := range f.peers {
			c.answer(id, true, val, nil)
		}
	}
}

// failFetches fails the local ranks' part of every outstanding fetch
// with err. A fetch made for other nodes' gets (Tree) goes on: this node
// still forwards for them once its own ranks are done.
func (c *Core) failFetches(err error) {
	ids := make([]uint64, 0, len(c.fetchByID))
	for id := range c.fetchByID {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		f := c.fetchByID[id]
		for _, t := range f.ranks {
			c.reply(t, Reply{Err: err})
		}
		f.ranks = nil
		if len(f.peers) == 0 {
			c.dropFetch(f)
		}
	}
}

// Waiting is this node's part of the job-wide deadlock check (pmirun
// judges it; agent/node reports it): whether every live local rank is
// waiting in the agent — in a get (here or fetched), a collective
// (started or not; one entered detached only once the rank waits for it),
// a barrier or a ring — and, if so, how many wait in
// gets, what the first few wait for and the first collective epoch a
// rank waits in (0: none). A node whose ranks are all done is not
// Waiting: it has nobody left to wait.
func (c *Core) Waiting() (all bool, gets int, what []string, epoch uint64) {
	fetching := make(map[int]string) // local rank → the key it fetches (the least, for a stable message)
	for k, f := range c.fetches {
		for _, t := range f.ranks {
			if old, ok := fetching[t.local]; !ok || k.key < old {
				fetching[t.local] = k.key
			}
		}
	}
	live := 0
	for _, rs := range c.ranks {
		if rs.gone || rs.finalized {
			continue
		}
		live++
		w, get := c.waitingFor(rs)
		if k, ok := fetching[rs.local]; ok {
			w, get = "get of "+k, true
		}
		if w == "" {
			return false, 0, nil, 0
		}
		if get {
			gets++
		}
		if len(what) < 4 {
			what = append(what, fmt.Sprintf("rank %d in %s", rs.global, w))
		}
		for e, ec := range c.colls {
			if rs.waits(ec) && !ec.finished && (epoch == 0 || e < epoch) {
				epoch = e
			}
		}
	}
	return live > 0, gets, what, epoch
}

// Contributed is the last collective epoch this node has contributed to
// the job (every local rank entered it), 0 if none: the job's other
// nodes wait in later epochs in vain once this node's ranks are done.
func (c *Core) Contributed() uint64 { return c.contributed }

// waitingFor says what rs waits for in the agent besides a fetch, ""
// if nothing; get says it is a get.
func (c *Core) waitingFor(rs *rankState) (what string, get bool) {
	if w := c.blocked(rs); w != "" {
		return w, strings.HasPrefix(w, "get of ")
	}
	for _, e := range c.colls {
		if rs.waits(e) && !e.finished {
			return e.kind.String(), false
		}
	}
	if rs.inRing {
		return "ring", false
	}
	return "", false
}
