package netio

import (
	"bytes"
	"errors"
	"runtime"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	frames := []Frame{
		{Type: 0, Epoch: 0, Payload: []byte{}},
		{Type: 1, Epoch: 1, Payload: []byte("x")},
		{Type: 0xFEFF, Epoch: ^uint64(0), Payload: bytes.Repeat([]byte("abc"), 1000)},
	}
	var stream []byte
	for _, f := range frames {
		var err error
		stream, err = AppendFrame(stream, f, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
	}
	// One shot.
	rest := stream
	for i, want := range frames {
		got, n, err := DecodeFrame(rest, 1<<20)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if got.Type != want.Type || got.Epoch != want.Epoch || !bytes.Equal(got.Payload, want.Payload) {
			t.Fatalf("frame %d: got %+v", i, got)
		}
		rest = rest[n:]
	}
	if len(rest) != 0 {
		t.Fatalf("%d bytes left", len(rest))
	}
	// Streamed, split at every position.
	for split := range len(stream) + 1 {
		d := NewDecoder(1 << 20)
		var got []Frame
		emit := func(f Frame) { got = append(got, f) }
		if err := d.Feed(stream[:split], emit); err != nil {
			t.Fatal(err)
		}
		if err := d.Feed(stream[split:], emit); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(frames) || d.Mid() {
			t.Fatalf("split %d: %d frames, mid %v", split, len(got), d.Mid())
		}
		for i := range frames {
			if !bytes.Equal(got[i].Payload, frames[i].Payload) || got[i].Epoch != frames[i].Epoch {
				t.Fatalf("split %d frame %d differs", split, i)
			}
		}
	}
}

func TestFrameErrors(t *testing.T) {
	good, _ := AppendFrame(nil, Frame{Type: 2, Epoch: 3, Payload: []byte("payload")}, 100)
	if _, err := AppendFrame(nil, Frame{Payload: make([]byte, 101)}, 100); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("encode too large: %v", err)
	}
	if _, _, err := DecodeFrame(good, 6); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("decode too large: %v", err)
	}
	if _, _, err := DecodeFrame(good[:10], 100); !errors.Is(err, ErrShortFrame) {
		t.Errorf("decode short header: %v", err)
	}
	if _, _, err := DecodeFrame(good[:len(good)-1], 100); !errors.Is(err, ErrShortFrame) {
		t.Errorf("decode short payload: %v", err)
	}
	bad := bytes.Clone(good)
	bad[offMagic] = 'G'
	if _, _, err := DecodeFrame(bad, 100); !errors.Is(err, ErrBadMagic) {
		t.Errorf("decode bad magic: %v", err)
	}
	bad = bytes.Clone(good)
	bad[offVersion] = 9
	if _, _, err := DecodeFrame(bad, 100); !errors.Is(err, ErrBadVersion) {
		t.Errorf("decode bad version: %v", err)
	}
	// The decoder's error is sticky, and frames before it are delivered.
	d := NewDecoder(100)
	n := 0
	err := d.Feed(append(bytes.Clone(good), bad...), func(Frame) { n++ })
	if !errors.Is(err, ErrBadVersion) || n != 1 {
		t.Errorf("feed good+bad: %v after %d frames", err, n)
	}
	if err := d.Feed(good, func(Frame) { n++ }); !errors.Is(err, ErrBadVersion) || n != 1 {
		t.Errorf("feed after error: %v", err)
	}
	// Handshake mode bounds the first two frames only.
	big, _ := AppendFrame(nil, Frame{Payload: make([]byte, handshakeFrameMax+1)}, 1000)
	small, _ := AppendFrame(nil, Frame{Payload: make([]byte, handshakeFrameMax)}, 1000)
	d = &Decoder{Max: 1000, Handshake: true}
	if err := d.Feed(big, func(Frame) {}); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("large first frame in handshake mode: %v", err)
	}
	d = &Decoder{Max: 1000, Handshake: true}
	n = 0
	if err := d.Feed(bytes.Join([][]byte{small, small, big}, nil), func(Frame) { n++ }); err != nil || n != 3 {
		t.Errorf("large third frame in handshake mode: %v, %d frames", err, n)
	}
}

// A header announcing a huge payload does not allocate it up front.
func TestDecoderLazyAllocation(t *testing.T) {
	h, _ := AppendFrame(nil, Frame{Payload: make([]byte, 0)}, 1)
	putHeader(h, 1, 1, 512<<20)
	d := NewDecoder(1 << 30)
	ms1 := memAlloc()
	if err := d.Feed(h, func(Frame) { t.Fatal("frame emitted") }); err != nil {
		t.Fatal(err)
	}
	ms2 := memAlloc()
	if ms2-ms1 > 4<<20 {
		t.Fatalf("a 16-byte header made the decoder allocate %.0f bytes", ms2-ms1)
	}
	if !d.Mid() {
		t.Fatal("decoder not mid-frame")
	}
}

// FuzzFrameDecoder checks the streaming decoder against the one-shot
// decoder on arbitrary bytes fed in arbitrary pieces, and that every frame
// decoded re-encodes to the bytes it came from.
func FuzzFrameDecoder(f *testing.F) {
	seed, _ := AppendFrame(nil, Frame{Type: 7, Epoch: 9, Payload: []byte("seed")}, 64)
	f.Add(seed, uint16(3))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint16) {
		const max = 4096
		// Reference: one-shot decoding.
		var want []Frame
		var wantErr error
		rest := data
		for len(rest) > 0 {
			fr, n, err := DecodeFrame(rest, max)
			if err != nil {
				if !errors.Is(err, ErrShortFrame) {
					wantErr = err
				}
				break
			}
			enc, eerr := AppendFrame(nil, fr, max)
			if eerr != nil || !bytes.Equal(enc, rest[:n]) {
				t.Fatalf("frame does not re-encode to its bytes: %v", eerr)
			}
			want = append(want, fr)
			rest = rest[n:]
		}
		// Streaming, in pieces of chunk bytes (at least 1).
		step := int(chunk%64) + 1
		d := NewDecoder(max)
		var got []Frame
		var gotErr error
		for i := 0; i < len(data) && gotErr == nil; i += step {
			gotErr = d.Feed(data[i:min(i+step, len(data))], func(f Frame) { got = append(got, f) })
		}
		if (wantErr == nil) != (gotErr == nil) {
			t.Fatalf("one-shot error %v, streaming error %v", wantErr, gotErr)
		}
		if len(got) != len(want) {
			t.Fatalf("one-shot %d frames, streaming %d", len(want), len(got))
		}
		for i := range want {
			if got[i].Type != want[i].Type || got[i].Epoch != want[i].Epoch || !bytes.Equal(got[i].Payload, want[i].Payload) {
				t.Fatalf("frame %d differs", i)
			}
		}
		if wantErr == nil && d.Mid() != (len(rest) > 0) {
			t.Fatalf("mid-frame %v with %d bytes left", d.Mid(), len(rest))
		}
	})
}

func memAlloc() float64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.TotalAlloc)
}
