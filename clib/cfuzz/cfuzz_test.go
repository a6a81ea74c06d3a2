package cfuzz

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/shm"
)

// params are segment sizes the C layout must compute exactly as shm does.
var params = []shm.Params{
	{LocalRanks: 1},
	{LocalRanks: 3, WorldSize: 7},
	{LocalRanks: 64, WorldSize: 128},
	{LocalRanks: 65, WorldSize: 1000, MaxValue: 100, RequestRingBytes: 256, ResponseRingBytes: 1 << 20},
	{LocalRanks: 2, WorldSize: 2, KVSCapacity: 1, KVSKeyMax: 1, MaxValue: 1},
	{LocalRanks: 16, KVSCapacity: 5000, KVSArenaBytes: 1 << 22},
}

// The C library accepts every segment shm makes and agrees on its
// geometry (it compares every stored offset with its own computation).
func TestLayoutMatchesShm(t *testing.T) {
	for _, p := range params {
		seg, err := shm.NewHeap(p)
		if err != nil {
			t.Fatalf("%+v: %v", p, err)
		}
		b := seg.Bytes()
		l, err := ReadLayout(b[:4096], uint64(len(b)))
		if err != nil {
			t.Errorf("%+v: libfastpmi refused shm's segment: %v", p, err)
		} else if l.Total != uint64(len(b)) {
			t.Errorf("%+v: total %d, segment has %d", p, l.Total, len(b))
		}
		seg.Close()
	}
}

// Header fields the C library must refuse, each named in its message.
func TestLayoutRefusals(t *testing.T) {
	seg, err := shm.NewHeap(shm.Params{LocalRanks: 4, WorldSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	good := append([]byte(nil), seg.Bytes()[:4096]...)
	size := uint64(len(seg.Bytes()))
	for _, c := range []struct {
		name string
		off  int
		val  uint32
		size uint64
		want string
	}{
		{"magic", 0, 1, size, "bad magic"},
		{"version", 8, 99, size, "layout version 99"},
		{"local ranks", 24, 0, size, "local ranks"},
		{"world below local", 28, 2, size, "world size"},
		{"ring not a power of two", 36, 1000, size, "rings"},
		{"ring offset", 64, 12345, size, "ring offset"},
		{"size", 0, 0, size + 4096, "segment has"},
		{"short", 0, 0, 100, "shorter than"},
	} {
		h := append([]byte(nil), good...)
		if c.name != "size" && c.name != "short" {
			binary.LittleEndian.PutUint32(h[c.off:], c.val)
		}
		if c.name == "short" {
			h = h[:100]
		}
		_, err := ReadLayout(h, c.size)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error about %q", c.name, err, c.want)
		}
	}
}

// FuzzLayout feeds arbitrary headers and sizes to the C reader: it must
// never crash, and whatever it accepts shm must accept too, with the same
// length.
func FuzzLayout(f *testing.F) {
	for _, p := range params[:3] {
		seg, err := shm.NewHeap(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(append([]byte(nil), seg.Bytes()[:256]...), uint64(len(seg.Bytes())))
		seg.Close()
	}
	f.Fuzz(func(t *testing.T, hdr []byte, size uint64) {
		h := make([]byte, 4096)
		copy(h, hdr)
		l, err := ReadLayout(h, size)
		if err != nil {
			return
		}
		if l.Total != size {
			t.Fatalf("accepted a %d-byte segment whose header says %d", size, l.Total)
		}
		if size > 64<<20 {
			return
		}
		if err := attach(h, int(size)); err != nil {
			t.Fatalf("libfastpmi accepted a header shm refuses: %v", err)
		}
	})
}

// attach runs shm.Attach on an n-byte buffer starting with h, at each
// start offset until one is 64-byte aligned (Attach checks that after the
// header).
func attach(h []byte, n int) error {
	b := make([]byte, n+64)
	var err error
	for i := range 64 {
		s := b[i : i+n : i+n]
		copy(s, h)
		if _, err = shm.Attach(s); err == nil || !strings.Contains(err.Error(), "aligned") {
			return err
		}
	}
	return err
}

// FuzzWire feeds arbitrary PMI-2 bodies to the C parser: it must never
// crash; what it accepts has a command and non-empty keys without '=' or
// ';', and re-encoding it (escaping ';') and parsing again gives the same
// message, which pmiwire decodes alike.
func FuzzWire(f *testing.F) {
	for _, s := range []string{
		"cmd=fullinit-response;rc=0;rank=1;size=4;",
		"cmd=kvs-get-response;rc=0;found=TRUE;value=a;;b=c;",
		"cmd=x;k=;",
		"cmd=;",
		"cmd=a;k",
		"rc=0;cmd=a;",
		"cmd=fastpmi-allgather-response;rc=0;v0=x;v1=;;;;;",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		cmd, pairs, ok := ParseBody(body)
		if !ok {
			return
		}
		if cmd == "" {
			t.Fatalf("accepted %q without a command", body)
		}
		for _, p := range pairs {
			if p.Key == "" || strings.ContainsAny(p.Key, "=;\x00") {
				t.Fatalf("accepted %q with key %q", body, p.Key)
			}
		}
		if strings.ContainsRune(cmd, 0) {
			return
		}
		for _, p := range pairs {
			if strings.ContainsRune(p.Val, 0) {
				return // a NUL ends a C string: not representable in a re-encoding
			}
		}
		frame, ok := Encode(cmd, pairs)
		if !ok {
			return
		}
		if n := FrameLen([6]byte(frame[:6])); n != int64(len(frame)-6) {
			t.Fatalf("frame header says %d, body has %d", n, len(frame)-6)
		}
		cmd2, pairs2, ok := ParseBody(frame[6:])
		if !ok || cmd2 != cmd || len(pairs2) != len(pairs) {
			t.Fatalf("re-encoded %q as %q, which parses as %v %q %v", body, frame, ok, cmd2, pairs2)
		}
		for i := range pairs {
			if pairs[i] != pairs2[i] {
				t.Fatalf("pair %d of %q: %v then %v", i, body, pairs[i], pairs2[i])
			}
		}
		if strings.ContainsRune(cmd, ';') {
			return
		}
		var d pmiwire.Decoder
		d.Feed(frame)
		m, ok2, err := d.Next()
		if err != nil || !ok2 || m.Cmd != cmd {
			t.Fatalf("pmiwire decodes libfastpmi's frame %q as %v %v %v", frame, m.Cmd, ok2, err)
		}
	})
}

// The length header: digits padded by spaces on either side, nothing else.
func TestFrameLen(t *testing.T) {
	for in, want := range map[string]int64{
		"26    ": 26, "    26": 26, "  7   ": 7, "999999": 999999, "0     ": 0,
		"      ": -1, "2 6   ": -1, "-1    ": -1, "12a   ": -1, "\x0026   ": -1,
	} {
		if got := FrameLen([6]byte([]byte(in))); got != want {
			t.Errorf("FrameLen(%q) = %d, want %d", in, got, want)
		}
	}
}
