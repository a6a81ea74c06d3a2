package pmix

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/fastpmi/fastpmi/agent"
)

// ErrNotSupported is returned by NewJob from a build without the pmix tag.
var ErrNotSupported = errors.New("pmix: built without PMIx support (build with -tags pmix and OpenPMIx's libpmix-dev; docs/pmix.md)")

// errNotFound answers a lookup that found none of its names.
var errNotFound = errors.New("pmix: not found")

// errJobClosed refuses or fails requests once the Job is closed.
var errJobClosed = errors.New("pmix: job ended")

// Config is one job's share of a node, as PMIx needs it.
type Config struct {
	Agent  *agent.Agent // the node's agent; the Job attaches to it as its external front end
	Nspace string       // the job's PMIx namespace (its job id)
	Size   int          // ranks in the job
	Usize  int          // universe size; < Size (unlimited) is given as Size
	Nodes  [][]int      // global ranks of each node, local order
	Index  int          // this node's index in Nodes
	// Hostname names this node to the ranks; other nodes are named
	// "fastpmi-node<i>".
	Hostname string
	// Appnum gives each global rank's application number (MPMD index);
	// nil means 0 for all.
	Appnum []int
	Logger *slog.Logger
}

func (c *Config) validate() error {
	if c.Agent == nil {
		return errors.New("pmix config: no agent")
	}
	if c.Nspace == "" || len(c.Nspace) > nspaceMax {
		return fmt.Errorf("pmix config: namespace %q: want 1..%d bytes", c.Nspace, nspaceMax)
	}
	if c.Size < 1 || c.Index < 0 || c.Index >= len(c.Nodes) || len(c.Nodes[c.Index]) == 0 {
		return fmt.Errorf("pmix config: node %d of %d nodes, job of %d ranks", c.Index, len(c.Nodes), c.Size)
	}
	seen := 0
	for _, n := range c.Nodes {
		for _, r := range n {
			if r < 0 || r >= c.Size {
				return fmt.Errorf("pmix config: rank %d outside a job of %d", r, c.Size)
			}
			seen++
		}
	}
	if seen != c.Size {
		return fmt.Errorf("pmix config: nodes hold %d ranks, the job has %d", seen, c.Size)
	}
	if c.Appnum != nil && len(c.Appnum) != c.Size {
		return fmt.Errorf("pmix config: %d appnums for %d ranks", len(c.Appnum), c.Size)
	}
	if c.Usize < c.Size {
		c.Usize = c.Size
	}
	if c.Hostname == "" {
		c.Hostname = nodeName(c.Index)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// nspaceMax is PMIX_MAX_NSLEN.
const nspaceMax = 255

func nodeName(i int) string { return fmt.Sprintf("fastpmi-node%d", i) }

// reqKind is the kind of a request the server library handed over.
type reqKind uint8

const (
	reqConnected reqKind = iota + 1
	reqFinalized
	reqAbort
	reqFence
	reqPublish
	reqLookup
	reqUnpublish
)

// request is one host callback of the server library, copied out of C.
type request struct {
	kind reqKind
	rank int      // the calling rank (global); fences: none
	code int      // abort
	msg  string   // abort
	data []byte   // fence: the node's collected data
	strs []string // publish: key, value, ...; lookup, unpublish: keys
	// done completes the request in C (calls its PMIx callback); called
	// exactly once, from any goroutine, never under the Job's locks.
	done func(result)
}

// result completes a request.
type result struct {
	err   error
	data  []byte   // fence: every node's collected data
	found []string // lookup: key, value, ... of the names found
}

// pending is a request waiting for the agent's replies.
type pending struct {
	req   *request
	left  int // replies still to come
	err   error
	found []string
}

// slot is one agent request of a pending request: a fence's, or one
// key's of a name request (key indexes its key in req.strs).
type slot struct {
	p   *pending
	key int
}

// Job is one job's PMIx front end on one node: it turns the server
// library's host callbacks for the job's namespace into agent operations
// and completes them from the agent's replies.
//
// Model. Host callbacks run on PMIx's progress thread; each copies its
// request, queues it here and returns (enqueue never blocks). One worker
// goroutine, owned by the Job, steps the agent with the queued requests
// in order (Agent.StepExternal). Replies come back on whatever goroutine
// the agent's turn runs (the worker's, or an Upstream completion's) to
// reply, which matches them to pending requests by Req.ID and completes
// each once its last reply is in.
type Job struct {
	cfg   Config
	local []int // global ranks of this node, local order

	mu sync.Mutex
	// Guarded by mu.
	queue   []*request
	closed  bool
	pending map[uint64]slot // by the ID of their agent requests' Req
	nextID  uint64

	wake chan struct{} // one token: the queue has work, or closed is set
	done chan struct{} // closed when the worker has returned
}

// registry maps namespaces to their Jobs, for the host callbacks.
var registry struct {
	mu   sync.Mutex
	jobs map[string]*Job
	refs int // Jobs holding the server (serverAcquire)
}

// NewJob registers cfg's job with the process's PMIx server (starting it
// for the first job), attaches its front end to the agent, and starts
// serving. Env gives each local rank its PMIx environment; Close ends it.
func NewJob(cfg Config) (*Job, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	j := &Job{
		cfg: cfg, local: cfg.Nodes[cfg.Index],
		pending: make(map[uint64]slot),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	registry.mu.Lock()
	if registry.jobs[cfg.Nspace] != nil {
		registry.mu.Unlock()
		return nil, fmt.Errorf("pmix: namespace %q is already served by this process", cfg.Nspace)
	}
	if err := serverAcquire(); err != nil {
		registry.mu.Unlock()
		return nil, err
	}
	if registry.jobs == nil {
		registry.jobs = make(map[string]*Job)
	}
	registry.jobs[cfg.Nspace] = j
	registry.mu.Unlock()
	if err := cfg.Agent.AttachExternal(j.reply); err != nil {
		j.unregister()
		return nil, fmt.Errorf("pmix: %w", err)
	}
	if err := registerNspace(&cfg); err != nil {
		j.unregister()
		return nil, fmt.Errorf("pmix: register namespace %s: %w", cfg.Nspace, err)
	}
	go j.run()
	return j, nil
}

// unregister takes j out of the registry and releases the server.
func (j *Job) unregister() {
	registry.mu.Lock()
	delete(registry.jobs, j.cfg.Nspace)
	serverRelease()
	registry.mu.Unlock()
}

// Env registers local rank i with the server and returns the variables
// its process needs to reach it (PMIX_NAMESPACE, PMIX_RANK,
// PMIX_SERVER_URI*, ...), to add to its environment before it is forked.
func (j *Job) Env(i int) ([]string, error) {
	if i < 0 || i >= len(j.local) {
		return nil, fmt.Errorf("pmix: local rank %d of %d", i, len(j.local))
	}
	env, err := clientEnv(j.cfg.Nspace, j.local[i])
	if err != nil {
		return nil, fmt.Errorf("pmix: set up rank %d: %w", j.local[i], err)
	}
	return env, nil
}

// Close stops serving: requests still queued or waiting for the agent
// fail, later ones are refused, and the namespace is deregistered. It
// waits for the worker and is idempotent.
func (j *Job) Close() {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		<-j.done
		return
	}
	j.closed = true
	j.mu.Unlock()
	j.signal()
	<-j.done
	registry.mu.Lock()
	delete(registry.jobs, j.cfg.Nspace)
	registry.mu.Unlock()
	deregisterNspace(j.cfg.Nspace)
	registry.mu.Lock()
	serverRelease()
	registry.mu.Unlock()
}

func (j *Job) signal() {
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// run is the worker: it serves the queue until Close, then fails what is
// left.
func (j *Job) run() {
	defer close(j.done)
	for range j.wake {
		j.mu.Lock()
		q, closed := j.queue, j.closed
		j.queue = nil
		j.mu.Unlock()
		if closed {
			err := errJobClosed
			for _, r := range q {
				r.done(result{err: err})
			}
			j.mu.Lock()
			var left []*pending
			for _, id := range slices.Sorted(maps.Keys(j.pending)) {
				if p := j.pending[id].p; !slices.Contains(left, p) {
					left = append(left, p)
				}
				delete(j.pending, id)
			}
			j.mu.Unlock()
			for _, p := range left {
				p.req.done(result{err: err})
			}
			return
		}
		for _, r := range q {
			j.serve(r)
		}
	}
}

// expect records r as waiting for n replies and returns the Req of
// each (the i-th for key i of a name request).
func (j *Job) expect(r *request, n int) []agent.Req {
	j.mu.Lock()
	defer j.mu.Unlock()
	p := &pending{req: r, left: n}
	reqs := make([]agent.Req, n)
	for i := range reqs {
		j.nextID++
		j.pending[j.nextID] = slot{p: p, key: i}
		reqs[i] = agent.Req{Via: agent.ViaExternal, ID: j.nextID}
	}
	return reqs
}

// drop forgets a pending request whose operations the agent refused and
// completes it with err, unless a reply already did.
func (j *Job) drop(reqs []agent.Req, err error) {
	j.mu.Lock()
	var p *pending
	for _, rq := range reqs {
		if s, ok := j.pending[rq.ID]; ok {
			p = s.p
			delete(j.pending, rq.ID)
		}
	}
	j.mu.Unlock()
	if p != nil {
		p.req.done(result{err: err})
	}
}

// serve steps the agent with one request.
func (j *Job) serve(r *request) {
	a := j.cfg.Agent
	if r.kind == reqFence {
		j.fence(r)
		return
	}
	l := a.LocalIndex(r.rank)
	if l < 0 {
		r.done(result{err: fmt.Errorf("pmix: rank %d is not served on this node", r.rank)})
		return
	}
	var err error
	switch r.kind {
	case reqConnected:
		err = a.StepExternal(agent.Init{Local: l})
	case reqFinalized:
		err = a.StepExternal(agent.Finalize{Local: l, Req: agent.Req{Via: agent.ViaExternal}})
	case reqAbort:
		msg := r.msg
		if len(msg) > maxAbortMsg {
			msg = msg[:maxAbortMsg]
		}
		err = a.StepExternal(agent.Abort{Local: l, Code: r.code, Msg: msg})
	case reqPublish, reqLookup, reqUnpublish:
		j.names(r, l)
		return
	}
	r.done(result{err: err})
}

// maxAbortMsg bounds an abort message passed on to the launcher.
const maxAbortMsg = 1024

// fence enters every local rank in the agent's next allgather epoch, the
// first carrying the node's collected data: the job-wide result, every
// node's data concatenated in rank order, is what the server library
// expects back. A fence without data is the same allgather with empty
// values, so every node takes the same path whatever it collected.
func (j *Job) fence(r *request) {
	reqs := j.expect(r, 1) // the first local rank's reply completes it
	ops := make([]agent.Op, len(j.local))
	for i := range j.local {
		var v []byte
		if i == 0 {
			v = r.data
		}
		ops[i] = agent.Allgather{Local: i, Req: reqs[0], Value: v}
	}
	if err := j.cfg.Agent.StepExternal(ops...); err != nil {
		j.drop(reqs, err)
	}
}

// names serves publish, lookup and unpublish as one agent name operation
// per key, completed once all are answered.
func (j *Job) names(r *request, l int) {
	var ops []agent.Op
	var reqs []agent.Req
	for i := 0; i < len(r.strs); i++ {
		name, port := r.strs[i], ""
		if r.kind == reqPublish && i+1 < len(r.strs) {
			port = r.strs[i+1]
			i++
		}
		if err := agent.CheckName(name, port); err != nil {
			r.done(result{err: fmt.Errorf("pmix: %w", err)})
			return
		}
	}
	switch r.kind {
	case reqPublish:
		if len(r.strs)%2 != 0 {
			r.done(result{err: errors.New("pmix: publish: odd key/value list")})
			return
		}
		reqs = j.expect(r, len(r.strs)/2)
		for i, rq := range reqs {
			ops = append(ops, agent.Name{Local: l, Req: rq, Op: agent.NamePublish, Name: r.strs[2*i], Port: r.strs[2*i+1]})
		}
	case reqLookup, reqUnpublish:
		op := agent.NameLookup
		if r.kind == reqUnpublish {
			op = agent.NameUnpublish
		}
		reqs = j.expect(r, len(r.strs))
		for i, rq := range reqs {
			ops = append(ops, agent.Name{Local: l, Req: rq, Op: op, Name: r.strs[i]})
		}
	}
	if err := j.cfg.Agent.StepExternal(ops...); err != nil {
		j.drop(reqs, err)
	}
}

// reply is the agent's external front end (Agent.AttachExternal): it
// completes a request once its last reply is in.
func (j *Job) reply(rp agent.Reply) {
	j.mu.Lock()
	s, ok := j.pending[rp.Req.ID]
	p := s.p
	if !ok || (rp.Kind == agent.ReplyAllgather && rp.Local != 0) {
		j.mu.Unlock()
		return // a finalize's, a fence's other ranks', or one failed at Close
	}
	var res result
	switch rp.Kind {
	case agent.ReplyAllgather:
		delete(j.pending, rp.Req.ID)
		j.mu.Unlock()
		res.err = rp.Err
		if rp.Err == nil {
			for _, v := range rp.Values {
				res.data = append(res.data, v...) // a copy: Values are views
			}
		}
		p.req.done(res)
		return
	case agent.ReplyName:
		if rp.Err != nil && p.err == nil && p.req.kind != reqLookup {
			p.err = rp.Err // a lookup's failed names are names not found
		}
		delete(j.pending, rp.Req.ID)
		if p.req.kind == reqLookup && rp.Err == nil && rp.Found {
			p.found = append(p.found, p.req.strs[s.key], rp.Val)
		}
		p.left--
		if p.left > 0 {
			j.mu.Unlock()
			return
		}
	default:
		delete(j.pending, rp.Req.ID)
	}
	j.mu.Unlock()
	res.err, res.found = p.err, p.found
	if p.req.kind == reqLookup && res.err == nil && len(res.found) == 0 {
		res.err = errNotFound
	}
	p.req.done(res)
}
