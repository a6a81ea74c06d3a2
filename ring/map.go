package ring

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxMappingLen is the longest PMI_process_mapping value ProcessMapping
// returns (the PMI value length limit, vallen_max); a longer mapping is
// replaced by "" as RFC 13 asks.
const MaxMappingLen = 1024

// ErrMap reports an invalid placement or mapping string.
var ErrMap = errors.New("invalid rank map")

// Map is the placement of P ranks on K nodes. Ring order is node order,
// then local order. A Map is immutable; it may be shared.
type Map struct {
	nodes  [][]int // nodes[n]: global ranks on node n, in local order
	nodeOf []int   // nodeOf[r]: node of rank r
	local  []int   // local[r]: index of rank r on its node
	offset []int   // offset[n]: ranks on nodes before n (ring offset with count 1)
}

// FromNodes builds a Map from explicit per-node rank lists in local order.
// Together the lists must hold each of 0..P-1 exactly once; a list may be
// empty. The lists are copied.
func FromNodes(nodes [][]int) (*Map, error) {
	p := 0
	for _, rs := range nodes {
		p += len(rs)
	}
	if len(nodes) == 0 || p == 0 {
		return nil, fmt.Errorf("build map from node lists: %w: no ranks", ErrMap)
	}
	seen := make([]bool, p)
	cp := make([][]int, len(nodes))
	for n, rs := range nodes {
		for _, r := range rs {
			if r < 0 || r >= p {
				return nil, fmt.Errorf("build map from node lists: %w: rank %d on node %d out of range [0,%d)", ErrMap, r, n, p)
			}
			if seen[r] {
				return nil, fmt.Errorf("build map from node lists: %w: rank %d placed twice", ErrMap, r)
			}
			seen[r] = true
		}
		cp[n] = append([]int(nil), rs...)
	}
	return build(cp, p), nil
}

func build(nodes [][]int, p int) *Map {
	m := &Map{
		nodes:  nodes,
		nodeOf: make([]int, p),
		local:  make([]int, p),
		offset: make([]int, len(nodes)),
	}
	off := 0
	for n, rs := range nodes {
		m.offset[n] = off
		for i, r := range rs {
			m.nodeOf[r] = n
			m.local[r] = i
		}
		off += len(rs)
	}
	return m
}

// Size is the number of ranks P.
func (m *Map) Size() int { return len(m.nodeOf) }

// Nodes is the number of nodes K, empty ones included.
func (m *Map) Nodes() int { return len(m.nodes) }

// NodeOf is the node of rank r.
func (m *Map) NodeOf(r int) int { return m.nodeOf[r] }

// LocalIndex is the index of rank r among its node's ranks.
func (m *Map) LocalIndex(r int) int { return m.local[r] }

// Position is rank r's ring position when every rank's count is 1.
func (m *Map) Position(r int) int { return m.offset[m.nodeOf[r]] + m.local[r] }

// Ranks are the ranks on node n in local order. The slice must not be
// modified.
func (m *Map) Ranks(n int) []int { return m.nodes[n] }

// Offset is the ring position of node n's first rank when every count is 1
// (the number of ranks on nodes before n).
func (m *Map) Offset(n int) int { return m.offset[n] }

// Neighbours are the nearest nodes holding ranks before and after node n in
// ring order, wrapping; n itself when it is the only such node.
func (m *Map) Neighbours(n int) (left, right int) {
	k := len(m.nodes)
	left, right = n, n
	for i := 1; i < k; i++ {
		if l := (n - i + k) % k; len(m.nodes[l]) > 0 {
			left = l
			break
		}
	}
	for i := 1; i < k; i++ {
		if r := (n + i) % k; len(m.nodes[r]) > 0 {
			right = r
			break
		}
	}
	return left, right
}

// head is the first node holding ranks: the node at ring offset 0.
func (m *Map) head() int {
	for n, rs := range m.nodes {
		if len(rs) > 0 {
			return n
		}
	}
	return 0 // unreachable: a Map holds at least one rank
}

// tail is the last node holding ranks.
func (m *Map) tail() int {
	for n := len(m.nodes) - 1; n >= 0; n-- {
		if len(m.nodes[n]) > 0 {
			return n
		}
	}
	return 0
}

// item is one block of a mapping vector: nodes start..start+nnodes-1 each
// get ppn consecutive ranks.
type item struct{ start, nnodes, ppn int }

func (it item) String() string {
	return "(" + strconv.Itoa(it.start) + "," + strconv.Itoa(it.nnodes) + "," + strconv.Itoa(it.ppn) + ")"
}

// ProcessMapping is the PMI_process_mapping value of the map in the
// vector format: runs of consecutive ranks on one node, coalesced into
// blocks over consecutive nodes — (vector,(0,2,4)) for 2 nodes of 4 in
// blocks, (vector,(0,2,1),(0,2,1)) for 4 ranks cyclic on 2 nodes. If that
// is longer than MaxMappingLen, a periodic vector is written in MPICH's
// repeat form, (vector,[(0,4096,1)]x256); if that does not fit either, the
// value is "".
func (m *Map) ProcessMapping() string {
	var items []item
	for r := 0; r < len(m.nodeOf); {
		n := m.nodeOf[r]
		run := 1
		for r+run < len(m.nodeOf) && m.nodeOf[r+run] == n {
			run++
		}
		r += run
		if l := len(items) - 1; l >= 0 && items[l].ppn == run && items[l].start+items[l].nnodes == n {
			items[l].nnodes++
			continue
		}
		items = append(items, item{n, 1, run})
	}
	var b strings.Builder
	b.WriteString("(vector")
	for _, it := range items {
		if b.Len() > MaxMappingLen {
			break
		}
		b.WriteString(",")
		b.WriteString(it.String())
	}
	b.WriteString(")")
	if b.Len() <= MaxMappingLen {
		return b.String()
	}
	return repeatForm(items)
}

// repeatForm writes items as [pattern]xN followed by the leftover items,
// choosing the shortest pattern that fits MaxMappingLen; "" if none does.
func repeatForm(items []item) string {
	const maxPattern = MaxMappingLen / 8 // an item takes at least 8 bytes
	for l := 1; l <= maxPattern && 2*l <= len(items); l++ {
		reps := 1
		for (reps+1)*l <= len(items) && equalItems(items[reps*l:(reps+1)*l], items[:l]) {
			reps++
		}
		if reps < 2 || len(items)-reps*l > maxPattern {
			continue
		}
		var b strings.Builder
		b.WriteString("(vector,[")
		for i, it := range items[:l] {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(it.String())
		}
		b.WriteString("]x")
		b.WriteString(strconv.Itoa(reps))
		for _, it := range items[reps*l:] {
			b.WriteString(",")
			b.WriteString(it.String())
		}
		b.WriteString(")")
		if b.Len() <= MaxMappingLen {
			return b.String()
		}
	}
	return ""
}

func equalItems(a, b []item) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
