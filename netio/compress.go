package netio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// A Codec names a compression codec. As a tag it is the first byte of a
// compressed payload (CodecNone, CodecS2, CodecZstd); as a policy for
// Compress it may also be CodecAuto, which picks one by the payload's size
// (see the package documentation for the measurements behind the rule).
type Codec uint8

const (
	CodecNone Codec = 0
	CodecS2   Codec = 1
	CodecZstd Codec = 2
	CodecAuto Codec = 0xFF // a policy only, never a tag
)

// AutoMinSize is the size below which the auto policy sends a payload as
// it is: such a payload fits one TCP segment on Ethernet (MSS 1448), so
// compressing it cannot save a packet. From it on auto uses s2. The
// package documentation has the measurements behind the rule.
const AutoMinSize = 1400

// Compression errors.
var (
	ErrUnknownCodec = errors.New("unknown codec")
	ErrCorrupt      = errors.New("corrupt compressed payload")
	ErrTooLarge     = errors.New("decompressed payload exceeds limit")
)

func (c Codec) String() string {
	switch c {
	case CodecNone:
		return "none"
	case CodecS2:
		return "s2"
	case CodecZstd:
		return "zstd"
	case CodecAuto:
		return "auto"
	}
	return fmt.Sprintf("codec(%d)", uint8(c))
}

// ParseCodec parses a policy name: "auto", "s2", "zstd" or "none".
func ParseCodec(s string) (Codec, error) {
	switch s {
	case "auto", "":
		return CodecAuto, nil
	case "s2":
		return CodecS2, nil
	case "zstd":
		return CodecZstd, nil
	case "none":
		return CodecNone, nil
	}
	return 0, fmt.Errorf("parse codec %q: want auto, s2, zstd or none: %w", s, ErrUnknownCodec)
}

// autoCodec is the auto policy's choice for n bytes.
func autoCodec(n int) Codec {
	if n < AutoMinSize {
		return CodecNone
	}
	return CodecS2
}

// The zstd coders are made once and shared: EncodeAll and DecodeAll are
// safe for concurrent use.
var (
	zstdEncoder = sync.OnceValue(func() *zstd.Encoder {
		e, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
		if err != nil {
			panic("netio: make zstd encoder: " + err.Error()) // options are constant
		}
		return e
	})
	zstdDecoder = sync.OnceValue(func() *zstd.Decoder {
		d, err := zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(0),
			zstd.WithDecodeAllCapLimit(true),
			zstd.WithDecoderMaxMemory(MaxFrameSizeLimit))
		if err != nil {
			panic("netio: make zstd decoder: " + err.Error())
		}
		return d
	})
)

// Compress appends to dst a one-byte codec tag and src compressed by the
// codec policy picks (CodecAuto: by size). If compression would not make
// src smaller the tag is CodecNone and src follows as it is, whatever the
// policy. The receiver needs nothing but the bytes: see Decompress.
func Compress(policy Codec, dst, src []byte) ([]byte, error) {
	codec := policy
	if policy == CodecAuto {
		codec = autoCodec(len(src))
	}
	start := len(dst)
	switch codec {
	case CodecNone:
	case CodecS2:
		n := s2.MaxEncodedLen(len(src))
		if n < 0 {
			return dst, fmt.Errorf("compress %d bytes with s2: %w", len(src), ErrTooLarge)
		}
		out := slices.Grow(dst, 1+n)[:start+1+n]
		out[start] = byte(CodecS2)
		enc := s2.Encode(out[start+1:], src)
		if len(enc) < len(src) {
			return out[:start+1+len(enc)], nil
		}
		dst = out[:start]
	case CodecZstd:
		out := append(dst, byte(CodecZstd))
		out = zstdEncoder().EncodeAll(src, out)
		if len(out)-start-1 < len(src) {
			return out, nil
		}
		dst = out[:start]
	default:
		return dst, fmt.Errorf("compress with %v: %w", policy, ErrUnknownCodec)
	}
	dst = append(dst, byte(CodecNone))
	return append(dst, src...), nil
}

// Decompress appends to dst the payload src (a tag and its data, as made
// by Compress) decompressed. It fails without allocating beyond max bytes
// of output if src claims or produces more, so a bad frame cannot exhaust
// memory.
func Decompress(dst, src []byte, max int) ([]byte, error) {
	if len(src) == 0 {
		return dst, fmt.Errorf("decompress: empty payload: %w", ErrCorrupt)
	}
	tag, body := Codec(src[0]), src[1:]
	switch tag {
	case CodecNone:
		if len(body) > max {
			return dst, fmt.Errorf("decompress %d bytes (max %d): %w", len(body), max, ErrTooLarge)
		}
		return append(dst, body...), nil
	case CodecS2:
		n, err := s2.DecodedLen(body)
		if err != nil {
			return dst, fmt.Errorf("decompress s2: %w: %w", ErrCorrupt, err)
		}
		if n > max {
			return dst, fmt.Errorf("decompress s2 to %d bytes (max %d): %w", n, max, ErrTooLarge)
		}
		if n > s2TrustedLen && n/s2TrustedRatio > len(body) {
			// The header's size is a claim: check that the body makes
			// it before allocating it (s2Check).
			if err := s2Check(body, n); err != nil {
				return dst, fmt.Errorf("decompress s2 to %d bytes: %w: %w", n, ErrCorrupt, err)
			}
		}
		start := len(dst)
		out := slices.Grow(dst, n)[:start+n]
		dec, err := s2.Decode(out[start:], body)
		if err != nil {
			return dst, fmt.Errorf("decompress s2: %w: %w", ErrCorrupt, err)
		}
		if len(dec) != n {
			return dst, fmt.Errorf("decompress s2: %d bytes, header said %d: %w", len(dec), n, ErrCorrupt)
		}
		return out, nil
	case CodecZstd:
		var h zstd.Header
		if err := h.Decode(body); err != nil {
			return dst, fmt.Errorf("decompress zstd: %w: %w", ErrCorrupt, err)
		}
		if !h.HasFCS {
			return dst, fmt.Errorf("decompress zstd: frame without content size: %w", ErrCorrupt)
		}
		if h.FrameContentSize > uint64(max) {
			return dst, fmt.Errorf("decompress zstd to %d bytes (max %d): %w", h.FrameContentSize, max, ErrTooLarge)
		}
		if h.FrameContentSize > s2TrustedLen && h.FrameContentSize/s2TrustedRatio > uint64(len(body)) {
			return zstdStream(dst, body, int(h.FrameContentSize))
		}
		start := len(dst)
		// The decoder stops at cap(out): the announced size bounds the
		// work even if later frames in body lie about theirs.
		out := slices.Grow(dst, int(h.FrameContentSize))
		out = out[: start : start+int(h.FrameContentSize)]
		out, err := zstdDecoder().DecodeAll(body, out)
		if err != nil {
			if errors.Is(err, zstd.ErrDecoderSizeExceeded) {
				return dst, fmt.Errorf("decompress zstd (max %d): %w", max, ErrTooLarge)
			}
			return dst, fmt.Errorf("decompress zstd: %w: %w", ErrCorrupt, err)
		}
		return out, nil
	}
	return dst, fmt.Errorf("decompress: tag %d: %w", src[0], ErrUnknownCodec)
}

// An s2 payload's header may claim up to s2TrustedLen bytes, or up to
// s2TrustedRatio times the payload's length, without s2Check looking
// first: allocating that much on a claim costs little, or no more than
// the frame's own bytes do. The walk costs about as much as decoding
// (0.26 ms against 0.34 for 2.4 MB of business cards, ratio 9.6), so
// payloads that compress as PMI data does are not walked; those that
// compress better are small for what they make, and walked fast.
const (
	s2TrustedLen   = 1 << 20
	s2TrustedRatio = 16
)

// s2Check walks an s2 block (header and tags, as s2's decoder reads
// them) and checks that it decodes to exactly n bytes, without decoding
// it. A header is only a claim: a payload of ten bytes that announces 2
// GiB made Decompress allocate (and the runtime zero) 2 GiB before s2
// found the body corrupt, seconds of work per frame. The walk costs one
// pass over the compressed bytes and allocates nothing.
func s2Check(src []byte, n int) error {
	_, h := binary.Uvarint(src)
	if h <= 0 {
		return errors.New("bad length header")
	}
	s, d, offset := h, 0, 0
	need := func(k int) bool { s += k; return uint(s) <= uint(len(src)) }
	for s < len(src) {
		tag := src[s]
		var length int
		switch tag & 0x03 {
		case 0x00: // literal
			x := uint32(tag >> 2)
			switch {
			case x < 60:
				s++
			case x == 60:
				if !need(2) {
					return errors.New("truncated literal")
				}
				x = uint32(src[s-1])
			case x == 61:
				if !need(3) {
					return errors.New("truncated literal")
				}
				x = uint32(src[s-2]) | uint32(src[s-1])<<8
			case x == 62:
				if !need(4) {
					return errors.New("truncated literal")
				}
				x = uint32(src[s-3]) | uint32(src[s-2])<<8 | uint32(src[s-1])<<16
			default:
				if !need(5) {
					return errors.New("truncated literal")
				}
				x = uint32(src[s-4]) | uint32(src[s-3])<<8 | uint32(src[s-2])<<16 | uint32(src[s-1])<<24
			}
			length = int(x) + 1
			if length <= 0 || length > n-d || length > len(src)-s {
				return fmt.Errorf("literal of %d bytes at output byte %d", length, d)
			}
			d += length
			s += length
			continue
		case 0x01: // copy with a 1-byte offset, or a repeat of the last offset
			if !need(2) {
				return errors.New("truncated copy")
			}
			length = int(src[s-2]) >> 2 & 0x7
			if toffset := int(uint32(src[s-2])&0xe0<<3 | uint32(src[s-1])); toffset != 0 {
				offset = toffset
			} else {
				switch length {
				case 5:
					if !need(1) {
						return errors.New("truncated repeat")
					}
					length = int(src[s-1]) + 4
				case 6:
					if !need(2) {
						return errors.New("truncated repeat")
					}
					length = int(uint32(src[s-2])|uint32(src[s-1])<<8) + 1<<8
				case 7:
					if !need(3) {
						return errors.New("truncated repeat")
					}
					length = int(uint32(src[s-3])|uint32(src[s-2])<<8|uint32(src[s-1])<<16) + 1<<16
				}
			}
			length += 4
		case 0x02: // copy with a 2-byte offset
			if !need(3) {
				return errors.New("truncated copy")
			}
			length = 1 + int(src[s-3])>>2
			offset = int(uint32(src[s-2]) | uint32(src[s-1])<<8)
		default: // copy with a 4-byte offset
			if !need(5) {
				return errors.New("truncated copy")
			}
			length = 1 + int(src[s-5])>>2
			offset = int(uint32(src[s-4]) | uint32(src[s-3])<<8 | uint32(src[s-2])<<16 | uint32(src[s-1])<<24)
		}
		if offset <= 0 || d < offset || length > n-d {
			return fmt.Errorf("copy of %d bytes from offset %d at output byte %d", length, offset, d)
		}
		d += length
	}
	if d != n {
		return fmt.Errorf("%d bytes, header said %d", d, n)
	}
	return nil
}

// zstdMaxWindow bounds the window of a zstd payload zstdStream decodes:
// Compress's encoder (SpeedFastest) uses at most 8 MiB, and a frame of
// one segment (its window its size) only up to that size.
const zstdMaxWindow = 8 << 20

// zstdStream decodes body, zstd frames that claim n bytes from far
// fewer, appending to dst as the bytes come: nothing is allocated on the
// strength of the claim. DecodeAll allocates the claimed size first (a
// frame of 16 bytes that claimed 1.5 GiB cost 1.5 GiB and seconds of
// zeroing before it was found short), as s2 did (s2Check). Output beyond
// n, or short of it, is refused.
func zstdStream(dst, body []byte, n int) ([]byte, error) {
	d, err := zstd.NewReader(bytes.NewReader(body), zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxWindow(zstdMaxWindow), zstd.WithDecoderMaxMemory(uint64(n)))
	if err != nil {
		return dst, fmt.Errorf("decompress zstd: %w", err)
	}
	defer d.Close()
	start := len(dst)
	out := dst
	for {
		if len(out) == cap(out) {
			// Double what came so far (at least 1 MiB), never beyond
			// one byte past the claim: that byte shows a lie.
			have := len(out) - start
			out = slices.Grow(out, min(max(have, s2TrustedLen), n+1-have))
		}
		k, err := d.Read(out[len(out):cap(out)])
		out = out[:len(out)+k]
		if len(out)-start > n {
			return dst, fmt.Errorf("decompress zstd: more than the %d bytes announced: %w", n, ErrCorrupt)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return dst, fmt.Errorf("decompress zstd: %w: %w", ErrCorrupt, err)
		}
	}
	if len(out)-start != n {
		return dst, fmt.Errorf("decompress zstd: %d bytes, header said %d: %w", len(out)-start, n, ErrCorrupt)
	}
	return out, nil
}
