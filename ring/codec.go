package ring

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire format of a Message (all integers unsigned varints unless noted):
//
//	tag      1 byte, 'r'
//	version  1 byte, 1
//	epoch, from, to
//	dir      1 byte (1 ToLeft, 2 ToRight)
//	mode     1 byte, 1 (CountsFromMap)
//	flags    1 byte (bit 0: size present; other bits must be 0)
//	offset
//	size     only if flag bit 0
//	vlen, then vlen bytes of value
//
// Nothing may follow the value. The mode byte stays for compatibility, but
// 1 is the only mode: 2 (counts passed along the ring) is no longer spoken
// and is refused like any other value.
const (
	msgTag     = 'r'
	msgVersion = 1
	flagSize   = 1 << 0

	// MaxValueLen bounds a ring value on the wire.
	MaxValueLen = 1 << 20
	// MaxNodes bounds a node id on the wire.
	MaxNodes = 1 << 24
)

// ErrMalformed reports bytes that are not a valid ring message.
var ErrMalformed = errors.New("malformed ring message")

// AppendMessage appends m's encoding to dst.
func AppendMessage(dst []byte, m Message) []byte {
	dst = append(dst, msgTag, msgVersion)
	dst = binary.AppendUvarint(dst, m.Epoch)
	dst = binary.AppendUvarint(dst, uint64(m.From))
	dst = binary.AppendUvarint(dst, uint64(m.To))
	var flags byte
	if m.HasSize {
		flags |= flagSize
	}
	dst = append(dst, byte(m.Dir), byte(m.Mode), flags)
	dst = binary.AppendUvarint(dst, m.Offset)
	if m.HasSize {
		dst = binary.AppendUvarint(dst, m.Size)
	}
	dst = binary.AppendUvarint(dst, uint64(len(m.Value)))
	return append(dst, m.Value...)
}

// DecodeMessage decodes one whole message. The value is copied out of b.
func DecodeMessage(b []byte) (Message, error) {
	d := decoder{b: b}
	var m Message
	if d.byte() != msgTag || d.byte() != msgVersion {
		return Message{}, fmt.Errorf("decode ring message: %w: bad tag or version", ErrMalformed)
	}
	m.Epoch = d.uvarint()
	m.From = d.node()
	m.To = d.node()
	m.Dir = Dir(d.byte())
	m.Mode = CountMode(d.byte())
	flags := d.byte()
	m.Offset = d.uvarint()
	if flags&flagSize != 0 {
		m.Size, m.HasSize = d.uvarint(), true
	}
	n := d.uvarint()
	switch {
	case d.err != nil:
		return Message{}, fmt.Errorf("decode ring message: %w", d.err)
	case m.Dir != ToLeft && m.Dir != ToRight:
		return Message{}, fmt.Errorf("decode ring message: %w: direction %d", ErrMalformed, m.Dir)
	case m.Mode != CountsFromMap:
		return Message{}, fmt.Errorf("decode ring message: %w: mode %d", ErrMalformed, m.Mode)
	case flags&^flagSize != 0:
		return Message{}, fmt.Errorf("decode ring message: %w: flags %#x", ErrMalformed, flags)
	case n > MaxValueLen:
		return Message{}, fmt.Errorf("decode ring message: %w: value of %d bytes", ErrMalformed, n)
	case n != uint64(len(d.b)-d.i):
		return Message{}, fmt.Errorf("decode ring message: %w: value of %d bytes, %d left", ErrMalformed, n, len(d.b)-d.i)
	}
	m.Value = string(d.b[d.i:])
	return m, nil
}

type decoder struct {
	b   []byte
	i   int
	err error
}

func (d *decoder) byte() byte {
	if d.err != nil || d.i >= len(d.b) {
		if d.err == nil {
			d.err = fmt.Errorf("%w: truncated", ErrMalformed)
		}
		return 0
	}
	d.i++
	return d.b[d.i-1]
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.i:])
	if n <= 0 {
		d.err = fmt.Errorf("%w: bad varint at byte %d", ErrMalformed, d.i)
		return 0
	}
	d.i += n
	return v
}

func (d *decoder) node() int {
	v := d.uvarint()
	if v >= MaxNodes && d.err == nil {
		d.err = fmt.Errorf("%w: node id %d", ErrMalformed, v)
	}
	return int(v)
}
