package netio

import (
	"errors"
	"fmt"
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
