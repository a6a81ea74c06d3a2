package agent

import (
	"errors"
	"fmt"
)

// Collectives across jobs: a PMIx fence over the ranks of several jobs,
// PMIx_Connect and PMIx_Disconnect (Open MPI joins a parent and the job
// it spawned with them, and MPI_Comm_disconnect fences over both). They
// are the external front end's (agent/pmix), one per node that hosts
// participants: OpenPMIx's server library gathers its local participants
// first, whatever job they belong to, and then asks its host once. Only
// the launcher knows every job's nodes, so the collective is a deferred
// call like a spawn: the Upstream completes it once every node hosting a
// participant has called, and answers each with every node's data
// concatenated (empty for connect and disconnect).

// Kinds of collective across jobs (JobsColl.Kind). Calls of different
// kinds over the same ranks are different collectives.
const (
	JobsFence      = "fence"
	JobsConnect    = "connect"
	JobsDisconnect = "disconnect"
)

// JobRanks names ranks of one job of the launcher's run: Ranks, or every
// rank of Job when Ranks is nil.
type JobRanks struct {
	Job   string `json:"job"`
	Ranks []int  `json:"ranks,omitempty"`
}

// MaxJobsCollJobs bounds the jobs one collective across jobs names.
const MaxJobsCollJobs = 64

type (
	// JobsColl is this node's entry into a collective across jobs over
	// Procs, carrying Data (the node's collected data of a fence). It is
	// answered by one Reply of kind ReplyJobs to Local: Val holds every
	// node's data, or Err.
	JobsColl struct {
		Local int
		Req   Req
		Kind  string
		Procs []JobRanks
		Data  []byte
	}
	// JobsCollDone is the Upstream's answer to collective call ID.
	JobsCollDone struct {
		ID   uint64
		Data []byte
		Err  error
	}
)

func (JobsColl) isOp()     {}
func (JobsCollDone) isOp() {}

// ErrJobsColl is returned (wrapped) for a collective across jobs the core
// refuses before asking the Upstream.
var ErrJobsColl = errors.New("collective across jobs")

// CheckJobsColl checks a collective's framing: a known kind, 1 to
// MaxJobsCollJobs jobs, each named once, no negative rank (the jobs'
// sizes are the launcher's to check).
func CheckJobsColl(o JobsColl) error {
	switch o.Kind {
	case JobsFence, JobsConnect, JobsDisconnect:
	default:
		return fmt.Errorf("%w: unknown kind %q", ErrJobsColl, o.Kind)
	}
	if len(o.Procs) == 0 || len(o.Procs) > MaxJobsCollJobs {
		return fmt.Errorf("%w: %d jobs, want 1..%d", ErrJobsColl, len(o.Procs), MaxJobsCollJobs)
	}
	seen := make(map[string]bool, len(o.Procs))
	for _, p := range o.Procs {
		if p.Job == "" || seen[p.Job] {
			return fmt.Errorf("%w: job %q named twice or empty", ErrJobsColl, p.Job)
		}
		seen[p.Job] = true
		for _, r := range p.Ranks {
			if r < 0 {
				return fmt.Errorf("%w: rank %d of job %s", ErrJobsColl, r, p.Job)
			}
		}
	}
	return nil
}

// jobsColl starts a collective across jobs; the node is answered at
// JobsCollDone.
func (c *Core) jobsColl(o JobsColl) {
	t := to{o.Local, o.Req, ReplyJobs}
	if c.closed {
		c.reply(t, Reply{Err: errors.New("agent shutting down")})
		return
	}
	if err := CheckJobsColl(o); err != nil {
		c.reply(t, Reply{Err: err})
		return
	}
	c.up(UpCall{Kind: UpJobs, ID: c.newCall(t), Name: o.Kind, Jobs: o.Procs, Port: string(o.Data)})
}

// jobsCollDone answers call o.ID, if it still waits.
func (c *Core) jobsCollDone(o JobsCollDone) {
	t, waiting := c.takeCall(o.ID)
	if !waiting {
		return // answered by Shutdown
	}
	c.reply(t, Reply{Err: o.Err, Val: string(o.Data), Found: o.Err == nil})
}

// Layout is where a job's ranks run: its size, and by node the node's
// name (as the job's ranks know it) and its global ranks in local order.
type Layout struct {
	Size  int      `json:"size"`
	Hosts []string `json:"hosts"`
	Nodes [][]int  `json:"nodes"`
}

// HostOK reports whether h can name a node in a node map (PMIx's: a
// comma-separated list): not empty, no separator, space or control
// character.
func HostOK(h string) bool {
	if h == "" {
		return false
	}
	for _, c := range h {
		if c == ',' || c == ';' || c <= ' ' {
			return false
		}
	}
	return true
}

// CheckHosts checks the names of n nodes: one each, distinct (a node map
// tells nodes apart by name), each HostOK.
func CheckHosts(hosts []string, n int) error {
	if len(hosts) != n {
		return fmt.Errorf("%d node names for %d nodes", len(hosts), n)
	}
	seen := make(map[string]bool, n)
	for _, h := range hosts {
		if seen[h] || !HostOK(h) {
			return fmt.Errorf("node names %q: want distinct names without separators or spaces", hosts)
		}
		seen[h] = true
	}
	return nil
}

// Check reports whether l describes a job: every rank 0..Size-1 on
// exactly one node, the nodes named (CheckHosts).
func (l *Layout) Check() error {
	n := 0
	for _, ranks := range l.Nodes {
		n += len(ranks)
	}
	if l.Size < 1 || n != l.Size {
		return fmt.Errorf("%w: a job of %d ranks, %d on its nodes", ErrJobsColl, l.Size, n)
	}
	if err := CheckHosts(l.Hosts, len(l.Nodes)); err != nil {
		return fmt.Errorf("%w: %w", ErrJobsColl, err)
	}
	seen := make([]bool, l.Size) // as large as the layout itself
	for i, ranks := range l.Nodes {
		if len(ranks) == 0 {
			return fmt.Errorf("%w: node %d of a job runs no rank", ErrJobsColl, i)
		}
		for _, r := range ranks {
			if r < 0 || r >= l.Size || seen[r] {
				return fmt.Errorf("%w: rank %d of a job of %d twice or outside it", ErrJobsColl, r, l.Size)
			}
			seen[r] = true
		}
	}
	return nil
}

type (
	// JobLayout asks the launcher where another job of its run runs
	// (PMIx: the job data of a namespace with no rank on this node). It
	// is answered by one Reply of kind ReplyLayout with Local -1: Layout,
	// or Err.
	JobLayout struct {
		Req Req
		Job string
	}
	// JobLayoutDone is the Upstream's answer to job-layout call ID.
	JobLayoutDone struct {
		ID     uint64
		Layout *Layout
		Err    error
	}
)

func (JobLayout) isOp()     {}
func (JobLayoutDone) isOp() {}

// jobLayout starts a job-layout request; it is answered at
// JobLayoutDone.
func (c *Core) jobLayout(o JobLayout) {
	t := to{-1, o.Req, ReplyLayout}
	switch {
	case c.closed:
		c.reply(t, Reply{Err: errors.New("agent shutting down")})
	case o.Job == "":
		c.reply(t, Reply{Err: fmt.Errorf("%w: layout of a job without a name", ErrJobsColl)})
	default:
		c.up(UpCall{Kind: UpJobLayout, ID: c.newCall(t), Name: o.Job})
	}
}

// jobLayoutDone answers call o.ID, if it still waits.
func (c *Core) jobLayoutDone(o JobLayoutDone) {
	t, waiting := c.takeCall(o.ID)
	if !waiting {
		return // answered by Shutdown
	}
	if o.Err == nil && o.Layout == nil {
		o.Err = fmt.Errorf("%w: no layout", ErrJobsColl)
	}
	if o.Err == nil {
		o.Err = o.Layout.Check()
	}
	r := Reply{Err: o.Err, Found: o.Err == nil}
	if o.Err == nil {
		r.Layout = o.Layout
	}
	c.reply(t, r)
}
