package agent

import (
	"errors"
	"fmt"
	"sync"
)

// KV is one key-value pair of the job KVS.
type KV struct{ Key, Val string }

// RingIn is one rank's contribution to a ring exchange, in ring order.
type RingIn struct {
	Count       int    // ring-count (1 for PMIX_Ring)
	Left, Right string // values handed to the left and right neighbours
}

// RingOut is the node-level result of a ring exchange: where this node's
// first entry sits in the job-wide ring, the value its left neighbour node
// handed to the right (the left value of this node's first entry), the value
// its right neighbour node handed to the left (the right value of this
// node's last entry), and the ring size (sum of counts).
type RingOut struct {
	Offset      int
	Total       int
	LeftOfFirst string
	RightOfLast string
}

// Upstream is everything a node agent needs from the rest of the job. The
// done callbacks may be called from any goroutine, once, and possibly
// before the method returns; agents call these methods without locks held.
type Upstream interface {
	// Fence contributes this node's puts to world fence number epoch and
	// reports every node's puts once all nodes have entered.
	Fence(epoch uint64, puts []KV, done func(all []KV, err error))
	// Ring contributes this node's ring entries (in order) to ring number
	// epoch.
	Ring(epoch uint64, in []RingIn, done func(RingOut, error))
	// Allgather contributes this node's values to allgather number epoch
	// and reports every rank's value, indexed by rank.
	Allgather(epoch uint64, in []RankValue, done func(all [][]byte, err error))
	// Publish, Unpublish and Lookup are the job's name service.
	Publish(name, port string) error
	Unpublish(name string) error
	Lookup(name string) (string, error)
}

// Name-service errors.
var (
	ErrNameExists   = errors.New("service name already published")
	ErrNameNotFound = errors.New("service name not published")
)

// Local is the Upstream of a job that runs on one node: collectives
// complete as soon as the node's part is in, and the name service is a
// map. It is also the root's name service in multi-node jobs.
type Local struct {
	mu    sync.Mutex
	names map[string]string // guarded by mu
}

// NewLocal returns a single-node Upstream.
func NewLocal() *Local { return &Local{names: make(map[string]string)} }

// Fence completes at once: this node holds the whole job.
func (l *Local) Fence(epoch uint64, puts []KV, done func([]KV, error)) { done(puts, nil) }

// Ring completes at once: the ring closes on this node.
func (l *Local) Ring(epoch uint64, in []RingIn, done func(RingOut, error)) {
	if len(in) == 0 {
		done(RingOut{}, fmt.Errorf("ring %d: no entries", epoch))
		return
	}
	total := 0
	for _, e := range in {
		total += e.Count
	}
	done(RingOut{Offset: 0, Total: total, LeftOfFirst: in[len(in)-1].Right, RightOfLast: in[0].Left}, nil)
}

// Allgather completes at once: every rank is on this node.
func (l *Local) Allgather(epoch uint64, in []RankValue, done func([][]byte, error)) {
	size := 0
	for _, rv := range in {
		size = max(size, rv.Rank+1)
	}
	all := make([][]byte, size)
	for _, rv := range in {
		all[rv.Rank] = rv.Value
	}
	done(all, nil)
}

// Publish records name → port; publishing a name twice is an error, as in
// MPI_Publish_name.
func (l *Local) Publish(name, port string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.names[name]; ok {
		return fmt.Errorf("publish %q: %w", name, ErrNameExists)
	}
	l.names[name] = port
	return nil
}

// Unpublish removes name.
func (l *Local) Unpublish(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.names[name]; !ok {
		return fmt.Errorf("unpublish %q: %w", name, ErrNameNotFound)
	}
	delete(l.names, name)
	return nil
}

// Lookup returns the port published under name.
func (l *Local) Lookup(name string) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.names[name]
	if !ok {
		return "", fmt.Errorf("lookup %q: %w", name, ErrNameNotFound)
	}
	return p, nil
}

// RankValue is one rank's contribution to an allgather.
type RankValue struct {
	Rank  int
	Value []byte
}
