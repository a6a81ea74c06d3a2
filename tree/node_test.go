package tree

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

var testLimits = Limits{Ranks: 1 << 16, MaxValue: 1 << 10, MaxEntry: 1 << 10, MaxKey: 64, MaxTotal: 1 << 26}

func TestTopology(t *testing.T) {
	tp, err := NewTopology(10, 3)
	if err != nil {
		t.Fatal(err)
	}
	wantParent := []int{-1, 0, 0, 0, 1, 1, 1, 2, 2, 2}
	for i, p := range wantParent {
		if got := tp.Parent(i); got != p {
			t.Errorf("Parent(%d) = %d, want %d", i, got, p)
		}
	}
	if got := fmt.Sprint(tp.Children(0), tp.Children(2), tp.Children(3)); got != "[1 2 3] [7 8 9] []" {
		t.Errorf("children: %s", got)
	}
	if tp.Depth(0) != 0 || tp.Depth(3) != 1 || tp.Depth(9) != 2 || tp.Height() != 2 {
		t.Errorf("depths %d %d %d height %d", tp.Depth(0), tp.Depth(3), tp.Depth(9), tp.Height())
	}
	chain, _ := NewTopology(5, 1)
	if chain.Height() != 4 || chain.Parent(4) != 3 || fmt.Sprint(chain.Children(4)) != "[]" {
		t.Errorf("chain: height %d", chain.Height())
	}
	for _, c := range [][2]int{{0, 2}, {3, 0}, {-1, 2}, {MaxNodes + 1, 2}, {2, MaxWidth + 1}} {
		if _, err := NewTopology(c[0], c[1]); !errors.Is(err, ErrTopology) {
			t.Errorf("NewTopology%v: %v", c, err)
		}
	}
	// Every node but the root is exactly one child of its parent.
	for _, w := range []int{1, 2, 3, 8} {
		tp, _ := NewTopology(200, w)
		seen := map[int]int{}
		for i := range 200 {
			for _, c := range tp.Children(i) {
				seen[c]++
				if tp.Parent(c) != i {
					t.Fatalf("width %d: child %d of %d has parent %d", w, c, i, tp.Parent(c))
				}
			}
		}
		if len(seen) != 199 || seen[0] != 0 {
			t.Fatalf("width %d: %d nodes have parents", w, len(seen))
		}
	}
}

// sim is K Node state machines joined by a network that delivers in-flight
// messages in random order.
type sim struct {
	t       *testing.T
	rng     *rand.Rand
	topo    Topology
	nodes   []*Node
	wire    []Msg
	ups     map[[3]uint64]int // (node, kind, epoch) -> Up messages sent
	deliver map[[3]uint64][]byte
	gather  map[[2]uint64][]byte // (kind, epoch) -> root result
}

func newSim(t *testing.T, rng *rand.Rand, k, width int, window uint64) *sim {
	tp, err := NewTopology(k, width)
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{t: t, rng: rng, topo: tp, ups: map[[3]uint64]int{}, deliver: map[[3]uint64][]byte{}, gather: map[[2]uint64][]byte{}}
	for i := range k {
		n, err := NewNode(Config{Topology: tp, Node: i, Limits: testLimits, Window: window})
		if err != nil {
			t.Fatal(err)
		}
		s.nodes = append(s.nodes, n)
	}
	return s
}

// take records what node i produced.
func (s *sim) take(i int, r Ready) {
	s.t.Helper()
	for _, m := range r.Msgs {
		if m.From != i {
			s.t.Fatalf("node %d sent %v as node %d", i, m.Type, m.From)
		}
		if m.Type == Up {
			s.ups[[3]uint64{uint64(i), uint64(m.Kind), m.Epoch}]++
		}
		// Every message goes through the codec.
		got, err := DecodeMsg(AppendMsg(nil, m))
		if err != nil || got.Kind != m.Kind || got.Type != m.Type || got.Epoch != m.Epoch || got.From != m.From || got.To != m.To || !bytes.Equal(got.Payload, m.Payload) {
			s.t.Fatalf("codec round trip of %+v: %+v, %v", m, got, err)
		}
		s.wire = append(s.wire, got)
	}
	for _, ev := range r.Events {
		switch ev.Type {
		case EventGathered:
			if i != 0 {
				s.t.Fatalf("node %d gathered", i)
			}
			key := [2]uint64{uint64(ev.Kind), ev.Epoch}
			if _, dup := s.gather[key]; dup {
				s.t.Fatalf("%v epoch %d gathered twice", ev.Kind, ev.Epoch)
			}
			s.gather[key] = ev.Payload
		case EventDelivered:
			key := [3]uint64{uint64(i), uint64(ev.Kind), ev.Epoch}
			if _, dup := s.deliver[key]; dup {
				s.t.Fatalf("node %d: %v epoch %d delivered twice", i, ev.Kind, ev.Epoch)
			}
			s.deliver[key] = ev.Payload
		}
	}
}

// deliverOne delivers a random in-flight message.
func (s *sim) deliverOne() {
	s.t.Helper()
	j := s.rng.IntN(len(s.wire))
	m := s.wire[j]
	s.wire[j] = s.wire[len(s.wire)-1]
	s.wire = s.wire[:len(s.wire)-1]
	r, err := s.nodes[m.To].Step(m)
	if err != nil {
		s.t.Fatalf("deliver %v %v epoch %d %d->%d: %v", m.Kind, m.Type, m.Epoch, m.From, m.To, err)
	}
	s.take(m.To, r)
}

// TestGatherDifferential runs many epochs of both kinds interleaved at
// random on random trees and checks each root result against the naive
// union of what every rank contributed to that epoch.
func TestGatherDifferential(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for iter := range 60 {
		k := 1 + rng.IntN(200)
		width := 1 + rng.IntN(8)
		epochs := 1 + rng.IntN(6)
		s := newSim(t, rng, k, width, 0)

		// Place ranks: 0..3 per node, numbered at random.
		var owner []int // node of each rank
		for i := range k {
			for range rng.IntN(4) {
				owner = append(owner, i)
			}
		}
		rng.Shuffle(len(owner), func(a, b int) { owner[a], owner[b] = owner[b], owner[a] })
		ranksOf := make([][]uint32, k)
		for r, i := range owner {
			ranksOf[i] = append(ranksOf[i], uint32(r))
		}

		// What each node contributes, and the naive reference per epoch.
		contrib := map[ekey][][]byte{} // per node
		want := map[ekey][]byte{}
		for _, kind := range []Kind{Allgather, Fence} {
			for e := uint64(1); e <= uint64(epochs); e++ {
				kk := ekey{kind, e}
				contrib[kk] = make([][]byte, k)
				var allE []Entry
				var allKV []KV
				for i := range k {
					var es []Entry
					var kvs []KV
					for _, r := range ranksOf[i] {
						v := fmt.Appendf(nil, "%v/e%d/r%d/%x", kind, e, r, rng.Uint32())
						es = append(es, Entry{Rank: r, Value: v})
						for j := range rng.IntN(3) {
							kvs = append(kvs, KV{Key: fmt.Appendf(nil, "key-%d-%d", r, j), Value: v, Owner: r})
						}
					}
					var b []byte
					var err error
					if kind == Allgather {
						SortEntries(es)
						b, err = AppendEntries(nil, es)
					} else {
						SortKVs(kvs)
						b, err = AppendKVs(nil, kvs)
					}
					if err != nil {
						t.Fatal(err)
					}
					contrib[kk][i] = b
					allE = append(allE, es...)
					allKV = append(allKV, kvs...)
				}
				// Reference: the flat union, sorted, encoded.
				if kind == Allgather {
					SortEntries(allE)
					want[kk], _ = AppendEntries(nil, allE)
				} else {
					SortKVs(allKV)
					want[kk], _ = AppendKVs(nil, allKV)
				}
			}
		}

		next := make([][numKinds]uint64, k) // next epoch each node contributes
		for i := range next {
			next[i][Allgather], next[i][Fence] = 1, 1
		}
		var bcast []ekey // gathered at the root, not yet broadcast
		pending := 2 * epochs * k
		for pending > 0 || len(s.wire) > 0 || len(bcast) > 0 {
			switch c := s.rng.IntN(10); {
			case c < 3 && pending > 0:
				i := s.rng.IntN(k)
				kind := Kind(1 + s.rng.IntN(2))
				e := next[i][kind]
				if e > uint64(epochs) {
					continue
				}
				next[i][kind]++
				pending--
				r, err := s.nodes[i].Contribute(kind, e, contrib[ekey{kind, e}][i])
				if err != nil {
					t.Fatal(err)
				}
				s.take(i, r)
			case c < 4 && len(bcast) > 0:
				j := s.rng.IntN(len(bcast))
				kk := bcast[j]
				bcast = append(bcast[:j], bcast[j+1:]...)
				// "Compress" the result: the tree forwards it unchanged.
				payload := append([]byte(fmt.Sprintf("Z%v%d:", kk.kind, kk.epoch)), s.gather[[2]uint64{uint64(kk.kind), kk.epoch}]...)
				r, err := s.nodes[0].Broadcast(kk.kind, kk.epoch, payload)
				if err != nil {
					t.Fatal(err)
				}
				s.take(0, r)
			case len(s.wire) > 0:
				s.deliverOne()
			default:
				continue
			}
			for kk := range want {
				if _, ok := s.gather[[2]uint64{uint64(kk.kind), kk.epoch}]; ok && !s.inBcast(bcast, kk.kind, kk.epoch) && !s.broadcastDone(kk.kind, kk.epoch) {
					bcast = append(bcast, kk)
				}
			}
		}

		for kk, w := range want {
			got := s.gather[[2]uint64{uint64(kk.kind), kk.epoch}]
			if !bytes.Equal(got, w) {
				t.Fatalf("iter %d (K=%d k=%d): %v epoch %d: root result differs from the union (%d vs %d bytes)", iter, k, width, kk.kind, kk.epoch, len(got), len(w))
			}
			payload := append([]byte(fmt.Sprintf("Z%v%d:", kk.kind, kk.epoch)), w...)
			for i := range k {
				if n := s.ups[[3]uint64{uint64(i), uint64(kk.kind), kk.epoch}]; (i == 0 && n != 0) || (i > 0 && n != 1) {
					t.Fatalf("iter %d: node %d sent %d Up messages for %v epoch %d", iter, i, n, kk.kind, kk.epoch)
				}
				if d := s.deliver[[3]uint64{uint64(i), uint64(kk.kind), kk.epoch}]; !bytes.Equal(d, payload) {
					t.Fatalf("iter %d: node %d delivered %q for %v epoch %d", iter, i, d, kk.kind, kk.epoch)
				}
			}
		}
		for i, n := range s.nodes {
			if n.Open(Fence)+n.Open(Allgather) != 0 {
				t.Fatalf("node %d still has open epochs", i)
			}
		}
	}
}

// ekey names one epoch of one kind.
type ekey struct {
	kind  Kind
	epoch uint64
}

func (s *sim) inBcast(b []ekey, k Kind, e uint64) bool {
	for _, x := range b {
		if x.kind == k && x.epoch == e {
			return true
		}
	}
	return false
}

func (s *sim) broadcastDone(k Kind, e uint64) bool {
	_, ok := s.deliver[[3]uint64{0, uint64(k), e}]
	return ok
}

func TestNodeRejects(t *testing.T) {
	tp, _ := NewTopology(4, 2) // 0 -> 1, 2; 1 -> 3
	mk := func(i int) *Node {
		n, err := NewNode(Config{Topology: tp, Node: i, Limits: testLimits, Window: 4})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	one := func(r uint32) []byte {
		b, _ := AppendEntries(nil, []Entry{{Rank: r, Value: []byte("v")}})
		return b
	}
	n1 := mk(1)
	up := Msg{Kind: Allgather, Type: Up, Epoch: 1, From: 3, To: 1, Payload: one(3)}
	// Future epochs within the window are kept, beyond it refused.
	if _, err := n1.Step(Msg{Kind: Allgather, Type: Up, Epoch: 4, From: 3, To: 1, Payload: one(3)}); err != nil {
		t.Fatalf("epoch 4 within window: %v", err)
	}
	if _, err := n1.Step(Msg{Kind: Allgather, Type: Up, Epoch: 5, From: 3, To: 1, Payload: one(3)}); !errors.Is(err, ErrFutureEpoch) {
		t.Errorf("epoch 5 beyond window: %v", err)
	}
	bad := []struct {
		name string
		m    Msg
		want error
	}{
		{"not a child", Msg{Kind: Allgather, Type: Up, Epoch: 1, From: 2, To: 1}, ErrUnexpected},
		{"wrong receiver", Msg{Kind: Allgather, Type: Up, Epoch: 1, From: 3, To: 2}, ErrUnexpected},
		{"down from non-parent", Msg{Kind: Allgather, Type: Down, Epoch: 1, From: 3, To: 1}, ErrUnexpected},
		{"down before up", Msg{Kind: Allgather, Type: Down, Epoch: 1, From: 0, To: 1}, ErrUnexpected},
		{"bad kind", Msg{Kind: 9, Type: Up, Epoch: 1, From: 3, To: 1}, ErrUnexpected},
		{"epoch 0", Msg{Kind: Allgather, Type: Up, Epoch: 0, From: 3, To: 1}, ErrStaleEpoch},
	}
	for _, b := range bad {
		if _, err := n1.Step(b.m); !errors.Is(err, b.want) {
			t.Errorf("%s: got %v, want %v", b.name, err, b.want)
		}
	}
	if _, err := n1.Step(up); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.Step(up); !errors.Is(err, ErrDuplicate) {
		t.Errorf("second Up from child 3: %v", err)
	}
	if _, err := n1.Contribute(Allgather, 2, one(1)); !errors.Is(err, ErrUnexpected) {
		t.Errorf("contribute epoch 2 first: %v", err)
	}
	r, err := n1.Contribute(Allgather, 1, one(1))
	if err != nil || len(r.Msgs) != 1 || r.Msgs[0].To != 0 || r.Msgs[0].Type != Up {
		t.Fatalf("contribute: %+v, %v", r, err)
	}
	if _, err := n1.Step(up); !errors.Is(err, ErrDuplicate) {
		t.Errorf("Up after sending up: %v", err)
	}
	down := Msg{Kind: Allgather, Type: Down, Epoch: 1, From: 0, To: 1, Payload: []byte("result")}
	r, err = n1.Step(down)
	if err != nil || len(r.Msgs) != 1 || r.Msgs[0].To != 3 || string(r.Msgs[0].Payload) != "result" || len(r.Events) != 1 {
		t.Fatalf("down: %+v, %v", r, err)
	}
	for _, m := range []Msg{down, up} {
		if _, err := n1.Step(m); !errors.Is(err, ErrStaleEpoch) {
			t.Errorf("%v after epoch finished: %v", m.Type, err)
		}
	}
	// Epoch 1 of Fence is independent of Allgather's.
	if _, err := n1.Step(Msg{Kind: Fence, Type: Up, Epoch: 1, From: 3, To: 1, Payload: []byte("x")}); err != nil {
		t.Errorf("fence epoch 1: %v", err)
	}
	// A child's bad payload fails the merge.
	if _, err := n1.Contribute(Fence, 1, []byte("y")); !errors.Is(err, ErrMalformed) {
		t.Errorf("merge of malformed parts: %v", err)
	}
	// Two children contributing the same rank conflict at the root.
	root := mk(0)
	root.Contribute(Allgather, 1, one(0))
	root.Step(Msg{Kind: Allgather, Type: Up, Epoch: 1, From: 1, To: 0, Payload: one(5)})
	if _, err := root.Step(Msg{Kind: Allgather, Type: Up, Epoch: 1, From: 2, To: 0, Payload: one(5)}); !errors.Is(err, ErrConflict) {
		t.Errorf("same rank from two children: %v", err)
	}
	if _, err := root.Broadcast(Allgather, 1, nil); !errors.Is(err, ErrUnexpected) {
		t.Errorf("broadcast before gathered: %v", err)
	}
	if _, err := n1.Broadcast(Allgather, 2, nil); !errors.Is(err, ErrUnexpected) {
		t.Errorf("broadcast at a non-root: %v", err)
	}
}

// TestSingleNode: a one-node tree gathers and delivers on its own.
func TestSingleNode(t *testing.T) {
	tp, _ := NewTopology(1, 4)
	n, err := NewNode(Config{Topology: tp, Node: 0, Limits: testLimits})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := AppendEntries(nil, []Entry{{0, []byte("a")}, {1, []byte("b")}})
	r, err := n.Contribute(Allgather, 1, b)
	if err != nil || len(r.Msgs) != 0 || len(r.Events) != 1 || r.Events[0].Type != EventGathered || !bytes.Equal(r.Events[0].Payload, b) {
		t.Fatalf("contribute: %+v, %v", r, err)
	}
	r, err = n.Broadcast(Allgather, 1, []byte("z"))
	if err != nil || len(r.Msgs) != 0 || len(r.Events) != 1 || r.Events[0].Type != EventDelivered {
		t.Fatalf("broadcast: %+v, %v", r, err)
	}
}

// TestWindowSlides: finished epochs free the window, so a long run of
// epochs never hits ErrFutureEpoch.
func TestWindowSlides(t *testing.T) {
	s := newSim(t, rand.New(rand.NewPCG(1, 1)), 3, 2, 2)
	for e := uint64(1); e <= 100; e++ {
		for i := range 3 {
			b, _ := AppendEntries(nil, []Entry{{Rank: uint32(i), Value: []byte{byte(e)}}})
			r, err := s.nodes[i].Contribute(Allgather, e, b)
			if err != nil {
				t.Fatalf("epoch %d node %d: %v", e, i, err)
			}
			s.take(i, r)
		}
		for len(s.wire) > 0 {
			s.deliverOne()
		}
		r, err := s.nodes[0].Broadcast(Allgather, e, s.gather[[2]uint64{uint64(Allgather), e}])
		if err != nil {
			t.Fatal(err)
		}
		s.take(0, r)
		for len(s.wire) > 0 {
			s.deliverOne()
		}
	}
}
