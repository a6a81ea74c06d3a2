package shm

import (
	"bytes"
	"testing"
)

func TestProtoPayloads(t *testing.T) {
	a, b, err := Pair(AppendPair(nil, "key", "value with = and ;"))
	if err != nil || string(a) != "key" || string(b) != "value with = and ;" {
		t.Fatalf("Pair = %q %q %v", a, b, err)
	}
	v, rest, err := Int32(AppendInt32(nil, -7, "msg"))
	if err != nil || v != -7 || string(rest) != "msg" {
		t.Fatalf("Int32 = %d %q %v", v, rest, err)
	}
	pos, size, l, r, err := Ring(AppendRing(nil, 3, 9, "left", "right"))
	if err != nil || pos != 3 || size != 9 || string(l) != "left" || string(r) != "right" {
		t.Fatalf("Ring = %d %d %q %q %v", pos, size, l, r, err)
	}
	for _, bad := range [][]byte{nil, {1}, {9, 0, 'a'}} {
		if _, _, err := Pair(bad); err == nil {
			t.Errorf("Pair(%v) accepted", bad)
		}
	}
	if _, _, _, _, err := Ring(append(bytes.Repeat([]byte{0}, 8), 0xff, 0xff, 0, 0)); err == nil {
		t.Error("Ring accepted a length past the end")
	}
	if _, _, err := Int32([]byte{1, 2}); err == nil {
		t.Error("Int32 accepted 2 bytes")
	}
}

func FuzzProtoPayloads(f *testing.F) {
	f.Add(AppendPair(nil, "k", "v"))
	f.Add(AppendRing(nil, 1, 2, "l", "r"))
	f.Fuzz(func(t *testing.T, p []byte) {
		if a, b, err := Pair(p); err == nil && len(a)+len(b)+2 != len(p) {
			t.Fatalf("Pair lost bytes")
		}
		if _, _, l, r, err := Ring(p); err == nil && len(l)+len(r)+12 != len(p) {
			t.Fatalf("Ring lost bytes")
		}
		_, _, _ = Int32(p)
	})
}

func TestKVSReplace(t *testing.T) {
	seg, err := NewHeap(Params{LocalRanks: 1, FirstEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	a, r := seg.Agent(), seg.Rank(0)
	if err := a.KVSPut([]byte("k"), []byte("v1"), 1); err != nil {
		t.Fatal(err)
	}
	a.Publish(1)
	if v, ok := r.Lookup([]byte("k")); !ok || string(v) != "v1" {
		t.Fatalf("Lookup = %q %v", v, ok)
	}
	if err := a.KVSPut([]byte("k"), []byte("v2"), 2); err != ErrKeyExists {
		t.Fatalf("KVSPut of an existing key: %v, want ErrKeyExists", err)
	}
	if err := a.KVSReplace([]byte("k"), []byte("v2"), 2); err != nil {
		t.Fatal(err)
	}
	if v, ok := r.Lookup([]byte("k")); ok {
		t.Fatalf("replaced value %q visible before its epoch is published", v)
	}
	a.Publish(2)
	if v, ok := r.Lookup([]byte("k")); !ok || string(v) != "v2" {
		t.Fatalf("Lookup after replace = %q %v", v, ok)
	}
	if n := a.KVSLen(); n != 2 {
		t.Fatalf("KVSLen = %d, want 2 entries (old and new)", n)
	}
	if err := a.KVSReplace([]byte("k"), []byte("v2"), 3); err != nil || a.KVSLen() != 2 {
		t.Fatalf("replacing with the same value: %v, %d entries", err, a.KVSLen())
	}
}

// A key that cannot be replaced (table full) is withdrawn, never left
// readable with its old value.
func TestKVSReplaceWhenFull(t *testing.T) {
	seg, err := NewHeap(Params{LocalRanks: 1, FirstEpoch: 1, KVSCapacity: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	a, r := seg.Agent(), seg.Rank(0)
	for _, kv := range [][2]string{{"a", "1"}, {"b", "1"}} {
		if err := a.KVSPut([]byte(kv[0]), []byte(kv[1]), 1); err != nil {
			t.Fatal(err)
		}
	}
	a.Publish(1)
	if err := a.KVSReplace([]byte("a"), []byte("2"), 2); err != ErrKVSFull {
		t.Fatalf("replace in a full table: %v, want ErrKVSFull", err)
	}
	a.Publish(2)
	if v, ok := r.Lookup([]byte("a")); ok {
		t.Fatalf("stale value %q still readable", v)
	}
	if v, ok := r.Lookup([]byte("b")); !ok || string(v) != "1" {
		t.Fatalf("other key: %q %v", v, ok)
	}
}
