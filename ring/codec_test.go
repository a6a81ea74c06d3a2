package ring

import (
	"errors"
	"testing"
)

func TestCodecRoundTrip(t *testing.T) {
	for _, m := range []Message{
		{Epoch: 1, From: 2, To: 3, Dir: ToLeft, Mode: CountsFromMap, Offset: 9, Size: 10, HasSize: true, Value: "val"},
		{Epoch: 1<<64 - 1, From: MaxNodes - 1, To: 0, Dir: ToRight, Mode: CountsFromMap, Offset: 1<<64 - 1, Value: ""},
	} {
		got, err := DecodeMessage(AppendMessage(nil, m))
		if err != nil || got != m {
			t.Errorf("round trip of %+v: %+v, %v", m, got, err)
		}
	}
}

func TestCodecRejects(t *testing.T) {
	good := AppendMessage(nil, Message{Epoch: 1, From: 2, To: 3, Dir: ToLeft, Mode: CountsFromMap, Offset: 9, Size: 10, HasSize: true, Value: "val"})
	if _, err := DecodeMessage(good); err != nil {
		t.Fatal(err)
	}
	for i := range good {
		if _, err := DecodeMessage(good[:i]); !errors.Is(err, ErrMalformed) {
			t.Errorf("truncated to %d: %v", i, err)
		}
	}
	if _, err := DecodeMessage(append(good[:len(good):len(good)], 'x')); !errors.Is(err, ErrMalformed) {
		t.Errorf("trailing byte: %v", err)
	}
	// tag, version, dir, mode, flags; mode 2 (counts passed along the
	// ring) is no longer spoken.
	for _, c := range []struct {
		off int
		b   byte
	}{{0, 0xfe}, {1, 0xfe}, {5, 0}, {5, 3}, {6, 0}, {6, 2}, {6, 0xfe}, {7, 0xfe}} {
		b := append([]byte(nil), good...)
		b[c.off] = c.b
		if _, err := DecodeMessage(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("byte %d set to %#x: %v", c.off, c.b, err)
		}
	}
	if _, err := DecodeMessage(AppendMessage(nil, Message{Epoch: 1, From: MaxNodes, Dir: ToLeft, Mode: CountsFromMap})); !errors.Is(err, ErrMalformed) {
		t.Errorf("node id MaxNodes: %v", err)
	}
}
