package agent

import (
	"time"

	"github.com/fastpmi/fastpmi/shm"
)

// Trace slices of shared-memory requests, as the text front end stamps
// its own (writeTraced): one slice per request on its rank's track, from
// the sweep that read it from the rank's request ring to the reply (or,
// for a request that has none, to the end of its turn); a request
// answered by a later turn than the one that read it — a fence, an
// allgather, a ring, a get that waited for a put — holds a waiting part
// until that turn. Only with a tracer: otherwise none of this runs.

// shmKey names one request of one local rank.
type shmKey struct {
	local int
	seq   uint32
}

// shmRead is when a request was read, and by which turn.
type shmRead struct {
	at   time.Time
	turn uint64
}

// shmTraceRead notes that request m of local rank i is read by turn t,
// under mu. A block is no request of its own: it says the rank now waits
// for a collective whose slice is already open.
func (a *Agent) shmTraceRead(i int, m *shm.Msg, t *turn) {
	if !a.rec.Tracing() || m.Op == shm.OpBlock {
		return
	}
	a.pubMu.Lock()
	if a.shmReads == nil {
		a.shmReads = make(map[shmKey]shmRead)
	}
	a.shmReads[shmKey{i, m.Seq}] = shmRead{at: time.Now(), turn: t.seq}
	a.pubMu.Unlock()
}

// shmTraceAnswered stamps the request a reply of turn t answers, under
// pubMu.
func (a *Agent) shmTraceAnswered(t *turn, local int, op uint16, seq uint32) {
	k := shmKey{local, seq}
	rd, ok := a.shmReads[k]
	if !ok {
		return
	}
	delete(a.shmReads, k)
	end := time.Now()
	var answered time.Time
	if rd.turn != t.seq {
		answered = end
	}
	a.rec.Request(shm.OpName(op), a.ranks[local].global, rd.at, answered, end)
}

// shmTraceUnanswered stamps request m of local rank i if its turn did not
// answer it and it gets no reply (hello, abort), under mu.
func (a *Agent) shmTraceUnanswered(i int, m *shm.Msg) {
	if !a.rec.Tracing() || (m.Op != shm.OpHello && m.Op != shm.OpAbort) {
		return
	}
	a.pubMu.Lock()
	k := shmKey{i, m.Seq}
	if rd, ok := a.shmReads[k]; ok {
		delete(a.shmReads, k)
		a.rec.Request(shm.OpName(m.Op), a.ranks[i].global, rd.at, time.Time{}, time.Now())
	}
	a.pubMu.Unlock()
}
