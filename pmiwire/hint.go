package pmiwire

// Hint says how a put travels: the research's put hints. It is the one
// type for them in the Go client, the agent and the wire (the
// fastpmi-hint field of a PMI-2 kvs-put); the shared-memory layout
// carries the same numbers in a put's header flags.
type Hint uint8

const (
	// HintNone: PMI semantics, visible to gets after the next fence.
	HintNone Hint = iota
	// HintDense: like HintNone; the key travels with the fence (gather
	// and broadcast), for keys most ranks read.
	HintDense
	// HintSparse: the key is visible at once to the ranks of the node
	// where it was put, without a fence, and is not carried by the fence:
	// for keys few ranks read. Fetching it on demand from other nodes is
	// not built yet.
	HintSparse
)

// Wire is h as the fastpmi-hint field's value ("" for HintNone, which
// sends no field).
func (h Hint) Wire() string {
	switch h {
	case HintDense:
		return "dense"
	case HintSparse:
		return "sparse"
	}
	return ""
}

// ParseHint reads a fastpmi-hint value. An unknown value is HintNone: the
// put keeps plain PMI semantics.
func ParseHint(s string) Hint {
	switch s {
	case "dense":
		return HintDense
	case "sparse":
		return HintSparse
	}
	return HintNone
}
