package netio

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire format of one frame (all integers big-endian):
//
//	offset  size  field
//	0       4     payload length in bytes
//	4       2     type
//	6       1     magic (0xF7), catches a desynchronised or foreign stream
//	7       1     format version (1)
//	8       8     epoch
//	16      n     payload
const (
	HeaderSize = 16

	offLength  = 0
	offType    = 4
	offMagic   = 6
	offVersion = 7
	offEpoch   = 8

	frameMagic   = 0xF7
	frameVersion = 1
)

// Frame sizes. DefaultMaxFrameSize bounds what a Conn accepts unless
// Config.MaxFrameSize says otherwise; MaxFrameSizeLimit bounds the setting.
const (
	DefaultMaxFrameSize = 64 << 20
	MaxFrameSizeLimit   = 1 << 30

	// handshakeFrameMax bounds the frames a peer may send before it is
	// authenticated (hello and proof), so an unauthenticated peer cannot
	// make a receiver allocate.
	handshakeFrameMax = 64
	// handshakeFrames is how many leading frames handshakeFrameMax covers.
	handshakeFrames = 2
)

// Frame types at or above TypeReserved belong to the transport (the
// handshake); Send refuses them.
const TypeReserved uint16 = 0xFF00

// A Frame is the unit the transport moves: a typed, epoch-stamped payload.
// A received Frame's Payload is owned by the receiver; a sent Frame's
// Payload may be reused by the caller as soon as Send returns.
type Frame struct {
	Type    uint16
	Epoch   uint64
	Payload []byte
}

// Decoding errors. A stream that produced one of them is desynchronised and
// the connection carrying it is closed.
var (
	ErrFrameTooLarge  = errors.New("frame exceeds maximum size")
	ErrBadMagic       = errors.New("bad frame magic")
	ErrBadVersion     = errors.New("unsupported frame version")
	ErrShortFrame     = errors.New("incomplete frame")
	ErrReservedType   = errors.New("frame type is reserved for the transport")
	ErrTruncatedFrame = errors.New("stream ended inside a frame")
	// ErrUnauthenticated: a frame came before its sender was
	// authenticated (Decoder.Sealed).
	ErrUnauthenticated = errors.New("frame before authentication")
)

// AppendFrame appends the encoding of f to dst. It fails if the payload is
// longer than max.
func AppendFrame(dst []byte, f Frame, max int) ([]byte, error) {
	if len(f.Payload) > max {
		return dst, fmt.Errorf("encode frame of %d bytes (max %d): %w", len(f.Payload), max, ErrFrameTooLarge)
	}
	var h [HeaderSize]byte
	putHeader(h[:], f.Type, f.Epoch, len(f.Payload))
	dst = append(dst, h[:]...)
	return append(dst, f.Payload...), nil
}

func putHeader(h []byte, typ uint16, epoch uint64, n int) {
	binary.BigEndian.PutUint32(h[offLength:], uint32(n))
	binary.BigEndian.PutUint16(h[offType:], typ)
	h[offMagic] = frameMagic
	h[offVersion] = frameVersion
	binary.BigEndian.PutUint64(h[offEpoch:], epoch)
}

// parseHeader checks a complete header against max and returns the type,
// epoch and payload length it announces.
func parseHeader(h []byte, max int) (typ uint16, epoch uint64, n int, err error) {
	if h[offMagic] != frameMagic {
		return 0, 0, 0, fmt.Errorf("decode frame header: magic %#02x: %w", h[offMagic], ErrBadMagic)
	}
	if h[offVersion] != frameVersion {
		return 0, 0, 0, fmt.Errorf("decode frame header: version %d: %w", h[offVersion], ErrBadVersion)
	}
	l := binary.BigEndian.Uint32(h[offLength:])
	if uint64(l) > uint64(max) {
		return 0, 0, 0, fmt.Errorf("decode frame header: length %d (max %d): %w", l, max, ErrFrameTooLarge)
	}
	return binary.BigEndian.Uint16(h[offType:]), binary.BigEndian.Uint64(h[offEpoch:]), int(l), nil
}

// DecodeFrame decodes the first frame in b. It returns the frame, the number
// of bytes it occupied, and ErrShortFrame (wrapped) if b holds only part of
// it. The payload aliases b.
func DecodeFrame(b []byte, max int) (Frame, int, error) {
	if len(b) < HeaderSize {
		return Frame{}, 0, fmt.Errorf("decode frame: %d of %d header bytes: %w", len(b), HeaderSize, ErrShortFrame)
	}
	typ, epoch, n, err := parseHeader(b[:HeaderSize], max)
	if err != nil {
		return Frame{}, 0, err
	}
	if len(b)-HeaderSize < n {
		return Frame{}, 0, fmt.Errorf("decode frame: %d of %d payload bytes: %w", len(b)-HeaderSize, n, ErrShortFrame)
	}
	return Frame{Type: typ, Epoch: epoch, Payload: b[HeaderSize : HeaderSize+n : HeaderSize+n]}, HeaderSize + n, nil
}

// A Decoder turns a byte stream, fed in pieces of any size, into frames. It
// is a pure state machine: no I/O, no goroutines, one owner. Each emitted
// payload is a fresh allocation the receiver owns. At most payloadStep bytes
// are allocated on the strength of a header alone; beyond that the payload
// grows (doubling) as its bytes arrive, so a peer has to send the bytes it
// makes us hold.
//
// The first handshakeFrames frames are limited to handshakeFrameMax bytes
// when Handshake is set: they precede authentication.
type Decoder struct {
	Max       int  // largest payload accepted
	Handshake bool // limit the leading frames to the handshake's size
	// Sealed refuses any frame after the handshake's (ErrUnauthenticated)
	// until it is cleared: an acceptor's connection, whose dialer sends
	// nothing more before the acceptor proved itself, which it does once
	// the dialer has. A stranger's bytes after its two frames are then
	// never taken in.
	Sealed bool

	frames int              // frames whose header has been parsed
	hdr    [HeaderSize]byte // header being assembled
	nhdr   int              // bytes in hdr
	cur    Frame            // frame whose payload is being assembled
	need   int              // payload bytes of cur still missing
	in     bool             // a header has been parsed, cur is being assembled
	err    error            // sticky: the stream is desynchronised
}

// payloadStep is the largest allocation made ahead of arriving bytes.
const payloadStep = 1 << 20

// NewDecoder returns a decoder accepting payloads up to max bytes.
func NewDecoder(max int) *Decoder { return &Decoder{Max: max} }

// Feed consumes p, calling emit for each frame it completes, in order. After
// an error the decoder is stuck and returns the same error again.
func (d *Decoder) Feed(p []byte, emit func(Frame)) error {
	if d.err != nil {
		return d.err
	}
	for len(p) > 0 {
		if !d.in {
			// Fast path: a whole header in p.
			if d.nhdr == 0 && len(p) >= HeaderSize {
				if err := d.startFrame(p[:HeaderSize]); err != nil {
					return err
				}
				p = p[HeaderSize:]
			} else {
				c := copy(d.hdr[d.nhdr:], p)
				d.nhdr += c
				p = p[c:]
				if d.nhdr < HeaderSize {
					return nil
				}
				d.nhdr = 0
				if err := d.startFrame(d.hdr[:]); err != nil {
					return err
				}
			}
		}
		if d.need > 0 {
			c := min(d.need, len(p))
			if cap(d.cur.Payload)-len(d.cur.Payload) < c {
				// Double (at least payloadStep), capped by what is announced.
				grow := max(c, min(d.need, max(len(d.cur.Payload), payloadStep)))
				nb := make([]byte, len(d.cur.Payload), len(d.cur.Payload)+grow)
				copy(nb, d.cur.Payload)
				d.cur.Payload = nb
			}
			d.cur.Payload = append(d.cur.Payload, p[:c]...)
			d.need -= c
			p = p[c:]
		}
		if d.need == 0 {
			f := d.cur
			d.cur = Frame{}
			d.in = false
			emit(f)
		}
	}
	return nil
}

func (d *Decoder) startFrame(h []byte) error {
	if d.Sealed && d.frames >= handshakeFrames {
		d.err = fmt.Errorf("decode frame %d: %w", d.frames+1, ErrUnauthenticated)
		return d.err
	}
	limit := d.Max
	if d.Handshake && d.frames < handshakeFrames {
		limit = min(limit, handshakeFrameMax)
	}
	typ, epoch, n, err := parseHeader(h, limit)
	if err != nil {
		d.err = err
		return err
	}
	d.frames++
	d.cur = Frame{Type: typ, Epoch: epoch}
	if n > 0 {
		d.cur.Payload = make([]byte, 0, min(n, payloadStep))
	} else {
		d.cur.Payload = []byte{}
	}
	d.need = n
	d.in = true
	return nil
}

// Mid reports whether the decoder holds part of a frame: a stream that ends
// now ends inside a frame.
func (d *Decoder) Mid() bool { return d.nhdr > 0 || d.in }
