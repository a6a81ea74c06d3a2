//go:generate go run -ldflags=-checklinkname=0 ../internal/genlayout -o ../clib/fastpmi_layout.h

package shm

import (
	"bytes"
	"fmt"
)

// cConst is one constant of the layout as libfastpmi's C header names it.
type cConst struct {
	name  string
	value uint64
	doc   string
}

// cConsts is the layout's specification for its other implementation,
// libfastpmi (clib/): every constant the C rank side needs to validate a
// segment, compute its geometry and speak the request protocol, taken from
// this package's own constants so that the two cannot drift. CHeader
// renders it; a test fails when the committed header differs.
func cConsts() []cConst {
	return []cConst{
		{"FPMI_SHM_MAGIC", Magic, `"fpmi-shm" as a little-endian uint64`},
		{"FPMI_SHM_LAYOUT_VERSION", uint64(LayoutVersion), "agent and ranks must agree exactly"},
		{"FPMI_SHM_CACHE_LINE", CacheLine, ""},
		{"FPMI_SHM_LINE_GAP", lineGap, "rank and agent halves of a control block"},
		{"FPMI_SHM_REGION_ALIGN", regionAlign, "every region starts on this boundary"},
		{"FPMI_SHM_HEADER_BYTES", headerBytes, ""},

		{"FPMI_HDR_MAGIC", hdrMagic, "uint64"},
		{"FPMI_HDR_VERSION", hdrVersion, "uint32"},
		{"FPMI_HDR_HEADER_BYTES", hdrHeaderBytes, "uint32"},
		{"FPMI_HDR_TOTAL", hdrTotal, "uint64: segment length"},
		{"FPMI_HDR_LOCAL_RANKS", hdrLocalRanks, "uint32"},
		{"FPMI_HDR_WORLD_SIZE", hdrWorldSize, "uint32"},
		{"FPMI_HDR_MAX_VALUE", hdrMaxValue, "uint32"},
		{"FPMI_HDR_REQ_RING_BYTES", hdrReqRingBytes, "uint32"},
		{"FPMI_HDR_RESP_RING_BYTES", hdrRespRingBytes, "uint32"},
		{"FPMI_HDR_KVS_CAPACITY", hdrKVSCapacity, "uint32"},
		{"FPMI_HDR_KVS_KEY_MAX", hdrKVSKeyMax, "uint32"},
		{"FPMI_HDR_KVS_BUCKETS", hdrKVSBuckets, "uint32"},
		{"FPMI_HDR_CTRL_OFF", hdrCtrlOff, "uint64"},
		{"FPMI_HDR_RING_OFF", hdrRingOff, "uint64"},
		{"FPMI_HDR_SLOT_OFF", hdrSlotOff, "uint64"},
		{"FPMI_HDR_RESULT_OFF", hdrResultOff, "uint64"},
		{"FPMI_HDR_KVS_INDEX_OFF", hdrKVSIndexOff, "uint64"},
		{"FPMI_HDR_KVS_ENTRY_OFF", hdrKVSEntryOff, "uint64"},
		{"FPMI_HDR_CTRL_STRIDE", hdrCtrlStride, "uint32"},
		{"FPMI_HDR_RING_STRIDE", hdrRingStride, "uint32"},
		{"FPMI_HDR_SLOT_BYTES", hdrSlotBytes, "uint32"},
		{"FPMI_HDR_RESULT_STRIDE", hdrResultStride, "uint32"},
		{"FPMI_HDR_KVS_ENTRY_BYTES", hdrKVSEntryBytes, "uint32"},
		{"FPMI_HDR_KVS_ARENA_PAGES", hdrKVSArenaPages, "uint32"},
		{"FPMI_HDR_FIELDS_END", hdrFieldsEnd, ""},

		{"FPMI_OFF_DOORBELL", offDoorbell, "uint32 futex word: ranks bump it to wake the agent"},
		{"FPMI_OFF_AGENT_SLEEPERS", offAgentSleepers, "uint32: non-zero while the agent sleeps"},
		{"FPMI_OFF_EPOCH", offEpoch, "uint32: last published collective epoch"},
		{"FPMI_OFF_EPOCH_WAKE", offEpochWake, "uint32 futex word of epoch sleepers"},
		{"FPMI_OFF_EPOCH_SLEEPERS", offEpochSleepers, "uint32: ranks inside an epoch wait"},

		{"FPMI_CTL_REQ_TAIL", ctlReqTail, "uint64, rank half"},
		{"FPMI_CTL_RESP_HEAD", ctlRespHead, "uint64, rank half"},
		{"FPMI_CTL_RANK_SLEEPERS", ctlRankSleepers, "uint32, rank half"},
		{"FPMI_CTL_RANK_STATE", ctlRankState, "uint32, rank half"},
		{"FPMI_CTL_RANK_PID", ctlRankPID, "uint32, rank half"},
		{"FPMI_CTL_REQ_HEAD", ctlReqHead, "uint64, agent half"},
		{"FPMI_CTL_RESP_TAIL", ctlRespTail, "uint64, agent half"},
		{"FPMI_CTL_RANK_WAKE", ctlRankWake, "uint32 futex word, agent half"},
		{"FPMI_CTRL_STRIDE", ctrlStride, ""},

		{"FPMI_SLOT_LEN", slotLen, "uint32"},
		{"FPMI_SLOT_EPOCH", slotEpoch, "uint32"},
		{"FPMI_SLOT_DATA", slotData, ""},
		{"FPMI_RES_LEN", resLen, "uint32"},
		{"FPMI_RES_EPOCH", resEpoch, "uint32"},
		{"FPMI_RES_DATA", resData, ""},

		{"FPMI_KVS_EPOCH", kvsEpoch, "uint32"},
		{"FPMI_KVS_KEY_LEN", kvsKeyLen, "uint32"},
		{"FPMI_KVS_VAL_LEN", kvsValLen, "uint32"},
		{"FPMI_KVS_HASH", kvsHash, "uint32: low 32 bits of FNV-1a"},
		{"FPMI_KVS_DATA", kvsData, "uint64: arena offset of key then value"},
		{"FPMI_KVS_ENTRY_BYTES", kvsEntryBytes, ""},
		{"FPMI_KVS_DATA_ALIGN", kvsDataAlign, ""},
		{"FPMI_KVS_TOMBSTONE", uint64(kvsTombstone), "bucket of a withdrawn key"},

		{"FPMI_MAX_LOCAL_RANKS", maxLocalRanks, ""},
		{"FPMI_MAX_WORLD_SIZE", maxWorldSize, ""},
		{"FPMI_MAX_VALUE_BYTES", maxValueBytes, ""},
		{"FPMI_MIN_RING_BYTES", minRingBytes, ""},
		{"FPMI_MAX_RING_BYTES", maxRingBytes, ""},
		{"FPMI_MAX_KVS_ENTRIES", maxKVSEntries, ""},
		{"FPMI_MAX_KVS_KEY_MAX", maxKVSKeyMax, ""},
		{"FPMI_MAX_KVS_ARENA", maxKVSArena, ""},
		{"FPMI_MAX_TOTAL", maxTotal, ""},

		{"FPMI_MSG_LEN", msgLen, "uint32: payload length"},
		{"FPMI_MSG_OP", msgOp, "uint16"},
		{"FPMI_MSG_FLAGS", msgFlags, "uint16"},
		{"FPMI_MSG_SEQ", msgSeq, "uint32"},
		{"FPMI_MSG_EPOCH", msgEpoch, "uint32"},
		{"FPMI_MSG_HEADER_LEN", MsgHeaderLen, ""},
		{"FPMI_RECORD_ALIGN", recordAlign, ""},
		{"FPMI_OP_PAD", uint64(OpPad), ""},

		{"FPMI_OP_HELLO", uint64(OpHello), ""},
		{"FPMI_OP_PUT", uint64(OpPut), ""},
		{"FPMI_OP_FENCE", uint64(OpFence), ""},
		{"FPMI_OP_ALLGATHER", uint64(OpAllgather), ""},
		{"FPMI_OP_GET", uint64(OpGet), ""},
		{"FPMI_OP_RING", uint64(OpRing), ""},
		{"FPMI_OP_JOB_ATTR", uint64(OpJobAttr), ""},
		{"FPMI_OP_PUBLISH", uint64(OpPublish), ""},
		{"FPMI_OP_UNPUBLISH", uint64(OpUnpublish), ""},
		{"FPMI_OP_LOOKUP", uint64(OpLookup), ""},
		{"FPMI_OP_ABORT", uint64(OpAbort), ""},
		{"FPMI_OP_FINALIZE", uint64(OpFinalize), ""},
		{"FPMI_OP_ERROR", uint64(OpError), ""},
		{"FPMI_OP_SPAWN", uint64(OpSpawn), ""},
		{"FPMI_OP_PUT_NODE_ATTR", uint64(OpPutNodeAttr), ""},
		{"FPMI_OP_GET_NODE_ATTR", uint64(OpGetNodeAttr), ""},
		{"FPMI_OP_BLOCK", uint64(OpBlock), ""},
		{"FPMI_HINT_NONE", uint64(HintNone), ""},
		{"FPMI_HINT_DENSE", uint64(HintDense), ""},
		{"FPMI_HINT_SPARSE", uint64(HintSparse), ""},
		{"FPMI_GET_WAIT", uint64(GetWait), ""},
		{"FPMI_COLL_DETACHED", uint64(CollDetached), ""},
		{"FPMI_STATUS_OK", uint64(StatusOK), ""},
		{"FPMI_STATUS_NOT_FOUND", uint64(StatusNotFound), ""},
		{"FPMI_STATUS_ERROR", uint64(StatusError), ""},
		{"FPMI_RANK_ATTACHED", uint64(RankAttached), ""},
		{"FPMI_RANK_FINALIZED", uint64(RankFinalized), ""},
		{"FPMI_RANK_ABORTED", uint64(RankAborted), ""},

		{"FPMI_DEFAULT_SPINS", defaultSpins, "condition checks before sleeping, when spinning is allowed"},
	}
}

// CHeader renders the layout's constants as the C header libfastpmi
// compiles against (clib/fastpmi_layout.h, written by internal/genlayout
// through go generate).
func CHeader() []byte {
	var b bytes.Buffer
	b.WriteString("/* Code generated by internal/genlayout from package shm; DO NOT EDIT.\n")
	b.WriteString(" * The shared-memory layout's constants, owned by the Go package shm\n")
	b.WriteString(" * (shm/layout.go, shm/ring.go, shm/proto.go); see shm/doc.go. */\n")
	b.WriteString("#ifndef FASTPMI_LAYOUT_H\n#define FASTPMI_LAYOUT_H\n\n")
	for _, c := range cConsts() {
		v := fmt.Sprintf("%dULL", c.value)
		if c.value > 1<<32 {
			v = fmt.Sprintf("%#xULL", c.value)
		}
		if c.doc != "" {
			fmt.Fprintf(&b, "#define %-26s %s /* %s */\n", c.name, v, c.doc)
		} else {
			fmt.Fprintf(&b, "#define %-26s %s\n", c.name, v)
		}
	}
	b.WriteString("\n#endif\n")
	return b.Bytes()
}
