package ring

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// linkSim drives one Link per node holding ranks through several epochs,
// as the agent does, over a simulated network. The ranks of the ring enter
// their epochs in a random order that respects PMIX_Ring: a rank enters
// epoch e+1 only once both its neighbours' values of epoch e are known to
// it (a local neighbour's once that rank entered e; a neighbour node's once
// the Link delivered it). A boundary rank's Send happens some random time
// after it entered, and messages arrive in a random interleaving, in order
// per sender and receiver, as on one TCP connection per pair of nodes.
// Every delivered value is checked against the flat ring order.
type linkSim struct {
	t      *testing.T
	desc   string // for failures
	rng    *rand.Rand
	m      *Map
	epochs uint64
	salt   string

	flat    []int    // ranks in ring order, built from the node lists
	nodeAt  []int    // by position: the node
	first   []bool   // by position: the node's first rank
	last    []bool   // by position: the node's last rank
	entered []uint64 // by position: last epoch the rank entered

	links   map[int]*Link
	sent    map[int]*[2]uint64    // by node and side: last epoch sent
	got     map[int]*[2][]string  // by node, side and epoch: delivered value
	have    map[int]*[2][]bool    // by node, side and epoch: delivered
	held    map[int]*[2]heldValue // by node and side: Recv held this
	pending []pendingSend         // boundary ranks entered, not yet sent
	queues  map[[2]int][]Message  // by (from, to): in flight, in order
	qkeys   [][2]int              // queues' keys, in a reproducible order
	onWire  map[int][]int         // by node and epoch: messages to other nodes
	toSelf  map[int][]int         // by node and epoch: messages to itself
	holds   int                   // values Recv held and Send returned
}

type heldValue struct {
	epoch uint64
	value string
}

type pendingSend struct {
	node  int
	d     Dir
	epoch uint64
}

// sideIdx indexes per-side state by the direction the side sends in.
func sideIdx(d Dir) int {
	if d == ToLeft {
		return 0
	}
	return 1
}

func newLinkSim(t *testing.T, desc string, rng *rand.Rand, m *Map, epochs uint64) *linkSim {
	t.Helper()
	s := &linkSim{
		t: t, desc: desc, rng: rng, m: m, epochs: epochs, salt: fmt.Sprintf("%x", rng.Uint32()),
		links: map[int]*Link{}, sent: map[int]*[2]uint64{}, got: map[int]*[2][]string{},
		have: map[int]*[2][]bool{}, held: map[int]*[2]heldValue{},
		queues: map[[2]int][]Message{}, onWire: map[int][]int{}, toSelf: map[int][]int{},
	}
	for n := range m.Nodes() {
		rs := m.Ranks(n)
		for i, r := range rs {
			s.flat = append(s.flat, r)
			s.nodeAt = append(s.nodeAt, n)
			s.first = append(s.first, i == 0)
			s.last = append(s.last, i == len(rs)-1)
		}
	}
	s.entered = make([]uint64, len(s.flat))
	if len(s.flat) != m.Size() {
		s.fatalf("%d ranks in the node lists, map size %d", len(s.flat), m.Size())
	}
	for p, r := range s.flat {
		if m.Position(r) != p {
			s.fatalf("rank %d at ring position %d, map says %d", r, p, m.Position(r))
		}
	}
	pos := 0
	for n := range m.Nodes() {
		l, err := NewLink(m, n)
		if err != nil {
			s.fatalf("NewLink(%d): %v", n, err)
		}
		if l.Offset() != pos || l.Size() != len(s.flat) {
			s.fatalf("node %d: offset %d size %d, want %d %d", n, l.Offset(), l.Size(), pos, len(s.flat))
		}
		pos += len(m.Ranks(n))
		if len(m.Ranks(n)) == 0 {
			continue
		}
		s.links[n] = l
		s.sent[n] = &[2]uint64{}
		s.got[n] = &[2][]string{make([]string, epochs+1), make([]string, epochs+1)}
		s.have[n] = &[2][]bool{make([]bool, epochs+1), make([]bool, epochs+1)}
		s.held[n] = &[2]heldValue{}
		s.onWire[n] = make([]int, epochs+1)
		s.toSelf[n] = make([]int, epochs+1)
	}
	return s
}

func (s *linkSim) fatalf(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf("%s, %d nodes, %d ranks, %d epochs: %s", s.desc, s.m.Nodes(), s.m.Size(), s.epochs, fmt.Sprintf(format, args...))
}

// value is rank r's Left (right false) or Right value of epoch e.
func (s *linkSim) value(r int, e uint64, right bool) string {
	if right {
		return fmt.Sprintf("R%d.%d.%s", r, e, s.salt)
	}
	return fmt.Sprintf("L%d.%d.%s", r, e, s.salt)
}

// want is the reference: the value the side of node n must get in epoch
// e, straight from the flat ring order. Side ToLeft is the first rank's
// left, the Right value of the position before it; side ToRight the last
// rank's right, the Left value of the position after it.
func (s *linkSim) want(n int, d Dir, e uint64) string {
	p, P := s.m.Offset(n), len(s.flat)
	if d == ToLeft {
		return s.value(s.flat[(p-1+P)%P], e, true)
	}
	return s.value(s.flat[(p+len(s.m.Ranks(n)))%P], e, false)
}

// known reports whether the rank at position p knows both neighbours'
// values of epoch e.
func (s *linkSim) known(p int, e uint64) bool {
	n := s.nodeAt[p]
	left := s.first[p] && s.have[n][sideIdx(ToLeft)][e] || !s.first[p] && s.entered[p-1] >= e
	right := s.last[p] && s.have[n][sideIdx(ToRight)][e] || !s.last[p] && s.entered[p+1] >= e
	return left && right
}

func (s *linkSim) canEnter(p int) bool {
	e := s.entered[p]
	return e < s.epochs && (e == 0 || s.known(p, e))
}

func (s *linkSim) enter(p int) {
	s.entered[p]++
	if s.first[p] {
		s.pending = append(s.pending, pendingSend{s.nodeAt[p], ToLeft, s.entered[p]})
	}
	if s.last[p] {
		s.pending = append(s.pending, pendingSend{s.nodeAt[p], ToRight, s.entered[p]})
	}
}

// deliver records the value the side of node n got for epoch e.
func (s *linkSim) deliver(n int, d Dir, e uint64, v, how string) {
	i := sideIdx(d)
	if e < 1 || e > s.epochs {
		s.fatalf("node %d %v: %s delivered epoch %d", n, d, how, e)
	}
	if s.have[n][i][e] {
		s.fatalf("node %d %v epoch %d: %s delivered twice", n, d, e, how)
	}
	// The side's rank is in epoch e: it cannot have gone on without this.
	if s.sent[n][i] != e {
		s.fatalf("node %d %v epoch %d: %s delivered with the side at epoch %d", n, d, e, how, s.sent[n][i])
	}
	if w := s.want(n, d, e); v != w {
		s.fatalf("node %d %v epoch %d: %s delivered %q, want %q", n, d, e, how, v, w)
	}
	s.have[n][i][e], s.got[n][i][e] = true, v
}

func (s *linkSim) send(ps pendingSend) {
	n, l := ps.node, s.links[ps.node]
	rs := s.m.Ranks(n)
	v := s.value(rs[0], ps.epoch, false)
	if ps.d == ToRight {
		v = s.value(rs[len(rs)-1], ps.epoch, true)
	}
	msg, got, ok, err := l.Send(ps.d, ps.epoch, v)
	if err != nil {
		s.fatalf("node %d: Send(%v, %d): %v", n, ps.d, ps.epoch, err)
	}
	i := sideIdx(ps.d)
	s.sent[n][i] = ps.epoch
	left, right := s.m.Neighbours(n)
	to := left
	if ps.d == ToRight {
		to = right
	}
	if msg.From != n || msg.To != to || msg.Epoch != ps.epoch || msg.Dir != ps.d || msg.Value != v {
		s.fatalf("node %d: Send(%v, %d, %q) made %+v", n, ps.d, ps.epoch, v, msg)
	}
	h := s.held[n][i]
	switch {
	case ok && h.epoch != ps.epoch:
		s.fatalf("node %d: Send(%v, %d) returned %q, nothing held", n, ps.d, ps.epoch, got)
	case ok && got != h.value:
		s.fatalf("node %d: Send(%v, %d) returned %q, held %q", n, ps.d, ps.epoch, got, h.value)
	case !ok && h.epoch == ps.epoch:
		s.fatalf("node %d: Send(%v, %d) did not return the held %q", n, ps.d, ps.epoch, h.value)
	}
	if ok {
		s.holds++
		s.held[n][i] = heldValue{}
		s.deliver(n, ps.d, ps.epoch, got, "Send")
	}
	if msg.To == n { // the ring closes on this node
		s.toSelf[n][ps.epoch]++
		s.recv(msg)
		return
	}
	s.onWire[n][ps.epoch]++
	dec, err := DecodeMessage(AppendMessage(nil, msg))
	if err != nil || dec != msg {
		s.fatalf("codec round trip of %+v: %+v, %v", msg, dec, err)
	}
	k := [2]int{msg.From, msg.To}
	if _, ok := s.queues[k]; !ok {
		s.qkeys = append(s.qkeys, k)
	}
	s.queues[k] = append(s.queues[k], dec)
}

func (s *linkSim) recv(msg Message) {
	n := msg.To
	side, deliver, err := s.links[n].Recv(msg)
	if err != nil {
		s.fatalf("node %d: Recv(%+v): %v", n, msg, err)
	}
	want := ToRight // a ToLeft came from the right: the last rank's right
	if msg.Dir == ToRight {
		want = ToLeft
	}
	if side != want {
		s.fatalf("node %d: Recv(%v) answers side %v, want %v", n, msg.Dir, side, want)
	}
	if deliver {
		s.deliver(n, side, msg.Epoch, msg.Value, "Recv")
		return
	}
	i := sideIdx(side)
	if s.sent[n][i]+1 != msg.Epoch || s.held[n][i].epoch != 0 {
		s.fatalf("node %d %v: held epoch %d with the side at %d, holding %+v", n, side, msg.Epoch, s.sent[n][i], s.held[n][i])
	}
	s.held[n][i] = heldValue{msg.Epoch, msg.Value}
}

// run performs random enabled actions until none is left, then checks
// that every rank finished every epoch.
func (s *linkSim) run() {
	type action struct {
		kind int // 0 enter, 1 send, 2 deliver
		i    int
		q    [2]int
	}
	var acts []action
	for {
		acts = acts[:0]
		for p := range s.flat {
			if s.canEnter(p) {
				acts = append(acts, action{kind: 0, i: p})
			}
		}
		for i := range s.pending {
			acts = append(acts, action{kind: 1, i: i})
		}
		for _, q := range s.qkeys {
			if len(s.queues[q]) > 0 {
				acts = append(acts, action{kind: 2, q: q})
			}
		}
		if len(acts) == 0 {
			break
		}
		a := acts[s.rng.IntN(len(acts))]
		switch a.kind {
		case 0:
			s.enter(a.i)
		case 1:
			ps := s.pending[a.i]
			s.pending = append(s.pending[:a.i], s.pending[a.i+1:]...)
			s.send(ps)
		case 2:
			msg := s.queues[a.q][0]
			s.queues[a.q] = s.queues[a.q][1:]
			s.recv(msg)
		}
	}
	for p := range s.flat {
		if s.entered[p] != s.epochs || !s.known(p, s.epochs) {
			s.fatalf("rank %d (position %d) stuck: entered %d of %d epochs", s.flat[p], p, s.entered[p], s.epochs)
		}
	}
	for n := range s.links {
		for e := uint64(1); e <= s.epochs; e++ {
			for _, d := range []Dir{ToLeft, ToRight} {
				if got, w := s.got[n][sideIdx(d)][e], s.want(n, d, e); !s.have[n][sideIdx(d)][e] || got != w {
					s.fatalf("node %d %v epoch %d: got %q, want %q", n, d, e, got, w)
				}
			}
		}
	}
}

// checkCounts: two messages per node and epoch, to the neighbours on a
// ring of several nodes, to the node itself on a ring of one.
func (s *linkSim) checkCounts() {
	for n := range s.links {
		for e := uint64(1); e <= s.epochs; e++ {
			wire, self := s.onWire[n][e], s.toSelf[n][e]
			if len(s.links) == 1 && (wire != 0 || self != 2) || len(s.links) > 1 && (wire != 2 || self != 0) {
				s.fatalf("%d-node ring: node %d epoch %d: %d messages on the wire, %d to itself", len(s.links), n, e, wire, self)
			}
		}
	}
}

// oneNodeMap places p ranks, in random order, on one of k nodes.
func oneNodeMap(t *testing.T, rng *rand.Rand, k, p int) *Map {
	t.Helper()
	nodes := make([][]int, k)
	nodes[rng.IntN(k)] = rng.Perm(p)
	m, err := FromNodes(nodes)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestLinkDifferential(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	var oneNode, withEmpty, headNotZero, holds int
	for iter := range 600 {
		var m *Map
		switch {
		case iter%10 == 0:
			m = oneNodeMap(t, rng, 1+rng.IntN(4), 1+rng.IntN(4))
		case iter%50 == 1:
			m = randomMap(t, rng, 40, 16) // a few large rings
		default:
			m = randomMap(t, rng, 10, 4)
		}
		epochs := uint64(1 + rng.IntN(5))
		s := newLinkSim(t, fmt.Sprintf("iter %d", iter), rng, m, epochs)
		s.run()
		s.checkCounts()
		if len(s.links) == 1 {
			oneNode++
		} else {
			holds += s.holds
		}
		if len(s.links) < m.Nodes() {
			withEmpty++
		}
		if len(m.Ranks(0)) == 0 {
			headNotZero++
		}
	}
	// The random schedules must reach the cases that matter.
	if oneNode < 30 || withEmpty < 50 || headNotZero < 10 || holds < 1000 {
		t.Errorf("coverage: %d one-node rings, %d with empty nodes, %d with node 0 empty, %d values held on rings of several nodes", oneNode, withEmpty, headNotZero, holds)
	}
}

// TestLinkOneNode spells the closed ring out: the first rank's left is the
// last rank's Right, the last rank's right the first rank's Left.
func TestLinkOneNode(t *testing.T) {
	for _, nodes := range [][][]int{{{0}}, {{2, 0, 1}}, {{}, {1, 0}, {}}} {
		m, err := FromNodes(nodes)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for len(m.Ranks(n)) == 0 {
			n++
		}
		l, err := NewLink(m, n)
		if err != nil {
			t.Fatal(err)
		}
		for e := uint64(1); e <= 3; e++ {
			ml, _, ok, err := l.Send(ToLeft, e, fmt.Sprintf("first-left-%d", e))
			if err != nil || ok || ml.To != n || ml.From != n {
				t.Fatalf("%v epoch %d: Send(ToLeft): %+v, %v, %v", nodes, e, ml, ok, err)
			}
			side, deliver, err := l.Recv(ml)
			if err != nil || side != ToRight || deliver {
				t.Fatalf("%v epoch %d: own ToLeft: side %v deliver %v, %v", nodes, e, side, deliver, err)
			}
			mr, got, ok, err := l.Send(ToRight, e, fmt.Sprintf("last-right-%d", e))
			if err != nil || !ok || got != fmt.Sprintf("first-left-%d", e) {
				t.Fatalf("%v epoch %d: Send(ToRight): %q, %v, %v", nodes, e, got, ok, err)
			}
			side, deliver, err = l.Recv(mr)
			if err != nil || side != ToLeft || !deliver || mr.Value != fmt.Sprintf("last-right-%d", e) {
				t.Fatalf("%v epoch %d: own ToRight: side %v deliver %v, %v", nodes, e, side, deliver, err)
			}
		}
	}
}

// TestLinkHold: a neighbour's value for epoch e+1 that arrives before this
// side's Send(e+1) is held and returned by that Send, once, on that side
// only.
func TestLinkHold(t *testing.T) {
	m, _ := Block(4, 2, 2) // node 0: ranks 0 1, node 1: ranks 2 3
	a, _ := NewLink(m, 0)
	b, _ := NewLink(m, 1)
	send := func(l *Link, d Dir, e uint64, v string) (Message, string, bool) {
		t.Helper()
		msg, got, ok, err := l.Send(d, e, v)
		if err != nil {
			t.Fatalf("Send(%v, %d): %v", d, e, err)
		}
		return msg, got, ok
	}
	recv := func(l *Link, msg Message, wantSide Dir, wantDeliver bool) {
		t.Helper()
		side, deliver, err := l.Recv(msg)
		if err != nil || side != wantSide || deliver != wantDeliver {
			t.Fatalf("Recv(%+v): side %v deliver %v, %v; want %v %v", msg, side, deliver, err, wantSide, wantDeliver)
		}
	}
	// Epoch 1 goes both ways.
	aL, _, _ := send(a, ToLeft, 1, "a.L1")
	aR, _, _ := send(a, ToRight, 1, "a.R1")
	bL, _, _ := send(b, ToLeft, 1, "b.L1")
	bR, _, _ := send(b, ToRight, 1, "b.R1")
	recv(b, aL, ToRight, true)
	recv(b, aR, ToLeft, true)
	recv(a, bR, ToLeft, true)
	recv(a, bL, ToRight, true)
	// b enters epoch 2 first; its right value (for a's first rank) and its
	// empty left value reach a before a's ranks enter epoch 2.
	bR2, _, ok := send(b, ToRight, 2, "b.R2")
	if ok {
		t.Fatal("b's right side returned a value before a sent epoch 2")
	}
	bL2, _, _ := send(b, ToLeft, 2, "")
	recv(a, bR2, ToLeft, false)
	// The held left-side value is not the right side's.
	if _, got, ok := send(a, ToRight, 2, "a.R2"); ok {
		t.Fatalf("a's right side returned %q, nothing held there", got)
	}
	recv(a, bL2, ToRight, true) // a's right side already sent 2
	if _, got, ok := send(a, ToLeft, 2, "a.L2"); !ok || got != "b.R2" {
		t.Fatalf("a's left side, epoch 2: %q, %v; want the held b.R2", got, ok)
	}
	// Held once: epoch 3 starts empty, and an empty value is held too.
	if _, got, ok := send(a, ToLeft, 3, "a.L3"); ok {
		t.Fatalf("a's left side, epoch 3: %q returned again", got)
	}
	// a's right side: b's empty ToLeft of epoch 3 arrives first.
	bL3, _, _ := send(b, ToLeft, 3, "")
	recv(a, bL3, ToRight, false)
	if _, got, ok := send(a, ToRight, 3, "a.R3"); !ok || got != "" {
		t.Fatalf("a's right side, epoch 3: %q, %v; want the held empty value", got, ok)
	}
}

// linkRejectCase is one refused Recv or Send: setup brings the Link into
// a state, bad is refused with want, and after it, then still works.
type linkRejectCase struct {
	name  string
	node  int
	setup func(t *testing.T, l *Link)
	bad   func(l *Link) error
	want  error
	then  func(t *testing.T, l *Link)
}

func TestLinkRejects(t *testing.T) {
	m, _ := Block(6, 3, 2) // node 0: 0 1 (head), node 1: 2 3, node 2: 4 5 (tail)
	// Good messages to node 1 in epoch e: from its left neighbour (ToRight,
	// answers side ToLeft) and from its right one (ToLeft, side ToRight).
	fromLeft := func(e uint64) Message {
		return Message{Epoch: e, From: 0, To: 1, Dir: ToRight, Mode: CountsFromMap, Offset: 2, Size: 6, HasSize: true, Value: fmt.Sprintf("l%d", e)}
	}
	fromRight := func(e uint64) Message {
		return Message{Epoch: e, From: 2, To: 1, Dir: ToLeft, Mode: CountsFromMap, Offset: 4, Size: 6, HasSize: true, Value: fmt.Sprintf("r%d", e)}
	}
	mut := func(msg Message, f func(*Message)) Message { f(&msg); return msg }
	recvErr := func(msg Message) func(l *Link) error {
		return func(l *Link) error { _, _, err := l.Recv(msg); return err }
	}
	sendErr := func(d Dir, e uint64) func(l *Link) error {
		return func(l *Link) error { _, _, _, err := l.Send(d, e, "x"); return err }
	}
	mustSend := func(d Dir, e uint64) func(t *testing.T, l *Link) {
		return func(t *testing.T, l *Link) {
			t.Helper()
			if _, _, _, err := l.Send(d, e, "x"); err != nil {
				t.Fatalf("Send(%v, %d): %v", d, e, err)
			}
		}
	}
	expectRecv := func(msg Message, side Dir, deliver bool) func(t *testing.T, l *Link) {
		return func(t *testing.T, l *Link) {
			t.Helper()
			s, d, err := l.Recv(msg)
			if err != nil || s != side || d != deliver {
				t.Fatalf("Recv(%+v): side %v deliver %v, %v; want %v %v", msg, s, d, err, side, deliver)
			}
		}
	}
	expectSend := func(d Dir, e uint64, got string, ok bool) func(t *testing.T, l *Link) {
		return func(t *testing.T, l *Link) {
			t.Helper()
			_, g, o, err := l.Send(d, e, "x")
			if err != nil || g != got || o != ok {
				t.Fatalf("Send(%v, %d): %q %v, %v; want %q %v", d, e, g, o, err, got, ok)
			}
		}
	}
	steps := func(fs ...func(t *testing.T, l *Link)) func(t *testing.T, l *Link) {
		return func(t *testing.T, l *Link) {
			t.Helper()
			for _, f := range fs {
				f(t, l)
			}
		}
	}
	sentBoth := steps(mustSend(ToLeft, 1), mustSend(ToRight, 1))
	none := func(*testing.T, *Link) {}
	// The good messages of epoch 1 once both sides sent it.
	goodAfter := steps(expectRecv(fromLeft(1), ToLeft, true), expectRecv(fromRight(1), ToRight, true))

	cases := []linkRejectCase{
		{"wrong receiver", 1, sentBoth, recvErr(mut(fromLeft(1), func(m *Message) { m.To = 2 })), ErrUnexpected, goodAfter},
		{"wrong sender from the left", 1, sentBoth, recvErr(mut(fromLeft(1), func(m *Message) { m.From = 2 })), ErrUnexpected, goodAfter},
		{"wrong sender from the right", 1, sentBoth, recvErr(mut(fromRight(1), func(m *Message) { m.From = 0 })), ErrUnexpected, goodAfter},
		{"self as sender", 1, sentBoth, recvErr(mut(fromRight(1), func(m *Message) { m.From = 1 })), ErrUnexpected, goodAfter},
		{"mode 2", 1, sentBoth, recvErr(mut(fromLeft(1), func(m *Message) { m.Mode = 2 })), ErrUnexpected, goodAfter},
		{"mode 0", 1, sentBoth, recvErr(mut(fromRight(1), func(m *Message) { m.Mode = 0 })), ErrUnexpected, goodAfter},
		{"direction 0", 1, sentBoth, recvErr(mut(fromLeft(1), func(m *Message) { m.Dir = 0 })), ErrUnexpected, goodAfter},
		{"direction 3", 1, sentBoth, recvErr(mut(fromLeft(1), func(m *Message) { m.Dir = 3 })), ErrUnexpected, goodAfter},
		// Right sender, wrong direction: node 0 sends ToRight to node 1.
		{"reversed direction", 1, sentBoth, recvErr(mut(fromLeft(1), func(m *Message) { m.Dir = ToLeft })), ErrUnexpected, goodAfter},
		{"wrong size", 1, sentBoth, recvErr(mut(fromLeft(1), func(m *Message) { m.Size = 7 })), ErrMismatch, goodAfter},
		{"no size", 1, sentBoth, recvErr(mut(fromRight(1), func(m *Message) { m.HasSize = false })), ErrMismatch, goodAfter},
		{"wrong offset from the left", 1, sentBoth, recvErr(mut(fromLeft(1), func(m *Message) { m.Offset = 3 })), ErrMismatch, goodAfter},
		{"wrong offset from the right", 1, sentBoth, recvErr(mut(fromRight(1), func(m *Message) { m.Offset = 2 })), ErrMismatch, goodAfter},
		{"huge offset", 1, sentBoth, recvErr(mut(fromRight(1), func(m *Message) { m.Offset = 1<<64 - 1 })), ErrMismatch, goodAfter},
		// The head gets the tail's ToRight at the ring size, not at the
		// tail's own end in some other sense.
		{"head: tail's end not the size", 0, sentBoth,
			recvErr(Message{Epoch: 1, From: 2, To: 0, Dir: ToRight, Mode: CountsFromMap, Offset: 4, Size: 6, HasSize: true}), ErrMismatch,
			expectRecv(Message{Epoch: 1, From: 2, To: 0, Dir: ToRight, Mode: CountsFromMap, Offset: 6, Size: 6, HasSize: true}, ToLeft, true)},
		{"tail: head's offset not 0", 2, sentBoth,
			recvErr(Message{Epoch: 1, From: 0, To: 2, Dir: ToLeft, Mode: CountsFromMap, Offset: 6, Size: 6, HasSize: true}), ErrMismatch,
			expectRecv(Message{Epoch: 1, From: 0, To: 2, Dir: ToLeft, Mode: CountsFromMap, Offset: 0, Size: 6, HasSize: true}, ToRight, true)},
		{"epoch 0", 1, sentBoth, recvErr(fromLeft(0)), ErrSequence, goodAfter},
		{"duplicate epoch", 1, steps(sentBoth, expectRecv(fromLeft(1), ToLeft, true)), recvErr(fromLeft(1)), ErrSequence,
			steps(expectRecv(fromLeft(2), ToLeft, false), expectSend(ToLeft, 2, "l2", true))},
		{"duplicate held epoch", 1, expectRecv(fromLeft(1), ToLeft, false), recvErr(fromLeft(1)), ErrSequence,
			expectSend(ToLeft, 1, "l1", true)},
		{"skipped epoch", 1, sentBoth, recvErr(fromLeft(2)), ErrSequence, goodAfter},
		{"skipped epoch, nothing sent", 1, none, recvErr(fromRight(2)), ErrSequence,
			steps(expectRecv(fromRight(1), ToRight, false), expectSend(ToRight, 1, "r1", true))},
		// got+1 but two past the side's last Send.
		{"two ahead of the side", 1, steps(expectRecv(fromLeft(1), ToLeft, false)), recvErr(fromLeft(2)), ErrFutureEpoch,
			steps(expectSend(ToLeft, 1, "l1", true), expectRecv(fromLeft(2), ToLeft, false), expectSend(ToLeft, 2, "l2", true))},
		{"two ahead, the held value kept", 1, steps(mustSend(ToRight, 1), expectRecv(fromRight(1), ToRight, true), expectRecv(fromRight(2), ToRight, false)),
			recvErr(fromRight(3)), ErrFutureEpoch,
			steps(expectSend(ToRight, 2, "r2", true), expectRecv(fromRight(3), ToRight, false), expectSend(ToRight, 3, "r3", true))},
		// The other side's Sends do not let a side run ahead.
		{"ahead of its own side", 1, steps(mustSend(ToLeft, 1), mustSend(ToLeft, 2), expectRecv(fromRight(1), ToRight, false)),
			recvErr(fromRight(2)), ErrFutureEpoch,
			steps(expectSend(ToRight, 1, "r1", true), expectRecv(fromRight(2), ToRight, false))},
		{"Send skips an epoch", 1, none, sendErr(ToLeft, 2), ErrSequence,
			steps(expectSend(ToLeft, 1, "", false), expectSend(ToLeft, 2, "", false))},
		{"Send repeats an epoch", 1, sentBoth, sendErr(ToRight, 1), ErrSequence, expectSend(ToRight, 2, "", false)},
		{"Send epoch 0", 1, none, sendErr(ToRight, 0), ErrSequence, expectSend(ToRight, 1, "", false)},
		{"Send goes back", 1, steps(mustSend(ToLeft, 1), mustSend(ToLeft, 2)), sendErr(ToLeft, 1), ErrSequence, expectSend(ToLeft, 3, "", false)},
		{"Send direction 0", 1, none, sendErr(0, 1), ErrUnexpected, steps(sentBoth, goodAfter)},
		{"Send direction 3", 1, none, sendErr(3, 1), ErrUnexpected, steps(sentBoth, goodAfter)},
		// A refused Send keeps a held value for the right one.
		{"Send refused while holding", 1, expectRecv(fromLeft(1), ToLeft, false), sendErr(ToLeft, 2), ErrSequence,
			expectSend(ToLeft, 1, "l1", true)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, err := NewLink(m, tc.node)
			if err != nil {
				t.Fatal(err)
			}
			tc.setup(t, l)
			if err := tc.bad(l); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			tc.then(t, l)
		})
	}
}

func TestNewLinkRejects(t *testing.T) {
	m, _ := Block(4, 2, 2)
	if _, err := NewLink(nil, 0); err == nil {
		t.Error("no map: no error")
	}
	for _, n := range []int{-1, 2} {
		if _, err := NewLink(m, n); !errors.Is(err, ErrMap) {
			t.Errorf("node %d: %v", n, err)
		}
	}
}
