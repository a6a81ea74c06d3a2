package ring

import (
	"fmt"
)

// Limits of ParseProcessMapping.
const (
	maxMappingNumber = 1 << 31 // largest start, nnodes, ppn or repeat count
	maxMappingDepth  = 8       // deepest nesting of [..]xN
)

// mapItem is a parsed vector item: a block, or a repeat of sub-items.
type mapItem struct {
	block item
	sub   []mapItem // non-nil for a repeat
	times int
}

// firstNode is the node of the first rank the item assigns.
func (it *mapItem) firstNode() int {
	if it.sub != nil {
		return it.sub[0].firstNode()
	}
	return it.block.start
}

// ParseProcessMapping reads a PMI_process_mapping value (pmi-wire.md
// §7.1: blocks, bare node ids, MPICH's [..]xN repeats, whitespace between
// tokens) and returns the node of each of the p ranks. As MPICH does, a
// vector exhausted before p ranks are assigned restarts at its first item
// that begins at node 0 (the legacy cyclic form); ranks beyond p are
// ignored. Blocks and repeats must assign at least one rank.
func ParseProcessMapping(s string, p int) ([]int, error) {
	if p < 1 {
		return nil, fmt.Errorf("parse process mapping: %w: %d ranks", ErrMap, p)
	}
	ps := mappingParser{s: s}
	items, err := ps.vector()
	if err != nil {
		return nil, fmt.Errorf("parse process mapping %q: %w", truncate(s), err)
	}
	out := make([]int, 0, p)
	for _, it := range items {
		if !expand(&out, &it, p) {
			return out, nil
		}
	}
	restart := -1
	for i := range items {
		if items[i].firstNode() == 0 {
			restart = i
			break
		}
	}
	if restart < 0 {
		return nil, fmt.Errorf("parse process mapping %q: %w: %d ranks described, %d needed, and no item starts at node 0",
			truncate(s), ErrMap, len(out), p)
	}
	for {
		for i := restart; i < len(items); i++ {
			if !expand(&out, &items[i], p) {
				return out, nil
			}
		}
	}
}

// expand appends the nodes of the ranks it assigns to out and reports
// whether more ranks are wanted. Every item assigns at least one rank, so
// the work is bounded by p.
func expand(out *[]int, it *mapItem, p int) bool {
	if it.sub != nil {
		for range it.times {
			for i := range it.sub {
				if !expand(out, &it.sub[i], p) {
					return false
				}
			}
		}
		return true
	}
	for n := it.block.start; n < it.block.start+it.block.nnodes; n++ {
		for range it.block.ppn {
			if len(*out) == p {
				return false
			}
			*out = append(*out, n)
		}
	}
	return len(*out) < p
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

type mappingParser struct {
	s   string
	i   int
	err error
}

func (ps *mappingParser) fail(format string, args ...any) {
	if ps.err == nil {
		ps.err = fmt.Errorf("%w: at byte %d: %s", ErrMap, ps.i, fmt.Sprintf(format, args...))
	}
}

func (ps *mappingParser) space() {
	for ps.i < len(ps.s) && (ps.s[ps.i] == ' ' || ps.s[ps.i] == '\t' || ps.s[ps.i] == '\n' || ps.s[ps.i] == '\r') {
		ps.i++
	}
}

// accept consumes tok (after optional space) if it is next.
func (ps *mappingParser) accept(tok string) bool {
	ps.space()
	if len(ps.s)-ps.i >= len(tok) && ps.s[ps.i:ps.i+len(tok)] == tok {
		ps.i += len(tok)
		return true
	}
	return false
}

func (ps *mappingParser) expect(tok string) {
	if ps.err == nil && !ps.accept(tok) {
		ps.fail("want %q", tok)
	}
}

func (ps *mappingParser) number() int {
	ps.space()
	start, v := ps.i, 0
	for ps.i < len(ps.s) && ps.s[ps.i] >= '0' && ps.s[ps.i] <= '9' {
		v = v*10 + int(ps.s[ps.i]-'0')
		ps.i++
		if v > maxMappingNumber {
			ps.fail("number too large")
			return 0
		}
	}
	if ps.i == start {
		ps.fail("want a number")
	}
	return v
}

func (ps *mappingParser) vector() ([]mapItem, error) {
	ps.expect("(")
	ps.expect("vector")
	var items []mapItem
	for ps.err == nil && ps.accept(",") {
		items = append(items, ps.item(0))
	}
	ps.expect(")")
	ps.space()
	if ps.err == nil && ps.i != len(ps.s) {
		ps.fail("trailing bytes")
	}
	if ps.err == nil && len(items) == 0 {
		ps.fail("empty vector")
	}
	return items, ps.err
}

func (ps *mappingParser) item(depth int) mapItem {
	switch {
	case ps.err != nil:
		return mapItem{}
	case ps.accept("("):
		b := item{start: ps.number()}
		ps.expect(",")
		b.nnodes = ps.number()
		ps.expect(",")
		b.ppn = ps.number()
		ps.expect(")")
		if ps.err == nil && (b.nnodes == 0 || b.ppn == 0) {
			ps.fail("empty block %v", b)
		}
		return mapItem{block: b}
	case ps.accept("["):
		if depth >= maxMappingDepth {
			ps.fail("repeats nested too deep")
			return mapItem{}
		}
		it := mapItem{sub: []mapItem{ps.item(depth + 1)}}
		for ps.err == nil && ps.accept(",") {
			it.sub = append(it.sub, ps.item(depth+1))
		}
		ps.expect("]")
		ps.expect("x")
		it.times = ps.number()
		if ps.err == nil && it.times == 0 {
			ps.fail("repeat count 0")
		}
		return it
	default:
		return mapItem{block: item{start: ps.number(), nnodes: 1, ppn: 1}}
	}
}
