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
