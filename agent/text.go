package agent

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/pmiwire"
)

// The text front end: PMI-1 and PMI-2 over one connection per rank. Each
// connection's goroutine decodes requests with pmiwire, turns each into a
// core operation through the command tables pmi1Cmds and pmi2Cmds, and
// encodes the core's replies. Requests answered by the job's
// configuration alone (get_maxes, job-getid, ...) and requests rejected
// while decoding are answered by their handler directly.

// textConn is one PMI-1/PMI-2 text-protocol connection.
type textConn struct {
	a  *Agent
	nc net.Conn

	// Output (textout.go): wake (capacity 1) kicks the writer goroutine,
	// done is closed when the connection has ended and stops it.
	wake chan struct{}
	done chan struct{}
	omu  sync.Mutex
	out  textOutput // guarded by omu

	// rank is bound at Serve (PMI_FD) or by initack/fullinit (PMI_PORT).
	// Written under Agent.mu by the connection's own goroutine, which is
	// the only reader outside mu.
	rank *rankConn

	// Guarded by Agent.mu.
	unbound bool                // counted in Agent.unbound (port.go)
	pending map[uint64]*textReq // requests waiting for the core's reply, by Req.ID
	nextID  uint64
}

// textReq is one request being served: what its reply needs.
type textReq struct {
	m    pmiwire.Msg // the request, copied: the reader decodes on its stack
	name string      // response command
	cmd  *textCmd    // nil for an unknown command
	req  Req
	tag  string    // barrier_in: the group's tag, echoed
	read time.Time // when it was read, for a tracer (zero otherwise)
}

// textCmd serves one command. serve decodes the request into a core
// operation, or answers it directly (t.direct) and returns nil; encode
// builds the success reply from the core's Reply (errors are encoded
// uniformly by textReq.encode); a nil encode means the operation gets no
// reply. unbound commands may arrive before the connection has a rank.
type textCmd struct {
	unbound bool
	serve   func(c *textConn, t *turn, rq *textReq) Op
	encode  func(rq *textReq, r *Reply) *pmiwire.Resp
}

func (c *textConn) rankNum() int {
	if c.rank == nil {
		return -1
	}
	return c.rank.global
}

// run reads and serves requests until the connection closes.
func (c *textConn) run() {
	if c.rank == nil && !c.checkPeer() {
		c.closed()
		return
	}
	var dec pmiwire.Decoder
	// A Unix socket's requests stay on it until the reader is about to
	// wait: freed at once, they would wake the rank that sleeps for the
	// reply (sys.HeldReader says why).
	var in io.Reader = c.nc
	if hr, err := sys.NewHeldReader(c.nc); err == nil {
		in = hr
	} else if !errors.Is(err, sys.ErrNotSupported) {
		c.a.log.Debug("PMI connection read as usual", "rank", c.rankNum(), "err", err)
	}
	for {
		n, rerr := dec.Fill(in)
		if n > 0 {
			for {
				m, ok, err := dec.Next()
				if err != nil {
					var se *pmiwire.SyntaxError
					if errors.As(err, &se) {
						if se.Cmd == "abort" {
							c.handle(malformedAbort(se))
							continue
						}
						c.replyMalformed(se)
						continue
					}
					c.protocolError(err)
					return
				}
				if !ok {
					break
				}
				c.handle(&m)
			}
		}
		if rerr != nil {
			c.closed()
			return
		}
	}
}

// malformedAbort is an abort request whose body could not be parsed
// (MPICH does not escape a ';' in its message): an abort gets no reply,
// so it aborts with the fields read before the fault, its message saying
// what was wrong if its own was lost.
func malformedAbort(se *pmiwire.SyntaxError) *pmiwire.Msg {
	m := &pmiwire.Msg{Framing: se.Framing, Cmd: se.Cmd, Pairs: slices.Clone(se.Fields)}
	for i, p := range m.Pairs {
		if p.Key == "message" || p.Key == "msg" || p.Key == "error_msg" {
			m.Pairs[i].Val += " (the rest of the abort request was malformed: " + se.Reason + ")"
			return m
		}
	}
	m.Pairs = append(m.Pairs, pmiwire.Pair{Key: "message", Val: "(its abort request was malformed: " + se.Reason + ")"})
	return m
}

// replyMalformed answers a request whose body could not be parsed with a
// response of the matching name and rc≠0.
func (c *textConn) replyMalformed(se *pmiwire.SyntaxError) {
	r := pmiwire.NewResp(se.Framing, pmiwire.ResponseName(se.Framing, se.Cmd))
	addErr(r, pmiwire.RCInvalidArg, se)
	c.write(r.Append(nil))
}

func (c *textConn) protocolError(err error) {
	a := c.a
	a.log.Info("PMI protocol error; closing connection", "rank", c.rankNum(), "err", err)
	// Framing is lost: answer once in PMI-1 form so a waiting client sees
	// an error rather than silence, then close.
	c.writeLast(pmiwire.AppendV1(nil, "error", pmiwire.Pair{Key: "rc", Val: strconv.Itoa(pmiwire.RCFail)},
		pmiwire.Pair{Key: "msg", Val: err.Error()}))
	a.protocolError(c.rankNum(), err)
	c.nc.Close()
	c.closed()
}

// closed handles the end of the connection.
func (c *textConn) closed() {
	a := c.a
	a.mu.Lock()
	delete(a.conns, c)
	c.boundLocked()
	rc := c.rank
	report := false
	spoke := false
	if rc != nil && rc.conn == c {
		defer close(rc.drained)
		var finalized bool
		spoke, finalized = a.core.RankStatus(rc.local)
		// The launcher decides what a lost rank means (it knows how the
		// process ended) and calls RankGone; failing the peers' collectives
		// here would let them exit first and be blamed for the failure.
		report = !finalized && !a.closed
	}
	a.mu.Unlock()
	c.nc.Close()
	close(c.done)
	if report {
		a.cfg.Events(Event{Kind: EventDisconnected, Rank: rc.global, Spoke: spoke})
	}
}

// handle serves one request: one turn of the agent.
func (c *textConn) handle(m *pmiwire.Msg) {
	a := c.a
	var read time.Time
	if a.rec.Tracing() {
		read = time.Now()
	}
	a.mu.Lock()
	t := newTurn()
	t.read, t.cmd = read, m.Cmd
	t.self = c
	if rc := c.rank; rc != nil {
		_ = a.core.Step(Spoke{rc.local})
	}
	c.dispatchLocked(t, m)
	a.finishLocked(t)
}

// lookupCmd finds the handler of a command: in the table of the request's
// framing, then in the other (clients mix them: PMI-2 starts with a PMI-1
// framed init).
func lookupCmd(f pmiwire.Framing, cmd string) *textCmd {
	first, second := pmi1Cmds, pmi2Cmds
	if f == pmiwire.V2 {
		first, second = second, first
	}
	if h := first[cmd]; h != nil {
		return h
	}
	return second[cmd]
}

func (c *textConn) dispatchLocked(t *turn, m *pmiwire.Msg) {
	a := c.a
	rq := &textReq{m: *m, name: pmiwire.ResponseName(m.Framing, m.Cmd), cmd: lookupCmd(m.Framing, m.Cmd), read: t.read}
	if group, ok := m.Get("group"); ok && m.Cmd == "barrier_in" {
		// A threaded client finds its answer by the tag, refusals too.
		_, rq.tag, _ = splitGroup(group)
	}
	if rc := c.rank; rc != nil && m.Cmd != "finalize" {
		// Init included: it would answer rc=0 to a rank that stays
		// finalized.
		if _, fin := a.core.RankStatus(rc.local); fin {
			t.fail(c, rq, pmiwire.RCInit, fmt.Errorf("rank %d already finalized", rc.global))
			return
		}
	}
	if rq.cmd == nil || !rq.cmd.unbound {
		rc := c.rank
		if rc == nil {
			t.fail(c, rq, pmiwire.RCInit, errors.New("connection not bound to a rank: send initack or fullinit first"))
			return
		}
		if rq.cmd == nil {
			t.fail(c, rq, pmiwire.RCFail, fmt.Errorf("unknown command %q", m.Cmd))
			return
		}
	}
	if len(c.pending) >= MaxPendingPerConn {
		t.fail(c, rq, pmiwire.RCFail, fmt.Errorf("%w: more than %d requests waiting for an answer", ErrQuota, MaxPendingPerConn))
		return
	}
	c.nextID++
	rq.req = Req{Via: ViaText, ID: c.nextID}
	op := rq.cmd.serve(c, t, rq)
	if op == nil {
		return
	}
	if rq.cmd.encode != nil {
		if c.pending == nil {
			c.pending = make(map[uint64]*textReq)
		}
		c.pending[rq.req.ID] = rq
	}
	if err := a.core.Step(op); err != nil {
		delete(c.pending, rq.req.ID)
		t.fail(c, rq, pmiwire.RCFail, err)
	}
}

// local is the bound rank's local index.
func (c *textConn) local() int { return c.rank.local }

// encode is the reply to rq for the core's answer r.
func (rq *textReq) encode(r *Reply) []byte {
	if r.Err != nil {
		e := errResp(&rq.m, rq.name, pmiwire.RCFail, r.Err)
		if rq.tag != "" {
			e.Add("tag", rq.tag)
		}
		return e.Append(nil)
	}
	return rq.cmd.encode(rq, r).Append(nil)
}

// ok is the plain success reply.
func (rq *textReq) ok() *pmiwire.Resp { return resp(&rq.m, rq.name) }

func encodeOK(rq *textReq, _ *Reply) *pmiwire.Resp { return rq.ok() }

func encodeFound(rq *textReq, r *Reply) *pmiwire.Resp {
	if !r.Found {
		return rq.ok().AddBool("found", false)
	}
	return rq.ok().AddBool("found", true).Add("value", r.Val)
}

// direct answers: the request never reaches the core.
func (t *turn) answer(c *textConn, b []byte) { t.text = append(t.text, textOut{c: c, b: b}) }

func (t *turn) fail(c *textConn, rq *textReq, rc int, err error) {
	e := errResp(&rq.m, rq.name, rc, err)
	if rq.tag != "" {
		e.Add("tag", rq.tag)
	}
	t.answer(c, e.Append(nil))
}

func (t *turn) ok(c *textConn, r *pmiwire.Resp) { t.answer(c, r.Append(nil)) }

// unsupported refuses a command fastpmi does not implement.
var unsupported = &textCmd{serve: func(c *textConn, t *turn, rq *textReq) Op {
	t.fail(c, rq, pmiwire.RCFail, fmt.Errorf("%s is not supported", rq.m.Cmd))
	return nil
}}

// answered is a command answered from the job's configuration.
func answered(f func(c *textConn, rq *textReq) *pmiwire.Resp) *textCmd {
	return &textCmd{serve: func(c *textConn, t *turn, rq *textReq) Op {
		t.ok(c, f(c, rq))
		return nil
	}}
}

var pmi1Cmds = map[string]*textCmd{
	"init":    {unbound: true, serve: serveInit},
	"initack": {unbound: true, serve: serveInitack},
	"get_maxes": answered(func(c *textConn, rq *textReq) *pmiwire.Resp {
		return rq.ok().AddInt("kvsname_max", pmiwire.KVSNameMax).AddInt("keylen_max", pmiwire.KeyLenMax).AddInt("vallen_max", pmiwire.ValLenMax)
	}),
	"get_appnum": answered(func(c *textConn, rq *textReq) *pmiwire.Resp {
		return rq.ok().AddInt("appnum", c.rank.appnum)
	}),
	"get_universe_size": answered(func(c *textConn, rq *textReq) *pmiwire.Resp {
		return rq.ok().AddInt("size", c.a.cfg.UniverseSize)
	}),
	"get_my_kvsname": answered(func(c *textConn, rq *textReq) *pmiwire.Resp {
		return rq.ok().Add("kvsname", c.a.cfg.JobID)
	}),
	"put":            {serve: servePut, encode: encodeOK},
	"get":            {serve: serveGet1, encode: encodeGet1},
	"barrier_in":     {serve: serveBarrier, encode: encodeBarrier},
	"publish_name":   {serve: serveName, encode: encodeName},
	"unpublish_name": {serve: serveName, encode: encodeName},
	"lookup_name":    {serve: serveName, encode: encodeName},
	"abort":          {serve: serveAbort},
	"finalize":       {serve: serveFinalize, encode: encodeOK},
	"spawn":          {serve: serveSpawn, encode: encodeSpawn},
	"create_kvs":     unsupported,
	"destroy_kvs":    unsupported,
	"getbyidx":       unsupported,
}

var pmi2Cmds = map[string]*textCmd{
	"fullinit": {unbound: true, serve: serveFullinit},
	"job-getid": answered(func(c *textConn, rq *textReq) *pmiwire.Resp {
		return rq.ok().Add("jobid", c.a.cfg.JobID)
	}),
	"info-getjobattr":   {serve: serveJobAttr, encode: encodeFound},
	"job-getinfo":       {serve: serveJobAttr, encode: encodeFound},
	"info-putnodeattr":  {serve: servePutNodeAttr, encode: encodeOK},
	"info-getnodeattr":  {serve: serveGetNodeAttr, encode: encodeFound},
	"kvs-put":           {serve: servePut, encode: encodeOK},
	"kvs-fence":         {serve: serveFence, encode: encodeOK},
	"kvs-get":           {serve: serveGet2, encode: encodeFound},
	"ring":              {serve: serveRing, encode: encodeRing},
	"name-publish":      {serve: serveName, encode: encodeName},
	"name-unpublish":    {serve: serveName, encode: encodeName},
	"name-lookup":       {serve: serveName, encode: encodeName},
	"fastpmi-allgather": {serve: serveAllgather, encode: encodeAllgather},
	"fastpmi-block":     {serve: serveBlock},
	"finalize":          {serve: serveFinalize, encode: encodeOK},
	"abort":             {serve: serveAbort},
	"spawn":             {serve: serveSpawn, encode: encodeSpawn},
	// No client needs these: MPICH connects spawned jobs through its own
	// ports (PARENT_ROOT_PORT_NAME, see the recorded spawn conversations),
	// and Slurm's server answers nothing to them.
	"job-connect":    unsupported,
	"job-disconnect": unsupported,
}

// checkJob rejects a request that names a KVS other than this job's.
func (c *textConn) checkJob(m *pmiwire.Msg, field string) error {
	if j, ok := m.Get(field); ok && j != c.a.cfg.JobID {
		return fmt.Errorf("unknown %s %q (this job is %q)", field, j, c.a.cfg.JobID)
	}
	return nil
}

// checkPut enforces the announced limits and the reserved PMI_ prefix.
func checkPut(key, val string) (int, error) {
	switch {
	case key == "":
		return pmiwire.RCInvalidKey, errors.New("put without key")
	case len(key) > pmiwire.KeyLenMax:
		return pmiwire.RCInvalidKeyLength, fmt.Errorf("key longer than %d bytes", pmiwire.KeyLenMax)
	case len(val) > pmiwire.ValLenMax:
		return pmiwire.RCInvalidValLength, fmt.Errorf("value longer than %d bytes", pmiwire.ValLenMax)
	case strings.HasPrefix(key, "PMI_"):
		return pmiwire.RCInvalidKey, fmt.Errorf("key %s is reserved for the launcher", key)
	}
	if err := checkBytes("key", key); err != nil {
		return pmiwire.RCInvalidKey, err
	}
	if err := checkBytes("value", val); err != nil {
		return pmiwire.RCInvalidArg, err
	}
	return 0, nil
}

// checkNodeAttr enforces the limits on a node attribute's key and value
// ("" when reading), with the text protocol's rc for each.
func checkNodeAttr(key, val string) (int, error) {
	switch {
	case key == "" || len(key) > pmiwire.KeyLenMax:
		return pmiwire.RCInvalidKey, fmt.Errorf("bad node attribute key %q", key)
	case len(val) > pmiwire.ValLenMax:
		return pmiwire.RCInvalidValLength, fmt.Errorf("value longer than %d bytes", pmiwire.ValLenMax)
	}
	if err := checkBytes("node attribute key", key); err != nil {
		return pmiwire.RCInvalidKey, err
	}
	if err := checkBytes("node attribute value", val); err != nil {
		return pmiwire.RCInvalidArg, err
	}
	return 0, nil
}

func (c *textConn) bindLocked(rank int) error {
	a := c.a
	l := a.core.LocalOf(rank)
	if l < 0 {
		return fmt.Errorf("rank %d is not served by this agent", rank)
	}
	rc := a.ranks[l]
	if c.rank == rc {
		return nil
	}
	if c.rank != nil {
		return fmt.Errorf("connection of rank %d cannot become rank %d", c.rank.global, rank)
	}
	if rc.conn != nil {
		return fmt.Errorf("rank %d is already connected", rank)
	}
	rc.conn = c
	c.rank = rc
	c.boundLocked()
	return nil
}

// initOp is the core's note of a completed init, if the connection has a
// rank.
func (c *textConn) initOp() Op {
	if c.rank == nil {
		return nil
	}
	return Init{Local: c.local()}
}

func serveInit(c *textConn, t *turn, rq *textReq) Op {
	m := &rq.m
	name := pmiwire.ResponseName(pmiwire.V1, "init")
	vs, _ := m.Get("pmi_version")
	ss, _ := m.Get("pmi_subversion")
	v, verr := strconv.Atoi(vs)
	s, serr := strconv.Atoi(ss)
	switch {
	case verr != nil || serr != nil:
		t.answer(c, errResp(m, name, pmiwire.RCInvalidArg, fmt.Errorf("bad version %q.%q", vs, ss)).Append(nil))
	case v == 1 && s >= 0 && s <= 2:
		// As Hydra: answer 1.2 so MPICH enables group barriers.
		t.ok(c, resp(m, name).AddInt("pmi_version", 1).AddInt("pmi_subversion", 2))
		return c.initOp()
	case v == 2 && s == 0:
		t.ok(c, resp(m, name).AddInt("pmi_version", 2).AddInt("pmi_subversion", 0))
		// PMI-2 init completes with fullinit.
	default:
		t.answer(c, errResp(m, name, pmiwire.RCFail, fmt.Errorf("unsupported PMI version %d.%d (supported: 1.1, 1.2, 2.0)", v, s)).
			AddInt("pmi_version", 1).AddInt("pmi_subversion", 2).Append(nil))
	}
	return nil
}

func serveInitack(c *textConn, t *turn, rq *textReq) Op {
	m := &rq.m
	id, _ := m.Get("pmiid")
	r, err := c.a.rankOfID(id)
	if err == nil {
		err = c.bindLocked(r)
	}
	if err != nil {
		t.answer(c, errResp(m, "initack", pmiwire.RCInvalidArg, err).Append(nil))
		return nil
	}
	b := resp(m, "initack").Append(nil)
	b = pmiwire.AppendV1(b, "set", pmiwire.Pair{Key: "size", Val: strconv.Itoa(c.a.cfg.Size)})
	b = pmiwire.AppendV1(b, "set", pmiwire.Pair{Key: "rank", Val: strconv.Itoa(r)})
	b = pmiwire.AppendV1(b, "set", pmiwire.Pair{Key: "debug", Val: "0"})
	t.answer(c, b)
	return nil
}

func serveFullinit(c *textConn, t *turn, rq *textReq) Op {
	a, m, name := c.a, &rq.m, rq.name
	want := -1
	for _, k := range []string{"pmirank", "srcid"} {
		if s, ok := m.Get(k); ok {
			r, err := a.rankOfPMI2(s)
			if err != nil {
				t.fail(c, rq, pmiwire.RCInvalidArg, fmt.Errorf("bad %s %q", k, s))
				return nil
			}
			if r >= 0 {
				want = r
				break
			}
		}
	}
	if want >= 0 {
		if err := c.bindLocked(want); err != nil {
			t.fail(c, rq, pmiwire.RCInvalidArg, err)
			return nil
		}
	}
	rc := c.rank
	if rc == nil {
		t.fail(c, rq, pmiwire.RCInvalidArg, errors.New("fullinit without pmirank on a connection not bound to a rank"))
		return nil
	}
	if j, ok := m.Get("pmijobid"); ok && j != a.cfg.JobID {
		a.log.Debug("fullinit names another job id", "rank", rc.global, "pmijobid", j)
	}
	r := resp(m, name).AddInt("pmi-version", 2).AddInt("pmi-subversion", 0).
		AddInt("rank", rc.global).AddInt("size", a.cfg.Size).AddInt("appnum", rc.appnum).
		AddBool("debugged", false).AddBool("pmiverbose", false)
	// Announce fastpmi's extensions (fastpmi-allgather, put hints, waiting
	// gets, detached collectives and fastpmi-block) to clients that look
	// for them; other clients ignore the field.
	r.Add("fastpmi", "1")
	if a.cfg.SpawnerJobID != "" {
		r.Add("spawner-jobid", a.cfg.SpawnerJobID)
	}
	t.ok(c, r)
	return c.initOp()
}

// servePut serves PMI-1 put and PMI-2 kvs-put (with fastpmi's hint).
func servePut(c *textConn, t *turn, rq *textReq) Op {
	m := &rq.m
	if m.Cmd == "put" {
		if err := c.checkJob(m, "kvsname"); err != nil {
			t.fail(c, rq, pmiwire.RCInvalidArg, err)
			return nil
		}
	}
	key, _ := m.Get("key")
	val, _ := m.Get("value")
	if rc, err := checkPut(key, val); err != nil {
		t.fail(c, rq, rc, err)
		return nil
	}
	h, _ := m.Get("fastpmi-hint")
	hint := pmiwire.ParseHint(h)
	if m.Cmd == "put" {
		hint = pmiwire.HintNone
	}
	return Put{Local: c.local(), Req: rq.req, Key: key, Val: val, Hint: hint}
}

// serveGet1 serves PMI-1 get: a missing key is an error.
func serveGet1(c *textConn, t *turn, rq *textReq) Op {
	if err := c.checkJob(&rq.m, "kvsname"); err != nil {
		t.fail(c, rq, pmiwire.RCInvalidArg, err)
		return nil
	}
	key, _ := rq.m.Get("key")
	return Get{Local: c.local(), Req: rq.req, Key: key, Src: -1}
}

func encodeGet1(rq *textReq, r *Reply) *pmiwire.Resp {
	if !r.Found {
		key, _ := rq.m.Get("key")
		return errResp(&rq.m, rq.name, pmiwire.RCInvalidKey, fmt.Errorf("key %s not found", key))
	}
	return rq.ok().Add("value", r.Val)
}

// serveGet2 serves PMI-2 kvs-get, with fastpmi's waiting get.
func serveGet2(c *textConn, t *turn, rq *textReq) Op {
	m := &rq.m
	if err := c.checkJob(m, "jobid"); err != nil {
		t.fail(c, rq, pmiwire.RCInvalidArg, err)
		return nil
	}
	key, _ := m.Get("key")
	src := -1
	if srcid, has := m.Get("srcid"); has {
		n, err := strconv.Atoi(srcid)
		if err != nil {
			t.fail(c, rq, pmiwire.RCInvalidArg, fmt.Errorf("bad srcid %q", srcid))
			return nil
		}
		src = n // out of range (libpmi2 sends -1 for "unknown"): none
	}
	// fastpmi extension: wait for a late put instead of "not found".
	w, _ := m.Get("fastpmi-wait")
	return Get{Local: c.local(), Req: rq.req, Key: key, Wait: w == "TRUE" && key != "-NONEXIST-KEY", Src: src}
}

func serveJobAttr(c *textConn, t *turn, rq *textReq) Op {
	key, _ := rq.m.Get("key")
	return JobAttr{Local: c.local(), Req: rq.req, Key: key, KVS: true}
}

func servePutNodeAttr(c *textConn, t *turn, rq *textReq) Op {
	key, _ := rq.m.Get("key")
	val, _ := rq.m.Get("value")
	if rc, err := checkNodeAttr(key, val); err != nil {
		t.fail(c, rq, rc, err)
		return nil
	}
	return PutNodeAttr{Local: c.local(), Req: rq.req, Key: key, Val: val}
}

func serveGetNodeAttr(c *textConn, t *turn, rq *textReq) Op {
	key, _ := rq.m.Get("key")
	wait, _ := rq.m.Get("wait")
	return GetNodeAttr{Local: c.local(), Req: rq.req, Key: key, Wait: wait == "TRUE"}
}

func serveFence(c *textConn, t *turn, rq *textReq) Op {
	d, ok := detached(c, t, rq)
	if !ok {
		return nil
	}
	return Fence{Local: c.local(), Req: rq.req, Detached: d}
}

// detached reads fastpmi's fastpmi-detached field of a kvs-fence or
// fastpmi-allgather: TRUE says the rank goes on with other work (Ifence,
// Iallgather) until its fastpmi-block. ok is false if rq was answered
// with an error.
func detached(c *textConn, t *turn, rq *textReq) (d, ok bool) {
	switch v, _ := rq.m.Get("fastpmi-detached"); v {
	case "", "FALSE":
		return false, true
	case "TRUE":
		return true, true
	default:
		t.fail(c, rq, pmiwire.RCInvalidArg, fmt.Errorf("fastpmi-detached=%q: want TRUE or FALSE", v))
		return false, false
	}
}

// serveBlock serves fastpmi's fastpmi-block, which has no response:
// waiting=TRUE says the rank now waits for every collective it started
// (a Wait on one it started detached), waiting=FALSE that it waits for
// nothing any more (a Wait or a waiting kvs-get cut short; the gets it
// left parked are answered rc≠0).
func serveBlock(c *textConn, t *turn, rq *textReq) Op {
	switch v, _ := rq.m.Get("waiting"); v {
	case "TRUE":
		return Block{Local: c.local(), Until: BlockAll}
	case "FALSE":
		return Block{Local: c.local()}
	default:
		t.fail(c, rq, pmiwire.RCInvalidArg, fmt.Errorf("fastpmi-block: waiting=%q: want TRUE or FALSE", v))
		return nil
	}
}

// splitGroup splits a PMI-1.2 barrier group <group>:<tag>.
func splitGroup(group string) (kind, tag string, ok bool) {
	i := strings.LastIndexByte(group, ':')
	if i < 0 {
		return "", "", false
	}
	return group[:i], group[i+1:], true
}

// serveBarrier serves PMI-1 barrier_in, with PMI-1.2 groups:
// WORLD:<tag>, NODE:<tag> or r1,r2,...:<tag>.
func serveBarrier(c *textConn, t *turn, rq *textReq) Op {
	group, hasGroup := rq.m.Get("group")
	kind := "WORLD"
	if hasGroup {
		var ok bool
		if kind, rq.tag, ok = splitGroup(group); !ok {
			t.fail(c, rq, pmiwire.RCInvalidArg, fmt.Errorf("bad barrier group %q (want <group>:<tag>)", group))
			return nil
		}
	}
	switch kind {
	case "WORLD":
		return Fence{Local: c.local(), Req: rq.req}
	case "NODE":
		return Barrier{Local: c.local(), Req: rq.req, Group: group}
	}
	var members []int
	for _, f := range strings.Split(kind, ",") {
		r, err := strconv.Atoi(f)
		if err != nil || r < 0 || r >= c.a.cfg.Size {
			t.answer(c, rq.encode(&Reply{Err: fmt.Errorf("bad rank %q in barrier group", f)}))
			return nil
		}
		l := c.a.core.LocalOf(r)
		if l < 0 {
			t.answer(c, rq.encode(&Reply{Err: fmt.Errorf("barrier group with rank %d on another node is not supported", r)}))
			return nil
		}
		members = append(members, l)
	}
	return Barrier{Local: c.local(), Req: rq.req, Group: group, Members: members}
}

func encodeBarrier(rq *textReq, _ *Reply) *pmiwire.Resp {
	r := rq.ok()
	if rq.tag != "" {
		r.Add("tag", rq.tag)
	}
	return r
}

func serveRing(c *textConn, t *turn, rq *textReq) Op {
	m := &rq.m
	cs, _ := m.Get("ring-count")
	n, err := strconv.Atoi(cs)
	if err != nil || n < 0 {
		t.fail(c, rq, pmiwire.RCInvalidArg, fmt.Errorf("bad ring-count %q", cs))
		return nil
	}
	left, _ := m.Get("ring-left")
	right, _ := m.Get("ring-right")
	if len(left) > pmiwire.ValLenMax || len(right) > pmiwire.ValLenMax {
		t.fail(c, rq, pmiwire.RCInvalidValLength, fmt.Errorf("ring value longer than %d bytes", pmiwire.ValLenMax))
		return nil
	}
	return Ring{Local: c.local(), Req: rq.req, In: RingIn{Count: n, Left: left, Right: right}}
}

func encodeRing(rq *textReq, r *Reply) *pmiwire.Resp {
	return rq.ok().AddInt("ring-count", r.Ring.Pos).Add("ring-left", r.Ring.Left).Add("ring-right", r.Ring.Right)
}

func serveAbort(c *textConn, t *turn, rq *textReq) Op {
	m := &rq.m
	code := 1
	for _, k := range []string{"exitcode", "exit_code"} {
		if s, ok := m.Get(k); ok {
			if n, err := strconv.Atoi(s); err == nil {
				code = n
			}
			break
		}
	}
	msg := ""
	for _, k := range []string{"message", "msg", "error_msg"} {
		if s, ok := m.Get(k); ok {
			msg = s
			break
		}
	}
	if w, ok := m.Get("isworld"); ok && w == "FALSE" {
		// Slurm semantics: only the caller ends; its exit ends the job if
		// it fails.
		c.a.log.Info("rank aborts itself", "rank", c.rank.global, "msg", msg)
		return nil
	}
	return Abort{Local: c.local(), Code: code, Msg: msg}
}

func serveFinalize(c *textConn, t *turn, rq *textReq) Op {
	return Finalize{Local: c.local(), Req: rq.req}
}

// serveSpawn serves PMI-1 mcmd=spawn blocks (spawn_multiple included:
// the framing delivers the whole block of totspawns segments as one
// request) and PMI-2 spawn. The launcher starts the new job; the rank is
// answered with its job id once every child has started.
func serveSpawn(c *textConn, t *turn, rq *textReq) Op {
	sp, err := pmiwire.ParseSpawn(&rq.m)
	if err != nil {
		t.fail(c, rq, pmiwire.RCInvalidArg, err)
		return nil
	}
	return Spawn{Local: c.local(), Req: rq.req, Spawn: sp}
}

// encodeSpawn answers with the new job's id (Slurm sends it on both
// framings; MPICH's PMI-2 client reads it when its caller asks).
func encodeSpawn(rq *textReq, r *Reply) *pmiwire.Resp { return rq.ok().Add("jobid", r.Val) }

// serveName serves the name service: PMI-1 publish_name, unpublish_name
// and lookup_name, PMI-2 name-publish, name-unpublish and name-lookup. The
// rank is answered once the Upstream has (names.go).
func serveName(c *textConn, t *turn, rq *textReq) Op {
	m := &rq.m
	field := "service"
	if strings.HasPrefix(m.Cmd, "name-") {
		field = "name"
	}
	o := Name{Local: c.local(), Req: rq.req}
	o.Name, _ = m.Get(field)
	switch m.Cmd {
	case "publish_name", "name-publish":
		o.Op = NamePublish
		o.Port, _ = m.Get("port")
		if o.Name == "" || o.Port == "" {
			t.fail(c, rq, pmiwire.RCInvalidArg, fmt.Errorf("%s needs %s and port", m.Cmd, field))
			return nil
		}
	case "unpublish_name", "name-unpublish":
		o.Op = NameUnpublish
	default:
		o.Op = NameLookup
	}
	if err := checkName(o.Name, o.Port); err != nil {
		t.fail(c, rq, pmiwire.RCInvalidArg, err)
		return nil
	}
	return o
}

func encodeName(rq *textReq, r *Reply) *pmiwire.Resp {
	resp := rq.ok()
	if m := &rq.m; m.Cmd == "lookup_name" || m.Cmd == "name-lookup" {
		if m.Cmd == "name-lookup" {
			resp.Add("value", r.Val) // Slurm's client reads value, MPICH's reads port: send both.
		}
		resp.Add("port", r.Val)
	}
	return resp
}

// serveAllgather serves fastpmi's PMI-2 extension "fastpmi-allgather": the
// caller contributes value and receives every rank's value as v<rank>
// fields, so ranks on the text protocol join the same allgather as ranks on
// shared memory. Values travel with ';' doubled (pmiwire's escape).
//
// Values travel as the wire carries them, except a NUL byte, which no
// PMI-2 parser takes: a value holding one comes hex-encoded, with
// valenc=hex; a requester that says hex=TRUE gets every value
// hex-encoded, with enc=hex, when any holds one (encodeAllgather).
func serveAllgather(c *textConn, t *turn, rq *textReq) Op {
	val, _ := rq.m.Get("value")
	switch enc, _ := rq.m.Get("valenc"); enc {
	case "", "raw":
	case "hex":
		b, err := hex.DecodeString(val)
		if err != nil {
			t.fail(c, rq, pmiwire.RCInvalidArg, fmt.Errorf("value: valenc=hex: %v", err))
			return nil
		}
		val = string(b)
	default:
		t.fail(c, rq, pmiwire.RCInvalidArg, fmt.Errorf("unknown valenc %q (want raw or hex)", enc))
		return nil
	}
	if len(val) > pmiwire.ValLenMax {
		t.fail(c, rq, pmiwire.RCInvalidValLength, fmt.Errorf("value longer than %d bytes", pmiwire.ValLenMax))
		return nil
	}
	d, ok := detached(c, t, rq)
	if !ok {
		return nil
	}
	return Allgather{Local: c.local(), Req: rq.req, Value: []byte(val), Detached: d}
}

func encodeAllgather(rq *textReq, r *Reply) *pmiwire.Resp {
	resp := rq.ok().Add("epoch", strconv.FormatUint(r.Epoch, 10)).AddInt("size", len(r.Values))
	asHex := false
	if h, _ := rq.m.Get("hex"); h == "TRUE" {
		asHex = slices.ContainsFunc(r.Values, func(v []byte) bool { return bytes.IndexByte(v, 0) >= 0 })
	}
	if asHex {
		resp.Add("enc", "hex")
	}
	for i, v := range r.Values {
		if asHex {
			resp.Add("v"+strconv.Itoa(i), hex.EncodeToString(v))
			continue
		}
		resp.Add("v"+strconv.Itoa(i), string(v))
	}
	return resp
}

// resp starts the response to m, echoing a PMI-2 thrid.
func resp(m *pmiwire.Msg, name string) *pmiwire.Resp {
	r := pmiwire.NewResp(m.Framing, name)
	r.AddInt("rc", 0)
	if m.Framing == pmiwire.V2 {
		if t, ok := m.Get("thrid"); ok {
			r.Add("thrid", t)
		}
	}
	return r
}

// errResp is the failure response to m.
func errResp(m *pmiwire.Msg, name string, rc int, err error) *pmiwire.Resp {
	r := pmiwire.NewResp(m.Framing, name)
	if m.Framing == pmiwire.V2 {
		if t, ok := m.Get("thrid"); ok {
			r.Add("thrid", t)
		}
	}
	addErr(r, rc, err)
	return r
}

func addErr(r *pmiwire.Resp, rc int, err error) {
	r.Pairs = append([]pmiwire.Pair{{Key: "rc", Val: strconv.Itoa(rc)}}, r.Pairs...)
	msg := strings.ReplaceAll(err.Error(), ";", ",")
	if r.Framing == pmiwire.V2 {
		r.Add("errmsg", msg)
	} else {
		r.Add("msg", msg)
	}
}
