package tree

import (
	"testing"
)

// A 16,384-rank allgather contribution of 64-byte values.
const benchRanks, benchValue = 16384, 64

func benchEntries() []Entry {
	es := make([]Entry, benchRanks)
	vals := make([]byte, benchRanks*benchValue)
	for i := range vals {
		vals[i] = byte(i * 7)
	}
	for r := range es {
		es[r] = Entry{Rank: uint32(r), Value: vals[r*benchValue : (r+1)*benchValue]}
	}
	return es
}

var benchLimits = Limits{Ranks: benchRanks, MaxValue: 1024, MaxEntry: 1024, MaxKey: 64, MaxTotal: 1 << 24}

func BenchmarkEncodeEntries16K(b *testing.B) {
	es := benchEntries()
	buf, _ := AppendEntries(nil, es)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = AppendEntries(buf[:0], es); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/benchRanks, "ns/entry")
}

func BenchmarkDecodeEntries16K(b *testing.B) {
	buf, _ := AppendEntries(nil, benchEntries())
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeEntries(buf, benchLimits); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/benchRanks, "ns/entry")
}

// BenchmarkDecodeEntries16KReuse decodes into a reused slice: no
// allocation at all.
func BenchmarkDecodeEntries16KReuse(b *testing.B) {
	buf, _ := AppendEntries(nil, benchEntries())
	dst := make([]Entry, 0, benchRanks)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if dst, err = AppendDecodedEntries(dst[:0], buf, benchLimits); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/benchRanks, "ns/entry")
}

// BenchmarkMergeEntries16K merges 16K entries arriving from 8 children
// (cyclic ranks, the worst interleaving) into one upward message.
func BenchmarkMergeEntries16K(b *testing.B) {
	es := benchEntries()
	parts := make([][]byte, 8)
	for p := range parts {
		var sub []Entry
		for r := p; r < len(es); r += len(parts) {
			sub = append(sub, es[r])
		}
		parts[p], _ = AppendEntries(nil, sub)
	}
	var out []byte
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if out, err = MergeEntries(out[:0], parts, benchLimits); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(out)))
}
