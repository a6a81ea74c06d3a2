package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/netio"
	"github.com/fastpmi/fastpmi/pmiwire"
)

// The node's half of the on-demand KVS (agent/remote.go has the core's):
// it carries the core's placements and fetches to the node the router
// names, serves the requests other nodes send here, and holds a fence
// back until every placement it sent has arrived (so a get that follows
// the fence on any node finds every sparse put made before it).
//
// Messages travel as FrameKVS over the node's links: the tree and ring
// links it has from the start, links dialled to any other agent on first
// use (the research's DKVS and Direct designs talk to arbitrary nodes),
// and the control link to pmirun, the Tree strategy's top. Callbacks from
// the agent come in on any goroutine and reach the loop through post,
// which never blocks (a callback may run on the loop itself).

// FrameKVS carries a KVSMsg: agent ↔ agent, and agent ↔ pmirun (Tree).
const FrameKVS uint16 = 13

// KVSMsg is one on-demand KVS message.
type KVSMsg struct {
	Op string `json:"op"` // KVSPlace, KVSAck, KVSGet, KVSVal, KVSRankData or KVSRankVal
	ID uint64 `json:"id"` // the sender's id for a place or get; echoed by its ack or val
	// Puts are a place's puts: what a node placed at one destination
	// since its last message there (one frame and one ack for all).
	Puts  []KVSPut `json:"puts,omitempty"`
	Key   string   `json:"key,omitempty"`   // get, val
	Val   string   `json:"val,omitempty"`   // val
	Src   int      `json:"src,omitempty"`   // get: the rank that put the key, or -1; rank data: the rank
	Wait  bool     `json:"wait,omitempty"`  // get: wait for the put
	Found bool     `json:"found,omitempty"` // val, rank val
	Err   string   `json:"err,omitempty"`   // ack, val, rank val: the request failed
	// Blob is a rank val's data: bytes of any value (JSON carries it as
	// base64; a string would lose what is not UTF-8).
	Blob []byte `json:"blob,omitempty"`
}

// KVSPut is one placed put: its key, value and the rank that put it.
type KVSPut struct {
	Key   string `json:"k"`
	Val   string `json:"v"`
	Owner int    `json:"o"`
}

// MaxPlaceBatch bounds the puts of one place message (a frame of at
// most ~1 MiB with PMI's key and value limits).
const MaxPlaceBatch = 1024

// KVSMsg operations.
const (
	KVSPlace = "place"
	KVSAck   = "ack"
	KVSGet   = "get"
	KVSVal   = "val"
	// KVSRankData asks the node of rank Src for the data its external
	// front end holds for it (agent/rankdata.go, PMIx's direct modex);
	// KVSRankVal answers it.
	KVSRankData = "rankdata"
	KVSRankVal  = "rankval"
)

// Check refuses a message no agent or pmirun sends: an unknown
// operation, a key or value over the PMI limits, a rank outside the job
// of size ranks. Links are authenticated, but a peer is still not
// trusted with the receiver's memory or its maps.
func (m *KVSMsg) Check(size int) error {
	switch m.Op {
	case KVSAck:
		return nil
	case KVSPlace:
		if len(m.Puts) == 0 || len(m.Puts) > MaxPlaceBatch {
			return fmt.Errorf("KVS place of %d puts, want 1..%d", len(m.Puts), MaxPlaceBatch)
		}
		for _, p := range m.Puts {
			if err := checkKV(p.Key, p.Val); err != nil {
				return fmt.Errorf("KVS place: %w", err)
			}
			if p.Owner < -1 || p.Owner >= size {
				return fmt.Errorf("KVS place: rank %d outside the job's %d", p.Owner, size)
			}
		}
		return nil
	case KVSGet, KVSVal:
		if err := checkKV(m.Key, m.Val); err != nil {
			return fmt.Errorf("KVS %s: %w", m.Op, err)
		}
		if m.Src < -1 || m.Src >= size {
			return fmt.Errorf("KVS %s: rank %d outside the job's %d", m.Op, m.Src, size)
		}
		return nil
	case KVSRankData:
		if m.Src < 0 || m.Src >= size {
			return fmt.Errorf("KVS rank data of rank %d, job of %d", m.Src, size)
		}
		return nil
	case KVSRankVal:
		if len(m.Blob) > agent.MaxRankDataBytes {
			return fmt.Errorf("KVS rank data of %d bytes, want at most %d", len(m.Blob), agent.MaxRankDataBytes)
		}
		return nil
	}
	return fmt.Errorf("unknown KVS operation %q", m.Op)
}

func checkKV(key, val string) error {
	switch {
	case key == "" || len(key) > pmiwire.KeyLenMax:
		return fmt.Errorf("key of %d bytes, want 1..%d", len(key), pmiwire.KeyLenMax)
	case len(val) > pmiwire.ValLenMax:
		return fmt.Errorf("value of %d bytes, want at most %d", len(val), pmiwire.ValLenMax)
	}
	return nil
}

// kvsNet is an agentNode's on-demand KVS state. Touched only on the
// node's loop, except post's queue (guarded by mu).
type kvsNet struct {
	rt      router
	seq     uint64                 // ids of this node's places and gets
	places  map[uint64]func(error) // places sent, waiting for their ack
	outbox  map[int]*placeBatch    // places not sent yet, by destination (flushPlaces)
	flushT  *time.Timer            // armed while outbox holds anything: sends it PlaceDelay later
	flushC  <-chan time.Time       // flushT's channel while armed, else nil (the loop selects on it)
	fetches map[uint64]fetchDone   // gets sent, waiting for their val
	held    []func()               // fences waiting for places to arrive
	dialing map[int][]netio.Frame  // frames for nodes being dialled
	addrs   []string               // every agent's address (Table)
	extra   []netio.Conn           // second links to a node (both dialled at once); closed with the transport
	waiting Waiting                // what this node last told pmirun (reportWaiting)

	mu     sync.Mutex
	queue  []func()      // guarded by mu: work posted for the loop
	notify chan struct{} // one token: queue is not empty
}

// placeBatch is what this node will place at one destination: the puts
// and, for each, what to do once they arrived.
type placeBatch struct {
	puts  []KVSPut
	dones []func(error)
}

// fetchDone takes the answer to a get this node sent.
type fetchDone func(val string, found bool, err error)

// post queues f to run on the node's loop; it never blocks.
func (a *agentNode) post(f func()) {
	k := &a.kvs
	k.mu.Lock()
	k.queue = append(k.queue, f)
	k.mu.Unlock()
	select {
	case k.notify <- struct{}{}:
	default:
	}
}

// runPosted runs what post queued. On the loop.
func (a *agentNode) runPosted() {
	k := &a.kvs
	k.mu.Lock()
	q := k.queue
	k.queue = nil
	k.mu.Unlock()
	for _, f := range q {
		f()
	}
}

// sendKVS sends m to node to (atRoot: pmirun), dialling a link first if
// there is none. On the loop.
func (a *agentNode) sendKVS(to int, m KVSMsg) {
	f := netio.Frame{Type: FrameKVS, Payload: Encode(m)}
	a.rec.Add("kvs.msgs.sent", 1)
	if to == atRoot || a.peers[to] != nil {
		a.send(to, f)
		return
	}
	if q, ok := a.kvs.dialing[to]; ok {
		a.kvs.dialing[to] = append(q, f)
		return
	}
	a.kvs.dialing[to] = []netio.Frame{f}
	a.dialPeer(to)
}

// dialPeer links this node to node p on a goroutine of a.recv; the link
// (or the failure) reaches the loop through post.
func (a *agentNode) dialPeer(p int) {
	addr := a.kvs.addrs[p]
	a.rec.Add("kvs.links.dialed", 1)
	a.recv.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), a.spec.NetTimeout)
		defer cancel()
		c, err := a.tr.Dial(ctx, addr)
		if err == nil {
			err = c.Send(ctx, netio.Frame{Type: FrameLink, Payload: Encode(Link{From: a.idx})})
			if err != nil {
				c.Close()
			}
		}
		select {
		case <-a.quit:
			if err == nil {
				c.Close()
			}
			return
		default:
		}
		a.post(func() { a.linked(p, c, err) })
	})
}

// linked takes a dialled link to p, or its failure. On the loop.
func (a *agentNode) linked(p int, c netio.Conn, err error) {
	q := a.kvs.dialing[p]
	delete(a.kvs.dialing, p)
	if err != nil {
		a.failLink(p, fmt.Errorf("dial for the KVS: %w", err))
		return
	}
	if a.peers[p] == nil {
		a.peers[p] = c
	} else {
		a.kvs.extra = append(a.kvs.extra, c) // p dialled here meanwhile: keep both
	}
	a.recv.Go(func() { Receive(c, p, a.in, a.quit) })
	for _, f := range q {
		a.send(p, f)
	}
}

// acceptPeers takes the links other agents dial to this node after the
// start (for the KVS), until ctx ends. On its own goroutine of a.recv.
func (a *agentNode) acceptPeers(ctx context.Context, ln netio.Listener) {
	for {
		c, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, a.spec.NetTimeout)
		f, err := c.Recv(rctx)
		cancel()
		var lm Link
		if err == nil && f.Type == FrameLink {
			err = Decode(f.Payload, &lm)
		} else if err == nil {
			err = fmt.Errorf("first frame type %d", f.Type)
		}
		if err == nil && (lm.From < 0 || lm.From >= len(a.spec.Nodes) || lm.From == a.idx) {
			err = fmt.Errorf("link from node %d", lm.From)
		}
		if err != nil {
			a.log.Warn("refused a peer link", "peer", c.RemoteAddr(), "err", err)
			c.Close()
			continue
		}
		a.post(func() {
			if a.peers[lm.From] == nil {
				a.peers[lm.From] = c
			} else {
				a.kvs.extra = append(a.kvs.extra, c)
			}
		})
		a.recv.Go(func() { Receive(c, lm.From, a.in, a.quit) })
	}
}

// kvsFrame handles a FrameKVS from node from (-1: pmirun). On the loop.
func (a *agentNode) kvsFrame(from int, payload []byte) {
	var m KVSMsg
	err := Decode(payload, &m)
	if err == nil {
		err = m.Check(a.spec.Size)
	}
	if err != nil {
		// A peer that sends this is broken. Refused, its request is
		// never answered (its place then holds its fences for ever),
		// nor is what this node asked of it: the job's KVS cannot be
		// trusted to complete, and what waits on the link fails now.
		a.rec.Add("kvs.msgs.refused", 1)
		a.badMessage(from, "KVS", err)
		return
	}
	a.rec.Add("kvs.msgs.recv", 1)
	switch m.Op {
	case KVSPlace:
		ack := func(err error) {
			r := KVSMsg{Op: KVSAck, ID: m.ID}
			if err != nil {
				r.Err = err.Error()
			}
			a.sendKVS(from, r)
		}
		ag := a.n.Agent()
		for _, p := range m.Puts {
			if err := ag.PlaceKV(p.Key, p.Val, p.Owner); err != nil {
				ack(err)
				return
			}
		}
		if !a.kvs.rt.up() {
			ack(nil)
			return
		}
		// Every ancestor keeps them: up they go, and the child hears
		// once they arrived at the top.
		left, failed := len(m.Puts), error(nil)
		for _, p := range m.Puts {
			a.placeUp(p, func(err error) {
				left--
				if err != nil && failed == nil {
					failed = err
				}
				if left == 0 {
					ack(failed)
				}
			})
		}
	case KVSAck:
		if done, ok := a.kvs.places[m.ID]; ok {
			delete(a.kvs.places, m.ID)
			var err error
			if m.Err != "" {
				err = errors.New(m.Err)
			}
			done(err)
			// Every placement counts, this node's own and those it
			// forwards up the tree for a child: a fence held here goes
			// once the last is acknowledged.
			a.placed()
		}
	case KVSGet:
		a.rec.Add("kvs.gets.served", 1)
		final := a.kvs.rt.final(m.Key, m.Src)
		a.n.Agent().ServeGet(m.Key, m.Src, m.Wait, final, func(val string, found bool, err error) {
			r := KVSMsg{Op: KVSVal, ID: m.ID, Key: m.Key, Val: val, Found: found}
			if err != nil {
				r.Err = err.Error()
			}
			a.post(func() { a.sendKVS(from, r) })
		})
	case KVSRankData:
		a.rec.Add("kvs.rankdata.served", 1)
		a.n.Agent().ServeRankData(m.Src, func(val string, found bool, err error) {
			r := KVSMsg{Op: KVSRankVal, ID: m.ID, Blob: []byte(val), Found: found}
			if err != nil {
				r.Err = err.Error()
			}
			a.post(func() { a.sendKVS(from, r) })
		})
	case KVSVal, KVSRankVal:
		f, ok := a.kvs.fetches[m.ID]
		if !ok {
			return
		}
		delete(a.kvs.fetches, m.ID)
		var err error
		if m.Err != "" {
			err = errors.New(m.Err)
		}
		val := m.Val
		if m.Op == KVSRankVal {
			val = string(m.Blob)
		}
		f(val, m.Found, err)
	}
}

// placeUp queues a put for the router's place for it; done runs on the
// loop once it arrived (at once when the key stays here). flushPlaces
// sends what is queued.
func (a *agentNode) placeUp(p KVSPut, done func(error)) {
	to, ok := a.kvs.rt.placeAt(p.Key)
	if !ok {
		done(nil)
		return
	}
	b := a.kvs.outbox[to]
	if b == nil {
		b = &placeBatch{}
		a.kvs.outbox[to] = b
	}
	b.puts = append(b.puts, p)
	b.dones = append(b.dones, done)
	if len(b.puts) == MaxPlaceBatch {
		delete(a.kvs.outbox, to)
		a.sendPlaces(to, b)
	}
	if len(a.kvs.outbox) > 0 && a.kvs.flushC == nil {
		if a.kvs.flushT == nil {
			a.kvs.flushT = time.NewTimer(PlaceDelay)
		} else {
			a.kvs.flushT.Reset(PlaceDelay)
		}
		a.kvs.flushC = a.kvs.flushT.C
	}
}

// PlaceDelay is how long a placement may wait for others to the same
// node: each rank's put is its own turn of the agent, so without it a
// batch rarely holds more than a put or two. A fence sends what waits at
// once (holdFence).
const PlaceDelay = 200 * time.Microsecond

// flushPlaces sends every queued placement, one message per destination.
func (a *agentNode) flushPlaces() {
	if a.kvs.flushC != nil {
		a.kvs.flushT.Stop()
		a.kvs.flushC = nil
	}
	for to, b := range a.kvs.outbox {
		delete(a.kvs.outbox, to)
		a.sendPlaces(to, b)
	}
}

func (a *agentNode) sendPlaces(to int, b *placeBatch) {
	a.kvs.seq++
	id := a.kvs.seq
	a.kvs.places[id] = func(err error) {
		for _, d := range b.dones {
			d(err)
		}
	}
	a.rec.Add("kvs.places.sent", int64(len(b.puts)))
	a.sendKVS(to, KVSMsg{Op: KVSPlace, ID: id, Puts: b.puts})
}

// placed runs the fences held for placements once none is outstanding.
func (a *agentNode) placed() {
	if len(a.kvs.places) > 0 {
		return
	}
	held := a.kvs.held
	a.kvs.held = nil
	for _, f := range held {
		f()
	}
}

// holdFence runs f (a fence's contribution) once every placement this
// node sent has arrived.
func (a *agentNode) holdFence(f func()) {
	a.flushPlaces() // the placements queued before the fence go first
	if len(a.kvs.places) == 0 {
		f()
		return
	}
	a.kvs.held = append(a.kvs.held, f)
}

// failKVS fails every outstanding place and fetch with err.
func (a *agentNode) failKVS(err error) {
	for id, f := range a.kvs.fetches {
		delete(a.kvs.fetches, id)
		f("", false, err)
	}
	for id, done := range a.kvs.places {
		delete(a.kvs.places, id)
		done(err)
	}
	for p := range a.kvs.dialing {
		delete(a.kvs.dialing, p)
	}
	for to, b := range a.kvs.outbox {
		delete(a.kvs.outbox, to)
		for _, d := range b.dones {
			d(err)
		}
	}
	a.placed() // the held fences fail on a.dead
}

// Place places a sparse put of this node (agent.Upstream).
func (u netUpstream) Place(key, val string, owner int) {
	a := u.a
	a.post(func() {
		if a.dead != nil {
			return // the job is failing: fences fail with a.dead
		}
		a.placeUp(KVSPut{Key: key, Val: val, Owner: owner}, func(err error) {
			if err != nil {
				a.log.Error("KVS placement failed", "key", key, "err", err)
				if a.dead == nil {
					a.dead = fmt.Errorf("placing key %q: %w", key, err)
				}
			}
		})
	})
}

// Fetch asks the router's node for key (agent.Upstream).
func (u netUpstream) Fetch(key string, src int, wait bool, done func(string, bool, error)) {
	a := u.a
	a.post(func() {
		if a.dead != nil {
			done("", false, a.dead)
			return
		}
		to := a.kvs.rt.fetchFrom(key, src)
		if to == a.idx {
			// This node is where the key lives: wait here for its put.
			a.n.Agent().ServeGet(key, src, wait, true, done)
			return
		}
		a.kvs.seq++
		id := a.kvs.seq
		a.kvs.fetches[id] = done
		a.rec.Add("kvs.fetches.sent", 1)
		a.sendKVS(to, KVSMsg{Op: KVSGet, ID: id, Key: key, Src: src, Wait: wait})
	})
}

// FetchJobRankData asks pmirun for the data of rank of another job of
// the run, which it fetches from that job's node (agent.Upstream).
func (u netUpstream) FetchJobRankData(job string, rank int, done func(string, bool, error)) {
	u.name(Name{Op: "rankdata", Procs: []agent.JobRanks{{Job: job, Ranks: []int{rank}}}, Wait: agent.MaxNameWait}, func(r Name) {
		if r.NotFound {
			done("", false, nil)
			return
		}
		done(string(r.Data), r.Err == "", nameErr(r))
	})
}

// FetchJobLayout asks pmirun where another job of the run runs
// (agent.Upstream).
func (u netUpstream) FetchJobLayout(job string, done func(*agent.Layout, error)) {
	u.name(Name{Op: "joblayout", Procs: []agent.JobRanks{{Job: job}}}, func(r Name) {
		if err := nameErr(r); err != nil {
			done(nil, err)
			return
		}
		done(r.Layout, nil)
	})
}

// FetchRankData asks rank's node for the rank's data (agent.Upstream):
// straight there whatever the strategy, the only node that holds it.
func (u netUpstream) FetchRankData(rank int, done func(string, bool, error)) {
	a := u.a
	a.post(func() {
		if a.dead != nil {
			done("", false, a.dead)
			return
		}
		if !a.kvs.rt.named(rank) {
			done("", false, fmt.Errorf("rank data of rank %d, job of %d", rank, a.spec.Size))
			return
		}
		to := a.kvs.rt.rankNode[rank]
		if to == a.idx {
			a.n.Agent().ServeRankData(rank, done)
			return
		}
		a.kvs.seq++
		id := a.kvs.seq
		a.kvs.fetches[id] = done
		a.rec.Add("kvs.rankdata.sent", 1)
		a.sendKVS(to, KVSMsg{Op: KVSRankData, ID: id, Src: rank})
	})
}

// recordKVS books the agent's on-demand KVS figures on the node's
// recorder: fetches it made (one per key, wait flag and source at a
// time), gets that waited behind one instead, gets served for other
// nodes, cached bytes, fences whose unhinted puts went sparse.
func (a *agentNode) recordKVS() {
	st := a.n.Agent().Stats()
	for k, v := range map[string]int{"kvs.fetches": st.Fetches, "kvs.coalesced": st.Coalesced,
		"kvs.served": st.Served, "kvs.cache.bytes": st.CacheBytes, "kvs.auto.sparse": st.AutoSparse,
		"kvs.place.refused": st.PlaceRefused} {
		if v > 0 {
			a.rec.Add(k, int64(v))
		}
	}
}

// reportWaiting tells pmirun when this node's part of the deadlock check
// changed (Waiting). On the loop, every Heartbeat.
func (a *agentNode) reportWaiting() {
	all, gets, what, epoch := a.n.Agent().Waiting()
	if len(a.kvs.places) > 0 || len(a.kvs.dialing) > 0 || len(a.kvs.outbox) > 0 {
		all = false // a placement on its way may still answer a get
	}
	w := Waiting{All: all, Gets: gets, What: what, Epoch: epoch}
	if !all {
		w = Waiting{}
	}
	if w.All == a.kvs.waiting.All && w.Gets == a.kvs.waiting.Gets && w.Epoch == a.kvs.waiting.Epoch && slices.Equal(w.What, a.kvs.waiting.What) {
		return
	}
	a.kvs.waiting = w
	a.send(-1, netio.Frame{Type: FrameWaiting, Payload: Encode(w)})
}
