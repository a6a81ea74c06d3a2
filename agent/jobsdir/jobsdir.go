// Package jobsdir is a directory of running jobs for what spans jobs: a
// collective across jobs (agent.JobsColl: a PMIx fence over the ranks of
// several jobs, PMIx_Connect, PMIx_Disconnect) and the questions a node
// asks about a job it does not run (where it runs, agent.JobLayout; the
// data of one of its ranks). pmirun keeps one for the jobs of its run
// (the command line's job and the jobs it spawned); a daemon keeps one
// for the jobs that runs launched separately on it registered, so that
// they can connect to each other.
//
// Each agent process that hosts participants of a collective enters it
// once, whatever jobs it serves (one OpenPMIx server per process gathers
// its local participants of every job first). The directory knows which
// agent process runs each node of each job, so it completes the
// collective once every process that hosts a participant has entered,
// and answers each with their data concatenated in process order. A
// collective naming a job not in the directory is refused at once, and
// one under way fails when a job it names leaves: its participants would
// wait for ever.
package jobsdir

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/tree"
)

// Job is a job as the directory knows it. Owner is the caller's (the
// root of the job in pmirun, the registering session in a daemon).
type Job[O any] struct {
	Layout agent.Layout
	// Agents names the agent process of each node (host/pid, as the
	// agents' hellos give them): processes, not nodes, enter
	// collectives.
	Agents []string
	Owner  O
}

// ErrNotRunning is returned (wrapped) for a job the directory does not
// hold.
var ErrNotRunning = errors.New("is not running")

// Dir is a directory of running jobs and the collectives across them
// under way. It is safe for concurrent use; the callbacks it is given are
// called without its lock held.
type Dir[O any] struct {
	// where names the directory in errors ("in this run").
	where string

	mu    sync.Mutex
	jobs  map[string]*Job[O] // by job id
	colls map[string]*coll   // by kind and canonical participants
}

// coll is one collective across jobs under way.
type coll struct {
	jobs []string         // the jobs it names
	want []string         // agent processes that host participants, sorted
	in   map[string]entry // those that entered
}

// entry is one agent process's entry in a collective.
type entry struct {
	data []byte
	done func([]byte, error)
}

// New makes an empty directory; where says whose it is in errors ("in
// this run", "on this daemon").
func New[O any](where string) *Dir[O] {
	return &Dir[O]{where: where, jobs: make(map[string]*Job[O]), colls: make(map[string]*coll)}
}

// Add enters job id; it fails if the id is taken or j does not describe
// a job.
func (d *Dir[O]) Add(id string, j Job[O]) error {
	if id == "" {
		return errors.New("a job without an id")
	}
	if err := j.Layout.Check(); err != nil {
		return fmt.Errorf("job %s: %w", id, err)
	}
	if len(j.Agents) != len(j.Layout.Nodes) {
		return fmt.Errorf("job %s: %d agent processes for %d nodes", id, len(j.Agents), len(j.Layout.Nodes))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.jobs[id] != nil {
		return fmt.Errorf("job %s is there already", id)
	}
	d.jobs[id] = &j
	return nil
}

// Remove takes job id out, failing the collectives under way that name
// it.
func (d *Dir[O]) Remove(id string) {
	d.mu.Lock()
	if d.jobs[id] == nil {
		d.mu.Unlock()
		return
	}
	delete(d.jobs, id)
	var failed []*coll
	for key, c := range d.colls {
		if slices.Contains(c.jobs, id) {
			delete(d.colls, key)
			failed = append(failed, c)
		}
	}
	d.mu.Unlock()
	err := fmt.Errorf("collective across jobs: job %s ended before every participant joined", id)
	for _, c := range failed {
		for _, p := range c.want {
			if e, ok := c.in[p]; ok {
				e.done(nil, err)
			}
		}
	}
}

// Find returns job id, or why not.
func (d *Dir[O]) Find(id string) (Job[O], error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	j := d.jobs[id]
	if j == nil {
		return Job[O]{}, fmt.Errorf("job %s %w %s", id, ErrNotRunning, d.where)
	}
	return *j, nil
}

// Holds reports whether every job procs names is in the directory.
func (d *Dir[O]) Holds(procs []agent.JobRanks) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range procs {
		if d.jobs[p.Job] == nil {
			return false
		}
	}
	return true
}

// Pending returns how many collectives are under way.
func (d *Dir[O]) Pending() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.colls)
}

// NodeOf returns the node of job j that runs rank, or -1.
func NodeOf(l *agent.Layout, rank int) int {
	return slices.IndexFunc(l.Nodes, func(rs []int) bool { return slices.Contains(rs, rank) })
}

// Enter enters agent process me in the collective of kind over procs,
// with its data; done is called once, when the collective completes
// (every participating process's data, in process order) or with why it
// cannot. While the collective is under way, withdraw takes the entry
// back (done is then never called: for an entrant that has gone, whose
// data the directory need not hold); it is nil once done was called.
func (d *Dir[O]) Enter(kind string, procs []agent.JobRanks, me string, data []byte, done func([]byte, error)) (withdraw func()) {
	fail := func(err error) { done(nil, fmt.Errorf("%s across jobs: %w", kind, err)) }
	if err := agent.CheckJobsColl(agent.JobsColl{Kind: kind, Procs: procs}); err != nil {
		fail(err)
		return nil
	}
	if len(data) > tree.MaxNodeEntry {
		fail(fmt.Errorf("%d bytes of node data, want at most %d", len(data), tree.MaxNodeEntry))
		return nil
	}
	procs = canonical(procs)
	keyJSON, _ := json.Marshal(procs)
	key := kind + " " + string(keyJSON)

	d.mu.Lock()
	want, err := d.agents(procs)
	if err != nil {
		d.mu.Unlock()
		fail(err)
		return nil
	}
	if !slices.Contains(want, me) {
		d.mu.Unlock()
		fail(fmt.Errorf("agent process %s hosts no participant", me))
		return nil
	}
	c := d.colls[key]
	if c == nil {
		c = &coll{want: want, in: make(map[string]entry, len(want))}
		for _, p := range procs {
			c.jobs = append(c.jobs, p.Job)
		}
		d.colls[key] = c
	}
	if _, twice := c.in[me]; twice {
		d.mu.Unlock()
		fail(fmt.Errorf("agent process %s entered twice", me))
		return nil
	}
	c.in[me] = entry{data: slices.Clone(data), done: done}
	if len(c.in) < len(c.want) {
		d.mu.Unlock()
		return func() { d.withdraw(key, c, me) }
	}
	delete(d.colls, key)
	d.mu.Unlock()
	var all []byte
	for _, p := range c.want {
		all = append(all, c.in[p].data...)
	}
	for _, p := range c.want {
		c.in[p].done(all, nil)
	}
	return nil
}

// withdraw takes me's entry out of collective c (key), if c is still
// under way; the collective goes with its last entry.
func (d *Dir[O]) withdraw(key string, c *coll, me string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.colls[key] != c {
		return // completed or failed: done was called
	}
	delete(c.in, me)
	if len(c.in) == 0 {
		delete(d.colls, key)
	}
}

// agents returns the agent processes hosting the ranks procs names,
// sorted and distinct, or why procs names ranks no job of the directory
// has. Under d.mu.
func (d *Dir[O]) agents(procs []agent.JobRanks) ([]string, error) {
	var want []string
	for _, p := range procs {
		j := d.jobs[p.Job]
		if j == nil {
			return nil, fmt.Errorf("job %s %w %s", p.Job, ErrNotRunning, d.where)
		}
		if p.Ranks == nil {
			want = append(want, j.Agents...)
			continue
		}
		nodeOf := make([]int, j.Layout.Size)
		for n, rs := range j.Layout.Nodes {
			for _, r := range rs {
				nodeOf[r] = n
			}
		}
		for _, r := range p.Ranks {
			if r < 0 || r >= len(nodeOf) {
				return nil, fmt.Errorf("rank %d of job %s of %d ranks", r, p.Job, j.Layout.Size)
			}
			want = append(want, j.Agents[nodeOf[r]])
		}
	}
	slices.Sort(want)
	return slices.Compact(want), nil
}

// canonical sorts procs by job and each job's ranks, without duplicates:
// every node names one collective alike.
func canonical(procs []agent.JobRanks) []agent.JobRanks {
	out := make([]agent.JobRanks, len(procs))
	for i, p := range procs {
		out[i].Job = p.Job
		if p.Ranks != nil {
			out[i].Ranks = slices.Compact(slices.Sorted(slices.Values(p.Ranks)))
		}
	}
	slices.SortFunc(out, func(a, b agent.JobRanks) int { return strings.Compare(a.Job, b.Job) })
	return out
}
