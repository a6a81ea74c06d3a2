package agent

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/tree"
)

// RingIn is one rank's contribution to a ring exchange, in ring order.
type RingIn struct {
	Count       int    // ring-count (1 for PMIX_Ring)
	Left, Right string // values handed to the left and right neighbours
}

// Upstream is everything a node agent needs from the rest of the job. The
// done callbacks may be called from any goroutine, once, and possibly
// before the method returns; agents call these methods without locks held.
type Upstream interface {
	// Fence contributes this node's puts to world fence number epoch and
	// reports every node's puts once all nodes have entered. puts holds
	// one put per key (the last), each with the rank that put it.
	Fence(epoch uint64, puts []KV, done func(all []KV, err error))
	// RingLayout reports where this node's ranks sit in the job-wide ring
	// (see ring.Map): the ring position of its first local rank and the
	// ring size, given the number of local ranks. Every rank counts 1.
	// New calls it once.
	RingLayout(local int) (offset, size int)
	// RingEdge exchanges one of this node's boundary values of ring
	// exchange epoch with a neighbour node. With toLeft, value is the first
	// local rank's Left value, for the left neighbour node, and done gets
	// what that node sent to the right: its last rank's Right value, the
	// first local rank's left neighbour. Otherwise value is the last local
	// rank's Right value, for the right neighbour node, and done gets that
	// node's first rank's Left value. An agent calls it once per epoch and
	// side, in epoch order, as soon as the boundary rank has entered; on a
	// ring that closes on this node the two sides answer each other.
	RingEdge(epoch uint64, toLeft bool, value string, done func(string, error))
	// Allgather contributes this node's values to allgather number epoch
	// and reports every rank's value, indexed by rank.
	Allgather(epoch uint64, in []tree.Entry, done func(all [][]byte, err error))
	// Publish, Unpublish and Lookup are the job's name service. They may
	// wait for the launcher (a multi-node job asks pmirun), so they answer
	// through done like the collectives. Lookup and Unpublish of a name
	// that is not published fail with an error wrapping ErrNameNotFound.
	// A name published once is withdrawn by the first lookup that finds
	// it; a lookup with wait > 0 of a name not yet published waits up to
	// wait for it to be (Name.Once, Name.Wait: PMIx's).
	Publish(name, port string, once bool, done func(error))
	Unpublish(name string, done func(error))
	Lookup(name string, wait time.Duration, done func(port string, err error))
	// Spawn starts the job req asks for (pmiwire.Spawn: the commands,
	// their sizes, arguments, info keys and the keys to pre-put in the
	// new job's KVS) and reports its job id once every child has been
	// started, or why it could not be started; the spawning job keeps
	// running either way. The launcher owns the new job from then on.
	// rank is the global rank that asked, the children's parent
	// (PMIx's PMIX_PARENT_ID).
	Spawn(req *pmiwire.Spawn, rank int, done func(jobID string, err error))
	// Place places a sparse put (key, its value, the rank that put it)
	// where the job's get strategy looks for it; a fence this node enters
	// afterwards completes only once every placement arrived. Fetch asks
	// the rest of the job for a key that is not on this node: src is the
	// rank that put it, or -1; with wait, the answer waits until the key
	// is put. The core calls them only in a job that spans nodes
	// (remote.go).
	Place(key, val string, owner int)
	Fetch(key string, src int, wait bool, done func(val string, found bool, err error))
	// FetchRankData asks rank's node for the data its external front end
	// holds for rank (rankdata.go; PMIx's direct modex): found is false
	// when the front end has none. The core calls it only for a rank of
	// another node.
	FetchRankData(rank int, done func(val string, found bool, err error))
	// JobsCollective enters this node in the collective across jobs
	// (jobs.go) of kind over procs, carrying data, and reports every
	// participating node's data, concatenated, once each has entered.
	JobsCollective(kind string, procs []JobRanks, data []byte, done func(all []byte, err error))
	// FetchJobRankData is FetchRankData for rank of another job of the
	// launcher's run (GetRankData.Job).
	FetchJobRankData(job string, rank int, done func(val string, found bool, err error))
	// FetchJobLayout asks where another job of the launcher's run runs
	// (JobLayout).
	FetchJobLayout(job string, done func(l *Layout, err error))
}

// ErrNoSpawn is Local's answer to a spawn: a job without a launcher
// behind its agent (a test, a benchmark's played ranks) has nowhere to
// start children.
var ErrNoSpawn = errors.New("spawn needs a launcher: this agent runs without one")

// Name-service errors.
var (
	ErrNameExists   = errors.New("service name already published")
	ErrNameNotFound = errors.New("service name not published")
)

// Local is the Upstream of a job that runs on one node: collectives
// complete as soon as the node's part is in, and the name service is a
// map. It is also the root's name service in multi-node jobs. Its name
// service answers on the caller's goroutine before the method returns,
// but for a lookup that waits for a name: that one is answered by the
// Publish that brings the name (on the publisher's goroutine), by its
// timer when its wait is over, or by Close.
type Local struct {
	maxNames int // names published at once, and lookups waiting at once; 0: no cap. Read-only.

	mu sync.Mutex
	// Guarded by mu.
	names  map[string]localName    // at most maxNames
	waits  map[string][]*localWait // lookups waiting for a name, in arrival order
	nwaits int                     // len of every waits list; at most maxNames
	closed bool                    // Close was called: no lookup waits any more
	edges  map[uint64]*localEdges  // ring edges waiting for their pair
}

// localName is a published name.
type localName struct {
	port  string
	once  bool // withdrawn by the first lookup that finds it
	owner any  // who published it (PublishAs), nil for Publish; compared with ==
}

// localWait is a lookup waiting for its name; timer ends the wait. It is
// answered exactly once, by whoever takes it out of Local.waits.
type localWait struct {
	done  func(port string, err error)
	timer *time.Timer
}

// NewLocal returns a single-node Upstream whose name service holds at
// most MaxNamesPerJob names.
func NewLocal() *Local { return NewLocalNames(MaxNamesPerJob) }

// NewLocalNames returns a single-node Upstream whose name service holds
// at most maxNames names; 0 sets no cap (a daemon's, shared by runs
// capped each).
func NewLocalNames(maxNames int) *Local {
	return &Local{maxNames: maxNames, names: make(map[string]localName), waits: make(map[string][]*localWait),
		edges: make(map[uint64]*localEdges)}
}

// Close answers every lookup still waiting for its name as not found
// and stops their timers; a later lookup answers at once. Its owner (the
// run, the daemon) calls it as it ends. Idempotent.
func (l *Local) Close() {
	l.mu.Lock()
	l.closed = true
	waits := l.waits
	l.waits, l.nwaits = make(map[string][]*localWait), 0
	l.mu.Unlock()
	for name, ws := range waits {
		for _, w := range ws {
			w.timer.Stop()
			w.done("", fmt.Errorf("lookup %q: %w (the name service closed)", name, ErrNameNotFound))
		}
	}
}

// Fence completes at once: this node holds the whole job.
func (l *Local) Fence(epoch uint64, puts []KV, done func([]KV, error)) { done(puts, nil) }

// RingLayout: this node holds the whole ring.
func (l *Local) RingLayout(local int) (offset, size int) { return 0, local }

// RingEdge pairs the node's two sides: the ring closes on this node, so
// the first rank's Left is the last rank's right neighbour value and the
// last rank's Right is the first rank's left neighbour value.
func (l *Local) RingEdge(epoch uint64, toLeft bool, value string, done func(string, error)) {
	l.mu.Lock()
	e := l.edges[epoch]
	if e == nil {
		e = new(localEdges)
		l.edges[epoch] = e
	}
	side, other := &e.sides[0], &e.sides[1]
	if !toLeft {
		side, other = other, side
	}
	if side.done != nil {
		l.mu.Unlock()
		done("", fmt.Errorf("ring %d: second edge of one side", epoch))
		return
	}
	side.value, side.done = value, done
	if other.done == nil {
		l.mu.Unlock()
		return
	}
	delete(l.edges, epoch)
	l.mu.Unlock()
	side.done(other.value, nil)
	other.done(side.value, nil)
}

// localEdges is one epoch's pair of ring edges on a Local node.
type localEdges struct {
	sides [2]struct {
		value string
		done  func(string, error)
	}
}

// Allgather completes at once: every rank is on this node.
func (l *Local) Allgather(epoch uint64, in []tree.Entry, done func([][]byte, error)) {
	size := 0
	for _, rv := range in {
		size = max(size, int(rv.Rank)+1)
	}
	all := make([][]byte, size)
	for _, rv := range in {
		all[rv.Rank] = rv.Value
	}
	done(all, nil)
}

// Place does nothing: a Local job has no other node.
func (l *Local) Place(key, val string, owner int) {}

// Fetch finds nothing: a Local job has no other node.
func (l *Local) Fetch(key string, src int, wait bool, done func(string, bool, error)) {
	done("", false, nil)
}

// FetchRankData fails: every rank of a Local job is on its node, whose
// own front end the core asks.
func (l *Local) FetchRankData(rank int, done func(string, bool, error)) {
	done("", false, fmt.Errorf("rank data of rank %d: no other node", rank))
}

// ErrNoJobs is Local's answer to a collective across jobs: a job
// without a launcher knows no other job.
var ErrNoJobs = errors.New("no launcher to join other jobs")

// JobsCollective fails: a Local job has no launcher that knows other jobs.
func (l *Local) JobsCollective(kind string, procs []JobRanks, data []byte, done func([]byte, error)) {
	done(nil, fmt.Errorf("%s across jobs: %w", kind, ErrNoJobs))
}

// FetchJobRankData fails: a Local job has no launcher that knows other jobs.
func (l *Local) FetchJobRankData(job string, rank int, done func(string, bool, error)) {
	done("", false, fmt.Errorf("rank data of job %s: %w", job, ErrNoJobs))
}

// FetchJobLayout fails: a Local job has no launcher that knows other
// jobs.
func (l *Local) FetchJobLayout(job string, done func(*Layout, error)) {
	done(nil, fmt.Errorf("layout of job %s: %w", job, ErrNoJobs))
}

// Spawn fails: a Local job has no launcher to start children.
func (l *Local) Spawn(req *pmiwire.Spawn, rank int, done func(string, error)) {
	done("", ErrNoSpawn)
}

// Publish records name → port; publishing a name twice is an error, as in
// MPI_Publish_name. Lookups waiting for the name get it first: all of
// them, or with once the first one only, which withdraws it.
func (l *Local) Publish(name, port string, once bool, done func(error)) {
	l.PublishAs(nil, name, port, once, done)
}

// PublishAs is Publish for owner (comparable, not nil), whose names only
// UnpublishAs with the same owner withdraws: a daemon's runs share its
// name service, and one run never withdraws another's name, also one of
// the same name published after the run's own has gone (taken by a
// lookup, once).
func (l *Local) PublishAs(owner any, name, port string, once bool, done func(error)) {
	l.mu.Lock()
	_, dup := l.names[name]
	full := !dup && l.maxNames > 0 && len(l.names) >= l.maxNames
	var found []*localWait
	if !dup && !full {
		found = l.waits[name]
		if once && len(found) > 1 {
			l.waits[name], found = found[1:], found[:1]
		} else {
			delete(l.waits, name)
		}
		l.nwaits -= len(found)
		if !once || len(found) == 0 {
			l.names[name] = localName{port: port, once: once, owner: owner}
		}
	}
	l.mu.Unlock()
	switch {
	case dup:
		done(fmt.Errorf("publish %q: %w", name, ErrNameExists))
	case full:
		done(fmt.Errorf("publish %q: %w: the job has %d names published", name, ErrQuota, l.maxNames))
	default:
		done(nil)
	}
	for _, w := range found {
		w.timer.Stop()
		w.done(port, nil)
	}
}

// Owns reports whether owner published name (PublishAs) and it is still
// published.
func (l *Local) Owns(owner any, name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, ok := l.names[name]
	return ok && n.owner == owner
}

// Unpublish removes name.
func (l *Local) Unpublish(name string, done func(error)) {
	l.UnpublishAs(nil, name, done)
}

// UnpublishAs removes name if owner published it (PublishAs); a name
// another owner published is not found.
func (l *Local) UnpublishAs(owner any, name string, done func(error)) {
	l.mu.Lock()
	n, ok := l.names[name]
	ok = ok && n.owner == owner
	if ok {
		delete(l.names, name)
	}
	l.mu.Unlock()
	if !ok {
		done(fmt.Errorf("unpublish %q: %w", name, ErrNameNotFound))
		return
	}
	done(nil)
}

// Lookup reports the port published under name; with wait > 0, a name
// not yet published is waited for (at most MaxNameWait), and not found
// only once the wait is over.
func (l *Local) Lookup(name string, wait time.Duration, done func(port string, err error)) {
	l.mu.Lock()
	p, ok := l.names[name]
	if ok && p.once {
		delete(l.names, name)
	}
	full := l.maxNames > 0 && l.nwaits >= l.maxNames
	if ok || wait <= 0 || l.closed || full {
		l.mu.Unlock()
		switch {
		case ok:
			done(p.port, nil)
		case wait > 0 && full:
			done("", fmt.Errorf("lookup %q: %w: %d lookups wait for names", name, ErrQuota, l.maxNames))
		default:
			done("", fmt.Errorf("lookup %q: %w", name, ErrNameNotFound))
		}
		return
	}
	w := &localWait{done: done}
	w.timer = time.AfterFunc(min(wait, MaxNameWait), func() {
		if l.dropWait(name, w) {
			done("", fmt.Errorf("lookup %q: %w after waiting %v", name, ErrNameNotFound, min(wait, MaxNameWait)))
		}
	})
	l.waits[name] = append(l.waits[name], w)
	l.nwaits++
	l.mu.Unlock()
}

// dropWait takes w out of the lookups waiting for name, and reports
// whether it was still there (then its caller answers it).
func (l *Local) dropWait(name string, w *localWait) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ws := l.waits[name]
	i := slices.Index(ws, w)
	if i < 0 {
		return false
	}
	if ws = slices.Delete(ws, i, i+1); len(ws) == 0 {
		delete(l.waits, name)
	} else {
		l.waits[name] = ws
	}
	l.nwaits--
	return true
}
