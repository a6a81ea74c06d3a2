package netio

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// businessCards builds what an allgather of MPICH business cards looks
// like on the tree: per rank a rank number, a length and the card, hex
// encoded as MPICH puts binary values into the KVS. Ranks are 16 per node;
// ports are random, as ephemeral ports are.
func businessCards(p int) []byte {
	rng := rand.New(rand.NewPCG(uint64(p), 42))
	var out []byte
	for r := range p {
		node := r / 16
		card := fmt.Sprintf("description#node%04d.cluster.example.org$port#%d$ifname#10.%d.%d.%d$",
			node, 32768+rng.IntN(28232), 1+node>>16, (node>>8)&255, node&255)
		h := hex.EncodeToString([]byte(card))
		out = binary.BigEndian.AppendUint32(out, uint32(r))
		out = binary.BigEndian.AppendUint16(out, uint16(len(h)))
		out = append(out, h...)
	}
	return out
}

func TestCompressRoundTrip(t *testing.T) {
	rnd := make([]byte, 100000)
	for i := range rnd {
		rnd[i] = byte(rand.Uint32())
	}
	inputs := map[string][]byte{
		"empty":  {},
		"small":  []byte("description#h$port#1$"),
		"cards":  businessCards(4096),
		"random": rnd,
	}
	for name, src := range inputs {
		for _, policy := range []Codec{CodecAuto, CodecNone, CodecS2, CodecZstd} {
			prefix := []byte("prefix")
			c, err := Compress(policy, bytes.Clone(prefix), src)
			if err != nil {
				t.Fatalf("%s/%v: %v", name, policy, err)
			}
			if !bytes.HasPrefix(c, prefix) {
				t.Fatalf("%s/%v: dst prefix lost", name, policy)
			}
			c = c[len(prefix):]
			if len(c) > len(src)+1 {
				t.Errorf("%s/%v: %d bytes from %d: compression grew the payload", name, policy, len(c), len(src))
			}
			if name == "random" && Codec(c[0]) != CodecNone {
				t.Errorf("%s/%v: tag %v for incompressible data", name, policy, Codec(c[0]))
			}
			if name == "cards" && policy != CodecNone && len(c) > len(src)/3 {
				t.Errorf("%s/%v: %d bytes from %d: business cards should compress", name, policy, len(c), len(src))
			}
			d, err := Decompress([]byte("x"), c, len(src))
			if err != nil {
				t.Fatalf("%s/%v: decompress: %v", name, policy, err)
			}
			if !bytes.Equal(d[1:], src) || d[0] != 'x' {
				t.Fatalf("%s/%v: round trip differs", name, policy)
			}
			if len(src) > 0 {
				if _, err := Decompress(nil, c, len(src)-1); !errors.Is(err, ErrTooLarge) {
					t.Errorf("%s/%v: decompress over the limit: %v", name, policy, err)
				}
			}
		}
	}
	if _, err := ParseCodec("lz4"); !errors.Is(err, ErrUnknownCodec) {
		t.Errorf("parse lz4: %v", err)
	}
	for _, s := range []string{"auto", "s2", "zstd", "none"} {
		if c, err := ParseCodec(s); err != nil || c.String() != s {
			t.Errorf("parse %s: %v %v", s, c, err)
		}
	}
}

// TestDecompressBounded: payloads that claim or expand to more than the
// limit fail without the allocation.
func TestDecompressBounded(t *testing.T) {
	const max = 1 << 20
	zeros := make([]byte, 64<<20)
	for _, codec := range []Codec{CodecS2, CodecZstd} {
		bomb, err := Compress(codec, nil, zeros)
		if err != nil {
			t.Fatal(err)
		}
		before := memAlloc()
		_, err = Decompress(nil, bomb, max)
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("%v bomb of %d bytes: %v, want ErrTooLarge", codec, len(bomb), err)
		}
		if got := memAlloc() - before; got > 4*max {
			t.Fatalf("%v bomb: allocated %.0f bytes for a %d-byte limit", codec, got, max)
		}
	}
	// A zstd frame whose header hides its size is refused.
	enc, _ := zstd.NewWriter(nil, zstd.WithSingleSegment(false))
	var buf bytes.Buffer
	enc.Reset(&buf)
	enc.Write(zeros[:1000])
	enc.Flush() // the header goes out before the size is known
	enc.Write(zeros[:1000])
	enc.Close()
	if _, err := Decompress(nil, append([]byte{byte(CodecZstd)}, buf.Bytes()...), max); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("zstd stream without content size: %v", err)
	}
	for _, bad := range [][]byte{{}, {9, 1, 2}, {byte(CodecS2), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {byte(CodecZstd), 1, 2, 3}} {
		if _, err := Decompress(nil, bad, max); err == nil {
			t.Errorf("decompress %x succeeded", bad)
		}
	}
}

// An s2 payload whose header claims more than its body makes is refused
// before the claim is allocated: ten bytes that announce 2 GiB under a 2
// GiB limit (the agents' broadcast limit, tree.MaxJobTotal) made
// Decompress allocate, and the runtime zero, 2 GiB each time, seconds of
// CPU per frame.
func TestDecompressS2Claim(t *testing.T) {
	const max = 1<<31 - 1
	bomb := binary.AppendUvarint([]byte{byte(CodecS2)}, max)
	bomb = append(bomb, 0x0c, 'a', 'b', 'c', 'd') // one 4-byte literal
	before := memAlloc()
	for range 4 {
		if _, err := Decompress(nil, bomb, max); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("s2 claim of %d bytes in %d: %v, want ErrCorrupt", max, len(bomb), err)
		}
	}
	if got := memAlloc() - before; got > 1<<20 {
		t.Fatalf("4 claims of 2 GiB in %d bytes: allocated %.0f bytes", len(bomb), got)
	}
	// Payloads that do make what they claim still decode, those of long
	// repeats included.
	zeros := make([]byte, 8<<20)
	for _, src := range [][]byte{zeros, businessCards(16384), append(businessCards(4096), zeros...), make([]byte, 40<<20)} {
		for _, codec := range []Codec{CodecS2, CodecZstd} {
			z, _ := Compress(codec, nil, src)
			out, err := Decompress([]byte("x"), z, max)
			if err != nil || out[0] != 'x' || !bytes.Equal(out[1:], src) {
				t.Fatalf("%v round trip of %d bytes (%d compressed): %v", codec, len(src), len(z), err)
			}
		}
	}
}

// The same for zstd: a frame's header claims its size, and DecodeAll
// allocated it before decoding.
func TestDecompressZstdClaim(t *testing.T) {
	const max = 1<<31 - 1
	frame := func(fcs uint32, blocks ...[]byte) []byte {
		b := []byte{byte(CodecZstd), 0x28, 0xB5, 0x2F, 0xFD, 0xA0} // one segment, 4-byte size
		b = binary.LittleEndian.AppendUint32(b, fcs)
		for i, blk := range blocks { // raw blocks
			h := uint32(len(blk)) << 3
			if i == len(blocks)-1 {
				h |= 1
			}
			b = append(b, byte(h), byte(h>>8), byte(h>>16))
			b = append(b, blk...)
		}
		return b
	}
	before := memAlloc()
	for _, fcs := range []uint32{3 << 29, 1<<31 - 1, 4 << 20} {
		bomb := frame(fcs, []byte("abcd"))
		if _, err := Decompress(nil, bomb, max); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("zstd claim of %d bytes in %d: %v, want ErrCorrupt", fcs, len(bomb), err)
		}
	}
	if got := memAlloc() - before; got > 16<<20 {
		t.Fatalf("claims of up to 2 GiB in 17 bytes: allocated %.0f bytes", got)
	}
	// A frame that makes more than it claims is refused too: 20 blocks
	// of 128 KiB of one byte (RLE) where 2 MiB are announced.
	b := frame(2 << 20)
	for i := range 20 {
		h := uint32(128<<10)<<3 | 1<<1 // RLE
		if i == 19 {
			h |= 1
		}
		b = append(b, byte(h), byte(h>>8), byte(h>>16), 'z')
	}
	if _, err := Decompress(nil, b, max); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a frame of 2.5 MiB that claims 2 MiB: %v, want ErrCorrupt", err)
	}
}

// s2Check agrees with s2's decoder on whether a block makes its size,
// on valid blocks and on their mutations.
func TestS2CheckMatchesDecoder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	srcs := [][]byte{{}, []byte("a"), make([]byte, 70000), businessCards(64)}
	var rep []byte // literals and copies, near and far, short and long
	for len(rep) < 150000 {
		rep = append(rep, byte(rng.IntN(4)))
		from := rep[max(0, len(rep)-rng.IntN(5000)-1):]
		rep = append(rep, from[:min(len(from), rng.IntN(3000))]...)
	}
	srcs = append(srcs, rep)
	for _, src := range srcs {
		z := s2.Encode(nil, src)
		if err := s2Check(z, len(src)); err != nil {
			t.Fatalf("valid block of %d bytes: %v", len(src), err)
		}
		for range 2000 {
			m := append([]byte(nil), z...)
			for range 1 + rng.IntN(3) {
				switch i := rng.IntN(len(m)); rng.IntN(3) {
				case 0:
					m[i] = byte(rng.Uint32())
				case 1:
					m = m[:i]
				default:
					m = append(m[:i:i], append([]byte{byte(rng.Uint32())}, m[i:]...)...)
				}
				if len(m) == 0 {
					break
				}
			}
			n, err := s2.DecodedLen(m)
			if err != nil || n > 1<<22 {
				continue
			}
			_, derr := s2.Decode(make([]byte, n), m)
			if cerr := s2Check(m, n); (cerr == nil) != (derr == nil) {
				t.Fatalf("block %x: s2Check %v, s2.Decode %v", m, cerr, derr)
			}
		}
	}
}

// FuzzDecompress: arbitrary payloads never panic nor exceed the limit.
func FuzzDecompress(f *testing.F) {
	for _, c := range []Codec{CodecNone, CodecS2, CodecZstd} {
		b, _ := Compress(c, nil, businessCards(8))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		const max = 1 << 16
		out, err := Decompress(nil, src, max)
		if err == nil && len(out) > max {
			t.Fatalf("%d bytes out, limit %d", len(out), max)
		}
	})
}

func BenchmarkCompress(b *testing.B) {
	for _, p := range []int{16, 1024, 4096, 16384} {
		src := businessCards(p)
		for _, codec := range []Codec{CodecNone, CodecS2, CodecZstd, CodecAuto} {
			b.Run(fmt.Sprintf("P=%d/%v", p, codec), func(b *testing.B) {
				var dst []byte
				b.SetBytes(int64(len(src)))
				for b.Loop() {
					dst, _ = Compress(codec, dst[:0], src)
				}
				b.ReportMetric(float64(len(src))/float64(len(dst)), "ratio")
				b.ReportMetric(float64(len(dst)), "out-bytes")
			})
		}
	}
}

func BenchmarkDecompress(b *testing.B) {
	for _, p := range []int{16, 1024, 4096, 16384} {
		src := businessCards(p)
		for _, codec := range []Codec{CodecNone, CodecS2, CodecZstd} {
			c, _ := Compress(codec, nil, src)
			b.Run(fmt.Sprintf("P=%d/%v", p, codec), func(b *testing.B) {
				var dst []byte
				b.SetBytes(int64(len(src)))
				for b.Loop() {
					var err error
					dst, err = Decompress(dst[:0], c, len(src))
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
