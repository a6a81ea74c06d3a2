package agent

import (
	"errors"
	"fmt"

	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/shm"
)

// The shared-memory path. One goroutine (serveShm) owns the consuming end
// of every local rank's request ring: it sleeps on the segment's doorbell,
// drains every ring it finds non-empty in one sweep under Agent.mu, and
// applies each request to the same agent state the text protocol uses, so
// ranks of both paths share one KVS, one epoch sequence and one ring.
// Responses are pushed onto the ranks' response rings under Agent.mu (the
// producing end is used by whichever goroutine holds mu); collectives are
// answered by publishing their epoch, which wakes every sleeping rank with
// one futex wake.

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
	sa := seg.Agent()
	a.epochSink = func(epoch uint64, allgather bool, values [][]byte, err error) {
		e := uint32(epoch)
		if allgather && err == nil {
			for g, v := range values {
				if werr := sa.SetResult(g, e, v); werr != nil {
					a.log.Error("write allgather result", "rank", g, "epoch", epoch, "err", werr)
				}
			}
		}
		sa.Publish(e)
	}
	a.wg.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.wg.Done()
		a.serveShm(seg)
	}()
	return nil
}

func (a *Agent) serveShm(seg *shm.Segment) {
	sa := seg.Agent()
	dead := make([]bool, len(a.ranks)) // rings that sent garbage
	var ready []int                    // local ranks with requests, per pass
	for {
		a.mu.Lock()
		if a.closed {
			a.mu.Unlock()
			return
		}
		var out outbox
		var events []func()
		did := false
		ready = sa.TakeReady(ready[:0])
		for _, i := range ready {
			rs := a.ranks[i]
			if dead[i] {
				continue
			}
			c := sa.Requests(i)
			for {
				m, err := c.Peek()
				if errors.Is(err, shm.ErrEmpty) {
					break
				}
				if err != nil {
					dead[i] = true
					g := rs.global
					events = append(events, func() { a.cfg.Events.ProtocolError(g, fmt.Errorf("request ring: %w", err)) })
					break
				}
				did = true
				if err := a.shmRequestLocked(&out, &events, rs, m); err != nil {
					dead[i] = true
					g := rs.global
					events = append(events, func() { a.cfg.Events.ProtocolError(g, err) })
				}
				c.Release()
				if dead[i] {
					break
				}
			}
		}
		a.unlockAndRun(&out, events)
		if !did {
			_ = sa.Wait(-1)
		}
	}
}

// respond pushes a response to local rank rs, under Agent.mu. The ring
// holds far more than a rank's outstanding requests; a full ring means the
// rank stopped reading, which is logged (the launcher's failure handling
// ends such a job).
func (a *Agent) respond(rs *rankState, op uint16, seq uint32, status uint16, payload []byte) {
	p := a.seg.Agent().Responses(rs.local)
	if err := p.Push(shm.Header{Op: op, Flags: status, Seq: seq}, payload); err != nil {
		a.log.Error("push response", "rank", rs.global, "op", op, "err", err)
	}
}

func (a *Agent) respondErr(rs *rankState, op uint16, seq uint32, err error) {
	a.respond(rs, op, seq, shm.StatusError, []byte(err.Error()))
}

// shmRequestLocked applies one request of rs. An error means the rank
// broke the protocol.
func (a *Agent) shmRequestLocked(out *outbox, events *[]func(), rs *rankState, m shm.Msg) error {
	if rs.finalized && m.Op != shm.OpFinalize {
		return fmt.Errorf("request %d after finalize", m.Op)
	}
	if !rs.spoke {
		rs.spoke = true
		if a.rec != nil {
			a.rec.Mark(perf.PhaseFirstPMI, rs.global)
		}
	}
	switch m.Op {
	case shm.OpHello:
		if a.rec != nil {
			a.rec.Mark(perf.PhaseInit, rs.global)
		}
		g := rs.global
		*events = append(*events, func() { a.cfg.Events.RankInit(g) })
	case shm.OpPut:
		k, v, err := shm.Pair(m.Payload)
		if err != nil {
			return fmt.Errorf("put: %w", err)
		}
		if _, err := checkPut(string(k), string(v)); err != nil {
			return fmt.Errorf("put: %w", err)
		}
		hint := HintNone
		switch m.Flags {
		case shm.HintDense:
			hint = HintDense
		case shm.HintSparse:
			hint = HintSparse
		}
		a.putLocked(out, rs, string(k), string(v), hint)
	case shm.OpFence, shm.OpAllgather:
		kind, op := kindFence, "fence"
		var val []byte
		if m.Op == shm.OpAllgather {
			kind, op = kindAllgather, "allgather"
			v, err := a.seg.Agent().Slot(rs.local, m.Epoch)
			if err != nil {
				return fmt.Errorf("allgather %d: read slot: %w", m.Epoch, err)
			}
			val = v
		}
		if want := uint32(rs.collSeq + 1); m.Epoch != want {
			return fmt.Errorf("%s for epoch %d, agent expects %d", op, m.Epoch, want)
		}
		a.enterEpochLocked(out, rs, kind, val, func(out *outbox, err error, c *epochColl) {
			if err != nil {
				p := a.seg.Agent().Responses(rs.local)
				if perr := p.Push(shm.Header{Op: shm.OpError, Epoch: uint32(c.epoch), Flags: shm.StatusError}, []byte(err.Error())); perr != nil {
					a.log.Error("push collective error", "rank", rs.global, "err", perr)
				}
			}
		})
	case shm.OpGet:
		src, key, err := shm.Int32(m.Payload)
		if err != nil || src < -1 || int(src) >= a.cfg.Size {
			return fmt.Errorf("get: bad payload")
		}
		if v, ok := a.lookupLocked(string(key)); ok {
			a.respond(rs, shm.OpGet, m.Seq, shm.StatusOK, []byte(v))
			return nil
		}
		if m.Flags&shm.GetWait == 0 {
			a.respond(rs, shm.OpGet, m.Seq, shm.StatusNotFound, nil)
			return nil
		}
		seq := m.Seq
		a.parkLocked(out, rs, "kvs:"+string(key), deferred{done: func(out *outbox, err error, v string) {
			if err != nil {
				a.respondErr(rs, shm.OpGet, seq, err)
				return
			}
			a.respond(rs, shm.OpGet, seq, shm.StatusOK, []byte(v))
		}})
	case shm.OpRing:
		seq := m.Seq
		v := string(m.Payload)
		a.enterRingLocked(out, rs, RingIn{Count: 1, Left: v, Right: v}, func(out *outbox, err error, r ringReply) {
			if err != nil {
				a.respondErr(rs, shm.OpRing, seq, err)
				return
			}
			a.respond(rs, shm.OpRing, seq, shm.StatusOK, shm.AppendRing(nil, uint32(r.Pos), uint32(r.Size), r.Left, r.Right))
		})
	case shm.OpJobAttr:
		if v, ok := a.jobAttr(string(m.Payload)); ok {
			a.respond(rs, m.Op, m.Seq, shm.StatusOK, []byte(v))
		} else {
			a.respond(rs, m.Op, m.Seq, shm.StatusNotFound, nil)
		}
	case shm.OpPublish:
		name, port, err := shm.Pair(m.Payload)
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		a.shmNameLocked(out, rs, m, nameReq{op: namePublish, name: string(name), port: string(port)})
	case shm.OpUnpublish:
		a.shmNameLocked(out, rs, m, nameReq{op: nameUnpublish, name: string(m.Payload)})
	case shm.OpLookup:
		a.shmNameLocked(out, rs, m, nameReq{op: nameLookup, name: string(m.Payload)})
	case shm.OpAbort:
		code, msg, err := shm.Int32(m.Payload)
		if err != nil {
			return fmt.Errorf("abort: %w", err)
		}
		g, c, s := rs.global, int(code), string(msg)
		*events = append(*events, func() { a.cfg.Events.Abort(g, c, s) })
	case shm.OpFinalize:
		if !rs.finalized {
			rs.finalized = true
			a.peerGoneLocked(out, rs, "finalized")
			if a.rec != nil {
				a.rec.Mark(perf.PhaseFinalize, rs.global)
			}
			g := rs.global
			*events = append(*events, func() { a.cfg.Events.RankFinalized(g) })
		}
		a.respond(rs, m.Op, m.Seq, shm.StatusOK, nil)
	default:
		return fmt.Errorf("unknown request op %d", m.Op)
	}
	return nil
}

// shmNameLocked starts a name-service request of rs; the response is
// pushed once the Upstream has answered (names.go). A lookup of a name
// not published is answered StatusNotFound.
func (a *Agent) shmNameLocked(out *outbox, rs *rankState, m shm.Msg, req nameReq) {
	op, seq := m.Op, m.Seq
	a.nameLocked(out, req, func(out *outbox, port string, err error) {
		switch {
		case req.op == nameLookup && errors.Is(err, ErrNameNotFound):
			a.respond(rs, op, seq, shm.StatusNotFound, nil)
		case err != nil:
			a.respondErr(rs, op, seq, err)
		case req.op == nameLookup:
			a.respond(rs, op, seq, shm.StatusOK, []byte(port))
		default:
			a.respond(rs, op, seq, shm.StatusOK, nil)
		}
	})
}
