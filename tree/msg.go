package tree

import (
	"encoding/binary"
	"fmt"
)

// Kind is the collective a message belongs to; each kind numbers its own
// epochs.
type Kind uint8

const (
	Fence     Kind = 1 // payloads are KV sets
	Allgather Kind = 2 // payloads are entry sets
	numKinds       = 3
)

func (k Kind) String() string {
	switch k {
	case Fence:
		return "fence"
	case Allgather:
		return "allgather"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Type says which way a message travels.
type Type uint8

const (
	Up   Type = 1 // child to parent: the child's merged subtree contribution
	Down Type = 2 // parent to child: the root's result, forwarded unchanged
)

func (t Type) String() string {
	switch t {
	case Up:
		return "up"
	case Down:
		return "down"
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// Msg is one tree message.
type Msg struct {
	Kind     Kind
	Type     Type
	Epoch    uint64
	From, To int // node ids
	Payload  []byte
}

// Wire format of a Msg: tag 't', version 1, kind byte, type byte, uvarint
// epoch, uvarint from, uvarint to, then the payload up to the end of the
// frame (the transport frames messages).
const tagMsg = 't'

// AppendMsg appends m's encoding to dst.
func AppendMsg(dst []byte, m Msg) []byte {
	dst = append(dst, tagMsg, version, byte(m.Kind), byte(m.Type))
	dst = binary.AppendUvarint(dst, m.Epoch)
	dst = binary.AppendUvarint(dst, uint64(m.From))
	dst = binary.AppendUvarint(dst, uint64(m.To))
	return append(dst, m.Payload...)
}

// DecodeMsg decodes one whole frame. The payload aliases b; epochs are at
// least 1 and node ids below MaxNodes.
func DecodeMsg(b []byte) (Msg, error) {
	if len(b) < 4 || b[0] != tagMsg || b[1] != version {
		return Msg{}, fmt.Errorf("decode tree message: %w: bad tag or version", ErrMalformed)
	}
	m := Msg{Kind: Kind(b[2]), Type: Type(b[3])}
	r := reader{b: b, i: 4}
	m.Epoch = r.uvarint()
	from, to := r.uvarint(), r.uvarint()
	switch {
	case r.err != nil:
		return Msg{}, fmt.Errorf("decode tree message: %w", r.err)
	case m.Kind != Fence && m.Kind != Allgather:
		return Msg{}, fmt.Errorf("decode tree message: %w: kind %d", ErrMalformed, m.Kind)
	case m.Type != Up && m.Type != Down:
		return Msg{}, fmt.Errorf("decode tree message: %w: type %d", ErrMalformed, m.Type)
	case m.Epoch == 0:
		return Msg{}, fmt.Errorf("decode tree message: %w: epoch 0", ErrMalformed)
	case from >= MaxNodes || to >= MaxNodes:
		return Msg{}, fmt.Errorf("decode tree message: %w: node %d to %d", ErrMalformed, from, to)
	}
	m.From, m.To = int(from), int(to)
	m.Payload = b[r.i:len(b):len(b)]
	return m, nil
}
