package agent

import (
	"errors"
	"fmt"
	"sync"

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
	Publish(name, port string, done func(error))
	Unpublish(name string, done func(error))
	Lookup(name string, done func(port string, err error))
	// Spawn starts the job req asks for (pmiwire.Spawn: the commands,
	// their sizes, arguments, info keys and the keys to pre-put in the
	// new job's KVS) and reports its job id once every child has been
	// started, or why it could not be started; the spawning job keeps
	// running either way. The launcher owns the new job from then on.
	Spawn(req *pmiwire.Spawn, done func(jobID string, err error))
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
// service answers on the caller's goroutine before the method returns.
type Local struct {
	maxNames int // names published at once; 0: no cap. Read-only.

	mu    sync.Mutex
	names map[string]string      // guarded by mu; at most maxNames
	edges map[uint64]*localEdges // ring edges waiting for their pair, guarded by mu
}

// NewLocal returns a single-node Upstream whose name service holds at
// most MaxNamesPerJob names.
func NewLocal() *Local { return NewLocalNames(MaxNamesPerJob) }

// NewLocalNames returns a single-node Upstream whose name service holds
// at most maxNames names; 0 sets no cap (a daemon's, shared by runs
// capped each).
func NewLocalNames(maxNames int) *Local {
	return &Local{maxNames: maxNames, names: make(map[string]string), edges: make(map[uint64]*localEdges)}
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

// Spawn fails: a Local job has no launcher to start children.
func (l *Local) Spawn(req *pmiwire.Spawn, done func(string, error)) { done("", ErrNoSpawn) }

// Publish records name → port; publishing a name twice is an error, as in
// MPI_Publish_name.
func (l *Local) Publish(name, port string, done func(error)) {
	l.mu.Lock()
	_, dup := l.names[name]
	full := !dup && l.maxNames > 0 && len(l.names) >= l.maxNames
	if !dup && !full {
		l.names[name] = port
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
}

// Unpublish removes name.
func (l *Local) Unpublish(name string, done func(error)) {
	l.mu.Lock()
	_, ok := l.names[name]
	delete(l.names, name)
	l.mu.Unlock()
	if !ok {
		done(fmt.Errorf("unpublish %q: %w", name, ErrNameNotFound))
		return
	}
	done(nil)
}

// Lookup reports the port published under name.
func (l *Local) Lookup(name string, done func(port string, err error)) {
	l.mu.Lock()
	p, ok := l.names[name]
	l.mu.Unlock()
	if !ok {
		done("", fmt.Errorf("lookup %q: %w", name, ErrNameNotFound))
		return
	}
	done(p, nil)
}
