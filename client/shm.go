package client

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/fastpmi/fastpmi/internal/clientseam"
	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/shm"
)

// shmTransport talks to the agent through the node's shared segment.
//
// Collectives are numbered by epoch: this rank's k-th fence or allgather
// is epoch k, the same number the agent gives it. A collective is done when
// the agent has published its epoch; a failed one also leaves an OpError
// response. Other requests are answered on the response ring by sequence
// number.
type shmTransport struct {
	info *Info
	seg  *shm.Segment
	r    *shm.Rank

	colls uint32            // collectives started (the last epoch used)
	seq   uint32            // request ids
	errs  map[uint32]string // failed epochs, from OpError
	resp  shm.Msg           // the response waited for, copied out
	buf   []byte            // response payload copy
	req   []byte            // request payload scratch (push copies it into the ring)
	got   bool
	// unread are the allgathers started and not yet read (values); kept
	// holds, by epoch, the results of those whose result slots a later
	// allgather took before they were read (harvest).
	unread []uint32
	kept   map[uint32][][]byte
	// virtual: the segment belongs to the caller (newPlayed).
	virtual bool
}

// newShmTransport maps the segment FASTPMI_SHM_FD=fdEnv names and takes
// this rank's place in it; placed says the environment gave that place
// (PMI_RANK and MPI_LOCALRANKID), which the segment itself does not say.
// A refused segment or place is a refused error: nothing was sent to the
// agent, and the launcher's text protocol may serve the rank instead.
func newShmTransport(info *Info, fdEnv string, placed bool) (*shmTransport, error) {
	f, taken, err := launcherFile("FASTPMI_SHM_FD", fdEnv)
	if err != nil {
		if _, nan := strconv.Atoi(fdEnv); nan != nil {
			return nil, err // a launcher's variable that is no number: no fallback, as libfastpmi
		}
		return nil, refused{err}
	}
	if !placed {
		// The defaults would be rank 0 and its ring, another rank's.
		f.Close()
		return nil, refused{untouched{errors.New("PMI_RANK or MPI_LOCALRANKID is not set, and the segment alone does not say which rank this is")}}
	}
	seg, err := shm.OpenFile(f)
	f.Close() // the mapping keeps the memory
	if err != nil {
		return nil, refused{untouched{fmt.Errorf("FASTPMI_SHM_FD=%s: %w", fdEnv, err)}}
	}
	taken()
	p := seg.Params()
	if info.Rank < 0 || info.Rank >= info.Size || info.LocalRank < 0 || info.LocalRank >= p.LocalRanks || p.WorldSize != info.Size {
		seg.Close()
		return nil, refused{fmt.Errorf("map segment: rank %d (PMI_RANK) of %d (PMI_SIZE), local rank %d (MPI_LOCALRANKID) of %d; segment has %d local ranks of %d",
			info.Rank, info.Size, info.LocalRank, info.LocalSize, p.LocalRanks, p.WorldSize)}
	}
	seg.SetWaiter(shm.NewWaiter(p.LocalRanks + 1))
	t := &shmTransport{info: info, seg: seg, r: seg.Rank(info.LocalRank), errs: make(map[uint32]string)}
	t.r.Announce()
	if err := t.push(shm.Header{Op: shm.OpHello}, nil); err != nil {
		seg.Close()
		return nil, err
	}
	info.Transport = "shm"
	info.Extensions = true
	return t, nil
}

func (t *shmTransport) maxValue() int { return t.seg.Params().MaxValue }

func (t *shmTransport) maxPut() (key, val int) { return pmiwire.KeyLenMax, t.maxValue() }

// push sends a request, waiting for ring space if the agent is behind.
func (t *shmTransport) push(h shm.Header, payload []byte) error {
	p := t.r.Requests()
	err := p.Push(h, payload)
	if errors.Is(err, shm.ErrFull) {
		err = p.PushWait(h, payload, 10*time.Second)
	}
	if err != nil {
		return fmt.Errorf("send request: %w", err)
	}
	return nil
}

func (t *shmTransport) put(key string, val []byte, hint Hint) error {
	p := t.r.Requests()
	n := 2 + len(key) + len(val)
	b, err := p.Reserve(n)
	if err == nil {
		binary.LittleEndian.PutUint16(b, uint16(len(key)))
		copy(b[2:], key)
		copy(b[2+len(key):], val)
		return p.Commit(shm.Header{Op: shm.OpPut, Flags: shmHint(hint)}, n)
	}
	if !errors.Is(err, shm.ErrFull) {
		return fmt.Errorf("send put: %w", err)
	}
	return t.push(shm.Header{Op: shm.OpPut, Flags: shmHint(hint)}, append(shm.AppendPair(nil, key, ""), val...))
}

// shmHint is h as a put's header flag: the layout's flags are pmiwire's
// hints, number for number (a mismatch does not compile).
func shmHint(h Hint) uint16 { return uint16(h) }

var _ = [1]struct{}{}[shm.HintNone-uint16(HintNone)+shm.HintDense-uint16(Dense)+shm.HintSparse-uint16(Sparse)]

// nextEpoch is the epoch of this rank's next collective, the agent's
// count of the collectives the rank entered or was moved past: the agent
// moves a rank past a failed epoch it never entered (the deadlock check
// failed it while the rank waited for a key) and publishes that epoch
// before it answers the rank's failed call. Every epoch published beyond
// t.colls is such a one, since none completes without this rank.
func (t *shmTransport) nextEpoch() uint32 {
	e := t.colls + 1
	if pub := t.r.Epoch(); published(pub, e) {
		return pub + 1
	}
	return e
}

// collFlags are a collective request's header flags.
func collFlags(detached bool) uint16 {
	if detached {
		return shm.CollDetached
	}
	return 0
}

func (t *shmTransport) startFence(detached bool) (uint32, error) {
	e := t.nextEpoch()
	if err := t.push(shm.Header{Op: shm.OpFence, Flags: collFlags(detached), Epoch: e}, nil); err != nil {
		return 0, err
	}
	t.colls = e
	return e, nil
}

func (t *shmTransport) startAllgather(val []byte, detached bool) (uint32, error) {
	e := t.nextEpoch()
	// The slot of epoch e is reused from e-2: wait until that is
	// published, telling the agent (e-2 may be detached).
	if prev := e - 2; e > 2 && !published(t.r.Epoch(), prev) {
		if err := t.block(prev); err != nil {
			return 0, err
		}
		if err := t.waitEpoch(context.Background(), prev); err != nil {
			return 0, err
		}
	}
	if err := t.harvest(e); err != nil {
		return 0, err
	}
	if err := t.r.SetSlot(e, val); err != nil {
		return 0, fmt.Errorf("write slot: %w", err)
	}
	if err := t.push(shm.Header{Op: shm.OpAllgather, Flags: collFlags(detached), Epoch: e}, nil); err != nil {
		return 0, err
	}
	t.colls = e
	t.unread = append(t.unread, e)
	return e, nil
}

// harvest copies out the results of every unread allgather that the
// allgather of epoch e will overwrite (results are double-buffered by
// epoch: e takes e-2's), so that several may be outstanding and read in
// any order. Epoch e-2 is published: its results, or its error, are in.
func (t *shmTransport) harvest(e uint32) error {
	keep := t.unread[:0]
	drained := false
	for _, id := range t.unread {
		if !published(e-2, id) {
			keep = append(keep, id)
			continue
		}
		if !drained {
			if err := t.drain(); err != nil { // errors of failed epochs
				return err
			}
			drained = true
		}
		if _, failed := t.errs[id]; failed {
			continue // its Wait returns the error
		}
		vals := make([][]byte, t.info.Size)
		for g := range vals {
			b, err := t.r.Result(g, id)
			if err != nil {
				return fmt.Errorf("keep the results of allgather %d: %w", id, err)
			}
			vals[g] = bytes.Clone(b)
		}
		if t.kept == nil {
			t.kept = make(map[uint32][][]byte)
		}
		t.kept[id] = vals
	}
	t.unread = keep
	return nil
}

// published reports whether epoch want is at or before cur (wrapping).
func published(cur, want uint32) bool { return int32(cur-want) >= 0 }

func (t *shmTransport) done(id uint32) (bool, error) {
	if !published(t.r.Epoch(), id) {
		return false, nil
	}
	// An OpError for a failed epoch is pushed before the epoch is
	// published; read it now.
	if err := t.drain(); err != nil {
		return true, err
	}
	if msg, ok := t.errs[id]; ok {
		return true, errors.New(msg)
	}
	return true, nil
}

// waitEpoch waits until epoch e is published or ctx ends. The segment's
// waiter watches ctx itself: virtual ranks (InProcessWaiter) sleep on
// ctx.Done() with no timer, rank processes wake every 100 ms to check it.
func (t *shmTransport) waitEpoch(ctx context.Context, e uint32) error {
	if err := t.r.WaitEpochContext(ctx, e); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("wait for epoch %d: %w", e, err)
	}
	return nil
}

func (t *shmTransport) progress(ctx context.Context, id uint32) error {
	return t.waitEpoch(ctx, id)
}

func (t *shmTransport) poll() error { return t.drain() }

// block says the rank waits for the collectives up to epoch id, or
// (0: no epoch has it) for nothing.
func (t *shmTransport) block(id uint32) error {
	return t.push(shm.Header{Op: shm.OpBlock, Epoch: id}, nil)
}

// values is allgather id's result: a view in place, or the copy harvest
// made of it (handed over once).
func (t *shmTransport) values(id uint32) Values {
	t.unread = slices.DeleteFunc(t.unread, func(u uint32) bool { return u == id })
	if v, ok := t.kept[id]; ok {
		delete(t.kept, id)
		return Values{n: t.info.Size, vals: v}
	}
	return Values{n: t.info.Size, rank: t.r, epoch: id}
}

// drain reads every waiting response: collective errors are recorded, the
// response to request t.seq (the one being waited for) is copied out.
func (t *shmTransport) drain() error {
	c := t.r.Responses()
	for {
		m, err := c.Peek()
		if errors.Is(err, shm.ErrEmpty) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read response: %w", err)
		}
		switch {
		case m.Op == shm.OpError:
			t.errs[m.Epoch] = string(m.Payload)
		case m.Seq == t.seq:
			t.resp = shm.Msg{Header: m.Header}
			t.buf = append(t.buf[:0], m.Payload...)
			t.got = true
		}
		c.Release()
	}
}

// call sends a request and waits for its response.
func (t *shmTransport) call(ctx context.Context, op, flags uint16, payload []byte) (shm.Header, []byte, error) {
	if err := ctx.Err(); err != nil {
		return shm.Header{}, nil, err // not sent: the request takes no effect
	}
	t.seq++
	t.got = false
	if err := t.push(shm.Header{Op: op, Flags: flags, Seq: t.seq}, payload); err != nil {
		return shm.Header{}, nil, err
	}
	for {
		if err := t.drain(); err != nil {
			return shm.Header{}, nil, err
		}
		if t.got {
			if t.resp.Op != op {
				return shm.Header{}, nil, fmt.Errorf("response op %d to request op %d", t.resp.Op, op)
			}
			if t.resp.Flags == shm.StatusError {
				return t.resp.Header, nil, errors.New(string(t.buf))
			}
			return t.resp.Header, t.buf, nil
		}
		// Sleeps on ctx as waitEpoch does.
		if err := t.r.Responses().WaitContext(ctx); err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return shm.Header{}, nil, cerr
			}
			return shm.Header{}, nil, fmt.Errorf("wait for response: %w", err)
		}
	}
}

func (t *shmTransport) get(ctx context.Context, key string, o getOpts) ([]byte, error) {
	// Fenced keys are read in place from the node KVS; anything else (a
	// sparse key, a key that did not fit the table, a late put) is asked
	// of the agent.
	if v, ok := t.r.Lookup(keyBytes(key)); ok {
		return append([]byte(nil), v...), nil
	}
	var flags uint16
	if o.wait {
		flags = shm.GetWait
	}
	t.req = shm.AppendInt32(t.req[:0], int32(o.src), key)
	h, v, err := t.call(ctx, shm.OpGet, flags, t.req)
	if err != nil {
		return nil, err
	}
	if h.Flags == shm.StatusNotFound {
		return nil, ErrNotFound
	}
	return append([]byte(nil), v...), nil
}

func (t *shmTransport) ring(ctx context.Context, val []byte) (RingResult, error) {
	_, p, err := t.call(ctx, shm.OpRing, 0, val)
	if err != nil {
		return RingResult{}, err
	}
	pos, size, l, r, err := shm.Ring(p)
	if err != nil {
		return RingResult{}, fmt.Errorf("ring response: %w", err)
	}
	// One allocation for both copies; Left's capacity ends where Right
	// starts, so appending to one never writes into the other.
	lr := make([]byte, len(l)+len(r))
	copy(lr, l)
	copy(lr[len(l):], r)
	return RingResult{Rank: int(pos), Size: int(size), Left: lr[:len(l):len(l)], Right: lr[len(l):]}, nil
}

func (t *shmTransport) jobAttr(ctx context.Context, key string) (string, bool, error) {
	h, v, err := t.call(ctx, shm.OpJobAttr, 0, []byte(key))
	if err != nil {
		return "", false, err
	}
	if h.Flags == shm.StatusNotFound {
		return "", false, nil
	}
	return string(v), true, nil
}

func (t *shmTransport) putNodeAttr(ctx context.Context, key, val string) error {
	_, _, err := t.call(ctx, shm.OpPutNodeAttr, 0, shm.AppendPair(nil, key, val))
	return err
}

func (t *shmTransport) nodeAttr(ctx context.Context, key string, wait bool) (string, bool, error) {
	var flags uint16
	if wait {
		flags = shm.GetWait
	}
	h, v, err := t.call(ctx, shm.OpGetNodeAttr, flags, []byte(key))
	if err != nil {
		return "", false, err
	}
	if h.Flags == shm.StatusNotFound {
		return "", false, nil
	}
	return string(v), true, nil
}

func (t *shmTransport) publish(ctx context.Context, name, port string) error {
	_, _, err := t.call(ctx, shm.OpPublish, 0, shm.AppendPair(nil, name, port))
	return err
}

func (t *shmTransport) unpublish(ctx context.Context, name string) error {
	h, _, err := t.call(ctx, shm.OpUnpublish, 0, []byte(name))
	if err == nil && h.Flags == shm.StatusNotFound {
		return ErrNotFound
	}
	return err
}

func (t *shmTransport) lookup(ctx context.Context, name string) (string, error) {
	h, v, err := t.call(ctx, shm.OpLookup, 0, []byte(name))
	if err != nil {
		return "", err
	}
	if h.Flags == shm.StatusNotFound {
		return "", ErrNotFound
	}
	return string(v), nil
}

// spawn sends the request as a PMI-2 spawn command in one ring message;
// the response carries the new job's id.
func (t *shmTransport) spawn(ctx context.Context, req *pmiwire.Spawn) (string, error) {
	_, v, err := t.call(ctx, shm.OpSpawn, 0, pmiwire.AppendSpawnV2(nil, req))
	if err != nil {
		return "", err
	}
	return string(v), nil
}

func (t *shmTransport) abort(code int, msg string) error {
	return t.push(shm.Header{Op: shm.OpAbort}, shm.AppendInt32(nil, int32(code), msg))
}

func (t *shmTransport) finalize(ctx context.Context) error {
	if _, _, err := t.call(ctx, shm.OpFinalize, 0, nil); err != nil {
		return err
	}
	t.r.SetState(shm.RankFinalized)
	return nil
}

func init() {
	clientseam.Register(func(seg *shm.Segment, i clientseam.Info) (any, error) {
		return newPlayed(seg, Info{Rank: i.Rank, Size: i.Size, LocalRank: i.LocalRank, LocalSize: i.LocalSize, JobID: i.JobID})
	})
}

// newPlayed returns a client for local rank info.LocalRank of a segment
// this process already mapped: a rank played by one goroutine of a
// process that plays many (the scale benchmark's virtual ranks, reached
// through internal/clientseam). Each played rank needs its own Client;
// they share seg, which the caller closes after every client finalized.
func newPlayed(seg *shm.Segment, info Info) (*Client, error) {
	p := seg.Params()
	if info.LocalRank < 0 || info.LocalRank >= p.LocalRanks || p.WorldSize != info.Size {
		return nil, &Error{Op: "init", Rank: info.Rank, Err: fmt.Errorf("local rank %d of a segment with %d local ranks of %d, job of %d",
			info.LocalRank, p.LocalRanks, p.WorldSize, info.Size)}
	}
	info.Transport, info.Extensions = "shm", true
	c := &Client{info: info}
	t := &shmTransport{info: &c.info, seg: seg, r: seg.Rank(info.LocalRank), errs: make(map[uint32]string), virtual: true}
	t.r.Announce()
	if err := t.push(shm.Header{Op: shm.OpHello}, nil); err != nil {
		return nil, &Error{Op: "init", Rank: info.Rank, Err: err}
	}
	c.t = t
	return c, nil
}

// keyBytes converts a key for a lookup that only reads it.
func keyBytes(s string) []byte { return []byte(s) }
