package tree

import (
	"errors"
	"fmt"
)

// Bounds of a Topology.
const (
	MaxNodes = 1 << 24
	MaxWidth = 1 << 16
)

// ErrTopology reports an invalid tree shape or node id.
var ErrTopology = errors.New("invalid tree topology")

// Topology is a k-ary tree over nodes 0..K-1 rooted at node 0.
type Topology struct {
	nodes, width int
}

// NewTopology checks 1 <= nodes <= MaxNodes and 1 <= width <= MaxWidth.
func NewTopology(nodes, width int) (Topology, error) {
	if nodes < 1 || nodes > MaxNodes || width < 1 || width > MaxWidth {
		return Topology{}, fmt.Errorf("make tree of %d nodes, width %d: %w", nodes, width, ErrTopology)
	}
	return Topology{nodes: nodes, width: width}, nil
}

// Nodes is K.
func (t Topology) Nodes() int { return t.nodes }

// Width is k.
func (t Topology) Width() int { return t.width }

// Parent of node i; -1 for the root.
func (t Topology) Parent(i int) int {
	if i == 0 {
		return -1
	}
	return (i - 1) / t.width
}

// ChildRange: node i's children are lo..hi-1 (none when lo == hi).
func (t Topology) ChildRange(i int) (lo, hi int) {
	lo = t.width*i + 1
	hi = lo + t.width
	lo, hi = min(lo, t.nodes), min(hi, t.nodes)
	return lo, hi
}

// Children of node i in order.
func (t Topology) Children(i int) []int {
	lo, hi := t.ChildRange(i)
	cs := make([]int, 0, hi-lo)
	for c := lo; c < hi; c++ {
		cs = append(cs, c)
	}
	return cs
}

// Depth of node i: 0 for the root.
func (t Topology) Depth(i int) int {
	d := 0
	for ; i > 0; i = (i - 1) / t.width {
		d++
	}
	return d
}

// Height is the largest depth (of node K-1).
func (t Topology) Height() int { return t.Depth(t.nodes - 1) }

// valid reports whether i is a node of t.
func (t Topology) valid(i int) bool { return i >= 0 && i < t.nodes }
