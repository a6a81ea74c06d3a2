package tree

import (
	"bytes"
	"testing"
)

var fuzzLimits = Limits{Ranks: 1000, MaxValue: 256, MaxEntry: 256, MaxKey: 64, MaxTotal: 1 << 16}

// FuzzDecodeEntries: the decoder never panics; what it accepts satisfies
// the limits, has strictly increasing ranks, and re-encodes to the input.
func FuzzDecodeEntries(f *testing.F) {
	b, _ := AppendEntries(nil, []Entry{{0, []byte("card-0")}, {5, nil}, {999, []byte("x")}})
	f.Add(b)
	f.Add([]byte{'c', 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := DecodeEntries(b, fuzzLimits)
		if err != nil {
			return
		}
		for i, e := range es {
			if int(e.Rank) >= fuzzLimits.Ranks || len(e.Value) > fuzzLimits.MaxEntry || (i > 0 && e.Rank <= es[i-1].Rank) {
				t.Fatalf("accepted entry %d: rank %d, %d bytes", i, e.Rank, len(e.Value))
			}
		}
		again, err := AppendEntries(nil, es)
		if err != nil {
			t.Fatal(err)
		}
		if es2, err := DecodeEntries(again, fuzzLimits); err != nil || len(es2) != len(es) {
			t.Fatalf("re-decode: %v", err)
		}
		if len(again) > len(b) {
			t.Fatalf("re-encoding longer than input")
		}
	})
}

// FuzzDecodeKVs: as FuzzDecodeEntries for KV sets.
func FuzzDecodeKVs(f *testing.F) {
	b, _ := AppendKVs(nil, []KV{{[]byte("P0-businesscard"), []byte("tcp://10.0.0.1:5000"), 0}, {[]byte("P1-businesscard"), nil, 1}})
	f.Add(b)
	f.Add([]byte{'k', 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		kvs, err := DecodeKVs(b, fuzzLimits)
		if err != nil {
			return
		}
		for i, kv := range kvs {
			if int(kv.Owner) >= fuzzLimits.Ranks || len(kv.Key) == 0 || len(kv.Key) > fuzzLimits.MaxKey ||
				len(kv.Value) > fuzzLimits.MaxValue || (i > 0 && bytes.Compare(kvs[i-1].Key, kv.Key) >= 0) {
				t.Fatalf("accepted put %d: %+v", i, kv)
			}
		}
		again, err := AppendKVs(nil, kvs)
		if err != nil {
			t.Fatal(err)
		}
		if kvs2, err := DecodeKVs(again, fuzzLimits); err != nil || len(kvs2) != len(kvs) {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

// FuzzDecodeMsg: the message decoder never panics and round-trips.
func FuzzDecodeMsg(f *testing.F) {
	f.Add(AppendMsg(nil, Msg{Kind: Fence, Type: Up, Epoch: 3, From: 4, To: 1, Payload: []byte("payload")}))
	f.Add(AppendMsg(nil, Msg{Kind: Allgather, Type: Down, Epoch: 1 << 40, From: 0, To: 9}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMsg(b)
		if err != nil {
			return
		}
		m2, err := DecodeMsg(AppendMsg(nil, m))
		if err != nil || m2.Kind != m.Kind || m2.Type != m.Type || m2.Epoch != m.Epoch || m2.From != m.From || m2.To != m.To || !bytes.Equal(m2.Payload, m.Payload) {
			t.Fatalf("round trip %+v -> %+v, %v", m, m2, err)
		}
	})
}
