package agent

import (
	"errors"
	"fmt"
	"time"

	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/shm"
)

// The shared-memory front end. One goroutine (serveShm) owns the consuming
// end of every local rank's request ring: it sleeps on the segment's
// doorbell, drains every ring it finds non-empty in one sweep under
// Agent.mu, decodes each request into a core operation (shmOp), so ranks
// of both paths share one KVS, one epoch sequence and one ring, and ends
// the sweep as one turn. Responses are pushed onto the ranks' response
// rings under Agent.pubMu (the producing end is used by whichever turn
// holds it; shmReply); collectives are answered by publishing their epoch
// (publish), which wakes every sleeping rank with one futex wake.

// AttachSegment makes the agent serve seg, whose local rank i is the
// agent's local rank i. The agent takes ownership of seg and closes it on
// Close.
func (a *Agent) AttachSegment(seg *shm.Segment) error {
	p := seg.Params()
	if p.LocalRanks != len(a.ranks) || p.WorldSize != a.cfg.Size {
		return fmt.Errorf("attach segment: it holds %d local ranks of %d, the job has %d of %d",
			p.LocalRanks, p.WorldSize, len(a.ranks), a.cfg.Size)
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return ErrClosed
	}
	if a.seg != nil {
		a.mu.Unlock()
		return errors.New("attach segment: agent already serves one")
	}
	a.seg = seg
	a.wg.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.wg.Done()
		a.serveShm(seg)
	}()
	return nil
}

// shmIdleWake bounds the agent's sleep on the doorbell. Ranks ring it only
// while the agent-sleepers word says the agent sleeps, and any rank can
// write that word: a stray store there delays the other ranks' requests by
// at most this much instead of forever. Each wake also checks the segment
// header. An agent that slept this long with nothing to do parks on
// Config.Sleeper, if there is one, which bounds the delay the same way.
const shmIdleWake = 100 * time.Millisecond

// shmStormSweeps and shmStormPause bound what a rank that wakes the agent
// without a request costs it: the doorbell word and the ready marks lie
// in memory every rank writes, and a rank ringing in a tight loop (a
// runaway loop, a stray pointer) handed a parked agent back from its bed
// at every ring, a CPU for the agent and one for the bed. A sweep that
// finds nothing after a wake-up is rare otherwise (a mark whose request
// an earlier sweep took), so after shmStormSweeps of them in a row the
// agent pauses shmStormPause before each further sleep: the storm costs
// it a sweep per pause and delays the other ranks' requests by at most
// that. (A storm that finds the agent in Wait is bounded there, by shm's
// own pause.)
const (
	shmStormSweeps = 16
	shmStormPause  = time.Millisecond
)

func (a *Agent) serveShm(seg *shm.Segment) {
	sa := seg.Agent()
	var ready []int // local ranks with requests, per pass
	sleeper := a.cfg.Sleeper
	idle := false // the last Wait timed out with nothing to do
	futile := 0   // sweeps in a row that a wake-up started and that found nothing
	for {
		if err := sa.CheckHeader(); err != nil {
			// No rank can be blamed: every rank maps the header writable.
			a.log.Error("shared memory corrupt; no longer serving it", "err", err)
			a.protocolError(-1, err)
			return
		}
		a.mu.Lock()
		if a.closed {
			a.mu.Unlock()
			return
		}
		t := newTurn()
		did := false
		ready = sa.TakeReady(ready[:0])
		for _, i := range ready {
			if a.serveRingLocked(sa, i, t) {
				did = true
			}
		}
		a.finishLocked(t)
		if did {
			futile = 0
		} else if futile++; futile > shmStormSweeps {
			time.Sleep(shmStormPause)
		}
		switch {
		case did:
			idle = false
		case idle && sleeper != nil:
			if err := sa.Park(sleeper); err != nil {
				// Closed, or it cannot sleep there: sleep here from now on.
				a.log.Debug("shared memory: parking refused; the agent sleeps on its own", "err", err)
				sleeper = nil
			}
		default:
			idle = errors.Is(sa.Wait(shmIdleWake), shm.ErrTimeout)
			if idle {
				futile = 0 // a quiet 100 ms: no storm
			}
		}
	}
}

// serveRingLocked serves every request waiting in local rank i's request
// ring into turn t, under Agent.mu, and reports whether there was one. A
// ring that breaks the protocol is not read again (shmDead).
func (a *Agent) serveRingLocked(sa *shm.Agent, i int, t *turn) bool {
	if a.shmDead == nil {
		a.shmDead = make([]bool, len(a.ranks))
		a.shmPending = make([]int, len(a.ranks))
	}
	if a.shmDead[i] {
		return false
	}
	did := false
	g := a.ranks[i].global
	c := sa.Requests(i)
	for {
		m, err := c.Peek()
		if errors.Is(err, shm.ErrEmpty) {
			return did
		}
		if err == nil {
			did = true
			a.shmTraceRead(i, &m, t)
			var op Op
			var ref *shmRefusal
			if op, err = a.shmOp(sa, i, m); err == nil && op != nil {
				if err = a.chargeShmLocked(i, m.Op); err == nil {
					err = a.core.Step(op)
				}
			} else if errors.As(err, &ref) {
				// A request the rank may make, with an argument out of
				// bounds: answered with an error.
				t.shm = append(t.shm, Reply{Local: i, Req: shmReq(&m), Kind: ref.kind, Err: ref.err})
				err = nil
			}
			// Respond before releasing the request: Release may wake the
			// rank, which should find its answer.
			a.pushShmLocked(t)
			a.shmTraceUnanswered(i, &m)
			c.Release()
		} else {
			err = fmt.Errorf("request ring: %w", err)
		}
		if err != nil {
			a.shmDead[i] = true
			t.events = append(t.events, func() { a.protocolError(g, err) })
			return did
		}
	}
}

// chargeShmLocked counts a request of local rank i that the core will
// answer, under Agent.mu, or refuses it when the rank already has
// MaxPendingPerConn waiting, as the text path refuses a connection's: a
// rank that parks gets or enters detached collectives without end would
// otherwise grow the agent's memory without bound (on a daemon, at the
// other jobs' expense). Nothing but the rank's requests is left in the
// ring to answer its refusal, so it ends the job as a protocol error
// naming the rank. Hello, block and abort get no answer.
func (a *Agent) chargeShmLocked(i int, op uint16) error {
	switch op {
	case shm.OpHello, shm.OpBlock, shm.OpAbort:
		return nil
	}
	if a.shmPending[i] >= MaxPendingPerConn {
		return fmt.Errorf("%w: more than %d requests waiting for an answer", ErrQuota, MaxPendingPerConn)
	}
	a.shmPending[i]++
	return nil
}

// Settle serves what rank global left in its shared-memory request ring
// and reports the events that made (its abort, its finalize) before it
// returns. The launcher calls it once the rank's process has ended, before
// judging that end: a rank that aborts and exits at once is reported as
// aborting, not as a plain exit that overtook its last request.
func (a *Agent) Settle(global int) {
	a.mu.Lock()
	l := a.core.LocalOf(global)
	if a.closed || a.seg == nil || l < 0 {
		a.mu.Unlock()
		return
	}
	t := newTurn()
	a.serveRingLocked(a.seg.Agent(), l, t)
	a.finishLocked(t)
}

// pushShmLocked pushes the shared-memory replies the sweep's turn t has
// produced so far, under pubMu (lock order mu, then pubMu): a rank
// waiting on its response ring is answered at once, not at the end of
// the sweep. The rest of the turn (results to publish included) waits for
// the sweep's end.
//
// While an epoch that failed waits for the sweep's end to be published,
// only the collectives' replies go early: the others wait with it
// (release says why).
func (a *Agent) pushShmLocked(t *turn) {
	t.take(a)
	if len(t.shm) == 0 || t.seg == nil {
		return
	}
	hold := false
	for i := range t.rd.Results {
		hold = hold || t.rd.Results[i].Err != nil
	}
	a.pubMu.Lock()
	kept := t.shm[:0]
	for i := range t.shm {
		if hold && !collReply(&t.shm[i]) {
			kept = append(kept, t.shm[i])
			continue
		}
		a.shmReply(t, &t.shm[i])
	}
	a.pubMu.Unlock()
	t.shm = kept
}

// collReply reports whether r answers a collective (a fence or
// allgather: only its failure is pushed, shmReply).
func collReply(r *Reply) bool { return r.Kind == ReplyFence || r.Kind == ReplyAllgather }

// shmRefusal is shmOp's answer to a well-formed request whose argument
// breaks a limit (as the text path answers rc≠0): the rank gets an error
// response, and its ring stays in service.
type shmRefusal struct {
	kind ReplyKind
	err  error
}

func (r *shmRefusal) Error() string { return r.err.Error() }

// shmReq packs a request's op and sequence number into a Req.
func shmReq(m *shm.Msg) Req { return Req{Via: ViaShm, ID: uint64(m.Op)<<32 | uint64(m.Seq)} }

// shmOp decodes request m of local rank i into a core operation, under
// Agent.mu. An error means the rank broke the protocol. m's payload lies
// in memory the rank may still write: each field is copied once, and the
// copy is both what is checked and what is stored.
func (a *Agent) shmOp(sa *shm.Agent, i int, m shm.Msg) (Op, error) {
	if _, fin := a.core.RankStatus(i); fin && m.Op != shm.OpFinalize {
		return nil, fmt.Errorf("request %d after finalize", m.Op)
	}
	req := shmReq(&m)
	switch m.Op {
	case shm.OpHello:
		return Init{Local: i}, nil
	case shm.OpPut:
		k, v, err := shm.Pair(m.Payload)
		if err != nil {
			return nil, fmt.Errorf("put: %w", err)
		}
		key, val := string(k), string(v) // copied once: checked is stored (shmOp)
		if _, err := checkPut(key, val); err != nil {
			return nil, fmt.Errorf("put: %w", err)
		}
		return Put{Local: i, Req: req, Key: key, Val: val, Hint: hintFlag(m.Flags)}, nil
	case shm.OpFence:
		if m.Epoch == 0 {
			return nil, errors.New("fence for epoch 0")
		}
		return Fence{Local: i, Req: req, Epoch: uint64(m.Epoch), Detached: m.Flags&shm.CollDetached != 0}, nil
	case shm.OpAllgather:
		if m.Epoch == 0 {
			return nil, errors.New("allgather for epoch 0")
		}
		v, err := sa.Slot(i, m.Epoch)
		if err != nil {
			return nil, fmt.Errorf("allgather %d: read slot: %w", m.Epoch, err)
		}
		return Allgather{Local: i, Req: req, Epoch: uint64(m.Epoch), Value: v, Detached: m.Flags&shm.CollDetached != 0}, nil
	case shm.OpBlock:
		return Block{Local: i, Until: uint64(m.Epoch)}, nil
	case shm.OpGet:
		src, key, err := shm.Int32(m.Payload)
		if err != nil || src < -1 || int(src) >= a.cfg.Size {
			return nil, fmt.Errorf("get: bad payload")
		}
		return Get{Local: i, Req: req, Key: string(key), Wait: m.Flags&shm.GetWait != 0, Src: int(src)}, nil
	case shm.OpRing:
		if len(m.Payload) > pmiwire.ValLenMax {
			return nil, &shmRefusal{ReplyRing, fmt.Errorf("ring value longer than %d bytes", pmiwire.ValLenMax)}
		}
		v := string(m.Payload)
		return Ring{Local: i, Req: req, In: RingIn{Count: 1, Left: v, Right: v}}, nil
	case shm.OpJobAttr:
		return JobAttr{Local: i, Req: req, Key: string(m.Payload)}, nil
	case shm.OpPutNodeAttr:
		k, v, err := shm.Pair(m.Payload)
		if err != nil {
			return nil, fmt.Errorf("put node attribute: %w", err)
		}
		key, val := string(k), string(v)
		if _, err := checkNodeAttr(key, val); err != nil {
			return nil, &shmRefusal{ReplyPutNodeAttr, err}
		}
		return PutNodeAttr{Local: i, Req: req, Key: key, Val: val}, nil
	case shm.OpGetNodeAttr:
		// A name no put can make (checkNodeAttr) is not found, as over
		// the text protocol.
		return GetNodeAttr{Local: i, Req: req, Key: string(m.Payload), Wait: m.Flags&shm.GetWait != 0}, nil
	case shm.OpPublish:
		name, port, err := shm.Pair(m.Payload)
		if err != nil {
			return nil, fmt.Errorf("publish: %w", err)
		}
		n, p := string(name), string(port)
		if err := checkName(n, p); err != nil {
			return nil, &shmRefusal{ReplyName, err}
		}
		return Name{Local: i, Req: req, Op: NamePublish, Name: n, Port: p}, nil
	case shm.OpUnpublish, shm.OpLookup:
		n := string(m.Payload)
		if err := checkName(n, ""); err != nil {
			return nil, &shmRefusal{ReplyName, err}
		}
		op := NameUnpublish
		if m.Op == shm.OpLookup {
			op = NameLookup
		}
		return Name{Local: i, Req: req, Op: op, Name: n}, nil
	case shm.OpAbort:
		code, msg, err := shm.Int32(m.Payload)
		if err != nil {
			return nil, fmt.Errorf("abort: %w", err)
		}
		return Abort{Local: i, Code: int(code), Msg: string(msg)}, nil
	case shm.OpFinalize:
		return Finalize{Local: i, Req: req}, nil
	case shm.OpSpawn:
		var d pmiwire.Decoder
		d.Feed(m.Payload)
		msg, ok, err := d.Next()
		if err == nil && (!ok || d.Buffered() != 0) {
			err = errors.New("not one whole PMI-2 spawn request")
		}
		if err != nil {
			return nil, fmt.Errorf("spawn: %w", err)
		}
		sp, err := pmiwire.ParseSpawn(&msg)
		if err != nil {
			// One whole request whose fields do not add up (an empty
			// info key, say): refused, as over the text protocol.
			return nil, &shmRefusal{ReplySpawn, err}
		}
		return Spawn{Local: i, Req: req, Spawn: sp}, nil
	}
	return nil, fmt.Errorf("unknown request op %d", m.Op)
}

// shmReply pushes the response to a shared-memory request, under pubMu.
// Puts have none; a collective is answered by publishing its epoch, so
// only its failure is pushed (as OpError naming the epoch). The ring holds
// far more than a rank's outstanding requests; a full ring means the rank
// stopped reading (or broke the ring's counters): the rank is reported
// once as a protocol error naming it, from t's events (so the launcher
// ends the job), and its later responses are dropped. The push never
// waits, so no rank stalls the turn.
func (a *Agent) shmReply(t *turn, r *Reply) {
	seg := t.seg
	op, seq := uint16(r.Req.ID>>32), uint32(r.Req.ID)
	if a.shmReads != nil {
		a.shmTraceAnswered(t, r.Local, op, seq)
	}
	h := shm.Header{Op: op, Seq: seq, Flags: shm.StatusOK}
	var payload []byte
	switch {
	case r.Kind == ReplyPut:
		return
	case r.Kind == ReplyFence || r.Kind == ReplyAllgather:
		if r.Err == nil {
			return
		}
		h = shm.Header{Op: shm.OpError, Epoch: uint32(r.Epoch), Flags: shm.StatusError}
		payload = []byte(r.Err.Error())
	case r.Kind == ReplyName && (op == shm.OpLookup || op == shm.OpUnpublish) && errors.Is(r.Err, ErrNameNotFound):
		h.Flags = shm.StatusNotFound
	case r.Err != nil:
		h.Flags, payload = shm.StatusError, []byte(r.Err.Error())
	case r.Kind == ReplyRing:
		payload = shm.AppendRing(nil, uint32(r.Ring.Pos), uint32(r.Ring.Size), r.Ring.Left, r.Ring.Right)
	case r.Kind == ReplyGet || r.Kind == ReplyJobAttr || r.Kind == ReplyGetNodeAttr:
		if !r.Found {
			h.Flags = shm.StatusNotFound
		} else {
			payload = []byte(r.Val)
		}
	case r.Kind == ReplyName && op == shm.OpLookup, r.Kind == ReplySpawn:
		payload = []byte(r.Val)
	}
	if err := seg.Agent().Responses(r.Local).Push(h, payload); err != nil {
		if a.shmFailed == nil {
			a.shmFailed = make([]bool, len(a.ranks))
		}
		if a.shmFailed[r.Local] {
			return
		}
		a.shmFailed[r.Local] = true
		g := a.ranks[r.Local].global
		if errors.Is(err, shm.ErrFull) {
			err = errors.New("stopped reading its shared-memory responses (response ring full)")
		} else {
			err = fmt.Errorf("push shared-memory response: %w", err)
		}
		a.log.Info("shared-memory response not delivered", "rank", g, "op", op, "err", err)
		t.events = append(t.events, func() { a.protocolError(g, err) })
	}
}

// publish makes a delivered epoch visible to the ranks on shared memory,
// under pubMu: a fence's keys go to the node KVS (ranks read fenced keys
// in place once the epoch is published; a key that does not fit — table
// full, too long — is still served by the agent), an allgather's values
// to the result array, then the epoch is published.
func (a *Agent) publish(seg *shm.Segment, r *Result) {
	sa := seg.Agent()
	e := uint32(r.Epoch)
	for _, kv := range r.KVs {
		if err := sa.KVSReplace([]byte(kv.Key), []byte(kv.Val), e); err != nil && a.rec != nil {
			a.rec.Add("shm.kvs.skipped", 1)
		}
	}
	if r.Allgather && r.Err == nil && r.ShmEntered {
		for g, v := range r.Values {
			if err := sa.SetResult(g, e, v); err != nil {
				a.log.Error("write allgather result", "rank", g, "epoch", r.Epoch, "err", err)
			}
		}
	}
	sa.Publish(e)
}

// The shared-memory layout's put-hint flags are pmiwire's hints, number
// for number (a mismatch does not compile).
var _ = [1]struct{}{}[shm.HintNone-uint16(pmiwire.HintNone)+shm.HintDense-uint16(pmiwire.HintDense)+shm.HintSparse-uint16(pmiwire.HintSparse)]

// hintFlag reads a put's hint flag; an unknown value is a plain put.
func hintFlag(f uint16) pmiwire.Hint {
	if f > shm.HintSparse {
		return pmiwire.HintNone
	}
	return pmiwire.Hint(f)
}
