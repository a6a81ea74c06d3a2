package agent

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/pmiwire"
)

// textConn is one PMI-1/PMI-2 text-protocol connection.
type textConn struct {
	a  *Agent
	nc net.Conn

	wmu sync.Mutex // serialises writes to nc

	// rank is bound at Serve (PMI_FD) or by initack/fullinit (PMI_PORT).
	// Written under Agent.mu by the connection's own goroutine, which is
	// the only reader outside mu.
	rank *rankState
}

func (c *textConn) write(b []byte) {
	c.wmu.Lock()
	_, err := c.nc.Write(b)
	c.wmu.Unlock()
	if err != nil {
		c.a.log.Debug("write PMI reply", "rank", c.rankNum(), "err", err)
	}
}

func (c *textConn) rankNum() int {
	if c.rank == nil {
		return -1
	}
	return c.rank.global
}

// run reads and serves requests until the connection closes.
func (c *textConn) run() {
	var dec pmiwire.Decoder
	buf := make([]byte, 16<<10)
	for {
		n, rerr := c.nc.Read(buf)
		if n > 0 {
			dec.Feed(buf[:n])
			for {
				m, ok, err := dec.Next()
				if err != nil {
					var se *pmiwire.SyntaxError
					if errors.As(err, &se) {
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

// replyMalformed answers a request whose body could not be parsed with a
// response of the matching name and rc≠0.
func (c *textConn) replyMalformed(se *pmiwire.SyntaxError) {
	r := pmiwire.NewResp(se.Framing, pmiwire.ResponseName(se.Framing, se.Cmd))
	addErr(r, pmiwire.RCInvalidArg, se)
	c.write(r.Append(nil))
}

func (c *textConn) protocolError(err error) {
	a := c.a
	a.log.Warn("PMI protocol error; closing connection", "rank", c.rankNum(), "err", err)
	// Framing is lost: answer once in PMI-1 form so a waiting client sees
	// an error rather than silence, then close.
	c.write(pmiwire.AppendV1(nil, "error", pmiwire.Pair{Key: "rc", Val: strconv.Itoa(pmiwire.RCFail)},
		pmiwire.Pair{Key: "msg", Val: err.Error()}))
	a.cfg.Events.ProtocolError(c.rankNum(), err)
	c.nc.Close()
	c.closed()
}

// closed handles the end of the connection.
func (c *textConn) closed() {
	a := c.a
	a.mu.Lock()
	delete(a.conns, c)
	rs := c.rank
	report := false
	spoke := false
	if rs != nil && rs.conn == c {
		defer close(rs.drained)
	}
	if rs != nil && rs.conn == c && !rs.finalized && !a.closed {
		// The launcher decides what a lost rank means (it knows how the
		// process ended) and calls RankGone; failing the peers' collectives
		// here would let them exit first and be blamed for the failure.
		report = true
		spoke = rs.spoke
	}
	a.mu.Unlock()
	c.nc.Close()
	if report {
		a.cfg.Events.RankDisconnected(rs.global, spoke)
	}
}

// handle serves one request.
func (c *textConn) handle(m *pmiwire.Msg) {
	a := c.a
	a.mu.Lock()
	var out outbox
	var events []func()
	if rs := c.rank; rs != nil && !rs.spoke {
		rs.spoke = true
		if a.rec != nil {
			a.rec.Mark(perf.PhaseFirstPMI, rs.global)
		}
	}
	c.dispatchLocked(&out, &events, m)
	a.unlockAndRun(&out, events)
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

func (c *textConn) dispatchLocked(out *outbox, events *[]func(), m *pmiwire.Msg) {
	a := c.a
	name := pmiwire.ResponseName(m.Framing, m.Cmd)
	fail := func(rc int, err error) { out.add(c, errResp(m, name, rc, err).Append(nil)) }
	ok := func(r *pmiwire.Resp) { out.add(c, r.Append(nil)) }

	// Commands that may arrive before the connection is bound to a rank.
	switch m.Cmd {
	case "init":
		c.cmdInit(out, events, m)
		return
	case "initack":
		c.cmdInitack(out, events, m)
		return
	case "fullinit":
		c.cmdFullinit(out, events, m)
		return
	}
	rs := c.rank
	if rs == nil {
		fail(pmiwire.RCInit, errors.New("connection not bound to a rank: send initack or fullinit first"))
		return
	}
	if rs.finalized && m.Cmd != "finalize" && m.Cmd != "init" {
		fail(pmiwire.RCInit, fmt.Errorf("rank %d already finalized", rs.global))
		return
	}

	switch m.Cmd {
	// ---- PMI-1 ----
	case "get_maxes":
		ok(resp(m, name).AddInt("kvsname_max", pmiwire.KVSNameMax).AddInt("keylen_max", pmiwire.KeyLenMax).AddInt("vallen_max", pmiwire.ValLenMax))
	case "get_appnum":
		ok(resp(m, name).AddInt("appnum", rs.appnum))
	case "get_universe_size":
		ok(resp(m, name).AddInt("size", a.cfg.UniverseSize))
	case "get_my_kvsname":
		ok(resp(m, name).Add("kvsname", a.cfg.JobID))
	case "put":
		if err := c.checkJob(m, "kvsname"); err != nil {
			fail(pmiwire.RCInvalidArg, err)
			return
		}
		key, _ := m.Get("key")
		val, _ := m.Get("value")
		if rc, err := checkPut(key, val); err != nil {
			fail(rc, err)
			return
		}
		a.putLocked(out, rs, key, val, HintNone)
		ok(resp(m, name))
	case "get":
		if err := c.checkJob(m, "kvsname"); err != nil {
			fail(pmiwire.RCInvalidArg, err)
			return
		}
		key, _ := m.Get("key")
		if v, found := a.lookupLocked(key); found {
			ok(resp(m, name).Add("value", v))
			return
		}
		fail(pmiwire.RCInvalidKey, fmt.Errorf("key %s not found", key))
	case "barrier_in":
		c.cmdBarrier(out, m, rs, name)
	case "publish_name", "unpublish_name", "lookup_name":
		c.cmdName(out, m, name)
	case "abort":
		c.cmdAbort(events, m, rs)
	case "finalize":
		c.cmdFinalize(out, events, m, rs, name)
	case "spawn":
		c.cmdSpawn(out, m, name)
	case "create_kvs", "destroy_kvs", "getbyidx":
		fail(pmiwire.RCFail, fmt.Errorf("%s is not supported", m.Cmd))

	// ---- PMI-2 ----
	case "job-getid":
		ok(resp(m, name).Add("jobid", a.cfg.JobID))
	case "info-getjobattr", "job-getinfo":
		key, _ := m.Get("key")
		if v, found := a.jobAttr(key); found {
			ok(resp(m, name).AddBool("found", true).Add("value", v))
			return
		}
		if v, found := a.kvs[key]; found && !strings.HasPrefix(key, "PMI_") {
			ok(resp(m, name).AddBool("found", true).Add("value", v))
			return
		}
		ok(resp(m, name).AddBool("found", false))
	case "info-putnodeattr":
		c.cmdPutNodeAttr(out, m, name)
	case "info-getnodeattr":
		c.cmdGetNodeAttr(out, m, name)
	case "kvs-put":
		key, _ := m.Get("key")
		val, _ := m.Get("value")
		if rc, err := checkPut(key, val); err != nil {
			fail(rc, err)
			return
		}
		hint := HintNone
		switch h, _ := m.Get("fastpmi-hint"); h {
		case "dense":
			hint = HintDense
		case "sparse":
			hint = HintSparse
		}
		a.putLocked(out, rs, key, val, hint)
		ok(resp(m, name))
	case "kvs-fence":
		a.enterEpochLocked(out, rs, kindFence, nil, func(out *outbox, err error, _ *epochColl) {
			if err != nil {
				out.add(c, errResp(m, name, pmiwire.RCFail, err).Append(nil))
				return
			}
			out.add(c, resp(m, name).Append(nil))
		})
	case "kvs-get":
		if err := c.checkJob(m, "jobid"); err != nil {
			fail(pmiwire.RCInvalidArg, err)
			return
		}
		key, _ := m.Get("key")
		if srcid, has := m.Get("srcid"); has {
			if _, err := strconv.Atoi(srcid); err != nil {
				fail(pmiwire.RCInvalidArg, fmt.Errorf("bad srcid %q", srcid))
				return
			}
		}
		if v, found := a.lookupLocked(key); found {
			ok(resp(m, name).AddBool("found", true).Add("value", v))
			return
		}
		if w, _ := m.Get("fastpmi-wait"); w == "TRUE" && key != "-NONEXIST-KEY" {
			// fastpmi extension: wait for a late put instead of "not found".
			a.parkLocked(out, rs, "kvs:"+key, deferred{c: c, reply: func(err error, v string) []byte {
				if err != nil {
					return errResp(m, name, pmiwire.RCFail, err).Append(nil)
				}
				return resp(m, name).AddBool("found", true).Add("value", v).Append(nil)
			}})
			return
		}
		ok(resp(m, name).AddBool("found", false))
	case "ring":
		c.cmdRing(out, m, rs, name)
	case "name-publish", "name-unpublish", "name-lookup":
		c.cmdName(out, m, name)
	case "fastpmi-allgather":
		c.cmdAllgather(out, m, rs, name)
	case "job-connect", "job-disconnect":
		fail(pmiwire.RCFail, fmt.Errorf("%s is not supported", m.Cmd))
	default:
		fail(pmiwire.RCFail, fmt.Errorf("unknown command %q", m.Cmd))
	}
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
	return 0, nil
}

func (c *textConn) bindLocked(rank int) error {
	a := c.a
	rs := a.byGlobal[rank]
	if rs == nil {
		return fmt.Errorf("rank %d is not served by this agent", rank)
	}
	if c.rank == rs {
		return nil
	}
	if c.rank != nil {
		return fmt.Errorf("connection of rank %d cannot become rank %d", c.rank.global, rank)
	}
	if rs.conn != nil {
		return fmt.Errorf("rank %d is already connected", rank)
	}
	rs.conn = c
	c.rank = rs
	return nil
}

func (c *textConn) noteInitLocked(events *[]func()) {
	rs := c.rank
	if rs == nil {
		return
	}
	a := c.a
	if a.rec != nil {
		a.rec.Mark(perf.PhaseInit, rs.global)
	}
	g := rs.global
	*events = append(*events, func() { a.cfg.Events.RankInit(g) })
}

func (c *textConn) cmdInit(out *outbox, events *[]func(), m *pmiwire.Msg) {
	name := pmiwire.ResponseName(pmiwire.V1, "init")
	vs, _ := m.Get("pmi_version")
	ss, _ := m.Get("pmi_subversion")
	v, verr := strconv.Atoi(vs)
	s, serr := strconv.Atoi(ss)
	switch {
	case verr != nil || serr != nil:
		out.add(c, errResp(m, name, pmiwire.RCInvalidArg, fmt.Errorf("bad version %q.%q", vs, ss)).Append(nil))
	case v == 1 && s >= 0 && s <= 2:
		// As Hydra: answer 1.2 so MPICH enables group barriers.
		out.add(c, resp(m, name).AddInt("pmi_version", 1).AddInt("pmi_subversion", 2).Append(nil))
		c.noteInitLocked(events)
	case v == 2 && s == 0:
		out.add(c, resp(m, name).AddInt("pmi_version", 2).AddInt("pmi_subversion", 0).Append(nil))
		// PMI-2 init completes with fullinit.
	default:
		out.add(c, errResp(m, name, pmiwire.RCFail, fmt.Errorf("unsupported PMI version %d.%d (supported: 1.1, 1.2, 2.0)", v, s)).
			AddInt("pmi_version", 1).AddInt("pmi_subversion", 2).Append(nil))
	}
}

func (c *textConn) cmdInitack(out *outbox, events *[]func(), m *pmiwire.Msg) {
	a := c.a
	id, _ := m.Get("pmiid")
	r, err := strconv.Atoi(id)
	if err == nil {
		err = c.bindLocked(r)
	} else {
		err = fmt.Errorf("bad pmiid %q", id)
	}
	if err != nil {
		out.add(c, errResp(m, "initack", pmiwire.RCInvalidArg, err).Append(nil))
		return
	}
	b := resp(m, "initack").Append(nil)
	b = pmiwire.AppendV1(b, "set", pmiwire.Pair{Key: "size", Val: strconv.Itoa(a.cfg.Size)})
	b = pmiwire.AppendV1(b, "set", pmiwire.Pair{Key: "rank", Val: strconv.Itoa(r)})
	b = pmiwire.AppendV1(b, "set", pmiwire.Pair{Key: "debug", Val: "0"})
	out.add(c, b)
}

func (c *textConn) cmdFullinit(out *outbox, events *[]func(), m *pmiwire.Msg) {
	a := c.a
	name := pmiwire.ResponseName(m.Framing, m.Cmd)
	want := -1
	for _, k := range []string{"pmirank", "srcid"} {
		if s, ok := m.Get(k); ok {
			r, err := strconv.Atoi(s)
			if err != nil {
				out.add(c, errResp(m, name, pmiwire.RCInvalidArg, fmt.Errorf("bad %s %q", k, s)).Append(nil))
				return
			}
			if r >= 0 {
				want = r
				break
			}
		}
	}
	if want >= 0 {
		if err := c.bindLocked(want); err != nil {
			out.add(c, errResp(m, name, pmiwire.RCInvalidArg, err).Append(nil))
			return
		}
	}
	rs := c.rank
	if rs == nil {
		out.add(c, errResp(m, name, pmiwire.RCInvalidArg, errors.New("fullinit without pmirank on a connection not bound to a rank")).Append(nil))
		return
	}
	if j, ok := m.Get("pmijobid"); ok && j != a.cfg.JobID {
		a.log.Debug("fullinit names another job id", "rank", rs.global, "pmijobid", j)
	}
	r := resp(m, name).AddInt("pmi-version", 2).AddInt("pmi-subversion", 0).
		AddInt("rank", rs.global).AddInt("size", a.cfg.Size).AddInt("appnum", rs.appnum).
		AddBool("debugged", false).AddBool("pmiverbose", false)
	// Announce fastpmi's extensions (fastpmi-allgather, put hints, waiting
	// gets) to clients that look for them; other clients ignore the field.
	r.Add("fastpmi", "1")
	if a.cfg.SpawnerJobID != "" {
		r.Add("spawner-jobid", a.cfg.SpawnerJobID)
	}
	out.add(c, r.Append(nil))
	c.noteInitLocked(events)
}

// cmdBarrier serves PMI-1 barrier_in, with PMI-1.2 groups:
// WORLD:<tag>, NODE:<tag> or r1,r2,...:<tag>.
func (c *textConn) cmdBarrier(out *outbox, m *pmiwire.Msg, rs *rankState, name string) {
	a := c.a
	group, hasGroup := m.Get("group")
	tag := ""
	kind := "WORLD"
	if hasGroup {
		i := strings.LastIndexByte(group, ':')
		if i < 0 {
			out.add(c, errResp(m, name, pmiwire.RCInvalidArg, fmt.Errorf("bad barrier group %q (want <group>:<tag>)", group)).Append(nil))
			return
		}
		kind, tag = group[:i], group[i+1:]
	}
	reply := func(err error, _ string) []byte {
		if err != nil {
			r := errResp(m, name, pmiwire.RCFail, err)
			if tag != "" {
				r.Add("tag", tag)
			}
			return r.Append(nil)
		}
		r := resp(m, name)
		if tag != "" {
			r.Add("tag", tag)
		}
		return r.Append(nil)
	}
	d := deferred{c: c, reply: reply}
	switch kind {
	case "WORLD":
		a.enterEpochLocked(out, rs, kindFence, nil, func(out *outbox, err error, _ *epochColl) { out.complete(d, err, "") })
	case "NODE":
		a.enterGroupLocked(out, rs, group, nil, d)
	default:
		members := make(map[*rankState]bool)
		for _, f := range strings.Split(kind, ",") {
			r, err := strconv.Atoi(f)
			if err != nil || r < 0 || r >= a.cfg.Size {
				out.add(c, reply(fmt.Errorf("bad rank %q in barrier group", f), ""))
				return
			}
			p := a.byGlobal[r]
			if p == nil {
				out.add(c, reply(fmt.Errorf("barrier group with rank %d on another node is not supported", r), ""))
				return
			}
			members[p] = true
		}
		a.enterGroupLocked(out, rs, group, members, d)
	}
}

func (c *textConn) cmdRing(out *outbox, m *pmiwire.Msg, rs *rankState, name string) {
	cs, _ := m.Get("ring-count")
	n, err := strconv.Atoi(cs)
	if err != nil || n < 0 {
		out.add(c, errResp(m, name, pmiwire.RCInvalidArg, fmt.Errorf("bad ring-count %q", cs)).Append(nil))
		return
	}
	left, _ := m.Get("ring-left")
	right, _ := m.Get("ring-right")
	if len(left) > pmiwire.ValLenMax || len(right) > pmiwire.ValLenMax {
		out.add(c, errResp(m, name, pmiwire.RCInvalidValLength, fmt.Errorf("ring value longer than %d bytes", pmiwire.ValLenMax)).Append(nil))
		return
	}
	done := func(out *outbox, err error, r ringReply) {
		if err != nil {
			out.add(c, errResp(m, name, pmiwire.RCFail, err).Append(nil))
			return
		}
		out.add(c, resp(m, name).AddInt("ring-count", r.Pos).Add("ring-left", r.Left).Add("ring-right", r.Right).Append(nil))
	}
	c.a.enterRingLocked(out, rs, RingIn{Count: n, Left: left, Right: right}, done)
}

func (c *textConn) cmdPutNodeAttr(out *outbox, m *pmiwire.Msg, name string) {
	a := c.a
	key, _ := m.Get("key")
	val, _ := m.Get("value")
	switch {
	case key == "" || len(key) > pmiwire.KeyLenMax:
		out.add(c, errResp(m, name, pmiwire.RCInvalidKey, fmt.Errorf("bad node attribute key %q", key)).Append(nil))
		return
	case len(val) > pmiwire.ValLenMax:
		out.add(c, errResp(m, name, pmiwire.RCInvalidValLength, fmt.Errorf("value longer than %d bytes", pmiwire.ValLenMax)).Append(nil))
		return
	}
	a.nodeAttr[key] = val
	a.releaseLocked(out, "attr:"+key, val)
	out.add(c, resp(m, name).Append(nil))
}

func (c *textConn) cmdGetNodeAttr(out *outbox, m *pmiwire.Msg, name string) {
	a := c.a
	key, _ := m.Get("key")
	wait, _ := m.Get("wait")
	reply := func(err error, v string) []byte {
		if err != nil {
			return errResp(m, name, pmiwire.RCFail, err).Append(nil)
		}
		return resp(m, name).AddBool("found", true).Add("value", v).Append(nil)
	}
	if v, ok := a.nodeAttr[key]; ok {
		out.add(c, reply(nil, v))
		return
	}
	if wait != "TRUE" {
		out.add(c, resp(m, name).AddBool("found", false).Append(nil))
		return
	}
	a.parkLocked(out, c.rank, "attr:"+key, deferred{c: c, reply: reply})
}

func (c *textConn) cmdAbort(events *[]func(), m *pmiwire.Msg, rs *rankState) {
	a := c.a
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
		a.log.Info("rank aborts itself", "rank", rs.global, "msg", msg)
		return
	}
	g := rs.global
	*events = append(*events, func() { a.cfg.Events.Abort(g, code, msg) })
}

func (c *textConn) cmdFinalize(out *outbox, events *[]func(), m *pmiwire.Msg, rs *rankState, name string) {
	a := c.a
	if !rs.finalized {
		rs.finalized = true
		a.peerGoneLocked(out, rs, "finalized")
		if a.rec != nil {
			a.rec.Mark(perf.PhaseFinalize, rs.global)
		}
		g := rs.global
		*events = append(*events, func() { a.cfg.Events.RankFinalized(g) })
	}
	out.add(c, resp(m, name).Append(nil))
}

func (c *textConn) cmdSpawn(out *outbox, m *pmiwire.Msg, name string) {
	sp, err := pmiwire.ParseSpawn(m)
	if err != nil {
		out.add(c, errResp(m, name, pmiwire.RCInvalidArg, err).Append(nil))
		return
	}
	n := 0
	for _, cmd := range sp.Cmds {
		n += cmd.MaxProcs
	}
	out.add(c, errResp(m, name, pmiwire.RCFail,
		fmt.Errorf("spawn of %d processes (%d commands) refused: this fastpmi version does not support spawn yet", n, len(sp.Cmds))).Append(nil))
}

// cmdName serves the name service: PMI-1 publish_name, unpublish_name and
// lookup_name, PMI-2 name-publish, name-unpublish and name-lookup. The
// rank is answered once the Upstream has (names.go).
func (c *textConn) cmdName(out *outbox, m *pmiwire.Msg, name string) {
	v2 := strings.HasPrefix(m.Cmd, "name-")
	field := "service"
	if v2 {
		field = "name"
	}
	var req nameReq
	req.name, _ = m.Get(field)
	switch m.Cmd {
	case "publish_name", "name-publish":
		req.op = namePublish
		req.port, _ = m.Get("port")
		if req.name == "" || req.port == "" {
			out.add(c, errResp(m, name, pmiwire.RCInvalidArg, fmt.Errorf("%s needs %s and port", m.Cmd, field)).Append(nil))
			return
		}
	case "unpublish_name", "name-unpublish":
		req.op = nameUnpublish
	default:
		req.op = nameLookup
	}
	c.a.nameLocked(out, req, func(out *outbox, port string, err error) {
		if err != nil {
			out.add(c, errResp(m, name, pmiwire.RCFail, err).Append(nil))
			return
		}
		r := resp(m, name)
		if req.op == nameLookup {
			if v2 {
				r.Add("value", port) // Slurm's client reads value, MPICH's reads port: send both.
			}
			r.Add("port", port)
		}
		out.add(c, r.Append(nil))
	})
}

// cmdAllgather serves fastpmi's PMI-2 extension "fastpmi-allgather": the
// caller contributes value and receives every rank's value as v<rank>
// fields, so ranks on the text protocol join the same allgather as ranks on
// shared memory. Values travel with ';' doubled (pmiwire's escape).
func (c *textConn) cmdAllgather(out *outbox, m *pmiwire.Msg, rs *rankState, name string) {
	val, _ := m.Get("value")
	if len(val) > pmiwire.ValLenMax {
		out.add(c, errResp(m, name, pmiwire.RCInvalidValLength, fmt.Errorf("value longer than %d bytes", pmiwire.ValLenMax)).Append(nil))
		return
	}
	c.a.enterEpochLocked(out, rs, kindAllgather, []byte(val), func(out *outbox, err error, ec *epochColl) {
		if err != nil {
			out.add(c, errResp(m, name, pmiwire.RCFail, err).Append(nil))
			return
		}
		r := resp(m, name).Add("epoch", strconv.FormatUint(ec.epoch, 10)).AddInt("size", len(ec.values))
		for i, v := range ec.values {
			r.Add("v"+strconv.Itoa(i), string(v))
		}
		out.add(c, r.Append(nil))
	})
}
