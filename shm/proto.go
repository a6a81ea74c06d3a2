package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The request protocol between a rank and its agent over the rings. A
// request is one ring message: Header.Op names the operation, Header.Seq is
// the rank's request id (echoed by the response), Header.Epoch the
// collective epoch where there is one. Collectives (fence, allgather) are
// answered by publishing their epoch; a failed collective is also answered
// with an OpError response carrying its epoch. The other requests get one
// response with the same Op and Seq; its Flags carry a Status.
const (
	OpHello     uint16 = 1  // rank attached; no response
	OpPut       uint16 = 2  // Flags = hint; payload: key (PutPayload); no response
	OpFence     uint16 = 3  // Epoch; Flags = CollDetached?
	OpAllgather uint16 = 4  // Epoch; Flags = CollDetached?; the value is in the rank's slot for Epoch
	OpGet       uint16 = 5  // Flags = GetWait?; payload: src rank, key (GetPayload)
	OpRing      uint16 = 6  // payload: the value; response: RingPayload
	OpJobAttr   uint16 = 7  // payload: key
	OpPublish   uint16 = 8  // payload: name, port (PairPayload)
	OpUnpublish uint16 = 9  // payload: name; StatusNotFound if it is not published
	OpLookup    uint16 = 10 // payload: name; response: the port, or StatusNotFound
	OpAbort     uint16 = 11 // payload: code, message (AbortPayload); no response
	OpFinalize  uint16 = 12 // response when done
	OpError     uint16 = 13 // agent → rank: collective Epoch failed; payload: message
	OpSpawn     uint16 = 14 // payload: a PMI-2 spawn request (pmiwire.AppendSpawnV2); response: the new job's id
	// Node attributes (PMI-2 info-putnodeattr / info-getnodeattr): values
	// shared by the ranks of one node only.
	OpPutNodeAttr uint16 = 15 // payload: key, value (AppendPair); response when stored
	OpGetNodeAttr uint16 = 16 // Flags = GetWait?; payload: key; response: the value, or StatusNotFound
	// OpBlock tells the agent the rank now waits for its collectives up
	// to Epoch (a Wait on a detached one), or with Epoch 0 that it waits
	// for nothing any more (a Wait or a waiting get cut short: the agent
	// answers what the rank left parked with StatusError, a response the
	// rank discards); no response of its own. The agent's deadlock check
	// counts only ranks that wait.
	OpBlock uint16 = 17
)

// opNames name the operations, for traces and messages.
var opNames = [...]string{
	OpHello: "hello", OpPut: "put", OpFence: "fence", OpAllgather: "allgather",
	OpGet: "get", OpRing: "ring", OpJobAttr: "jobattr", OpPublish: "publish",
	OpUnpublish: "unpublish", OpLookup: "lookup", OpAbort: "abort",
	OpFinalize: "finalize", OpError: "error", OpSpawn: "spawn",
	OpPutNodeAttr: "putnodeattr", OpGetNodeAttr: "getnodeattr", OpBlock: "block",
}

// OpName names op ("op N" for one this version does not know).
func OpName(op uint16) string {
	if int(op) < len(opNames) && opNames[op] != "" {
		return opNames[op]
	}
	return fmt.Sprintf("op %d", op)
}

// Put hints, in Header.Flags of OpPut.
const (
	HintNone   uint16 = 0
	HintDense  uint16 = 1
	HintSparse uint16 = 2
)

// GetWait in Header.Flags of OpGet waits for a late put.
const GetWait uint16 = 1

// CollDetached in Header.Flags of OpFence and OpAllgather says the rank
// goes on with other work (Ifence, Iallgather): it does not wait for the
// collective until an OpBlock says so.
const CollDetached uint16 = 1

// Status of a response, in Header.Flags.
const (
	StatusOK       uint16 = 0
	StatusNotFound uint16 = 1
	StatusError    uint16 = 2 // payload: message
)

// ErrPayload reports a malformed request or response payload.
var ErrPayload = errors.New("malformed payload")

// AppendPair encodes two byte strings: a 2-byte length of a, a, then b.
func AppendPair(dst []byte, a, b string) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(a)))
	dst = append(dst, a...)
	return append(dst, b...)
}

// Pair decodes AppendPair's encoding; the results are views into p.
func Pair(p []byte) (a, b []byte, err error) {
	if len(p) < 2 {
		return nil, nil, ErrPayload
	}
	n := int(binary.LittleEndian.Uint16(p))
	if 2+n > len(p) {
		return nil, nil, ErrPayload
	}
	return p[2 : 2+n], p[2+n:], nil
}

// AppendInt32 encodes a little-endian int32 then rest.
func AppendInt32(dst []byte, v int32, rest string) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(v))
	return append(dst, rest...)
}

// Int32 decodes AppendInt32's encoding.
func Int32(p []byte) (int32, []byte, error) {
	if len(p) < 4 {
		return 0, nil, ErrPayload
	}
	return int32(binary.LittleEndian.Uint32(p)), p[4:], nil
}

// AppendRing encodes a ring result: position, size, left, right.
func AppendRing(dst []byte, pos, size uint32, left, right string) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, pos)
	dst = binary.LittleEndian.AppendUint32(dst, size)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(left)))
	dst = append(dst, left...)
	return append(dst, right...)
}

// Ring decodes AppendRing's encoding; left and right are views into p.
func Ring(p []byte) (pos, size uint32, left, right []byte, err error) {
	if len(p) < 12 {
		return 0, 0, nil, nil, ErrPayload
	}
	le := binary.LittleEndian
	pos, size = le.Uint32(p), le.Uint32(p[4:])
	n := le.Uint32(p[8:])
	if uint64(n) > uint64(len(p)-12) {
		return 0, 0, nil, nil, ErrPayload
	}
	return pos, size, p[12 : 12+n], p[12+n:], nil
}
