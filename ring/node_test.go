package ring

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

// reference computes every process's answer over the flat list of all
// entries in ring order, the obvious way.
func reference(flat []Entry) []Result {
	var size uint64
	for _, e := range flat {
		size += uint64(e.Count)
	}
	out := make([]Result, len(flat))
	var pos uint64
	for j, e := range flat {
		out[j] = Result{
			Position: pos,
			Size:     size,
			Left:     flat[(j-1+len(flat))%len(flat)].Right,
			Right:    flat[(j+1)%len(flat)].Left,
		}
		pos += uint64(e.Count)
	}
	return out
}

// runRing drives one Node per non-empty node of m, delivering messages in
// random order, and returns every rank's answer indexed by rank and the
// number of messages each node sent.
func runRing(t *testing.T, rng *rand.Rand, m *Map, mode CountMode, epoch uint64, entries map[int][]Entry) ([]Result, map[int]int) {
	t.Helper()
	nodes := map[int]*Node{}
	sent := map[int]int{}
	var wire []Message
	for n := range m.Nodes() {
		if len(m.Ranks(n)) == 0 {
			continue
		}
		nd, err := New(Config{Map: m, Node: n, Epoch: epoch, Mode: mode}, entries[n])
		if err != nil {
			t.Fatalf("New node %d: %v", n, err)
		}
		nodes[n] = nd
	}
	// Start in random order, interleaved with deliveries.
	var unstarted []int
	for n := range nodes {
		unstarted = append(unstarted, n)
	}
	rng.Shuffle(len(unstarted), func(i, j int) { unstarted[i], unstarted[j] = unstarted[j], unstarted[i] })
	send := func(from int, ms []Message) {
		for _, msg := range ms {
			if msg.From != from || msg.Epoch != epoch {
				t.Fatalf("node %d sent %+v", from, msg)
			}
			// Every message goes through the codec.
			got, err := DecodeMessage(AppendMessage(nil, msg))
			if err != nil || got != msg {
				t.Fatalf("codec round trip of %+v: %+v, %v", msg, got, err)
			}
			sent[from]++
			wire = append(wire, got)
		}
	}
	for len(unstarted) > 0 || len(wire) > 0 {
		if len(unstarted) > 0 && (len(wire) == 0 || rng.IntN(3) == 0) {
			n := unstarted[0]
			unstarted = unstarted[1:]
			send(n, nodes[n].Start())
			continue
		}
		i := rng.IntN(len(wire))
		msg := wire[i]
		wire = append(wire[:i], wire[i+1:]...)
		out, err := nodes[msg.To].Step(msg)
		if err != nil {
			t.Fatalf("deliver %+v: %v", msg, err)
		}
		send(msg.To, out)
	}
	res := make([]Result, m.Size())
	for n, nd := range nodes {
		if !nd.Done() {
			t.Fatalf("node %d not done after all messages", n)
		}
		rs, err := nd.Results(nil)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range m.Ranks(n) {
			res[r] = rs[i]
		}
	}
	return res, sent
}

// randomMap places p ranks on k nodes block, cyclic, or at random (with
// some nodes left empty).
func randomMap(t *testing.T, rng *rand.Rand) *Map {
	t.Helper()
	k := 1 + rng.IntN(50)
	var m *Map
	var err error
	switch rng.IntN(3) {
	case 0:
		ppn := 1 + rng.IntN(20)
		m, err = Block(1+rng.IntN(k*ppn), k, ppn)
	case 1:
		ppn := 1 + rng.IntN(20)
		m, err = Cyclic(1+rng.IntN(k*ppn), k, ppn)
	default:
		nodes := make([][]int, k)
		p := 0
		for n := range nodes {
			if rng.IntN(5) > 0 || n == 0 {
				c := 1 + rng.IntN(20)
				for range c {
					nodes[n] = append(nodes[n], p)
					p++
				}
			}
		}
		perm := rng.Perm(p)
		for _, rs := range nodes {
			for i := range rs {
				rs[i] = perm[rs[i]]
			}
		}
		m, err = FromNodes(nodes)
	}
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestRingDifferential(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 400 {
		m := randomMap(t, rng)
		mode := CountsFromMap
		if iter%2 == 1 {
			mode = CountsChained
		}
		entries := map[int][]Entry{}
		var flat []Entry // ring order
		var flatRanks []int
		for n := range m.Nodes() {
			for _, r := range m.Ranks(n) {
				e := Entry{Count: 1, Left: fmt.Sprintf("L%d.%d", r, rng.IntN(1000)), Right: fmt.Sprintf("R%d.%d", r, rng.IntN(1000))}
				if mode == CountsChained {
					e.Count = uint32(rng.IntN(4))
				}
				entries[n] = append(entries[n], e)
				flat = append(flat, e)
				flatRanks = append(flatRanks, r)
			}
		}
		epoch := uint64(1 + rng.IntN(5))
		got, sent := runRing(t, rng, m, mode, epoch, entries)
		want := reference(flat)
		for j, r := range flatRanks {
			if got[r] != want[j] {
				t.Fatalf("iter %d (%d nodes, %d ranks, %v): rank %d: got %+v, want %+v", iter, m.Nodes(), m.Size(), mode, r, got[r], want[j])
			}
			if mode == CountsFromMap && got[r].Position != uint64(m.Position(r)) {
				t.Fatalf("rank %d: position %d, map says %d", r, got[r].Position, m.Position(r))
			}
		}
		nonEmpty := 0
		for n := range m.Nodes() {
			if len(m.Ranks(n)) > 0 {
				nonEmpty++
			}
		}
		for n, c := range sent {
			if nonEmpty > 1 && c != 2 {
				t.Fatalf("iter %d: node %d sent %d messages, want 2", iter, n, c)
			}
		}
		if nonEmpty == 1 && len(sent) != 0 {
			t.Fatalf("one-node ring sent %v", sent)
		}
		if nonEmpty > 1 && len(sent) != nonEmpty {
			t.Fatalf("%d nodes sent, %d non-empty", len(sent), nonEmpty)
		}
	}
}

func TestRingTwoMessagesPerNode(t *testing.T) {
	for _, mode := range []CountMode{CountsFromMap, CountsChained} {
		for k := 2; k <= 9; k++ {
			m, err := Block(3*k, k, 3)
			if err != nil {
				t.Fatal(err)
			}
			entries := map[int][]Entry{}
			for n := range k {
				for range 3 {
					entries[n] = append(entries[n], Entry{Count: 1, Left: "l", Right: "r"})
				}
			}
			_, sent := runRing(t, rand.New(rand.NewPCG(uint64(k), 9)), m, mode, 1, entries)
			for n := range k {
				if sent[n] != 2 {
					t.Errorf("%v, %d nodes: node %d sent %d messages, want 2", mode, k, n, sent[n])
				}
			}
		}
	}
}

func TestRingTable(t *testing.T) {
	e := func(l, r string) Entry { return Entry{Count: 1, Left: l, Right: r} }
	tests := []struct {
		name    string
		nodes   [][]int
		entries map[int][]Entry
		want    map[int]Result // by rank
	}{
		{
			name:    "singleton",
			nodes:   [][]int{{0}},
			entries: map[int][]Entry{0: {e("a", "b")}},
			want:    map[int]Result{0: {0, 1, "b", "a"}},
		},
		{
			name:    "one node, three ranks",
			nodes:   [][]int{{0, 1, 2}},
			entries: map[int][]Entry{0: {e("a0", "b0"), e("a1", "b1"), e("a2", "b2")}},
			want:    map[int]Result{0: {0, 3, "b2", "a1"}, 1: {1, 3, "b0", "a2"}, 2: {2, 3, "b1", "a0"}},
		},
		{
			name:    "two nodes cyclic",
			nodes:   [][]int{{0, 2}, {1, 3}},
			entries: map[int][]Entry{0: {e("a0", "b0"), e("a2", "b2")}, 1: {e("a1", "b1"), e("a3", "b3")}},
			// ring order 0,2,1,3
			want: map[int]Result{0: {0, 4, "b3", "a2"}, 2: {1, 4, "b0", "a1"}, 1: {2, 4, "b2", "a3"}, 3: {3, 4, "b1", "a0"}},
		},
		{
			name:    "empty middle node skipped",
			nodes:   [][]int{{0}, {}, {1}},
			entries: map[int][]Entry{0: {e("x", "x")}, 2: {e("y", "y")}},
			want:    map[int]Result{0: {0, 2, "y", "y"}, 1: {1, 2, "x", "x"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := FromNodes(tc.nodes)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := runRing(t, rand.New(rand.NewPCG(3, 4)), m, CountsFromMap, 7, tc.entries)
			for r, w := range tc.want {
				if got[r] != w {
					t.Errorf("rank %d: got %+v, want %+v", r, got[r], w)
				}
			}
		})
	}
}

func TestRingRejects(t *testing.T) {
	m, _ := Block(6, 3, 2)
	mk := func(node int, mode CountMode) *Node {
		nd, err := New(Config{Map: m, Node: node, Epoch: 5, Mode: mode}, []Entry{{1, "a", "b"}, {1, "c", "d"}})
		if err != nil {
			t.Fatal(err)
		}
		nd.Start()
		return nd
	}
	good := Message{Epoch: 5, From: 0, To: 1, Dir: ToRight, Mode: CountsFromMap, Offset: 2, Size: 6, HasSize: true, Value: "v"}
	tests := []struct {
		name string
		mut  func(*Message)
		want error
	}{
		{"stale epoch", func(m *Message) { m.Epoch = 4 }, ErrStaleEpoch},
		{"future epoch", func(m *Message) { m.Epoch = 6 }, ErrFutureEpoch},
		{"wrong receiver", func(m *Message) { m.To = 2 }, ErrUnexpected},
		{"wrong sender", func(m *Message) { m.From = 2 }, ErrUnexpected},
		{"wrong mode", func(m *Message) { m.Mode = CountsChained }, ErrUnexpected},
		{"wrong offset", func(m *Message) { m.Offset = 3 }, ErrMismatch},
		{"wrong size", func(m *Message) { m.Size = 7 }, ErrMismatch},
		{"huge offset", func(m *Message) { m.Offset = 1<<64 - 1; m.HasSize = false }, ErrMismatch},
	}
	for _, tc := range tests {
		nd := mk(1, CountsFromMap)
		msg := good
		tc.mut(&msg)
		if _, err := nd.Step(msg); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
		// A refused message changes nothing: the good one still fits.
		if _, err := nd.Step(good); err != nil {
			t.Errorf("%s: good message after refusal: %v", tc.name, err)
		}
		if _, err := nd.Step(good); !errors.Is(err, ErrDuplicate) {
			t.Errorf("%s: duplicate: got %v", tc.name, err)
		}
	}
	// Chained: a ToLeft to a middle node must carry the size.
	nd := mk(1, CountsChained)
	if _, err := nd.Step(Message{Epoch: 5, From: 0, To: 1, Dir: ToRight, Mode: CountsChained, Offset: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := nd.Step(Message{Epoch: 5, From: 2, To: 1, Dir: ToLeft, Mode: CountsChained, Offset: 4}); !errors.Is(err, ErrMismatch) {
		t.Errorf("ToLeft without size: %v", err)
	}
	if _, err := nd.Outcome(); !errors.Is(err, ErrNotDone) {
		t.Errorf("Outcome before done: %v", err)
	}
	// Count mode refusals.
	if _, err := New(Config{Map: m, Node: 0, Mode: CountsFromMap}, []Entry{{2, "", ""}, {1, "", ""}}); !errors.Is(err, ErrCounts) {
		t.Errorf("count 2 in from-map mode: %v", err)
	}
	if _, err := New(Config{Map: m, Node: 0, Mode: CountsFromMap}, []Entry{{1, "", ""}}); !errors.Is(err, ErrMap) {
		t.Errorf("too few entries: %v", err)
	}
}

// TestSequenceHoldsNextEpoch: a neighbour one epoch ahead is held and
// replayed; two epochs ahead and past epochs are refused.
func TestSequenceHoldsNextEpoch(t *testing.T) {
	m, _ := Block(2, 2, 1)
	a := NewSequence(Config{Map: m, Node: 0, Mode: CountsFromMap})
	b := NewSequence(Config{Map: m, Node: 1, Mode: CountsFromMap})
	ent := func(v string) []Entry { return []Entry{{1, v, v}} }

	outA, err := a.Start(ent("a1"))
	if err != nil {
		t.Fatal(err)
	}
	outB, err := b.Start(ent("b1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range outA {
		if _, err := b.Step(msg); err != nil {
			t.Fatal(err)
		}
	}
	// b is done with epoch 1 and starts epoch 2 before a hears from it.
	if !b.Done() {
		t.Fatal("b not done")
	}
	outB2, err := b.Start(ent("b2"))
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range outB2 { // epoch 2 reaches a first
		if _, err := a.Step(msg); err != nil {
			t.Fatalf("hold epoch 2: %v", err)
		}
	}
	if a.Done() {
		t.Fatal("a done early")
	}
	for _, msg := range outB {
		if _, err := a.Step(msg); err != nil {
			t.Fatal(err)
		}
	}
	if !a.Done() {
		t.Fatal("a not done with epoch 1")
	}
	o, _ := a.Node().Outcome()
	if o.LeftOfFirst != "b1" || o.RightOfLast != "b1" {
		t.Fatalf("epoch 1 outcome %+v", o)
	}
	if _, err := a.Step(Message{Epoch: 1, From: 1, To: 0, Dir: ToLeft, Mode: CountsFromMap}); !errors.Is(err, ErrStaleEpoch) {
		t.Errorf("finished epoch: %v", err)
	}
	if _, err := a.Step(Message{Epoch: 3, From: 1, To: 0, Dir: ToLeft, Mode: CountsFromMap}); !errors.Is(err, ErrFutureEpoch) {
		t.Errorf("two epochs ahead: %v", err)
	}
	outA2, err := a.Start(ent("a2"))
	if err != nil {
		t.Fatal(err)
	}
	if !a.Done() || len(outA2) != 2 {
		t.Fatalf("epoch 2 on a: done %v, %d messages", a.Done(), len(outA2))
	}
	o, _ = a.Node().Outcome()
	if want := (Outcome{0, 2, "b2", "b2"}); o != want {
		t.Fatalf("epoch 2 outcome %+v, want %+v", o, want)
	}
	if _, err := b.Start(ent("b3")); !errors.Is(err, ErrNotDone) {
		t.Errorf("start while running: %v", err)
	}
}

func TestCodecRejects(t *testing.T) {
	good := AppendMessage(nil, Message{Epoch: 1, From: 2, To: 3, Dir: ToLeft, Mode: CountsChained, Offset: 9, Size: 10, HasSize: true, Value: "val"})
	if _, err := DecodeMessage(good); err != nil {
		t.Fatal(err)
	}
	for i := range good {
		if _, err := DecodeMessage(good[:i]); !errors.Is(err, ErrMalformed) {
			t.Errorf("truncated to %d: %v", i, err)
		}
	}
	if _, err := DecodeMessage(append(good[:len(good):len(good)], 'x')); !errors.Is(err, ErrMalformed) {
		t.Errorf("trailing byte: %v", err)
	}
	for _, off := range []int{0, 1, 5, 6, 7} { // tag, version, dir, mode, flags
		b := append([]byte(nil), good...)
		b[off] = 0xfe
		if _, err := DecodeMessage(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("byte %d corrupted: %v", off, err)
		}
	}
	if got, _ := DecodeMessage(good); !reflect.DeepEqual(got.Value, "val") {
		t.Errorf("value %q", got.Value)
	}
}
