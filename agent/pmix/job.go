package pmix

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/pmiwire"
)

// ErrNotSupported is returned by NewJob from a build without the pmix tag.
var ErrNotSupported = errors.New("pmix: built without PMIx support (build with -tags pmix and OpenPMIx's libpmix-dev; docs/pmix.md)")

// errNotFound answers a lookup that found none of its names.
var errNotFound = errors.New("pmix: not found")

// errJobClosed refuses or fails requests once the Job is closed.
var errJobClosed = errors.New("pmix: job ended")

// errTimeout fails a direct modex or a collective (a fence, a connect or
// disconnect) whose PMIX_TIMEOUT passed.
var errTimeout = errors.New("pmix: timed out")

// Config is one job's share of a node, as PMIx needs it.
type Config struct {
	Agent  *agent.Agent // the node's agent; the Job attaches to it as its external front end
	Nspace string       // the job's PMIx namespace (its job id)
	Size   int          // ranks in the job
	Usize  int          // universe size; < Size (unlimited) is given as Size
	Nodes  [][]int      // global ranks of each node, local order
	Index  int          // this node's index in Nodes
	// Hosts names each node of Nodes to the ranks (PMIX_HOSTNAME, the
	// node map), the same on every node; nil names them
	// "fastpmi-node<i>".
	Hosts []string
	// Appnum gives each global rank's application number (MPMD index);
	// nil means 0 for all.
	Appnum []int
	// Parent, for a job started by a spawn, is the rank that spawned it
	// (PMIX_SPAWNED, and PMIX_PARENT_ID of every rank); nil otherwise.
	Parent *Proc
	Logger *slog.Logger
}

// Proc names one rank of a namespace (pmix_proc_t).
type Proc struct {
	Nspace string
	Rank   int
}

func (c *Config) validate() error {
	if c.Agent == nil {
		return errors.New("pmix config: no agent")
	}
	if c.Nspace == "" || len(c.Nspace) > nspaceMax {
		return fmt.Errorf("pmix config: namespace %q: want 1..%d bytes", c.Nspace, nspaceMax)
	}
	if p := c.Parent; p != nil && (p.Nspace == "" || len(p.Nspace) > nspaceMax || p.Rank < 0) {
		return fmt.Errorf("pmix config: parent %q rank %d", p.Nspace, p.Rank)
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
	if c.Hosts == nil {
		c.Hosts = make([]string, len(c.Nodes))
		for i := range c.Hosts {
			c.Hosts[i] = nodeName(i)
		}
	}
	if err := agent.CheckHosts(c.Hosts, len(c.Nodes)); err != nil {
		return fmt.Errorf("pmix config: %w", err)
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
	reqDmodex // a client's get of another node's rank: its data (rank), within timeout
	reqSpawn  // a client's spawn: the new job (spawn)
	reqEnd    // the job ends for rank (msg): its spawn failed, which its peers cannot learn (reply)
	reqJobs   // a fence (data), connect or disconnect over ranks of several jobs (jobs)
	// The launcher's answer to where a job with no rank here runs (job;
	// layout, or err), which registers its namespace (foreignLayout).
	reqForeignLayout
	// The agent's side of a direct modex on the rank's node (rank data):
	reqAsk      // the agent asks for local rank's data (id)
	reqRankData // the server library's answer to reqAsk id, or a marker's (rank -1)
)

// request is one host callback of the server library, copied out of C,
// or one of the agent's requests for rank data and the library's answer.
type request struct {
	kind reqKind
	rank int      // the calling rank (global); fences: none; direct modex, ask: the rank whose data
	code int      // abort
	msg  string   // abort
	data []byte   // fence: the node's collected data; rank data: the rank's
	strs []string // publish: key, value, ...; lookup, unpublish: keys
	// Direct modex, collectives: how long the client waits
	// (PMIX_TIMEOUT), 0 for ever.
	// Lookup: how long it waits for its names to be published (PMIX_WAIT),
	// 0 answering at once.
	timeout time.Duration
	once    bool           // publish: the names go at their first lookup (PMIX_PERSIST_FIRST_READ)
	spawn   *pmiwire.Spawn // spawn: the apps
	job     string         // direct modex: the rank's job, when another than the Job's (rank -1: its job data)
	jobs    agent.JobsColl // collective across jobs: its kind and participants (Local, Req and Data set at serve)
	layout  *agent.Layout  // where another job runs (reqForeignLayout)
	// Ask, rank data: the agent's request id, or a marker's sequence
	// number (rank -1); the library's answer: found, or its error.
	id    uint64
	found bool
	err   error
	// done completes the request in C (calls its PMIx callback); called
	// exactly once, from any goroutine, never under the Job's locks.
	done func(result)
}

// result completes a request.
type result struct {
	err    error
	data   []byte        // fence: every node's collected data
	found  []string      // lookup: key, value, ... of the names found
	nspace string        // spawn: the new job's namespace (its job id)
	layout *agent.Layout // where another job runs
}

// pending is a request waiting for the agent's replies.
type pending struct {
	req   *request
	left  int // replies still to come
	err   error
	found []string
	// deadline fails a direct modex or a collective with errTimeout if
	// no reply came by then; zero for ever.
	deadline time.Time
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

	// eventSaid is set once the job's log said that a rank's PMIx event
	// does not reach the job's other nodes (fpxNotifyEvent).
	eventSaid atomic.Bool
	// dmodexSaid is set once the job's log said why a direct modex
	// failed (reply); layoutSaid, why where another job runs is not
	// known (foreignLayout); foreignSaid, that a client asked for more
	// other jobs than maxForeign (foreignReady).
	// namesSaid, why a publish or unpublish failed (sayNames).
	// jobsSaid, why a collective across jobs failed (reply).
	dmodexSaid, layoutSaid, foreignSaid, namesSaid, jobsSaid atomic.Bool

	wake chan struct{} // one token: the queue has work, or closed is set
	done chan struct{} // closed when the worker has returned

	// Worker only: the agent's requests for rank data the server library
	// has not answered yet, by the agent's id; the local ranks whose
	// client finalized (every commit of theirs is in the library); the
	// number of requests made to the library so far.
	asks      map[uint64]ask
	finalized map[int]bool
	libSeq    uint64
}

// ask is one of the agent's requests for rank data, made to the server
// library as its request number seq.
type ask struct {
	rank int
	seq  uint64
}

// registry maps namespaces to their Jobs, for the host callbacks.
var registry struct {
	mu   sync.Mutex
	jobs map[string]*Job
	refs int // Jobs holding the server (serverAcquire)
	// foreign are the namespaces of other jobs of a run, with no rank
	// here, registered with the server library as such (foreignReady).
	foreign map[string]*foreign
}

// foreign is a namespace of another job of a run with no rank on this
// node. A direct modex for a namespace the server library does not know
// makes it record the namespace as one whose clients are not registered
// yet, and a fence or disconnect naming it would then wait for ever for
// them; and a client's PMIx_Get of its job data (PMIX_JOB_SIZE, the node
// map, a rank's PMIX_HOSTNAME) finds nothing. So the first direct modex
// naming it asks the launcher where the job runs (agent.JobLayout),
// registers the namespace so and without local clients, and the requests
// wait for that.
type foreign struct {
	owner   *Job       // the Job that registers it, and deregisters it at its Close
	ready   bool       // registered
	waiting []*request // direct modex requests waiting for the registration
	takers  []*Job     // the Job that took each (serves it once ready)
}

// foreignReady reports whether r's namespace (r.job) is known to the
// server library; if not, r waits for its registration, which the first
// such request starts. On j's worker.
func (j *Job) foreignReady(r *request) bool {
	registry.mu.Lock()
	if registry.jobs[r.job] != nil {
		registry.mu.Unlock()
		return true
	}
	if f := registry.foreign[r.job]; f != nil {
		if !f.ready {
			f.waiting, f.takers = append(f.waiting, r), append(f.takers, j)
		}
		registry.mu.Unlock()
		return f.ready
	}
	if len(registry.foreign) >= maxForeign {
		registry.mu.Unlock()
		err := fmt.Errorf("pmix: namespace %s: %w (%d registered, the most a node holds)", r.job, errForeignFull, maxForeign)
		if j.foreignSaid.CompareAndSwap(false, true) {
			j.cfg.Logger.Warn("pmix: a client asked for another job's data", "rank", r.rank, "err", err)
		}
		r.done(result{err: err})
		return false
	}
	if registry.foreign == nil {
		registry.foreign = make(map[string]*foreign)
	}
	registry.foreign[r.job] = &foreign{owner: j, waiting: []*request{r}, takers: []*Job{j}}
	registry.mu.Unlock()
	ask := &request{kind: reqForeignLayout, job: r.job}
	ask.done = func(res result) {
		j.enqueueInternal(&request{kind: reqForeignLayout, job: ask.job, layout: res.layout, err: res.err})
	}
	reqs := j.expect(ask, 1)
	if err := j.cfg.Agent.StepExternal(agent.JobLayout{Req: reqs[0], Job: r.job}); err != nil {
		j.drop(reqs, err)
	}
	return false
}

// maxForeign bounds the namespaces of other jobs registered with the
// process's server library (registry.foreign), each kept until the Job
// that registered it ends: a client that asks for the data of one made-up
// namespace after another (a loop over garbage names) registered every
// one, some 30 KiB of the library's each, growing the agent (and in a
// daemon, every job's agent) without bound. No run needs as many.
var maxForeign = 1024

// errForeignFull refuses a namespace of another job past maxForeign.
var errForeignFull = errors.New("too many other jobs' namespaces asked for on this node")

// foreignLayout registers namespace r.job as the launcher laid it out
// (r.layout; if it could not say, the namespace is registered without job
// data, so that what names it does not wait for its clients), and serves
// the requests that waited for it. On j's worker.
func (j *Job) foreignLayout(r *request) {
	l := r.layout
	if r.err != nil {
		if j.layoutSaid.CompareAndSwap(false, true) { // once a job: a client may ask for many
			j.cfg.Logger.Warn("pmix: where another job runs", "nspace", r.job, "err", r.err)
		}
		l = &agent.Layout{}
	}
	if err := registerForeign(r.job, l); err != nil {
		j.cfg.Logger.Warn("pmix: register another job's namespace", "nspace", r.job, "err", err)
	}
	registry.mu.Lock()
	f := registry.foreign[r.job]
	if f == nil { // its Job closed meanwhile, failing the waiters
		registry.mu.Unlock()
		return
	}
	f.ready = true
	waiting, takers := f.waiting, f.takers
	f.waiting, f.takers = nil, nil
	registry.mu.Unlock()
	for i, w := range waiting {
		if takers[i] == j {
			j.dmodex(w)
		} else if err := takers[i].enqueue(w); err != nil {
			w.done(result{err: err})
		}
	}
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
		pending:   make(map[uint64]slot),
		wake:      make(chan struct{}, 1),
		done:      make(chan struct{}),
		asks:      make(map[uint64]ask),
		finalized: make(map[int]bool),
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
	if err := cfg.Agent.AttachExternal((*external)(j)); err != nil {
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
	var foreign []string
	var orphans []*request
	for ns, f := range registry.foreign {
		if f.owner == j {
			foreign = append(foreign, ns)
			orphans = append(orphans, f.waiting...)
			delete(registry.foreign, ns)
		}
	}
	registry.mu.Unlock()
	for _, w := range orphans {
		w.done(result{err: errJobClosed})
	}
	for _, ns := range append(foreign, j.cfg.Nspace) {
		if err := deregisterNspace(ns); err != nil {
			j.cfg.Logger.Warn("pmix: job end", "err", err)
		}
	}
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
// left. It also fails the direct modex and collective requests whose
// timeout passed.
func (j *Job) run() {
	defer close(j.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-j.wake:
		case <-timer.C:
		}
		j.mu.Lock()
		q, closed := j.queue, j.closed
		j.queue = nil
		j.mu.Unlock()
		if closed {
			err := errJobClosed
			for _, r := range q {
				r.done(result{err: err})
			}
			for _, p := range j.takePending(func(*pending) bool { return true }) {
				p.req.done(result{err: err})
			}
			return
		}
		for _, r := range q {
			j.serve(r)
		}
		now := time.Now()
		for _, p := range j.takePending(func(p *pending) bool { return !p.deadline.IsZero() && !now.Before(p.deadline) }) {
			p.req.done(result{err: errTimeout})
		}
		if next := j.nextDeadline(); !next.IsZero() {
			timer.Reset(time.Until(next))
		}
	}
}

// takePending forgets the pending requests that match and returns them,
// in the order of their first agent request.
func (j *Job) takePending(match func(*pending) bool) []*pending {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []*pending
	for _, id := range slices.Sorted(maps.Keys(j.pending)) {
		p := j.pending[id].p
		if !match(p) {
			continue
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
		delete(j.pending, id)
	}
	return out
}

// nextDeadline is the earliest deadline of a pending request, zero if
// none has one.
func (j *Job) nextDeadline() time.Time {
	j.mu.Lock()
	defer j.mu.Unlock()
	var next time.Time
	for _, s := range j.pending {
		if d := s.p.deadline; !d.IsZero() && (next.IsZero() || d.Before(next)) {
			next = d
		}
	}
	return next
}

// expect records r as waiting for n replies and returns the Req of
// each (the i-th for key i of a name request).
func (j *Job) expect(r *request, n int) []agent.Req {
	j.mu.Lock()
	defer j.mu.Unlock()
	p := &pending{req: r, left: n}
	if r.timeout > 0 {
		p.deadline = time.Now().Add(r.timeout)
	}
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
	switch r.kind {
	case reqFence:
		j.fence(r)
		return
	case reqDmodex:
		j.dmodex(r)
		return
	case reqAsk:
		j.ask(r)
		return
	case reqRankData:
		j.rankData(r)
		return
	case reqJobs:
		j.jobsColl(r)
		return
	case reqForeignLayout:
		j.foreignLayout(r)
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
		j.finalize(r.rank)
	case reqAbort:
		msg := r.msg
		if len(msg) > maxAbortMsg {
			// Said as cut, as pmirun says of what it cuts itself: the
			// text ended at 1,024 bytes without a word.
			msg = fmt.Sprintf("%s [the first %d of %d bytes]", msg[:maxAbortMsg], maxAbortMsg, len(msg))
		}
		err = a.StepExternal(agent.Abort{Local: l, Code: r.code, Msg: msg})
	case reqEnd:
		err = a.StepExternal(agent.End{Local: l, Code: 1, Msg: r.msg})
	case reqPublish, reqLookup, reqUnpublish:
		j.names(r, l)
		return
	case reqSpawn:
		j.spawn(r, l)
		return
	}
	r.done(result{err: err})
}

// jobsColl enters this node in a collective over ranks of several jobs
// (or part of this one), which the launcher completes once every node
// hosting participants entered: the server library calls this once per
// process, after its local participants of every job, and the Job of
// one of its namespaces carries it (fpxJobsRequest). The answer is every
// node's data. One with a PMIX_TIMEOUT fails when it passes, as a fence.
func (j *Job) jobsColl(r *request) {
	reqs := j.expect(r, 1)
	o := r.jobs
	o.Local, o.Req, o.Data = 0, reqs[0], r.data
	if err := j.cfg.Agent.StepExternal(o); err != nil {
		j.drop(reqs, err)
	}
}

// spawn asks the launcher for the new job, placed as any spawn is: Open
// MPI's parent and children then connect (PMIx_Connect), which the
// server library completes by itself among its own clients and asks the
// host for across nodes (jobsColl).
func (j *Job) spawn(r *request, l int) {
	reqs := j.expect(r, 1)
	if err := j.cfg.Agent.StepExternal(agent.Spawn{Local: l, Req: reqs[0], Spawn: r.spawn}); err != nil {
		j.drop(reqs, err)
	}
}

// maxAbortMsg bounds an abort message passed on to the launcher.
const maxAbortMsg = 1024

// fence enters every local rank in the agent's next allgather epoch, the
// first carrying the node's collected data (agent.NodeAllgather): the
// job-wide result, every node's data concatenated in rank order, is what
// the server library expects back. A fence with a PMIX_TIMEOUT fails
// when it passes (run) and its late result is dropped (reply): the
// epoch stays entered, as a PMI rank's fence it stopped waiting for.
func (j *Job) fence(r *request) {
	reqs := j.expect(r, 1) // the first local rank's reply completes it
	if err := j.cfg.Agent.StepExternal(agent.NodeAllgather(len(j.local), reqs[0], r.data)...); err != nil {
		j.drop(reqs, err)
	}
}

// dmodex asks the agent for the data of r.rank, a rank of another node
// (a direct modex): the agent fetches it from that node's Job (ask),
// and the blob goes back to the server library as the rank's data.
func (j *Job) dmodex(r *request) {
	if r.job != "" {
		if !j.foreignReady(r) {
			return // served once the namespace is registered (foreignLayout)
		}
		if r.rank < 0 {
			r.done(result{}) // job data: registered with the namespace
			return
		}
		reqs := j.expect(r, 1)
		if err := j.cfg.Agent.StepExternal(agent.GetRankData{Req: reqs[0], Rank: r.rank, Job: r.job}); err != nil {
			j.drop(reqs, err)
		}
		return
	}
	if r.rank < 0 || r.rank >= j.cfg.Size {
		r.done(result{err: fmt.Errorf("pmix: direct modex of rank %d, job of %d", r.rank, j.cfg.Size)})
		return
	}
	reqs := j.expect(r, 1)
	if err := j.cfg.Agent.StepExternal(agent.GetRankData{Req: reqs[0], Rank: r.rank}); err != nil {
		j.drop(reqs, err)
	}
}

// ask hands the agent's request for local rank r.rank's data to the
// server library, which answers once the rank committed its data (at
// once if it has): rankData takes the answer. Once a rank finalized,
// every commit of its is in the library, so a request the library
// cannot answer then never will be: a marker request follows it
// (finalize).
func (j *Job) ask(r *request) {
	j.libSeq++
	j.asks[r.id] = ask{rank: r.rank, seq: j.libSeq}
	if err := rankDataRequest(j.cfg.Nspace, r.rank, r.id); err != nil {
		delete(j.asks, r.id)
		j.stepRankData(agent.RankDataDone{ID: r.id, Err: err})
		return
	}
	if j.finalized[r.rank] {
		j.mark(r.rank)
	}
}

// finalize notes that rank's client finalized, and marks its requests
// the library has not answered.
func (j *Job) finalize(rank int) {
	j.finalized[rank] = true
	for _, a := range j.asks {
		if a.rank == rank {
			j.mark(rank)
			return
		}
	}
}

// mark makes a marker request for rank: one for the namespace's job
// data, which the library answers at once, and after every request made
// before it (it runs them in order on its progress thread). When its
// answer comes, a request for rank made before it and still unanswered
// will not be: rank finalized without the data (rankData).
func (j *Job) mark(rank int) {
	j.libSeq++
	if err := rankDataRequest(j.cfg.Nspace, -1, j.libSeq<<32|uint64(rank)); err != nil {
		j.cfg.Logger.Warn("pmix: marker request", "rank", rank, "err", err)
	}
}

// rankData takes the server library's answer to an ask, or a marker's.
func (j *Job) rankData(r *request) {
	if r.rank < 0 {
		seq, rank := r.id>>32, int(r.id&0xffffffff)
		var ops []agent.Op
		for _, id := range slices.Sorted(maps.Keys(j.asks)) {
			if a := j.asks[id]; a.rank == rank && a.seq < seq {
				delete(j.asks, id)
				ops = append(ops, agent.RankDataDone{ID: id})
			}
		}
		j.stepRankData(ops...)
		return
	}
	if _, ok := j.asks[r.id]; !ok {
		return // the agent gave up on it (the rank ended)
	}
	delete(j.asks, r.id)
	j.stepRankData(agent.RankDataDone{ID: r.id, Found: r.found, Val: string(r.data), Err: r.err})
}

func (j *Job) stepRankData(ops ...agent.Op) {
	if len(ops) == 0 {
		return
	}
	if err := j.cfg.Agent.StepExternal(ops...); err != nil {
		j.cfg.Logger.Warn("pmix: rank data", "err", err)
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
			err = fmt.Errorf("pmix: %w", err)
			j.sayNames(r, err)
			r.done(result{err: err})
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
			ops = append(ops, agent.Name{Local: l, Req: rq, Op: agent.NamePublish, Name: r.strs[2*i], Port: r.strs[2*i+1], Once: r.once})
		}
	case reqLookup, reqUnpublish:
		op := agent.NameLookup
		if r.kind == reqUnpublish {
			op = agent.NameUnpublish
		}
		// A waiting lookup's timeout is the name service's, not the
		// Job's: expect sets no deadline for it.
		wait := r.timeout
		r.timeout = 0
		reqs = j.expect(r, len(r.strs))
		for i, rq := range reqs {
			ops = append(ops, agent.Name{Local: l, Req: rq, Op: op, Name: r.strs[i], Wait: wait})
		}
	}
	if err := j.cfg.Agent.StepExternal(ops...); err != nil {
		j.drop(reqs, err)
	}
}

// external is the Job as the agent's external front end
// (Agent.AttachExternal).
type external Job

// Reply completes a request once its last reply is in.
func (e *external) Reply(rp agent.Reply) { (*Job)(e).reply(rp) }

// AskRankData queues the agent's request for a local rank's data for the
// worker (ask). A closed Job drops it: the agent fails it as it closes.
func (e *external) AskRankData(id uint64, rank int) {
	(*Job)(e).enqueueInternal(&request{kind: reqAsk, rank: rank, id: id})
}

// reply completes a request once its last reply is in.
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
		res.data, _ = agent.NodeData(rp)
		res.err = rp.Err
		p.req.done(res)
		return
	case agent.ReplyGet: // a direct modex's
		delete(j.pending, rp.Req.ID)
		j.mu.Unlock()
		switch {
		case rp.Err != nil:
			res.err = rp.Err
			// The client sees only PMIX_ERROR: the reason (the data
			// over its bound, the rank's node gone) is said here,
			// once a job, as a rank may ask for every peer's.
			if j.dmodexSaid.CompareAndSwap(false, true) {
				j.cfg.Logger.Warn("pmix: a client's get of a rank's data failed", "rank", p.req.rank, "err", rp.Err)
			}
		case !rp.Found:
			res.err = errNotFound
		default:
			res.data = []byte(rp.Val)
		}
		p.req.done(res)
		return
	case agent.ReplySpawn:
		delete(j.pending, rp.Req.ID)
		j.mu.Unlock()
		p.req.done(result{err: rp.Err, nspace: rp.Val})
		if rp.Err != nil && j.cfg.Size > 1 {
			// Open MPI 4.1's other ranks wait in MPI_Comm_spawn for the
			// outcome, which its root shares only when the spawn
			// succeeded: they would wait for ever. End the job, as
			// mpirun does; a parent of one rank keeps its error return.
			j.enqueueInternal(&request{kind: reqEnd, rank: p.req.rank, msg: fmt.Sprintf(
				"its spawn failed (%v), which Open MPI's other ranks of the job cannot learn: the job ends, as under mpirun", rp.Err)})
		}
		return
	case agent.ReplyJobs: // a collective across jobs
		delete(j.pending, rp.Req.ID)
		j.mu.Unlock()
		// The clients see only PMIX_ERROR: why the launcher refused it
		// (a job not running, a rank outside its job) is said here,
		// once a job.
		if rp.Err != nil && j.jobsSaid.CompareAndSwap(false, true) {
			j.cfg.Logger.Warn("pmix: a collective across jobs (a fence over part of a job or other jobs, connect, disconnect) failed",
				"err", rp.Err)
		}
		p.req.done(result{err: rp.Err, data: []byte(rp.Val)})
		return
	case agent.ReplyLayout: // where another job runs
		delete(j.pending, rp.Req.ID)
		j.mu.Unlock()
		p.req.done(result{err: rp.Err, layout: rp.Layout})
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
	if p.req.kind == reqPublish || p.req.kind == reqUnpublish {
		j.sayNames(p.req, res.err)
	}
	p.req.done(res)
}

// sayNames says on the job's log, once a job, why a publish or an
// unpublish failed: the client sees only PMIX_ERROR, where a PMI-2 rank
// is told why (the names quota, a name too long, ...).
func (j *Job) sayNames(r *request, err error) {
	if err != nil && j.namesSaid.CompareAndSwap(false, true) {
		op := map[reqKind]string{reqPublish: "publish", reqLookup: "lookup", reqUnpublish: "unpublish"}[r.kind]
		j.cfg.Logger.Warn("pmix: a client's "+op+" failed", "rank", r.rank, "err", err)
	}
}

// maxQueued bounds the requests waiting for the worker: the ranks'
// requests arrive as fast as they can send them, the worker serves them
// one agent turn each.
const maxQueued = 1 << 16

// errQueueFull refuses a request when maxQueued wait.
var errQueueFull = fmt.Errorf("pmix: more than %d requests waiting", maxQueued)

// enqueue hands r to the worker, or says why not (the Job is closed, or
// too many requests wait): r is then not completed, the caller refuses
// it.
func (j *Job) enqueue(r *request) error {
	j.mu.Lock()
	switch {
	case j.closed:
		j.mu.Unlock()
		return errJobClosed
	case len(j.queue) >= maxQueued:
		j.mu.Unlock()
		return errQueueFull
	}
	j.queue = append(j.queue, r)
	j.mu.Unlock()
	j.signal()
	return nil
}

// enqueueInternal hands the worker a request of the agent's or an answer
// of the server library's to one (rank data), unbounded: the agent's
// requests are bounded by the other nodes' clients' direct modex
// requests, which their own Jobs bound. A closed Job drops it.
func (j *Job) enqueueInternal(r *request) {
	r.done = func(result) {}
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return
	}
	j.queue = append(j.queue, r)
	j.mu.Unlock()
	j.signal()
}

// Spawn requests as the server library hands them over (server.c's
// spawn): per app, cmd, maxprocs, cwd, then three counted lists — argc
// and argv[1..argc], envc and env, 2·ninfo and ninfo pairs of key and
// value — each count in decimal.

// PMIx info keys of an app that a spawn honours, as fastpmi's own spawn
// info keys (launch/spawn.go); any other is ignored, as Hydra does.
var spawnInfo = map[string]string{
	"pmix.wdir":     "wdir",
	"pmix.host":     "hosts",
	"pmix.hostfile": "hostfile",
	"pmix.prefix":   "", // where Open MPI is installed on the nodes: the same here
}

// parseApps turns napps apps flattened as strs into a spawn request.
func parseApps(strs []string, napps int) (*pmiwire.Spawn, error) {
	next := func(what string) (string, error) {
		if len(strs) == 0 {
			return "", fmt.Errorf("pmix spawn: %s missing", what)
		}
		s := strs[0]
		strs = strs[1:]
		return s, nil
	}
	count := func(what string, max int) (int, error) {
		s, err := next(what)
		if err != nil {
			return 0, err
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > max {
			return 0, fmt.Errorf("pmix spawn: %s %q: want 0..%d", what, s, max)
		}
		return n, nil
	}
	list := func(what string) ([]string, error) {
		n, err := count(what, len(strs))
		if err != nil {
			return nil, err
		}
		l := slices.Clone(strs[:n])
		strs = strs[n:]
		return l, nil
	}
	sp := &pmiwire.Spawn{}
	for a := range napps {
		var c pmiwire.SpawnCmd
		var err error
		if c.Exe, err = next("cmd"); err != nil {
			return nil, err
		}
		if c.Exe == "" {
			return nil, fmt.Errorf("pmix spawn: app %d has no command", a)
		}
		if c.MaxProcs, err = count("maxprocs", 1<<30); err != nil {
			return nil, err
		}
		if c.MaxProcs < 1 {
			return nil, fmt.Errorf("pmix spawn: app %d (%s): %d processes, want at least 1", a, c.Exe, c.MaxProcs)
		}
		cwd, err := next("cwd")
		if err != nil {
			return nil, err
		}
		if c.Args, err = list("argv"); err != nil {
			return nil, err
		}
		if c.Env, err = list("env"); err != nil {
			return nil, err
		}
		pairs, err := list("info")
		if err != nil {
			return nil, err
		}
		if len(pairs)%2 != 0 {
			return nil, fmt.Errorf("pmix spawn: app %d: odd info list", a)
		}
		wdir := cwd
		for i := 0; i+1 < len(pairs); i += 2 {
			key, ok := spawnInfo[pairs[i]]
			switch {
			case !ok || key == "":
			case key == "wdir":
				wdir = pairs[i+1]
			default:
				c.Info = append(c.Info, pmiwire.Pair{Key: key, Val: pairs[i+1]})
			}
		}
		if wdir != "" {
			c.Info = append(c.Info, pmiwire.Pair{Key: "wdir", Val: wdir})
		}
		sp.Cmds = append(sp.Cmds, c)
	}
	if len(strs) != 0 {
		return nil, fmt.Errorf("pmix spawn: %d strings after the last app", len(strs))
	}
	return sp, nil
}
