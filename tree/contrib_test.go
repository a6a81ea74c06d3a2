package tree

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fastpmi/fastpmi/pmiwire"
)

func TestEntriesRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for range 200 {
		var es []Entry
		perm := rng.Perm(100 + rng.IntN(300))
		for _, r := range perm[:rng.IntN(100)] {
			v := make([]byte, rng.IntN(40))
			for i := range v {
				v[i] = byte(rng.Uint32())
			}
			es = append(es, Entry{Rank: uint32(r), Value: v})
		}
		SortEntries(es)
		b, err := AppendEntries(nil, es)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeEntries(b, testLimits)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(got, es, func(a, b Entry) bool { return a.Rank == b.Rank && bytes.Equal(a.Value, b.Value) }) {
			t.Fatalf("round trip differs")
		}
	}
}

func TestEntriesRejects(t *testing.T) {
	if _, err := AppendEntries(nil, []Entry{{Rank: 2}, {Rank: 2}}); !errors.Is(err, ErrOrder) {
		t.Errorf("duplicate rank encoded: %v", err)
	}
	if _, err := AppendEntries(nil, []Entry{{Rank: 3}, {Rank: 1}}); !errors.Is(err, ErrOrder) {
		t.Errorf("unsorted ranks encoded: %v", err)
	}
	good, _ := AppendEntries(nil, []Entry{{Rank: 1, Value: []byte("ab")}, {Rank: 7, Value: []byte("cde")}})
	lim := Limits{Ranks: 8, MaxEntry: 3, MaxKey: 1, MaxTotal: 64}
	if _, err := DecodeEntries(good, lim); err != nil {
		t.Fatal(err)
	}
	for i := range good {
		if _, err := DecodeEntries(good[:i], lim); !errors.Is(err, ErrMalformed) {
			t.Errorf("truncated to %d: %v", i, err)
		}
	}
	tests := []struct {
		name string
		b    []byte
		lim  Limits
		want error
	}{
		{"rank beyond P", good, Limits{Ranks: 7, MaxEntry: 3, MaxKey: 1, MaxTotal: 64}, ErrLimit},
		{"value too long", good, Limits{Ranks: 8, MaxEntry: 2, MaxKey: 1, MaxTotal: 64}, ErrLimit},
		{"total too long", good, Limits{Ranks: 8, MaxEntry: 3, MaxKey: 1, MaxTotal: len(good) - 1}, ErrLimit},
		{"bad limits", good, Limits{}, ErrLimit},
		{"trailing byte", append(slices.Clone(good), 0), lim, ErrMalformed},
		{"count beyond bytes", []byte{'c', 1, 100, 0, 0}, lim, ErrMalformed},
		{"count beyond P", []byte{'c', 1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, Limits{Ranks: 8, MaxEntry: 3, MaxKey: 1, MaxTotal: 64}, ErrMalformed},
		{"rank gap overflow", []byte{'c', 1, 2, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0}, lim, ErrLimit},
		{"wrong tag", append([]byte{'k'}, good[1:]...), lim, ErrMalformed},
	}
	for _, tc := range tests {
		if _, err := DecodeEntries(tc.b, tc.lim); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	// On error the destination is returned unchanged.
	dst := []Entry{{Rank: 9}}
	if got, err := AppendDecodedEntries(dst, good[:len(good)-1], lim); err == nil || len(got) != 1 {
		t.Errorf("partial decode leaked: %d entries, %v", len(got), err)
	}
}

func TestKVsRejects(t *testing.T) {
	kvs := []KV{{Key: []byte("b"), Value: []byte("2"), Owner: 1}, {Key: []byte("a"), Value: []byte("1"), Owner: 0}}
	if _, err := AppendKVs(nil, kvs); !errors.Is(err, ErrOrder) {
		t.Errorf("unsorted keys encoded: %v", err)
	}
	SortKVs(kvs)
	good, err := AppendKVs(nil, kvs)
	if err != nil {
		t.Fatal(err)
	}
	lim := Limits{Ranks: 2, MaxValue: 1, MaxKey: 1, MaxTotal: 64}
	got, err := DecodeKVs(good, lim)
	if err != nil || len(got) != 2 || string(got[0].Key) != "a" || got[1].Owner != 1 {
		t.Fatalf("decode: %+v, %v", got, err)
	}
	for i := range good {
		if _, err := DecodeKVs(good[:i], lim); !errors.Is(err, ErrMalformed) {
			t.Errorf("truncated to %d: %v", i, err)
		}
	}
	dupe, _ := AppendKVs(nil, []KV{{Key: []byte("a")}})
	dupe = append(dupe[:2:2], 2)
	dupe = append(dupe, 0, 1, 'a', 0, 0, 1, 'a', 0) // key "a" twice
	empty := []byte{'k', 1, 1, 0, 0, 0}
	tests := []struct {
		name string
		b    []byte
		lim  Limits
		want error
	}{
		{"owner beyond P", good, Limits{Ranks: 1, MaxValue: 1, MaxKey: 1, MaxTotal: 64}, ErrLimit},
		{"key too long", good, Limits{Ranks: 2, MaxValue: 1, MaxKey: 0, MaxTotal: 64}, ErrLimit},
		{"value too long", good, Limits{Ranks: 2, MaxValue: 0, MaxKey: 1, MaxTotal: 64}, ErrLimit},
		{"duplicate key", dupe, lim, ErrMalformed},
		{"empty key", empty, lim, ErrMalformed},
	}
	for _, tc := range tests {
		if _, err := DecodeKVs(tc.b, tc.lim); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestMergeDifferential: merging random disjoint parts equals encoding
// their sorted union.
func TestMergeDifferential(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for range 200 {
		nparts := 1 + rng.IntN(9)
		parts := make([][]byte, nparts)
		kparts := make([][]byte, nparts)
		split := make([][]Entry, nparts)
		ksplit := make([][]KV, nparts)
		var all []Entry
		var kall []KV
		for _, r := range rng.Perm(500)[:rng.IntN(200)] {
			e := Entry{Rank: uint32(r), Value: []byte{byte(r), byte(r >> 8)}}
			kv := KV{Key: []byte{byte(r >> 8), byte(r)}, Value: e.Value, Owner: uint32(r)}
			p := rng.IntN(nparts)
			split[p] = append(split[p], e)
			ksplit[p] = append(ksplit[p], kv)
			all = append(all, e)
			kall = append(kall, kv)
		}
		for p := range nparts {
			SortEntries(split[p])
			SortKVs(ksplit[p])
			parts[p], _ = AppendEntries(nil, split[p])
			kparts[p], _ = AppendKVs(nil, ksplit[p])
		}
		SortEntries(all)
		SortKVs(kall)
		want, _ := AppendEntries(nil, all)
		kwant, _ := AppendKVs(nil, kall)
		if got, err := MergeEntries(nil, parts, testLimits); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("MergeEntries: %v", err)
		}
		if got, err := MergeKVs(nil, kparts, testLimits); err != nil || !bytes.Equal(got, kwant) {
			t.Fatalf("MergeKVs: %v", err)
		}
		if len(all) > 0 && nparts > 1 {
			// A rank in two parts conflicts.
			extra, _ := AppendEntries(nil, all[:1])
			if _, err := MergeEntries(nil, append(parts, extra), testLimits); !errors.Is(err, ErrConflict) {
				t.Fatalf("conflict not found: %v", err)
			}
			kextra, _ := AppendKVs(nil, kall[:1])
			if _, err := MergeKVs(nil, append(kparts, kextra), testLimits); !errors.Is(err, ErrConflict) {
				t.Fatalf("key conflict not found: %v", err)
			}
			// One key put by ranks of two nodes: the higher rank's value,
			// wherever its part is, as a node keeps its later rank's.
			k := rng.IntN(len(kall))
			other := KV{Key: kall[k].Key, Value: []byte("other"), Owner: kall[k].Owner + 1000}
			if rng.IntN(2) == 0 {
				other.Owner = kall[k].Owner - 1
				if kall[k].Owner == 0 {
					other.Owner = 1000
				}
			}
			oextra, _ := AppendKVs(nil, []KV{other})
			ref := slices.Clone(kall)
			if other.Owner > kall[k].Owner {
				ref[k] = other
			}
			owant, _ := AppendKVs(nil, ref)
			at := rng.IntN(len(kparts) + 1)
			oparts := slices.Insert(slices.Clone(kparts), at, oextra)
			if got, err := MergeKVs(nil, oparts, testLimits); err != nil || !bytes.Equal(got, owant) {
				t.Fatalf("key %q of ranks %d and %d in two parts: %v; want rank %d's value", other.Key, kall[k].Owner, other.Owner, err, max(kall[k].Owner, other.Owner))
			}
		}
	}
}

// JobLimits take the job's size limits from the PMI wire protocol: what a
// rank may put passes, a byte more does not; an allgather value may be as
// long as a node's collected data.
func TestJobLimits(t *testing.T) {
	lim := JobLimits(4)
	if lim.validate() != nil || lim.Ranks != 4 || lim.MaxValue != pmiwire.ValLenMax || lim.MaxEntry != MaxNodeEntry || lim.MaxKey != pmiwire.KeyLenMax {
		t.Fatalf("JobLimits(4) = %+v", lim)
	}
	for _, c := range []struct {
		key, val int
		want     error
	}{
		{pmiwire.KeyLenMax, pmiwire.ValLenMax, nil},
		{pmiwire.KeyLenMax + 1, 1, ErrLimit},
		{1, pmiwire.ValLenMax + 1, ErrLimit},
	} {
		b, err := AppendKVs(nil, []KV{{Key: bytes.Repeat([]byte("k"), c.key), Value: make([]byte, c.val), Owner: 3}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeKVs(b, lim); !errors.Is(err, c.want) {
			t.Errorf("key of %d bytes, value of %d: %v, want %v", c.key, c.val, err, c.want)
		}
	}
	// Allgather values are a node's collected data at most (a PMIx
	// fence's), far longer than what a rank may put.
	for _, c := range []struct {
		val  int
		want error
	}{
		{pmiwire.ValLenMax + 1, nil},
		{MaxNodeEntry, nil},
		{MaxNodeEntry + 1, ErrLimit},
	} {
		b, err := AppendEntries(nil, []Entry{{Rank: 3, Value: make([]byte, c.val)}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeEntries(b, lim); !errors.Is(err, c.want) {
			t.Errorf("allgather value of %d bytes: %v, want %v", c.val, err, c.want)
		}
	}
}
