package agent

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/fastpmi/fastpmi/pmiwire"
)

// The differential test: random sequences of operations (seeded), applied
// to a Core (its Upstream answered at once, as Local does) and to model,
// a naive reference of the same semantics for one node that holds the
// whole job: one lock, maps, no epochs-in-flight bookkeeping, everything
// recomputed from scratch. Ranks behave as blocking clients (a rank sends
// a request only once its previous one was answered), except that a rank
// may be gone at any time. After every operation the two must agree on
// the replies (rank, request, kind, success, found value, epoch,
// allgather values, ring result; for errors only that they are errors)
// and on the Upstream contributions (each fence's puts, one per key with
// its owner; each allgather's values).
//
// Half the seeds run "late": the Upstream's name-service answers are held
// and delivered at random later steps, out of order, and the job
// attribute PMI_hwloc_xmlfile is a late one (Config.LateAttrs) whose value
// the owner supplies at a random later step; reads of it wait until then.
// Job attributes (with and without the KVS fallback) are read, and group
// barriers (PMI-1.2, of every rank or of some, which commit their
// members' puts and leave them to the next fence) entered, in every seed.

// model is the reference.
type model struct {
	mu       sync.Mutex
	n        int
	kvs      map[string]string
	sparse   map[string]string
	nodeAttr map[string]string
	names    map[string]string
	ranks    []*mRank
	late     bool   // PMI_hwloc_xmlfile is a late attribute; name answers come late
	lateVal  string // its value, once set
	lateSet  bool
	colls    map[uint64]*mColl
	rings    map[uint64]*mRing
	groups   map[string]*mGroup
	out      []string // replies of the current operation
	ups      []string // Upstream contributions of the current operation
}

type mRank struct {
	busy      *mReq // outstanding request
	finalized bool
	gone      bool
	collSeq   uint64 // collectives entered or skipped
	ringSeq   uint64
	puts      []KV
}

func (r *mRank) ended() bool { return r.finalized || r.gone }

type mReq struct {
	id   uint64
	kind ReplyKind
	// wait: "kvs:k" or "attr:k" for a parked read; "name" for a name call
	// whose answer the Upstream has not delivered, "late" for a read of
	// a late attribute not yet set (neither judged by checkStuck: their
	// answers come from outside the node's ranks).
	wait string
	// answer is a name call's reply, known when the call was made (the
	// Upstream serves calls in the order they are made) and given when
	// the Upstream's answer is delivered.
	answer string
}

type mColl struct {
	kind    collKind
	in      map[int]*mReq
	vals    map[int]string
	failed  bool
	started bool
}

// mGroup is a PMI-1.2 group barrier: its members as the first rank to
// enter named them (nil: every rank), and the requests of those in it.
type mGroup struct {
	members []bool
	in      map[int]*mReq
}

func (g *mGroup) member(l int) bool { return g.members == nil || g.members[l] }

type mRing struct {
	in     map[int]RingIn
	req    map[int]*mReq // waiting
	failed bool
}

func newModel(n int, late bool) *model {
	m := &model{n: n, late: late, kvs: map[string]string{}, sparse: map[string]string{}, nodeAttr: map[string]string{},
		names: map[string]string{}, colls: map[uint64]*mColl{}, rings: map[uint64]*mRing{}, groups: map[string]*mGroup{}}
	for range n {
		m.ranks = append(m.ranks, &mRank{})
	}
	return m
}

func (m *model) answer(l int, q *mReq, s string) {
	m.out = append(m.out, fmt.Sprintf("#%d L%d %s %s", q.id, l, q.kind, s))
	if m.ranks[l].busy == q {
		m.ranks[l].busy = nil
	}
}

// step applies op and returns the replies and contributions it caused.
func (m *model) step(op Op) (replies, ups []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.out, m.ups = nil, nil
	switch o := op.(type) {
	case Put:
		r := m.ranks[o.Local]
		if _, fenced := m.kvs[o.Key]; o.Hint == pmiwire.HintSparse && !fenced { // a fenced key stays dense
			m.sparse[o.Key] = o.Val
			m.release("kvs:"+o.Key, o.Val)
		} else {
			r.puts = append(r.puts, KV{o.Key, o.Val, o.Local})
		}
		m.answer(o.Local, &mReq{id: o.Req.ID, kind: ReplyPut}, "ok")
	case Get:
		q := &mReq{id: o.Req.ID, kind: ReplyGet}
		if v, ok := m.lookup(o.Key); ok {
			m.answer(o.Local, q, "found="+v)
		} else if o.Wait {
			m.park(o.Local, q, "kvs:"+o.Key)
		} else {
			m.answer(o.Local, q, "not-found")
		}
	case PutNodeAttr:
		m.nodeAttr[o.Key] = o.Val
		m.release("attr:"+o.Key, o.Val)
		m.answer(o.Local, &mReq{id: o.Req.ID, kind: ReplyPutNodeAttr}, "ok")
	case GetNodeAttr:
		q := &mReq{id: o.Req.ID, kind: ReplyGetNodeAttr}
		if v, ok := m.nodeAttr[o.Key]; ok {
			m.answer(o.Local, q, "found="+v)
		} else if o.Wait {
			m.park(o.Local, q, "attr:"+o.Key)
		} else {
			m.answer(o.Local, q, "not-found")
		}
	case Fence:
		m.collective(o.Local, &mReq{id: o.Req.ID, kind: ReplyFence}, kindFence, "")
	case Allgather:
		m.collective(o.Local, &mReq{id: o.Req.ID, kind: ReplyAllgather}, kindAllgather, string(o.Value))
	case Ring:
		m.ring(o.Local, &mReq{id: o.Req.ID, kind: ReplyRing}, o.In)
	case Barrier:
		m.barrier(o.Local, &mReq{id: o.Req.ID, kind: ReplyBarrier}, o.Group, o.Members)
	case JobAttr:
		q := &mReq{id: o.Req.ID, kind: ReplyJobAttr}
		switch {
		case o.Key == AttrHwlocXML && m.late && !m.lateSet:
			q.wait = "late"
			m.ranks[o.Local].busy = q
		case o.Key == AttrHwlocXML && m.late:
			m.answer(o.Local, q, "found="+m.lateVal)
		case o.Key == AttrHwlocXML:
			m.answer(o.Local, q, "found=unavailable")
		case o.Key == "PMI_process_mapping":
			m.answer(o.Local, q, "found=map")
		case o.Key == "universeSize":
			m.answer(o.Local, q, "found="+strconv.Itoa(diffUniverse))
		case o.KVS && !strings.HasPrefix(o.Key, "PMI_") && m.kvs[o.Key] != "":
			m.answer(o.Local, q, "found="+m.kvs[o.Key]) // fenced keys only
		default:
			m.answer(o.Local, q, "not-found")
		}
	case SetJobAttr:
		if m.late && !m.lateSet {
			m.lateSet, m.lateVal = true, o.Val
			for l, r := range m.ranks {
				if q := r.busy; q != nil && q.wait == "late" {
					m.answer(l, q, "found="+o.Val)
				}
			}
		}
	case Name:
		q := &mReq{id: o.Req.ID, kind: ReplyName, wait: "name"}
		_, has := m.names[o.Name]
		switch {
		case o.Op == NamePublish && has, o.Op != NamePublish && !has:
			q.answer = "err"
		case o.Op == NamePublish:
			m.names[o.Name] = o.Port
			q.answer = "ok"
		case o.Op == NameUnpublish:
			delete(m.names, o.Name)
			q.answer = "ok"
		default:
			q.answer = "ok port=" + m.names[o.Name]
		}
		if m.late {
			m.ranks[o.Local].busy = q // until the Upstream's answer is delivered
		} else {
			m.answer(o.Local, q, q.answer)
		}
	case NameDone:
		// The test delivers the answer to rank Local's call (o.ID is the
		// core's call id; deliver maps it to the rank).
		panic("the model takes name answers through deliverName")
	case Finalize:
		r := m.ranks[o.Local]
		if !r.finalized {
			wasEnded := r.ended()
			r.finalized = true
			if !wasEnded {
				m.peerGone(o.Local)
			}
		}
		m.answer(o.Local, &mReq{id: o.Req.ID, kind: ReplyFinalize}, "ok")
	case Gone:
		r := m.ranks[o.Local]
		if !r.gone {
			wasEnded := r.ended()
			r.gone = true
			if !wasEnded {
				m.peerGone(o.Local)
			}
		}
	}
	m.checkStuck()
	slices.Sort(m.out)
	return m.out, m.ups
}

// deliverName gives rank l the answer of its name call, delivered by the
// Upstream.
func (m *model) deliverName(l int) (replies []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.out, m.ups = nil, nil
	// A rank gone meanwhile is answered too, as every request it left
	// (the shell drops replies to gone ranks).
	if q := m.ranks[l].busy; q != nil && q.wait == "name" {
		m.answer(l, q, q.answer)
	}
	m.checkStuck()
	slices.Sort(m.out)
	return m.out
}

// lateWaiting reports whether a rank waits for the late attribute.
func (m *model) lateWaiting() bool {
	for _, r := range m.ranks {
		if r.busy != nil && r.busy.wait == "late" && !r.gone {
			return true
		}
	}
	return false
}

func (m *model) lookup(k string) (string, bool) {
	switch k {
	case "PMI_process_mapping":
		return "map", true
	}
	if v, ok := m.kvs[k]; ok {
		return v, true
	}
	v, ok := m.sparse[k]
	return v, ok
}

func (m *model) park(l int, q *mReq, key string) {
	q.wait = key
	m.ranks[l].busy = q
}

// release answers every parked read of key.
func (m *model) release(key, val string) {
	for l, r := range m.ranks {
		if q := r.busy; q != nil && q.wait == key {
			m.answer(l, q, "found="+val)
		}
	}
}

// collective enters l's next fence-or-allgather; it completes when every
// rank has entered, and fails when a rank that has ended never will.
func (m *model) collective(l int, q *mReq, kind collKind, val string) {
	r := m.ranks[l]
	r.collSeq++
	e := r.collSeq
	q.wait = fmt.Sprintf("coll:%d", e)
	r.busy = q
	c := m.colls[e]
	if c != nil && c.failed {
		m.answer(l, q, fmt.Sprintf("err epoch=%d", e))
		return
	}
	if c == nil {
		c = &mColl{kind: kind, in: map[int]*mReq{}, vals: map[int]string{}}
		m.colls[e] = c
	}
	c.in[l], c.vals[l] = q, val
	if c.kind != kind {
		m.failColl(e)
		return
	}
	for p, pr := range m.ranks {
		if _, in := c.in[p]; !in && pr.ended() && pr.collSeq < e {
			m.failColl(e)
			return
		}
	}
	if len(c.in) < m.n {
		return
	}
	c.started = true
	delete(m.colls, e)
	if kind == kindFence {
		// One put per key: the last, in rank order then put order.
		last := map[string]KV{}
		for _, pr := range m.ranks {
			for _, kv := range pr.puts {
				last[kv.Key] = kv
			}
			pr.puts = nil
		}
		var ks []string
		for k, kv := range last {
			ks = append(ks, fmt.Sprintf("%s=%s@%d", k, kv.Val, kv.Owner))
			m.kvs[k] = kv.Val
		}
		slices.Sort(ks)
		m.ups = append(m.ups, fmt.Sprintf("fence %d %v", e, ks))
		for p := range m.n {
			m.answer(p, c.in[p], fmt.Sprintf("ok epoch=%d", e))
		}
		for k, kv := range last {
			m.release("kvs:"+k, kv.Val)
		}
		return
	}
	var vs []string
	for p := range m.n {
		vs = append(vs, c.vals[p])
	}
	m.ups = append(m.ups, fmt.Sprintf("allgather %d %v", e, vs))
	for p := range m.n {
		m.answer(p, c.in[p], fmt.Sprintf("ok epoch=%d values=%v", e, vs))
	}
}

func (m *model) failColl(e uint64) {
	c := m.colls[e]
	c.failed = true
	for p, q := range c.in {
		m.answer(p, q, fmt.Sprintf("err epoch=%d", e))
	}
	for p, r := range m.ranks {
		if _, in := c.in[p]; !in && r.collSeq < e {
			r.collSeq = e
		}
	}
}

// barrier enters l into group barrier name: an error if l is not a
// member, and for every rank in it if a member that has not entered has
// ended; complete when every member is in, which commits the members'
// puts here (no Upstream: a group barrier is the node's own) and leaves
// them for the next fence to carry.
func (m *model) barrier(l int, q *mReq, name string, members []int) {
	g := m.groups[name]
	if g == nil {
		g = &mGroup{in: map[int]*mReq{}}
		if members != nil {
			g.members = make([]bool, m.n)
			for _, x := range members {
				g.members[x] = true
			}
		}
		m.groups[name] = g
	}
	if !g.member(l) {
		m.answer(l, q, "err")
		return
	}
	for p, pr := range m.ranks {
		if p != l && g.member(p) && g.in[p] == nil && pr.ended() {
			m.answer(l, q, "err")
			m.failGroup(name)
			return
		}
	}
	q.wait = "group:" + name
	m.ranks[l].busy = q
	g.in[l] = q
	for p := range m.n {
		if g.member(p) && g.in[p] == nil {
			return
		}
	}
	delete(m.groups, name)
	last := map[string]string{}
	for p, pr := range m.ranks {
		if g.member(p) {
			for _, kv := range pr.puts {
				last[kv.Key] = kv.Val
			}
		}
	}
	for k, v := range last {
		m.kvs[k] = v
	}
	for p, pq := range g.in {
		m.answer(p, pq, "ok")
	}
	for k, v := range last {
		m.release("kvs:"+k, v)
	}
}

// failGroup fails every rank in group barrier name and forgets it.
func (m *model) failGroup(name string) {
	for p, q := range m.groups[name].in {
		m.answer(p, q, "err")
	}
	delete(m.groups, name)
}

// ring enters l's next ring exchange; a rank is answered once both its
// neighbours on the node's cycle have entered.
func (m *model) ring(l int, q *mReq, in RingIn) {
	r := m.ranks[l]
	r.ringSeq++
	e := r.ringSeq
	g := m.rings[e]
	if g == nil {
		g = &mRing{in: map[int]RingIn{}, req: map[int]*mReq{}}
		m.rings[e] = g
	}
	if g.failed {
		m.answer(l, q, "err")
		return
	}
	q.wait = fmt.Sprintf("ring:%d", e)
	r.busy = q
	for p, pr := range m.ranks {
		if p != l && pr.ended() && pr.ringSeq < e {
			m.answer(l, q, "err")
			m.failRing(g)
			return
		}
	}
	g.in[l], g.req[l] = in, q
	for j, jq := range g.req {
		left, lok := g.in[(j+m.n-1)%m.n]
		right, rok := g.in[(j+1)%m.n]
		if lok && rok {
			delete(g.req, j)
			m.answer(j, jq, fmt.Sprintf("ok pos=%d/%d left=%s right=%s", j, m.n, left.Right, right.Left))
		}
	}
}

func (m *model) failRing(g *mRing) {
	g.failed = true
	for j, q := range g.req {
		m.answer(j, q, "err")
		delete(g.req, j)
	}
}

// peerGone fails the collectives, barriers and rings that wait for l.
func (m *model) peerGone(l int) {
	r := m.ranks[l]
	for name, g := range m.groups {
		if g.member(l) && g.in[l] == nil {
			m.failGroup(name)
		}
	}
	for e, c := range m.colls {
		if _, in := c.in[l]; !in && !c.failed && r.collSeq < e && len(c.in) > 0 {
			m.failColl(e)
		}
	}
	for e, g := range m.rings {
		if !g.failed && len(g.req) > 0 && r.ringSeq < e {
			m.failRing(g)
		}
	}
}

// checkStuck: when every live rank waits, nothing can ever answer them,
// so every waiting request fails.
func (m *model) checkStuck() {
	live := 0
	for _, r := range m.ranks {
		if !r.ended() {
			live++
			if r.busy == nil || r.busy.wait == "name" || r.busy.wait == "late" {
				return
			}
		}
	}
	if live == 0 {
		return
	}
	for l, r := range m.ranks {
		q := r.busy
		if q == nil {
			continue
		}
		switch {
		case strings.HasPrefix(q.wait, "coll:"):
			var e uint64
			fmt.Sscanf(q.wait, "coll:%d", &e)
			if c := m.colls[e]; c != nil && !c.failed {
				m.failColl(e)
			}
		case strings.HasPrefix(q.wait, "group:"):
			if _, ok := m.groups[q.wait[len("group:"):]]; ok {
				m.failGroup(q.wait[len("group:"):])
			}
		case strings.HasPrefix(q.wait, "ring:"):
			var e uint64
			fmt.Sscanf(q.wait, "ring:%d", &e)
			if g := m.rings[e]; g != nil && !g.failed {
				m.failRing(g)
			}
		default:
			m.answer(l, q, "err")
		}
	}
}

// normReply is a core Reply in the model's notation.
func normReply(r *Reply) string {
	s := fmt.Sprintf("#%d L%d %s ", r.Req.ID, r.Local, r.Kind)
	if r.Err != nil {
		s += "err"
		if r.Kind == ReplyFence || r.Kind == ReplyAllgather {
			s += fmt.Sprintf(" epoch=%d", r.Epoch)
		}
		return s
	}
	switch r.Kind {
	case ReplyGet, ReplyGetNodeAttr, ReplyJobAttr:
		if r.Found {
			return s + "found=" + r.Val
		}
		return s + "not-found"
	case ReplyFence:
		return s + fmt.Sprintf("ok epoch=%d", r.Epoch)
	case ReplyAllgather:
		var vs []string
		for _, v := range r.Values {
			vs = append(vs, string(v))
		}
		return s + fmt.Sprintf("ok epoch=%d values=%v", r.Epoch, vs)
	case ReplyRing:
		return s + fmt.Sprintf("ok pos=%d/%d left=%s right=%s", r.Ring.Pos, r.Ring.Size, r.Ring.Left, r.Ring.Right)
	case ReplyName:
		if r.Val != "" {
			return s + "ok port=" + r.Val
		}
	}
	return s + "ok"
}

func TestDifferential(t *testing.T) {
	seeds, steps := 300, 400
	if testing.Short() {
		seeds = 30
	}
	total := diffStats{errs: map[string]int{}}
	for seed := range seeds {
		st := runDifferential(t, uint64(seed), 1+seed%5, steps)
		if t.Failed() {
			return
		}
		total.ops += st.ops
		total.replies += st.replies
		total.fails += st.fails
		total.epochs += st.epochs
		for k, v := range st.errs {
			total.errs[k] += v
		}
		total.delivered += st.delivered
		total.barriers += st.barriers
		total.groups += st.groups
		total.lateAnswered += st.lateAnswered
	}
	t.Logf("failed replies by kind: %v", total.errs)
	t.Logf("%d seeds: %d operations, %d replies (%d errors), %d completed collectives compared", seeds, total.ops, total.replies, total.fails, total.epochs)
	t.Logf("%d group barriers completed (%d entries)", total.groups, total.barriers)
	if total.barriers < seeds {
		t.Errorf("the generator completes too few group barriers (%d)", total.barriers)
	}
	t.Logf("late Upstream: %d held name answers delivered out of order, %d reads of a late attribute answered when it was set", total.delivered, total.lateAnswered)
	if total.delivered < seeds || total.lateAnswered < seeds/10 {
		t.Errorf("the generator exercises late answers too little (%d deliveries, %d late reads)", total.delivered, total.lateAnswered)
	}
	if total.epochs+total.groups < total.ops/10 {
		t.Errorf("the generator completes too few collectives (%d of %d operations) to test them", total.epochs+total.groups, total.ops)
	}
}

type diffStats struct {
	ops, replies, fails, epochs int
	errs                        map[string]int // failed replies by kind
	delivered, lateAnswered     int            // held name answers delivered; late-attribute reads answered by a set
	barriers, groups            int            // group barrier entries answered ok; barriers completed
}

// diffUniverse is the differential test's universe size.
const diffUniverse = 7

// heldName is a name-service answer the late Upstream holds back: the
// answer, and the local rank whose call it answers.
type heldName struct {
	done  NameDone
	local int
}

func runDifferential(t *testing.T, seed uint64, n, steps int) (st diffStats) {
	st.errs = map[string]int{}
	rng := rand.New(rand.NewPCG(seed, 7))
	lateUp := seed%2 == 1
	cfg := Config{JobID: "job", Size: n, Mapping: "map", UniverseSize: diffUniverse}
	if lateUp {
		cfg.LateAttrs = map[string]func(){AttrHwlocXML: func() {}}
	}
	for i := range n {
		cfg.Local = append(cfg.Local, i)
	}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	c := NewCore(&cfg, 0, n)
	emu := newLocalEmu(n)
	m := newModel(n, lateUp)
	var id uint64
	var history []string
	var held []heldName // name answers the late Upstream holds
	nameCaller := -1    // the local rank of this step's name call
	// drain takes the core's replies and Upstream contributions until the
	// Upstream has nothing more to answer now.
	drain := func(step int) (got, gotUp []string) {
		for {
			rd := c.Ready()
			for i := range rd.Replies {
				got = append(got, normReply(&rd.Replies[i]))
			}
			for _, u := range rd.Upstream {
				switch u.Kind {
				case UpFence:
					var ks []string
					for _, kv := range u.KVs {
						ks = append(ks, fmt.Sprintf("%s=%s@%d", kv.Key, kv.Val, kv.Owner))
					}
					slices.Sort(ks)
					if len(slices.Compact(slices.Clone(ks))) != len(ks) {
						t.Fatalf("seed %d: fence %d carries a key twice: %v", seed, u.Epoch, ks)
					}
					gotUp = append(gotUp, fmt.Sprintf("fence %d %v", u.Epoch, ks))
				case UpAllgather:
					var vs []string
					for _, rv := range u.Values {
						vs = append(vs, string(rv.Value))
					}
					gotUp = append(gotUp, fmt.Sprintf("allgather %d %v", u.Epoch, vs))
				}
			}
			var ops []Op
			for _, o := range emu.answer(rd.Upstream) {
				if nd, ok := o.(NameDone); ok && lateUp {
					if nameCaller < 0 {
						t.Fatalf("seed %d step %d: a name answer with no name call", seed, step)
					}
					held = append(held, heldName{nd, nameCaller})
					continue
				}
				ops = append(ops, o)
			}
			if len(ops) == 0 {
				break
			}
			for _, o := range ops {
				if err := c.Step(o); err != nil {
					t.Fatalf("seed %d step %d: upstream answer: %v", seed, step, err)
				}
			}
		}
		slices.Sort(got)
		return got, gotUp
	}
	// The program's collectives: 0 fence, 1 allgather, 2 ring, 3 a group
	// barrier of members (nil: all).
	type planned struct {
		kind    int
		members []int
	}
	var plan []planned
	pos := make([]int, n) // each rank's place in plan
	keys := []string{"a", "b", "c"}
	for step := 0; step < steps; step++ {
		var idle, alive []int
		for l, r := range m.ranks {
			if !r.gone {
				alive = append(alive, l)
				if r.busy == nil && !r.finalized {
					idle = append(idle, l)
				}
			}
		}
		if len(alive) == 0 {
			return st
		}
		if len(held) > 0 && (len(idle) == 0 || rng.IntN(4) == 0) {
			// The late Upstream delivers a held answer, any of them.
			i := rng.IntN(len(held))
			h := held[i]
			held = slices.Delete(held, i, i+1)
			history = append(history, fmt.Sprintf("deliver %+v to L%d", h.done, h.local))
			if err := c.Step(h.done); err != nil {
				t.Fatalf("seed %d step %d: name answer: %v", seed, step, err)
			}
			got, _ := drain(step)
			want := m.deliverName(h.local)
			if !slices.Equal(got, want) {
				from := max(0, len(history)-12)
				t.Fatalf("seed %d (%d ranks) step %d: %s\ncore replies:  %q\nmodel replies: %q\nlast ops:\n  %s",
					seed, n, step, history[len(history)-1], got, want, strings.Join(history[from:], "\n  "))
			}
			st.ops++
			st.replies += len(got)
			st.delivered++
			continue
		}
		var op Op
		id++
		req := Req{Via: ViaTest, ID: id}
		p := rng.IntN(1000)
		// Ranks end (gone, finalize) only in the last quarter: after that
		// every collective fails, which is tested, but not for long.
		late := step > steps*3/4
		switch {
		case lateUp && m.lateWaiting() && (len(idle) == 0 || rng.IntN(10) == 0), lateUp && rng.IntN(200) == 0:
			// The owner supplies the late attribute (again: it changes
			// nothing).
			op = SetJobAttr{Key: AttrHwlocXML, Val: fmt.Sprintf("xml%d", step)}
		case len(idle) == 0 || late && p < 10:
			op = Gone{Local: alive[rng.IntN(len(alive))], Why: "killed"}
		default:
			l := idle[rng.IntN(len(idle))]
			k := keys[rng.IntN(len(keys))]
			v := fmt.Sprintf("v%d", step)
			p /= 10
			// Ranks run one program: the same collectives in the same
			// order (plan), with a rare rank that strays from it.
			next := func() (kind int, group string, members []int) {
				for len(plan) <= pos[l] {
					pl := planned{kind: rng.IntN(4)}
					if pl.kind == 3 && rng.IntN(2) == 0 { // barriers half as often
						pl.kind = rng.IntN(3)
					}
					if pl.kind == 3 && rng.IntN(3) > 0 {
						for x := range n {
							if rng.IntN(3) > 0 {
								pl.members = append(pl.members, x)
							}
						}
						if pl.members == nil {
							pl.members = []int{}
						}
					}
					plan = append(plan, pl)
				}
				pl := plan[pos[l]]
				group = fmt.Sprintf("g%d", pos[l])
				pos[l]++
				if rng.IntN(300) == 0 {
					return rng.IntN(4), group, pl.members
				}
				return pl.kind, group, pl.members
			}
			switch {
			case p == 0 && late:
				op = Finalize{Local: l, Req: req}
			case p < 20:
				h := pmiwire.HintNone
				if rng.IntN(4) == 0 {
					h = pmiwire.HintSparse
				}
				op = Put{Local: l, Req: req, Key: k, Val: v, Hint: h}
			case p < 32:
				op = Get{Local: l, Req: req, Key: k, Wait: rng.IntN(5) == 0}
			case p < 36:
				op = PutNodeAttr{Local: l, Req: req, Key: k, Val: v}
			case p < 40:
				op = GetNodeAttr{Local: l, Req: req, Key: k, Wait: rng.IntN(3) == 0}
			case p < 44:
				attrs := []string{AttrHwlocXML, "PMI_process_mapping", "universeSize", "PMI_nosuch", k}
				op = JobAttr{Local: l, Req: req, Key: attrs[rng.IntN(len(attrs))], KVS: rng.IntN(2) == 0}
			case p < 90:
				switch kind, group, members := next(); kind {
				case 0:
					op = Fence{Local: l, Req: req}
				case 1:
					op = Allgather{Local: l, Req: req, Value: []byte(v)}
				case 2:
					op = Ring{Local: l, Req: req, In: RingIn{Count: 1, Left: "L" + v, Right: "R" + v}}
				default:
					op = Barrier{Local: l, Req: req, Group: group, Members: members}
				}
			case p < 94:
				op = Name{Local: l, Req: req, Op: NamePublish, Name: k, Port: v}
			case p < 97:
				op = Name{Local: l, Req: req, Op: NameUnpublish, Name: k}
			default:
				op = Name{Local: l, Req: req, Op: NameLookup, Name: k}
			}
		}
		history = append(history, fmt.Sprintf("%T%+v", op, op))
		nameCaller = -1
		if o, ok := op.(Name); ok {
			nameCaller = o.Local
		}
		if err := c.Step(op); err != nil {
			t.Fatalf("seed %d step %d: %v", seed, step, err)
		}
		got, gotUp := drain(step)
		if _, ok := op.(SetJobAttr); ok {
			st.lateAnswered += len(got)
		}
		st.ops++
		st.replies += len(got)
		st.epochs += len(gotUp)
		if slices.ContainsFunc(got, func(g string) bool { return strings.HasSuffix(g, " barrier ok") }) {
			st.groups++ // one completes per step at most
		}
		for _, g := range got {
			if strings.HasSuffix(g, " barrier ok") {
				st.barriers++
			}
			if strings.Contains(g, " err") {
				st.fails++
				st.errs[strings.Fields(g)[2]]++
			}
		}
		if err := c.checkCounts(); err != nil {
			t.Fatalf("seed %d step %d: %s: %v", seed, step, history[len(history)-1], err)
		}
		want, wantUp := m.step(op)
		if !slices.Equal(got, want) || !slices.Equal(gotUp, wantUp) {
			from := max(0, len(history)-12)
			t.Fatalf("seed %d (%d ranks) step %d: %s\ncore replies:  %q\nmodel replies: %q\ncore upstream:  %q\nmodel upstream: %q\nlast ops:\n  %s",
				seed, n, step, history[len(history)-1], got, want, gotUp, wantUp, strings.Join(history[from:], "\n  "))
		}
	}
	return st
}

// checkCounts recomputes the counts the deadlock check reads
// (rankState.parked and grouped, Core.parkedLocal and grouped) from the
// waits and groups they count.
func (c *Core) checkCounts() error {
	parked := make([]int, len(c.ranks))
	grouped := make([]int, len(c.ranks))
	for _, ws := range c.waits {
		for _, w := range ws {
			if w.local >= 0 {
				parked[w.local]++
			}
		}
	}
	for _, g := range c.groups {
		for i, e := range g.entered {
			if e.in {
				grouped[i]++
			}
		}
	}
	tp, tg := 0, 0
	for i, rs := range c.ranks {
		if rs.parked != parked[i] || rs.grouped != grouped[i] {
			return fmt.Errorf("local rank %d: parked %d grouped %d, counted %d and %d", i, rs.parked, rs.grouped, parked[i], grouped[i])
		}
		tp += parked[i]
		tg += grouped[i]
	}
	if c.parkedLocal != tp || c.grouped != tg {
		return fmt.Errorf("parkedLocal %d grouped %d, counted %d and %d", c.parkedLocal, c.grouped, tp, tg)
	}
	return nil
}
