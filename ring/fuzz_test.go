package ring

import (
	"testing"
)

// FuzzDecodeMessage: decoding never panics, only CountsFromMap decodes,
// and whatever decodes re-encodes to the same message (not always the same
// bytes: a varint may come padded).
func FuzzDecodeMessage(f *testing.F) {
	f.Add(AppendMessage(nil, Message{Epoch: 3, From: 1, To: 2, Dir: ToRight, Mode: CountsFromMap, Offset: 4, Size: 8, HasSize: true, Value: "business-card"}))
	f.Add(AppendMessage(nil, Message{Epoch: 1 << 40, From: 0, To: 1, Dir: ToLeft, Mode: CountsFromMap, Value: ""}))
	f.Add(AppendMessage(nil, Message{Epoch: 1, From: 0, To: 1, Dir: ToLeft, Mode: 2, Value: "x"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMessage(b)
		if err != nil {
			return
		}
		if m.Mode != CountsFromMap {
			t.Fatalf("decoded mode %v", m.Mode)
		}
		m2, err := DecodeMessage(AppendMessage(nil, m))
		if err != nil || m2 != m {
			t.Fatalf("round trip: %+v -> %+v, %v", m, m2, err)
		}
	})
}

// FuzzParseProcessMapping: parsing never panics or runs away; a parsed
// mapping assigns exactly p ranks to node ids that appear in it.
func FuzzParseProcessMapping(f *testing.F) {
	for _, s := range []string{"(vector,(0,2,4))", "(vector,(0,2,4),(2,1,2))", "(vector,[(0,2,1)]x2)", "(vector,(0,4,1))", "(vector,3,[1,(0,2,2)]x5)"} {
		f.Add(s, uint16(8))
	}
	f.Fuzz(func(t *testing.T, s string, p16 uint16) {
		p := int(p16%4096) + 1
		nodes, err := ParseProcessMapping(s, p)
		if err != nil {
			return
		}
		if len(nodes) != p {
			t.Fatalf("%q: %d ranks, want %d", s, len(nodes), p)
		}
		for _, n := range nodes {
			if n < 0 || n > 2*maxMappingNumber {
				t.Fatalf("%q: node %d", s, n)
			}
		}
	})
}
