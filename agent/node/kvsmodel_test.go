package node

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/tree"
)

// A differential test of the on-demand KVS across nodes: K agent cores,
// the router of each strategy and a simulated network that delivers
// messages in random order run random programs, and every get is checked
// against a naive reference — one global map per fence epoch. The shell
// here does what kvsnet.go does (places acknowledged before a fence,
// fetches routed by the router, answers sent back, Tree forwarding and a
// pmirun store at the top), so the test covers the core's caching,
// coalescing, waiting and staleness rules under every strategy and
// policy together with the routing.
//
// Each epoch every rank first puts its keys (a key has one putter per
// epoch, sparse or dense, and a dense one sometimes a second, whose value
// wins if its rank is higher), then gets some keys — with wait only keys that
// exist or are put sparse in this epoch, so that no get can wait forever
// — then all ranks fence. A get may return the key's value as of the
// last fence, or its value put in this epoch if that put was sparse;
// "not found" only when neither exists (a non-waiting get).
func TestKVSModel(t *testing.T) {
	for seed := range uint64(500) {
		r := rand.New(rand.NewPCG(seed, 7))
		m := newKVSModel(t, r)
		if err := m.run(); err != nil {
			t.Fatalf("seed %d (%s, %s, K=%d, P=%d): %v", seed, m.strategy, m.policy, m.k, m.p, err)
		}
	}
}

type kvsModel struct {
	t        *testing.T
	r        *rand.Rand
	strategy Strategy
	policy   agent.KVSPolicy
	k, p     int
	nodes    []*modelNode
	topo     tree.Topology
	ranks    []*modelRank
	rankNode []int
	net      []modelMsg
	root     struct {
		vals  map[string]string
		waits map[string][]modelMsg
	}
	// The reference: per epoch, the values as of the fence before it and
	// its own puts.
	epoch     int
	ref       []modelEpoch // by epoch - 1
	committed map[string]string
	fenceIn   int      // nodes that contributed to the fence
	fenceKVs  [][]byte // their puts, each node's encoded as its shell sends them (tree.KV)
	keys      []string
	putBy     map[string]int  // the rank that puts each key
	dense     map[string]bool // keys a fence has carried
	err       error           // the first error of a deferred step
}

type modelEpoch struct {
	old map[string]string
	now map[string]modelPut
}

type modelPut struct {
	val    string
	sparse bool
}

type modelNode struct {
	idx     int
	core    *agent.Core
	rt      router
	local   []int // global ranks
	places  int   // placements sent, not yet acknowledged
	held    *agent.UpCall
	seq     uint64
	fetches map[uint64]uint64   // shell fetch id → core fetch id
	answers map[uint64]modelMsg // core ServeGet id → the get to answer
	ansSeq  uint64
	placeBy map[uint64]modelMsg // Tree: placements forwarded up, by shell id → the child's place to acknowledge
}

type modelRank struct {
	g, node, local int
	ops            []modelOp
	next           int
	waiting        bool
	reqID          uint64
}

type modelOp struct {
	epoch int
	put   bool
	key   string
	val   string
	hint  pmiwire.Hint
	wait  bool
	src   int
	fence bool
}

type modelMsg struct {
	to, from int // node indices; atRoot = pmirun
	op       string
	id       uint64
	key, val string
	owner    int
	src      int
	wait     bool
	found    bool
	fence    *agent.FenceDone
}

func newKVSModel(t *testing.T, r *rand.Rand) *kvsModel {
	m := &kvsModel{t: t, r: r, strategy: Strategy(r.IntN(3)), policy: agent.KVSPolicy(r.IntN(3)),
		k: 2 + r.IntN(4), committed: map[string]string{}}
	m.p = m.k * (1 + r.IntN(3))
	spec := &Spec{Size: m.p, Nodes: make([][]int, m.k)}
	m.rankNode = make([]int, m.p)
	for g := range m.p {
		n := g % m.k
		if r.IntN(2) == 0 {
			n = g * m.k / m.p
		}
		m.rankNode[g] = n
		spec.Nodes[n] = append(spec.Nodes[n], g)
	}
	for i := range m.k {
		if len(spec.Nodes[i]) == 0 { // every node needs a rank: move one
			for j := range m.k {
				if len(spec.Nodes[j]) > 1 {
					g := spec.Nodes[j][len(spec.Nodes[j])-1]
					spec.Nodes[j] = spec.Nodes[j][:len(spec.Nodes[j])-1]
					spec.Nodes[i] = append(spec.Nodes[i], g)
					m.rankNode[g] = i
					break
				}
			}
		}
	}
	topo, err := tree.NewTopology(m.k+1, 2)
	if err != nil {
		t.Fatal(err)
	}
	m.topo = topo
	for i := range m.k {
		parent := atRoot
		if p := topo.Parent(i + 1); p > 0 {
			parent = p - 1
		}
		cfg := agent.Config{JobID: "j", Size: m.p, Local: spec.Nodes[i], KVS: m.policy}
		n := &modelNode{idx: i, core: agent.NewCore(&cfg, 0, len(spec.Nodes[i])), rt: newRouter(m.strategy, spec, i, parent),
			local: spec.Nodes[i], fetches: map[uint64]uint64{}, answers: map[uint64]modelMsg{}, placeBy: map[uint64]modelMsg{}}
		m.nodes = append(m.nodes, n)
	}
	m.ranks = make([]*modelRank, m.p)
	for i, n := range m.nodes {
		for li, g := range n.local {
			m.ranks[g] = &modelRank{g: g, node: i, local: li}
		}
	}
	for i := range 2 + r.IntN(6) {
		m.keys = append(m.keys, fmt.Sprintf("k%d", i))
	}
	m.root.vals, m.root.waits = map[string]string{}, map[string][]modelMsg{}
	m.putBy, m.dense = map[string]int{}, map[string]bool{}
	return m
}

// program appends every rank's ops of epoch m.epoch and records the
// reference's puts: ref[e] holds the values as of fence e-1 (old) and
// epoch e's puts (now).
func (m *kvsModel) program() {
	now := map[string]modelPut{}
	var puts [][]modelOp = make([][]modelOp, m.p)
	for _, k := range m.keys {
		if m.r.IntN(3) == 0 {
			continue // not put this epoch
		}
		g := m.r.IntN(m.p)
		if p, ok := m.putBy[k]; ok {
			g = p // a key is put again by the same rank (docs/kvs.md)
		}
		m.putBy[k] = g
		hint := []pmiwire.Hint{pmiwire.HintNone, pmiwire.HintDense, pmiwire.HintSparse}[m.r.IntN(3)]
		sparse := hint == pmiwire.HintSparse || hint == pmiwire.HintNone && m.policy == agent.PolicySparse
		if m.dense[k] {
			sparse = false // a key a fence carried stays dense
		}
		if !sparse {
			m.dense[k] = true
		}
		v := fmt.Sprintf("%s@%d", k, m.epoch)
		now[k] = modelPut{v, sparse}
		puts[g] = append(puts[g], modelOp{epoch: m.epoch, put: true, key: k, val: v, hint: hint})
		if g2 := m.r.IntN(m.p); !sparse && g2 != g && m.r.IntN(4) == 0 {
			// A second rank puts the dense key in the same epoch: the
			// fence keeps the higher rank's value on every node.
			v2 := fmt.Sprintf("%s@%d/%d", k, m.epoch, g2)
			puts[g2] = append(puts[g2], modelOp{epoch: m.epoch, put: true, key: k, val: v2, hint: pmiwire.HintDense})
			if g2 > g {
				now[k] = modelPut{v2, false}
			}
		}
	}
	old := m.committed
	m.ref = append(m.ref, modelEpoch{old: old, now: now})
	for g, rk := range m.ranks {
		rk.ops = append(rk.ops, puts[g]...)
		for range m.r.IntN(4) {
			k := m.keys[m.r.IntN(len(m.keys))]
			_, hasOld := old[k]
			p, isNow := now[k]
			wait := m.r.IntN(2) == 0 && (hasOld || isNow && p.sparse)
			src := -1
			if m.r.IntN(2) == 0 {
				src = m.putter(k)
			}
			rk.ops = append(rk.ops, modelOp{epoch: m.epoch, key: k, wait: wait, src: src})
		}
		rk.ops = append(rk.ops, modelOp{epoch: m.epoch, fence: true})
	}
	next := maps.Clone(old)
	for k, p := range now {
		next[k] = p.val
	}
	m.committed = next
}

// putter is the rank that puts k, or, for a key never put, any rank
// (Direct trusts the source a get names: programs name the putter).
func (m *kvsModel) putter(k string) int {
	if g, ok := m.putBy[k]; ok {
		return g
	}
	return m.r.IntN(m.p)
}

func (m *kvsModel) run() error {
	// Every epoch's program first; the ranks then run through them at
	// their own pace: a rank goes on to the next epoch as soon as its
	// fence is answered, while messages of the last one may still be on
	// their way.
	for m.epoch = 1; m.epoch <= 4; m.epoch++ {
		m.program()
	}
	for _, rk := range m.ranks {
		if err := m.advance(rk); err != nil {
			return err
		}
	}
	if m.err != nil {
		return m.err
	}
	for steps := 0; len(m.net) > 0 || m.busy(); steps++ {
		if steps > 200000 {
			return errors.New("no progress")
		}
		if len(m.net) == 0 {
			return fmt.Errorf("ranks wait with nothing on the network: %s", m.who())
		}
		i := m.r.IntN(len(m.net))
		msg := m.net[i]
		m.net = append(m.net[:i], m.net[i+1:]...)
		if err := m.deliver(msg); err != nil {
			return err
		}
		if m.err != nil {
			return m.err
		}
	}
	return nil
}

func (m *kvsModel) busy() bool {
	for _, rk := range m.ranks {
		if rk.next < len(rk.ops) || rk.waiting {
			return true
		}
	}
	return false
}

func (m *kvsModel) who() string {
	s := ""
	for _, rk := range m.ranks {
		if rk.waiting {
			s += fmt.Sprintf(" rank %d at op %d %+v;", rk.g, rk.next-1, rk.ops[rk.next-1])
		}
	}
	return s
}

// advance issues rk's ops until one waits for an answer.
func (m *kvsModel) advance(rk *modelRank) error {
	for !rk.waiting && rk.next < len(rk.ops) {
		if err := m.issue(rk); err != nil {
			return err
		}
	}
	return nil
}

func (m *kvsModel) issue(rk *modelRank) error {
	o := rk.ops[rk.next]
	rk.next++
	rk.reqID++
	n := m.nodes[rk.node]
	req := agent.Req{Via: agent.ViaTest, ID: rk.reqID}
	var op agent.Op
	switch {
	case o.put:
		op = agent.Put{Local: rk.local, Req: req, Key: o.key, Val: o.val, Hint: o.hint}
	case o.fence:
		op = agent.Fence{Local: rk.local, Req: req}
	default:
		op = agent.Get{Local: rk.local, Req: req, Key: o.key, Wait: o.wait, Src: o.src}
	}
	rk.waiting = true
	if err := n.core.Step(op); err != nil {
		return err
	}
	return m.ready(n)
}

// ready carries out node n's Ready as the shell would.
func (m *kvsModel) ready(n *modelNode) error {
	for {
		rd := n.core.Ready()
		if rd.Empty() {
			return nil
		}
		var next []*modelRank // ranks answered: they go on once the batch is carried out
		for _, rp := range rd.Replies {
			rk, err := m.reply(n, rp)
			if err != nil {
				return err
			}
			next = append(next, rk)
		}
		defer func() {
			for _, rk := range next {
				if err := m.advance(rk); err != nil && m.err == nil {
					m.err = err
				}
			}
		}()
		for _, u := range rd.Upstream {
			switch u.Kind {
			case agent.UpPlace:
				n.placeUp(m, u.Name, u.Port, u.Owner, modelMsg{})
			case agent.UpFetch:
				to := n.rt.fetchFrom(u.Name, u.Src)
				if to == n.idx {
					n.serve(m, modelMsg{to: n.idx, from: n.idx, op: "loop", id: u.ID, key: u.Name, src: u.Src, wait: u.Wait}, true)
					continue
				}
				n.seq++
				n.fetches[n.seq] = u.ID
				m.send(modelMsg{to: to, from: n.idx, op: KVSGet, id: n.seq, key: u.Name, src: u.Src, wait: u.Wait})
			case agent.UpAnswer:
				g, ok := n.answers[u.ID]
				if !ok {
					return fmt.Errorf("node %d: answer to unknown ServeGet %d", n.idx, u.ID)
				}
				delete(n.answers, u.ID)
				if g.op == "loop" {
					if err := n.core.Step(agent.FetchDone{ID: g.id, Found: u.Found, Val: u.Port, Err: u.Err}); err != nil {
						return err
					}
					continue
				}
				m.send(modelMsg{to: g.from, from: n.idx, op: KVSVal, id: g.id, key: g.key, val: u.Port, found: u.Found})
			case agent.UpFence:
				c := u
				n.held = &c
				m.tryFence(n)
			default:
				return fmt.Errorf("unexpected upstream call %v", u.Kind)
			}
		}
	}
}

func (m *kvsModel) send(msg modelMsg) { m.net = append(m.net, msg) }

// placeUp places a put where the router says; child, if set, is a
// child's place (Tree) to acknowledge once it arrived above.
func (n *modelNode) placeUp(m *kvsModel, key, val string, owner int, child modelMsg) {
	to, ok := n.rt.placeAt(key)
	if !ok {
		if child.op != "" {
			m.send(modelMsg{to: child.from, from: n.idx, op: KVSAck, id: child.id})
		}
		return
	}
	n.seq++
	n.places++
	if child.op != "" {
		n.placeBy[n.seq] = child
	}
	m.send(modelMsg{to: to, from: n.idx, op: KVSPlace, id: n.seq, key: key, val: val, owner: owner})
}

// serve steps a get routed to n.
func (n *modelNode) serve(m *kvsModel, g modelMsg, final bool) {
	n.ansSeq++
	n.answers[n.ansSeq] = g
	if err := n.core.Step(agent.ServeGet{ID: n.ansSeq, Key: g.key, Src: g.src, Wait: g.wait, Final: final}); err != nil {
		m.t.Fatal(err)
	}
}

func (m *kvsModel) tryFence(n *modelNode) {
	if n.held == nil || n.places > 0 {
		return
	}
	u := n.held
	n.held = nil
	m.fenceIn++
	part := make([]tree.KV, len(u.KVs))
	for i, p := range u.KVs {
		part[i] = tree.KV{Key: []byte(p.Key), Value: []byte(p.Val), Owner: uint32(p.Owner)}
	}
	tree.SortKVs(part)
	b, err := tree.AppendKVs(nil, part)
	if err != nil {
		m.t.Fatal(err)
	}
	m.fenceKVs = append(m.fenceKVs, b)
	if m.fenceIn < m.k {
		return
	}
	// Merged as the tree merges them (a key of two nodes' ranks: the
	// higher rank's value).
	merged, err := tree.MergeKVs(nil, m.fenceKVs, tree.JobLimits(m.p))
	if err != nil {
		m.t.Fatal(err)
	}
	kvs, err := tree.DecodeKVs(merged, tree.JobLimits(m.p))
	if err != nil {
		m.t.Fatal(err)
	}
	done := &agent.FenceDone{Epoch: u.Epoch}
	for _, kv := range kvs {
		done.KVs = append(done.KVs, agent.KV{Key: string(kv.Key), Val: string(kv.Value), Owner: int(kv.Owner)})
	}
	m.fenceIn, m.fenceKVs = 0, nil
	// The verdict goes down the agent tree, as the broadcast does: a node
	// has it before its children.
	for _, c := range m.topo.Children(0) {
		m.send(modelMsg{to: c - 1, op: "fencedone", fence: done})
	}
}

func (m *kvsModel) deliver(msg modelMsg) error {
	if msg.to == atRoot {
		m.rootMsg(msg)
		return nil
	}
	n := m.nodes[msg.to]
	switch msg.op {
	case KVSPlace:
		if err := n.core.Step(agent.PlaceKV{Key: msg.key, Val: msg.val, Owner: msg.owner}); err != nil {
			return err
		}
		if n.rt.up() {
			n.placeUp(m, msg.key, msg.val, msg.owner, msg)
		} else {
			m.send(modelMsg{to: msg.from, from: n.idx, op: KVSAck, id: msg.id})
		}
	case KVSAck:
		n.places--
		if child, ok := n.placeBy[msg.id]; ok {
			delete(n.placeBy, msg.id)
			m.send(modelMsg{to: child.from, from: n.idx, op: KVSAck, id: child.id})
		}
		m.tryFence(n)
	case KVSGet:
		n.serve(m, msg, n.rt.final(msg.key, msg.src))
	case KVSVal:
		id, ok := n.fetches[msg.id]
		if !ok {
			return fmt.Errorf("node %d: val for unknown fetch %d", n.idx, msg.id)
		}
		delete(n.fetches, msg.id)
		if err := n.core.Step(agent.FetchDone{ID: id, Found: msg.found, Val: msg.val}); err != nil {
			return err
		}
	case "fencedone":
		for _, c := range m.topo.Children(n.idx + 1) {
			m.send(modelMsg{to: c - 1, op: "fencedone", fence: msg.fence})
		}
		if err := n.core.Step(*msg.fence); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown message %q", msg.op)
	}
	return m.ready(n)
}

// rootMsg is pmirun's KVS (launch.rootKVS) under Tree.
func (m *kvsModel) rootMsg(msg modelMsg) {
	switch msg.op {
	case KVSPlace:
		m.root.vals[msg.key] = msg.val
		for _, w := range m.root.waits[msg.key] {
			m.send(modelMsg{to: w.from, from: atRoot, op: KVSVal, id: w.id, key: msg.key, val: msg.val, found: true})
		}
		delete(m.root.waits, msg.key)
		m.send(modelMsg{to: msg.from, from: atRoot, op: KVSAck, id: msg.id})
	case KVSGet:
		if v, ok := m.root.vals[msg.key]; ok {
			m.send(modelMsg{to: msg.from, from: atRoot, op: KVSVal, id: msg.id, key: msg.key, val: v, found: true})
		} else if msg.wait {
			m.root.waits[msg.key] = append(m.root.waits[msg.key], msg)
		} else {
			m.send(modelMsg{to: msg.from, from: atRoot, op: KVSVal, id: msg.id, key: msg.key})
		}
	}
}

// reply checks a rank's answer against the reference and lets it go on.
func (m *kvsModel) reply(n *modelNode, rp agent.Reply) (*modelRank, error) {
	rk := m.ranks[n.local[rp.Local]]
	if !rk.waiting || rp.Req.ID != rk.reqID {
		return nil, fmt.Errorf("rank %d: reply to request %d, waiting=%v for %d", rk.g, rp.Req.ID, rk.waiting, rk.reqID)
	}
	o := rk.ops[rk.next-1]
	if rp.Err != nil {
		return nil, fmt.Errorf("rank %d op %+v: %v", rk.g, o, rp.Err)
	}
	rk.waiting = false
	if rp.Kind == agent.ReplyGet {
		ref := m.ref[o.epoch-1]
		old, hasOld := ref.old[o.key]
		p, now := ref.now[o.key]
		ok := rp.Found && (hasOld && rp.Val == old || now && p.sparse && rp.Val == p.val) ||
			!rp.Found && !o.wait && !hasOld
		if !ok {
			return nil, fmt.Errorf("epoch %d: rank %d get %s (wait %v, src %d) = %q found %v; last fence %q (%v), this epoch %+v (%v)",
				o.epoch, rk.g, o.key, o.wait, o.src, rp.Val, rp.Found, old, hasOld, p, now)
		}
	}
	return rk, nil
}
