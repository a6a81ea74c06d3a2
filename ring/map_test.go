package ring

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestProcessMapping(t *testing.T) {
	must := func(m *Map, err error) *Map {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	tests := []struct {
		name string
		m    *Map
		want string
	}{
		{"block 2x4", must(Block(8, 2, 4)), "(vector,(0,2,4))"},
		{"block uneven 4,4,2", must(Block(10, 3, 4)), "(vector,(0,2,4),(2,1,2))"},
		{"cyclic 2x2", must(Cyclic(4, 2, 2)), "(vector,(0,2,1),(0,2,1))"},
		{"cyclic 5 on 2", must(Cyclic(5, 2, 3)), "(vector,(0,2,1),(0,2,1),(0,1,1))"},
		{"singleton", must(Block(1, 1, 1)), "(vector,(0,1,1))"},
		{"4096x256 block", must(Block(4096*256, 4096, 256)), "(vector,(0,4096,256))"},
		{"4096x4 cyclic", must(Cyclic(4096*4, 4096, 4)), "(vector,(0,4096,1),(0,4096,1),(0,4096,1),(0,4096,1))"},
		{"1000x100 cyclic", must(Cyclic(1000*100, 1000, 100)), "(vector,[(0,1000,1)]x100)"},
		{"cyclic with tail", must(Cyclic(1000*100+3, 1000, 101)), "(vector,[(0,1000,1)]x100,(0,3,1))"},
		{"arbitrary", must(FromNodes([][]int{{1, 2}, {0}, {3}})), "(vector,(1,1,1),(0,1,2),(2,1,1))"},
	}
	for _, tc := range tests {
		got := tc.m.ProcessMapping()
		if got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
		checkRoundTrip(t, tc.m, got)
	}
}

// checkRoundTrip parses s and compares every rank's node with m.
func checkRoundTrip(t *testing.T, m *Map, s string) {
	t.Helper()
	if s == "" {
		return
	}
	if len(s) > MaxMappingLen {
		t.Fatalf("mapping of %d bytes", len(s))
	}
	got, err := ParseProcessMapping(s, m.Size())
	if err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	for r, n := range got {
		if n != m.NodeOf(r) {
			t.Fatalf("parse %q: rank %d on node %d, map says %d", s, r, n, m.NodeOf(r))
		}
	}
}

func TestProcessMappingTooLong(t *testing.T) {
	// A random permutation over many nodes has no short form.
	rng := rand.New(rand.NewPCG(5, 6))
	nodes := make([][]int, 300)
	for i, r := range rng.Perm(600) {
		nodes[i%300] = append(nodes[i%300], r)
	}
	m, err := FromNodes(nodes)
	if err != nil {
		t.Fatal(err)
	}
	if s := m.ProcessMapping(); s != "" {
		t.Fatalf("got %d bytes, want empty", len(s))
	}
}

// randomMap places up to maxRanks ranks per node on 1..maxNodes nodes in
// blocks, cyclically, or at random with some nodes left empty (the first
// ones too).
func randomMap(t *testing.T, rng *rand.Rand, maxNodes, maxRanks int) *Map {
	t.Helper()
	k := 1 + rng.IntN(maxNodes)
	var m *Map
	var err error
	switch rng.IntN(3) {
	case 0:
		ppn := 1 + rng.IntN(maxRanks)
		m, err = Block(1+rng.IntN(k*ppn), k, ppn)
	case 1:
		ppn := 1 + rng.IntN(maxRanks)
		m, err = Cyclic(1+rng.IntN(k*ppn), k, ppn)
	default:
		nodes := make([][]int, k)
		p := 0
		for n := range nodes {
			if rng.IntN(5) > 0 || n == k-1 && p == 0 {
				c := 1 + rng.IntN(maxRanks)
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

func TestProcessMappingRandomRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	empty := 0
	for range 2000 {
		m := randomMap(t, rng, 50, 20)
		s := m.ProcessMapping()
		if s == "" {
			empty++
		}
		checkRoundTrip(t, m, s)
	}
	if empty > 1800 {
		t.Errorf("%d of 2000 mappings empty", empty)
	}
}

func TestParseProcessMapping(t *testing.T) {
	tests := []struct {
		s    string
		p    int
		want []int
	}{
		{"(vector,(0,2,4))", 8, []int{0, 0, 0, 0, 1, 1, 1, 1}},
		{" ( vector , ( 0 , 2 , 1 ) , ( 0 , 2 , 1 ) ) ", 4, []int{0, 1, 0, 1}},
		{"(vector,[(0,2,1)]x2)", 4, []int{0, 1, 0, 1}},
		{"(vector,(0,4,1))", 8, []int{0, 1, 2, 3, 0, 1, 2, 3}}, // legacy cyclic
		{"(vector,3,1,[0,[2]x2]x2)", 8, []int{3, 1, 0, 2, 2, 0, 2, 2}},
		{"(vector,(2,1,1),(0,2,1))", 5, []int{2, 0, 1, 0, 1}}, // restart at the item starting at 0
		{"(vector,(0,2,4))", 3, []int{0, 0, 0}},
	}
	for _, tc := range tests {
		got, err := ParseProcessMapping(tc.s, tc.p)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%q, %d: got %v, %v; want %v", tc.s, tc.p, got, err, tc.want)
		}
	}
	bad := []string{
		"", "(vector)", "(vector,)", "vector,(0,1,1)", "(vector,(0,1,1)", "(vector,(0,1,1))x",
		"(vector,(0,0,1))", "(vector,(0,1,0))", "(vector,[(0,1,1)]x0)", "(vector,[(0,1,1)])",
		"(vector,(1,1,1))", // exhausted, nothing starts at node 0
		"(vector,(99999999999,1,1))",
		"(vector," + strings.Repeat("[", 20) + "0" + strings.Repeat("]x1", 20) + ")",
	}
	for _, s := range bad {
		if _, err := ParseProcessMapping(s, 4); !errors.Is(err, ErrMap) {
			t.Errorf("%q: got %v, want ErrMap", s, err)
		}
	}
}

func TestMapAccessors(t *testing.T) {
	m, err := Cyclic(7, 3, 3) // node 0: 0 3 6; node 1: 1 4; node 2: 2 5
	if err != nil {
		t.Fatal(err)
	}
	if m.Size() != 7 || m.Nodes() != 3 {
		t.Fatalf("size %d nodes %d", m.Size(), m.Nodes())
	}
	wantPos := []int{0, 3, 5, 1, 4, 6, 2}
	for r := range 7 {
		if m.NodeOf(r) != r%3 || m.LocalIndex(r) != r/3 || m.Position(r) != wantPos[r] {
			t.Errorf("rank %d: node %d local %d pos %d", r, m.NodeOf(r), m.LocalIndex(r), m.Position(r))
		}
	}
	for _, c := range []struct{ p, k, ppn int }{{0, 1, 1}, {1, 0, 1}, {1, 1, 0}, {5, 2, 2}} {
		if _, err := Block(c.p, c.k, c.ppn); !errors.Is(err, ErrMap) {
			t.Errorf("Block%v: %v", c, err)
		}
		if _, err := Cyclic(c.p, c.k, c.ppn); !errors.Is(err, ErrMap) {
			t.Errorf("Cyclic%v: %v", c, err)
		}
	}
	for _, nodes := range [][][]int{nil, {{}}, {{0, 0}}, {{1}}, {{0}, {2}}} {
		if _, err := FromNodes(nodes); !errors.Is(err, ErrMap) {
			t.Errorf("FromNodes(%v): %v", nodes, err)
		}
	}
	b, _ := Block(5, 4, 2) // nodes 2,2,1,0
	if l, r := b.Neighbours(0); l != 2 || r != 1 {
		t.Errorf("neighbours of 0: %d %d", l, r)
	}
	if l, r := b.Neighbours(2); l != 1 || r != 0 {
		t.Errorf("neighbours of 2: %d %d", l, r)
	}
}

// Block and Cyclic make the placements launch's own makes (blocks of
// ppn consecutive ranks, or round robin), for the tests.

// Block places ranks 0..p-1 on k nodes in blocks of ppn consecutive ranks:
// node n holds ranks n*ppn .. n*ppn+ppn-1. The last used node may hold
// fewer, and nodes past it none. p must not exceed k*ppn.
func Block(p, k, ppn int) (*Map, error) {
	if err := checkPlacement(p, k, ppn); err != nil {
		return nil, fmt.Errorf("place %d ranks in blocks: %w", p, err)
	}
	nodes := make([][]int, k)
	for r := range p {
		nodes[r/ppn] = append(nodes[r/ppn], r)
	}
	return build(nodes, p), nil
}

// Cyclic places ranks 0..p-1 round robin on k nodes: rank r on node r mod
// k. p must not exceed k*ppn.
func Cyclic(p, k, ppn int) (*Map, error) {
	if err := checkPlacement(p, k, ppn); err != nil {
		return nil, fmt.Errorf("place %d ranks cyclically: %w", p, err)
	}
	nodes := make([][]int, k)
	for r := range p {
		nodes[r%k] = append(nodes[r%k], r)
	}
	return build(nodes, p), nil
}

func checkPlacement(p, k, ppn int) error {
	switch {
	case p < 1:
		return fmt.Errorf("%w: %d ranks", ErrMap, p)
	case k < 1:
		return fmt.Errorf("%w: %d nodes", ErrMap, k)
	case ppn < 1:
		return fmt.Errorf("%w: %d ranks per node", ErrMap, ppn)
	case (p+ppn-1)/ppn > k:
		return fmt.Errorf("%w: %d ranks do not fit %d nodes of %d", ErrMap, p, k, ppn)
	}
	return nil
}
