package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/ring"
)

// textTransport speaks PMI-2 on PMI_FD (or PMI_PORT), so the client runs
// under any PMI-2 launcher. Every request carries thrid=<id>; a response
// with thrid is routed to its request, one without (Slurm does not echo
// thrid) to the oldest outstanding request. Fences and allgathers are sent
// at once and answered later, so several can be outstanding.
//
// Against fastpmi's agent (which announces fastpmi=1 in fullinit)
// allgather, put hints and waiting gets are native; elsewhere allgather is
// a put of the hex-encoded value (in parts a server's value limit takes,
// putParts), a fence and a get of every rank's parts,
// a waiting get polls (backing off to pollMax), Ring (unless the
// launcher is Slurm, whose PMI-2 serves it) is a put, a fence and the two
// neighbours' gets, and under Hydra a get before the rank's first fence
// fails without asking (fenced).
type textTransport struct {
	info *Info
	nc   net.Conn
	dec  pmiwire.Decoder
	rbuf []byte
	wbuf []byte

	next    uint32
	pending []*textReq // outstanding requests, oldest first
	// colls are the collectives by request id, from their start until
	// forget drops them; nColl counts the collectives started.
	colls map[uint32]*textReq
	nColl int

	ext  bool // agent answers fastpmi extensions
	nAg  int  // allgathers started (fallback key names)
	vmax int
	// hydra: the server is neither fastpmi's (fastpmi=1 in fullinit) nor
	// Slurm's (SLURM_STEP_ID): Hydra's, which does not name itself. Its
	// PMI-2 has no ring command, on which
	// it would end the whole job (Ring is put/fence/get: ringByKVS, nRing
	// its calls), and no abort command, on which mpiexec fails with exit
	// code 255 (abort sends PMI-1's, which Hydra reads on the same
	// connection); it ends a value at its first ';', where the others
	// read the escape ";;" (storable).
	hydra bool
	nRing int
	// fenced: a kvs-fence was sent. Hydra's PMI-2 server ends the whole
	// job on a kvs-get from a rank that has not fenced yet (it looks up
	// the rank's fence epoch and asserts), so get asks it only after.
	fenced bool
}

// A waiting get polls a launcher that cannot park it: the first retry
// after pollFirst, each next one twice as late, at most pollMax apart,
// so that ranks waiting long (64 of them on the launcher's one thread)
// cost it a few requests a second each rather than a thousand.
const (
	pollFirst = time.Millisecond
	pollMax   = 32 * time.Millisecond
)

// textReq is one outstanding request.
type textReq struct {
	id     uint32
	cmd    string
	done   bool
	err    error
	resp   pmiwire.Msg
	vals   [][]byte // allgather result
	agNum  int      // fallback allgather: its number, to name keys
	onDone func(*textReq)
	// coll is a collective's number (textTransport.nColl); read says
	// its result was handed over (values), which lets forget drop it.
	coll int
	read bool
}

// handshakeTimeout bounds the launcher's answers to init and fullinit.
const handshakeTimeout = 30 * time.Second

func newTextTransport(info *Info) (*textTransport, error) {
	var nc net.Conn
	via := "PMI_PORT=" + os.Getenv("PMI_PORT") // the launcher's connection, for errors
	if fdEnv := os.Getenv("PMI_FD"); fdEnv != "" {
		via = "PMI_FD=" + fdEnv
		f, taken, err := launcherFile("PMI_FD", fdEnv)
		if err != nil {
			return nil, err
		}
		nc, err = net.FileConn(f)
		f.Close()
		if err != nil {
			return nil, untouched{fmt.Errorf("PMI_FD=%s: %w", fdEnv, err)}
		}
		taken()
	} else {
		var err error
		nc, err = net.DialTimeout("tcp", os.Getenv("PMI_PORT"), 10*time.Second)
		if err != nil {
			return nil, untouched{fmt.Errorf("connect to PMI_PORT: %w", err)}
		}
	}
	t := &textTransport{info: info, nc: nc, rbuf: make([]byte, 64<<10), colls: make(map[uint32]*textReq), vmax: pmiwire.ValLenMax}
	t.dec.FrameLimit = pmiwire.MaxFrame
	if err := t.handshake(); err != nil {
		nc.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer on %s in %v (%w)", via, handshakeTimeout, err)
		}
		return nil, fmt.Errorf("PMI-2 init: %w", err)
	}
	info.Transport = "pmi2"
	info.Extensions = t.ext
	return t, nil
}

func (t *textTransport) handshake() error {
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	defer cancel()
	if _, err := t.nc.Write([]byte("cmd=init pmi_version=2 pmi_subversion=0\n")); err != nil {
		return err
	}
	m, err := t.readMsg(ctx)
	if err != nil {
		return err
	}
	if rc, _ := m.Get("rc"); m.Cmd != "response_to_init" || (rc != "" && rc != "0") {
		return fmt.Errorf("launcher refused PMI-2: %s %v", m.Cmd, m.Pairs)
	}
	// pmirank: PMI_ID, else PMI_RANK, else none, so that a launcher that
	// knows the connection's rank (pmirun's PMI_FD) says it.
	pairs := []pmiwire.Pair{{Key: "threaded", Val: "FALSE"}}
	if id := cmp.Or(os.Getenv("PMI_ID"), os.Getenv("PMI_RANK")); id != "" {
		pairs = append([]pmiwire.Pair{{Key: "pmirank", Val: id}}, pairs...)
	}
	if j := os.Getenv("PMI_JOBID"); j != "" {
		pairs = append([]pmiwire.Pair{{Key: "pmijobid", Val: j}}, pairs...)
	}
	r, err := t.call(ctx, "fullinit", pairs...)
	if err != nil {
		return err
	}
	geti := func(k string) (int, error) {
		s, _ := r.resp.Get(k)
		v, err := strconv.Atoi(s)
		if err != nil {
			return 0, fmt.Errorf("fullinit-response: bad %s %q", k, s)
		}
		return v, nil
	}
	if t.info.Rank, err = geti("rank"); err != nil {
		return err
	}
	if t.info.Size, err = geti("size"); err != nil {
		return err
	}
	if t.info.Appnum, err = geti("appnum"); err != nil {
		return err
	}
	if _, ok := r.resp.Get("spawner-jobid"); ok {
		t.info.Spawned = true
	}
	if v, _ := r.resp.Get("fastpmi"); v == "1" {
		t.ext = true
	}
	if g, err := t.call(ctx, "job-getid"); err == nil {
		// job-getid is answered by every PMI-2 server; the id is advisory.
		if j, ok := g.resp.Get("jobid"); ok && j != "" {
			t.info.JobID = j
		}
	}
	t.hydra = !t.ext && os.Getenv("SLURM_STEP_ID") == ""
	if os.Getenv("MPI_LOCALRANKID") == "" || os.Getenv("MPI_LOCALNRANKS") == "" {
		return t.placeLocal(ctx)
	}
	return nil
}

// placeLocal sets this rank's local rank and size, for a launcher that
// does not set MPI_LOCALRANKID and MPI_LOCALNRANKS (Slurm sets neither),
// as MPICH finds them: the ranks that the job's PMI_process_mapping
// places on this rank's node, in rank order. Without a mapping every
// rank is taken to share one node.
func (t *textTransport) placeLocal(ctx context.Context) error {
	t.info.LocalRank, t.info.LocalSize = t.info.Rank, t.info.Size
	m, ok, err := t.jobAttr(ctx, "PMI_process_mapping")
	if err != nil || !ok {
		return err
	}
	nodes, err := ring.ParseProcessMapping(m, t.info.Size)
	if err != nil {
		return fmt.Errorf("find this rank's node: %w", err)
	}
	t.info.LocalRank, t.info.LocalSize = 0, 0
	for r, n := range nodes {
		if n != nodes[t.info.Rank] {
			continue
		}
		if r < t.info.Rank {
			t.info.LocalRank++
		}
		t.info.LocalSize++
	}
	return nil
}

func (t *textTransport) maxValue() int { return t.vmax }

// maxPut: a PMI-2 server other than fastpmi's keeps a key and a value in
// buffers of PMI2_MAX_KEYLEN (64) and PMI2_MAX_VALLEN (1024) bytes, the
// NUL included: Hydra stores a 1024-byte value as its first 1023 bytes
// and a 64-byte key under its first 63, where no get finds it, and
// answers the put rc=0.
func (t *textTransport) maxPut() (key, val int) {
	if t.ext {
		return pmiwire.KeyLenMax, t.vmax
	}
	return pmiwire.KeyLenMax - 1, pmiwire.ValLenMax - 1
}

// storable refuses a value the server would cut short without saying
// so: one holding a ';' where the server does not read the escape ";;"
// (Hydra stores "a;b" as "a"). maxPut bounds its length.
func (t *textTransport) storable(val string) error {
	if t.hydra && strings.IndexByte(val, ';') >= 0 {
		return errors.New("a ';' in the value, which this launcher's PMI-2 server takes for its end")
	}
	return nil
}

// send writes one request with a fresh thrid and records it outstanding.
func (t *textTransport) send(cmd string, pairs ...pmiwire.Pair) (*textReq, error) {
	t.next++
	r := &textReq{id: t.next, cmd: cmd}
	pairs = append(pairs, pmiwire.Pair{Key: "thrid", Val: strconv.FormatUint(uint64(r.id), 10)})
	t.wbuf = pmiwire.AppendRequestV2(t.wbuf[:0], cmd, pairs...)
	if _, err := t.nc.Write(t.wbuf); err != nil {
		return nil, fmt.Errorf("send %s: %w", cmd, err)
	}
	t.pending = append(t.pending, r)
	if cmd == "kvs-fence" {
		t.fenced = true
	}
	return r, nil
}

// block sends fastpmi-block, which has no response: the rank now waits
// for every collective it started (the agent's text front end knows no
// ids), or (id 0) for nothing. Other launchers have no deadlock check
// to tell.
func (t *textTransport) block(id uint32) error {
	if !t.ext {
		return nil
	}
	w := "FALSE"
	if id != 0 {
		w = "TRUE"
	}
	// A thrid of its own, never outstanding: an error response the agent
	// might send (a request it refuses) is then unexpected, not taken
	// for another request's.
	t.next++
	t.wbuf = pmiwire.AppendRequestV2(t.wbuf[:0], "fastpmi-block", pmiwire.Pair{Key: "waiting", Val: w},
		pmiwire.Pair{Key: "thrid", Val: strconv.FormatUint(uint64(t.next), 10)})
	if _, err := t.nc.Write(t.wbuf); err != nil {
		return fmt.Errorf("send fastpmi-block: %w", err)
	}
	return nil
}

// waitSlice bounds one read so a cancelled context is noticed.
const waitSlice = 100 * time.Millisecond

// readMsg reads one message, bounded by ctx.
func (t *textTransport) readMsg(ctx context.Context) (pmiwire.Msg, error) {
	for {
		m, ok, err := t.dec.Next()
		if err != nil {
			return pmiwire.Msg{}, fmt.Errorf("read response: %w", err)
		}
		if ok {
			return m, nil
		}
		dl := time.Now().Add(waitSlice)
		if d, ok := ctx.Deadline(); ok && d.Before(dl) {
			dl = d
		}
		_ = t.nc.SetReadDeadline(dl)
		n, err := t.nc.Read(t.rbuf)
		t.dec.Feed(t.rbuf[:n])
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if cerr := ctx.Err(); cerr != nil {
					return pmiwire.Msg{}, cerr
				}
				continue
			}
			if errors.Is(err, io.EOF) {
				return pmiwire.Msg{}, errors.New("launcher closed the PMI connection")
			}
			return pmiwire.Msg{}, fmt.Errorf("read response: %w", err)
		}
	}
}

// dispatch reads one response and completes its request.
func (t *textTransport) dispatch(ctx context.Context) error {
	m, err := t.readMsg(ctx)
	if err != nil {
		return err
	}
	idx := -1
	if th, ok := m.Get("thrid"); ok {
		for i, r := range t.pending {
			if strconv.FormatUint(uint64(r.id), 10) == th {
				idx = i
				break
			}
		}
	} else if len(t.pending) > 0 {
		idx = 0
	}
	if idx < 0 {
		return fmt.Errorf("unexpected response %s", m.Cmd)
	}
	r := t.pending[idx]
	t.pending = append(t.pending[:idx], t.pending[idx+1:]...)
	r.resp = m
	if m.Cmd != r.cmd+"-response" {
		r.err = fmt.Errorf("response %s to request %s", m.Cmd, r.cmd)
	} else if rc, _ := m.Get("rc"); rc != "" && rc != "0" {
		msg, _ := m.Get("errmsg")
		r.err = fmt.Errorf("%s failed (rc=%s): %s", r.cmd, rc, msg)
	}
	r.done = true
	if r.onDone != nil {
		r.onDone(r)
	}
	return nil
}

// call sends a request and waits for its response.
func (t *textTransport) call(ctx context.Context, cmd string, pairs ...pmiwire.Pair) (*textReq, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // not sent: the request takes no effect
	}
	r, err := t.send(cmd, pairs...)
	if err != nil {
		return nil, err
	}
	for !r.done {
		if err := t.dispatch(ctx); err != nil {
			return nil, err
		}
	}
	return r, r.err
}

func (t *textTransport) put(key string, val []byte, hint Hint) error {
	v := string(val)
	if err := t.storable(v); err != nil {
		return fmt.Errorf("key %q: %w", key, err)
	}
	pairs := []pmiwire.Pair{{Key: "key", Val: key}, {Key: "value", Val: v}}
	if t.ext && hint != HintNone {
		pairs = append(pairs, pmiwire.Pair{Key: "fastpmi-hint", Val: hint.Wire()})
	}
	_, err := t.call(context.Background(), "kvs-put", pairs...)
	return err
}

// detachedPairs marks a collective started detached, for fastpmi's agent.
func (t *textTransport) detachedPairs(detached bool) []pmiwire.Pair {
	if !t.ext || !detached {
		return nil
	}
	return []pmiwire.Pair{{Key: "fastpmi-detached", Val: "TRUE"}}
}

func (t *textTransport) startFence(detached bool) (uint32, error) {
	r, err := t.send("kvs-fence", t.detachedPairs(detached)...)
	if err != nil {
		return 0, err
	}
	t.started(r)
	return r.id, nil
}

// started records collective r and forgets those it outlives.
func (t *textTransport) started(r *textReq) {
	t.nColl++
	r.coll = t.nColl
	t.colls[r.id] = r
	t.forget()
}

// forget drops the collectives that completed and that no Wait, Test or
// Values needs any more: a fence that succeeded (done reports a dropped
// id done), an allgather whose values were read once two more
// collectives have started (the lifetime of a shared-memory view). A
// failed collective stays, so that every Wait on it returns its error;
// so does an allgather never read, as shared memory keeps a copy of one.
func (t *textTransport) forget() {
	for id, r := range t.colls {
		if !r.done || r.err != nil {
			continue
		}
		if r.cmd == "kvs-fence" && r.agNum == 0 || r.read && t.nColl-r.coll >= 2 {
			delete(t.colls, id)
		}
	}
}

func (t *textTransport) startAllgather(val []byte, detached bool) (uint32, error) {
	t.nAg++
	if t.ext {
		// A value holding a NUL byte, which the wire does not carry,
		// goes hex-encoded; hex=TRUE takes the values back so when any
		// holds one (the agent's serveAllgather).
		v, enc := string(val), "raw"
		if bytes.IndexByte(val, 0) >= 0 {
			v, enc = hex.EncodeToString(val), "hex"
		}
		r, err := t.send("fastpmi-allgather", append([]pmiwire.Pair{{Key: "value", Val: v}, {Key: "valenc", Val: enc},
			{Key: "hex", Val: "TRUE"}}, t.detachedPairs(detached)...)...)
		if err != nil {
			return 0, err
		}
		r.onDone = func(r *textReq) {
			if r.err != nil {
				return
			}
			asHex := false
			if e, _ := r.resp.Get("enc"); e == "hex" {
				asHex = true
			}
			r.vals = make([][]byte, t.info.Size)
			for i := range r.vals {
				v, _ := r.resp.Get("v" + strconv.Itoa(i))
				if !asHex {
					r.vals[i] = []byte(v)
					continue
				}
				b, err := hex.DecodeString(v)
				if err != nil {
					r.err = fmt.Errorf("allgather value of rank %d: %w", i, err)
					return
				}
				r.vals[i] = b
			}
		}
		t.started(r)
		return r.id, nil
	}
	// Plain PMI-2: put, fence now; the gets follow when the fence is
	// done.
	if err := t.putParts(fmt.Sprintf("fastpmi-ag-%d-%d", t.nAg, t.info.Rank), val); err != nil {
		return 0, err
	}
	r, err := t.send("kvs-fence")
	if err != nil {
		return 0, err
	}
	r.agNum = t.nAg
	t.started(r)
	return r.id, nil
}

func (t *textTransport) done(id uint32) (bool, error) {
	r := t.colls[id]
	if r == nil {
		return true, nil // forgotten: it completed and succeeded
	}
	if !r.done {
		return false, nil
	}
	if r.err == nil && r.agNum > 0 && r.vals == nil {
		// Fallback allgather: the fence is done, fetch every value.
		if err := t.fetchAll(r); err != nil {
			r.err = err
		}
	}
	return true, r.err
}

// hexPart is how many hex digits of a value one key holds when a value
// travels through a plain PMI-2 server's KVS (the fallback allgather and
// ring): with the first part's count prefix, within a PMI-2 value's 1024
// bytes. libfastpmi cuts its fallback allgather's values the same way.
const hexPart = 1000

// partKey names part p of a value put under key.
func partKey(key string, p int) string {
	if p == 0 {
		return key
	}
	return key + "-" + strconv.Itoa(p)
}

// putParts puts val under key through a plain PMI-2 server: hex-encoded
// (the wire carries no NUL byte), in parts the server's value limit
// takes, the first saying how many ("N.hex").
func (t *textTransport) putParts(key string, val []byte) error {
	h := hex.EncodeToString(val)
	parts := max(1, (len(h)+hexPart-1)/hexPart)
	for p := range parts {
		part := h[p*hexPart : min(len(h), (p+1)*hexPart)]
		if p == 0 {
			part = strconv.Itoa(parts) + "." + part
		}
		if err := t.put(partKey(key, p), []byte(part), HintNone); err != nil {
			return err
		}
	}
	return nil
}

// getParts reads what rank src put with putParts under key.
func (t *textTransport) getParts(ctx context.Context, key string, src int) ([]byte, error) {
	var h strings.Builder
	for p, parts := 0, 1; p < parts; p++ {
		g, err := t.call(ctx, "kvs-get", pmiwire.Pair{Key: "jobid", Val: ""},
			pmiwire.Pair{Key: "srcid", Val: strconv.Itoa(src)}, pmiwire.Pair{Key: "key", Val: partKey(key, p)})
		if err != nil {
			return nil, err
		}
		if f, _ := g.resp.Get("found"); f != "TRUE" {
			return nil, fmt.Errorf("part %d: %w", p, ErrNotFound)
		}
		part, _ := g.resp.Get("value")
		if p == 0 {
			n, rest, ok := strings.Cut(part, ".")
			if parts, err = strconv.Atoi(n); !ok || err != nil || parts < 1 || parts > (2*pmiwire.ValLenMax+hexPart-1)/hexPart {
				return nil, fmt.Errorf("malformed first part %.20q", part)
			}
			part = rest
		}
		h.WriteString(part)
	}
	return hex.DecodeString(h.String())
}

func (t *textTransport) fetchAll(r *textReq) error {
	vals := make([][]byte, t.info.Size)
	for i := range vals {
		v, err := t.getParts(context.Background(), fmt.Sprintf("fastpmi-ag-%d-%d", r.agNum, i), i)
		if err != nil {
			return fmt.Errorf("allgather value of rank %d: %w", i, err)
		}
		vals[i] = v
	}
	r.vals = vals
	return nil
}

func (t *textTransport) progress(ctx context.Context, id uint32) error {
	if r := t.colls[id]; r != nil && r.done {
		return nil
	}
	return t.dispatch(ctx)
}

func (t *textTransport) poll() error {
	// Take whatever responses already arrived, without blocking.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	for len(t.pending) > 0 {
		if err := t.dispatch(ctx); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return nil
			}
			return err
		}
	}
	return nil
}

func (t *textTransport) values(id uint32) Values {
	r := t.colls[id]
	if r == nil || r.vals == nil {
		return Values{}
	}
	r.read = true
	return Values{n: len(r.vals), vals: r.vals}
}

func (t *textTransport) get(ctx context.Context, key string, o getOpts) ([]byte, error) {
	pairs := []pmiwire.Pair{{Key: "jobid", Val: ""}, {Key: "srcid", Val: strconv.Itoa(o.src)}, {Key: "key", Val: key}}
	if o.wait && t.ext {
		pairs = append(pairs, pmiwire.Pair{Key: "fastpmi-wait", Val: "TRUE"})
	}
	if t.hydra && !t.fenced {
		return nil, errors.New("Hydra's PMI-2 server ends the whole job on a get before the rank's first fence; fence first")
	}
	pause := pollFirst
	for {
		r, err := t.call(ctx, "kvs-get", pairs...)
		if err != nil {
			return nil, err
		}
		if f, _ := r.resp.Get("found"); f == "TRUE" {
			v, _ := r.resp.Get("value")
			return []byte(v), nil
		}
		if !o.wait || t.ext {
			return nil, ErrNotFound
		}
		// A foreign launcher cannot park the get: poll.
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, pollMax)
	}
}

func (t *textTransport) ring(ctx context.Context, val []byte) (RingResult, error) {
	if t.hydra {
		return t.ringByKVS(ctx, val)
	}
	v := string(val)
	r, err := t.call(ctx, "ring", pmiwire.Pair{Key: "ring-count", Val: "1"}, pmiwire.Pair{Key: "ring-left", Val: v}, pmiwire.Pair{Key: "ring-right", Val: v})
	if err != nil {
		return RingResult{}, err
	}
	pos, _ := r.resp.Get("ring-count")
	p, err := strconv.Atoi(pos)
	if err != nil {
		return RingResult{}, fmt.Errorf("ring-response: bad ring-count %q", pos)
	}
	l, _ := r.resp.Get("ring-left")
	rt, _ := r.resp.Get("ring-right")
	return RingResult{Rank: p, Size: t.info.Size, Left: []byte(l), Right: []byte(rt)}, nil
}

// ringByKVS is Ring for launchers without the ring command: every rank
// puts its value (in parts, as the fallback allgather), fences, and gets
// its neighbours' values. The ring position is the rank.
func (t *textTransport) ringByKVS(ctx context.Context, val []byte) (RingResult, error) {
	t.nRing++
	key := func(r int) string { return fmt.Sprintf("fastpmi-ring-%d-%d", t.nRing, r) }
	me, n := t.info.Rank, t.info.Size
	if err := t.putParts(key(me), val); err != nil {
		return RingResult{}, err
	}
	if _, err := t.call(ctx, "kvs-fence"); err != nil {
		return RingResult{}, err
	}
	res := RingResult{Rank: me, Size: n}
	for _, nb := range []struct {
		r   int
		dst *[]byte
	}{{(me - 1 + n) % n, &res.Left}, {(me + 1) % n, &res.Right}} {
		v, err := t.getParts(ctx, key(nb.r), nb.r)
		if err != nil {
			return RingResult{}, fmt.Errorf("ring value of rank %d: %w", nb.r, err)
		}
		*nb.dst = v
	}
	return res, nil
}

func (t *textTransport) jobAttr(ctx context.Context, key string) (string, bool, error) {
	return foundValue(t.call(ctx, "info-getjobattr", pmiwire.Pair{Key: "key", Val: key}))
}

// foundValue reads a found/value response (info-getjobattr,
// info-getnodeattr) of call r.
func foundValue(r *textReq, err error) (string, bool, error) {
	if err != nil {
		return "", false, err
	}
	if f, _ := r.resp.Get("found"); f != "TRUE" {
		return "", false, nil
	}
	v, _ := r.resp.Get("value")
	return v, true, nil
}

func (t *textTransport) putNodeAttr(ctx context.Context, key, val string) error {
	if err := t.storable(val); err != nil {
		return err
	}
	_, err := t.call(ctx, "info-putnodeattr", pmiwire.Pair{Key: "key", Val: key}, pmiwire.Pair{Key: "value", Val: val})
	return err
}

func (t *textTransport) nodeAttr(ctx context.Context, key string, wait bool) (string, bool, error) {
	w := "FALSE"
	if wait {
		w = "TRUE"
	}
	return foundValue(t.call(ctx, "info-getnodeattr", pmiwire.Pair{Key: "key", Val: key}, pmiwire.Pair{Key: "wait", Val: w}))
}

func (t *textTransport) publish(ctx context.Context, name, port string) error {
	if err := t.storable(port); err != nil {
		return fmt.Errorf("port: %w", err)
	}
	_, err := t.call(ctx, "name-publish", pmiwire.Pair{Key: "name", Val: name}, pmiwire.Pair{Key: "port", Val: port})
	return err
}

func (t *textTransport) unpublish(ctx context.Context, name string) error {
	return t.notPublished(t.call(ctx, "name-unpublish", pmiwire.Pair{Key: "name", Val: name}))
}

// notPublished reads the answer r to a name-unpublish or name-lookup:
// one refused because the name is not published is ErrNotFound.
// fastpmi's agent says so in its errmsg; Hydra's name server refuses
// only that, with rc=1 and "service_<name>_not_found" or no message.
func (t *textTransport) notPublished(r *textReq, err error) error {
	switch {
	case r == nil || err == nil: // not answered, or found
		return err
	case !t.ext:
		return fmt.Errorf("%w (%v)", ErrNotFound, err)
	case strings.Contains(err.Error(), "not published"):
		return ErrNotFound
	}
	return err
}

func (t *textTransport) lookup(ctx context.Context, name string) (string, error) {
	r, err := t.call(ctx, "name-lookup", pmiwire.Pair{Key: "name", Val: name})
	if err := t.notPublished(r, err); err != nil {
		return "", err
	}
	if p, ok := r.resp.Get("port"); ok {
		return p, nil
	}
	v, _ := r.resp.Get("value")
	return v, nil
}

// spawn sends the request as one PMI-2 spawn command.
func (t *textTransport) spawn(ctx context.Context, req *pmiwire.Spawn) (string, error) {
	r, err := t.call(ctx, "spawn", req.PairsV2()...)
	if err != nil {
		return "", err
	}
	id, _ := r.resp.Get("jobid")
	return id, nil
}

func (t *textTransport) abort(code int, msg string) error {
	if t.hydra {
		t.wbuf = pmiwire.AppendV1(t.wbuf[:0], "abort", pmiwire.Pair{Key: "exitcode", Val: strconv.Itoa(code)},
			pmiwire.Pair{Key: "error_msg", Val: msg})
		if _, err := t.nc.Write(t.wbuf); err != nil {
			return fmt.Errorf("send abort: %w", err)
		}
		return nil
	}
	_, err := t.send("abort", pmiwire.Pair{Key: "isworld", Val: "TRUE"}, pmiwire.Pair{Key: "exitcode", Val: strconv.Itoa(code)}, pmiwire.Pair{Key: "msg", Val: msg})
	return err
}

// finalize first completes this rank's collectives still outstanding (an
// Ifence or Iallgather never waited for), telling the agent it waits:
// the server answers them on the connection finalize closes, and Hydra's
// proxy, writing an answer to a rank whose connection closed, ends the
// whole job (mpiexec exits 255, the ranks' output lost). Their results
// then stay for a Wait after Finalize, as over shared memory; a fallback
// allgather's values are fetched now, by gets the server takes only
// before finalize.
func (t *textTransport) finalize(ctx context.Context) error {
	err := t.settle(ctx)
	if err == nil {
		_, err = t.call(ctx, "finalize")
	}
	t.nc.Close()
	return err
}

// settle waits until every collective started has completed.
func (t *textTransport) settle(ctx context.Context) error {
	told := false
	for id, r := range t.colls {
		for {
			if done, _ := t.done(id); done {
				break
			}
			if !told {
				if err := t.block(id); err != nil {
					return err
				}
				told = true
			}
			if err := t.dispatch(ctx); err != nil {
				return fmt.Errorf("wait for the outstanding %s: %w", r.cmd, err)
			}
		}
	}
	return nil
}
