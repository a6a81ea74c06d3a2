package node

import (
	"fmt"
	"hash/fnv"
	"slices"
)

// Strategy is how a node fetches a sparse key it does not hold: the
// research's three designs ("PMI Extensions for Scalable MPI Startup",
// section 3; docs/kvs.md).
type Strategy uint8

const (
	// StrategyDirect asks the node of the rank that put the key when the
	// get names it (PMI-2 srcid, client.FromRank): one exchange. A get
	// that names no source falls back to Tree, so sparse puts also go up
	// the agent tree as under Tree (one batch per node to its parent,
	// where DKVS's copies would cost a message to every owner node).
	StrategyDirect Strategy = iota
	// StrategyDKVS hashes every key to an owner node: a sparse put is
	// placed there, a get asks there. Two exchanges per put and get.
	StrategyDKVS
	// StrategyTree sends a sparse put up the agent tree to pmirun, every
	// ancestor keeping a copy; a get goes up until a node holds the key,
	// and every node on the way caches the answer.
	StrategyTree
)

var strategyNames = [...]string{"direct", "dkvs", "tree"}

func (s Strategy) String() string { return strategyNames[s] }

// ParseStrategy parses --get-strategy ("" is direct).
func ParseStrategy(s string) (Strategy, error) {
	if s == "" {
		return StrategyDirect, nil
	}
	if i := slices.Index(strategyNames[:], s); i >= 0 {
		return Strategy(i), nil
	}
	return 0, fmt.Errorf("get strategy %q: want direct, dkvs or tree", s)
}

// rootNode is the router's name for pmirun, the agent tree's root.
const atRoot = -1

// router decides, for one node, where sparse keys are placed and where a
// get goes: a pure function of the strategy, the job's layout and the
// key. Nodes are indices into Spec.Nodes; atRoot is pmirun.
type router struct {
	strategy Strategy
	self     int
	nodes    int
	parent   int   // the tree parent: a node, or atRoot
	rankNode []int // node of each global rank
}

func newRouter(s Strategy, spec *Spec, self, parent int) router {
	rn := make([]int, spec.Size)
	for i, rs := range spec.Nodes {
		for _, r := range rs {
			rn[r] = i
		}
	}
	return router{strategy: s, self: self, nodes: len(spec.Nodes), parent: parent, rankNode: rn}
}

// owner is key's hash owner (DKVS).
func (r router) owner(key string) int { return KeyOwner(key, r.nodes) }

// KeyOwner is the node, of nodes, that owns key under DKVS: FNV-1a of
// the key modulo nodes.
func KeyOwner(key string, nodes int) int {
	h := fnv.New64a()
	h.Write([]byte(key))
	return int(h.Sum64() % uint64(nodes))
}

// up reports whether sparse puts go up the tree (Tree, and Direct's
// fallback): every agent on the way keeps them and passes them on.
func (r router) up() bool { return r.strategy != StrategyDKVS }

// placeAt is where this node places a sparse put of key; ok is false when
// the key stays here (this node is its owner).
func (r router) placeAt(key string) (to int, ok bool) {
	if r.up() {
		return r.parent, true
	}
	o := r.owner(key)
	return o, o != r.self
}

// named reports whether src names a rank of the job.
func (r router) named(src int) bool { return src >= 0 && src < len(r.rankNode) }

// fetchFrom is where this node asks for key, put by rank src (-1:
// unknown). It may be this node itself (the key is put here but not
// yet).
func (r router) fetchFrom(key string, src int) int {
	switch {
	case r.strategy == StrategyDirect && r.named(src):
		return r.rankNode[src]
	case r.up():
		return r.parent
	}
	return r.owner(key)
}

// final reports whether a get for key (put by src) routed to this node
// ends here: the key is put or placed here if it exists. Going up the
// tree only pmirun is final; agents pass a miss on.
func (r router) final(key string, src int) bool {
	switch {
	case r.strategy == StrategyDirect && r.named(src):
		return r.rankNode[src] == r.self
	case r.up():
		return false
	}
	return r.owner(key) == r.self
}
