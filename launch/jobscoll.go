package launch

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/netio"
	"github.com/fastpmi/fastpmi/tree"
)

// Collectives across the run's jobs (agent/jobs.go): a PMIx fence over
// the ranks of a parent and the job it spawned, PMIx_Connect and
// PMIx_Disconnect. Each agent process that hosts participants enters
// once, whatever jobs it serves (one OpenPMIx server per process gathers
// its local participants of every job first), on the link of one of
// its jobs. The root knows where every rank of every job runs and which
// agent process each job's node is (node.Hello's host and pid), so it
// completes the collective once every process that hosts a participant
// has entered, and answers each with their data concatenated in process
// order. A collective naming a job that is not running in this run is
// refused at once, and one under way fails when a job it names ends:
// its participants would wait for ever.

// jobsColl is one collective across jobs under way.
type jobsColl struct {
	jobs []*rootNode       // the jobs it names
	want []string          // agent processes that host participants, sorted
	in   map[string][]byte // the data of each that entered
	done []func([]byte, error)
}

// agentProc names the agent process of node i of job r (under run.mu).
func (r *rootNode) agentProc(i int) string {
	return r.hellos[i].Host + "/" + strconv.Itoa(r.hellos[i].PID)
}

// jobsColl enters node i of job from in the collective m asks for
// (node.Name Op "jobs"); done is called once, when it completes or with
// why it cannot.
func (run *multiRun) jobsColl(from *rootNode, i int, m *node.Name, done func([]byte, error)) {
	fail := func(err error) { done(nil, fmt.Errorf("%s across jobs: %w", m.Name, err)) }
	o := agent.JobsColl{Kind: m.Name, Procs: m.Procs}
	if err := agent.CheckJobsColl(o); err != nil {
		fail(err)
		return
	}
	if len(m.Data) > tree.MaxNodeEntry {
		fail(fmt.Errorf("%d bytes of node data, want at most %d", len(m.Data), tree.MaxNodeEntry))
		return
	}
	procs := canonicalJobRanks(m.Procs)
	keyJSON, _ := json.Marshal(procs)
	key := m.Name + " " + string(keyJSON)

	run.mu.Lock()
	jobs, want, err := run.jobsCollProcs(procs)
	if err != nil {
		run.mu.Unlock()
		fail(err)
		return
	}
	me := from.agentProc(i)
	if !slices.Contains(want, me) {
		run.mu.Unlock()
		fail(fmt.Errorf("node %d of job %s hosts no participant", i, from.spec.JobID))
		return
	}
	c := run.colls[key]
	if c == nil {
		c = &jobsColl{jobs: jobs, want: want, in: make(map[string][]byte, len(want))}
		run.colls[key] = c
	}
	if _, twice := c.in[me]; twice {
		run.mu.Unlock()
		fail(fmt.Errorf("agent process %s entered twice", me))
		return
	}
	c.in[me] = slices.Clone(m.Data)
	c.done = append(c.done, done)
	if len(c.in) < len(c.want) {
		run.mu.Unlock()
		return
	}
	delete(run.colls, key)
	run.mu.Unlock()
	var all []byte
	for _, p := range c.want {
		all = append(all, c.in[p]...)
	}
	for _, d := range c.done {
		d(all, nil)
	}
}

// jobsCollProcs returns the jobs procs names and the agent processes
// hosting their ranks, sorted, or why procs names ranks no running job
// of the run has. Under run.mu.
func (run *multiRun) jobsCollProcs(procs []agent.JobRanks) ([]*rootNode, []string, error) {
	var jobs []*rootNode
	var want []string
	for _, p := range procs {
		var job *rootNode
		for r := range run.live {
			if r.spec.JobID == p.Job {
				job = r
				break
			}
		}
		if job == nil || job.hellos == nil {
			return nil, nil, fmt.Errorf("job %s is not running in this run", p.Job)
		}
		jobs = append(jobs, job)
		nodeOf := make(map[int]int, job.spec.Size)
		for n, rs := range job.spec.Nodes {
			for _, r := range rs {
				nodeOf[r] = n
			}
		}
		if p.Ranks == nil {
			for n := range job.spec.Nodes {
				want = append(want, job.agentProc(n))
			}
			continue
		}
		for _, r := range p.Ranks {
			n, ok := nodeOf[r]
			if !ok {
				return nil, nil, fmt.Errorf("rank %d of job %s of %d ranks", r, p.Job, job.spec.Size)
			}
			want = append(want, job.agentProc(n))
		}
	}
	slices.Sort(want)
	return jobs, slices.Compact(want), nil
}

// dropJobsColls fails the collectives under way that name job r, which
// ended. Under run.mu; the returned calls answer them once it is
// released.
func (run *multiRun) dropJobsColls(r *rootNode) []func() {
	var later []func()
	for key, c := range run.colls {
		if !slices.Contains(c.jobs, r) {
			continue
		}
		delete(run.colls, key)
		err := fmt.Errorf("collective across jobs: job %s ended before every participant joined", r.spec.JobID)
		for _, d := range c.done {
			later = append(later, func() { d(nil, err) })
		}
	}
	return later
}

// canonicalJobRanks sorts procs by job and each job's ranks, without
// duplicates: every node names one collective alike.
func canonicalJobRanks(procs []agent.JobRanks) []agent.JobRanks {
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

// jobLayout answers where the one job m names runs (node.Name Op
// "joblayout", agent.JobLayout): a namespace a node registers with its
// PMIx server without ranks of it there. Its nodes are named as its ranks
// know them (nodeNames).
func (run *multiRun) jobLayout(m *node.Name) (*agent.Layout, error) {
	if len(m.Procs) != 1 {
		return nil, fmt.Errorf("layout across jobs: want one job, got %v", m.Procs)
	}
	run.mu.Lock()
	defer run.mu.Unlock()
	jobs, _, err := run.jobsCollProcs(m.Procs[:1])
	if err != nil {
		return nil, fmt.Errorf("layout of job %s: %w", m.Procs[0].Job, err)
	}
	r := jobs[0]
	l := &agent.Layout{Size: r.spec.Size, Nodes: r.spec.Nodes, Hosts: make([]string, len(r.at))}
	for i, n := range r.at {
		l.Hosts[i] = run.nodeNames[n]
	}
	return l, nil
}

// A rank's data across jobs (agent.GetRankData.Job): a PMIx client
// reading the data of a rank of another job of the run, which the server
// library of that rank's node holds (a direct modex: Open MPI reads the
// business cards of the job it spawned or connected to). Nodes know only
// their own job's nodes, so the request comes to the root, which asks
// the rank's node over its job's link (node.KVSRankData, as the nodes of
// one job ask each other) and hands the answer back.

// jobRankWait is a rank-data request waiting for the rank's node.
type jobRankWait struct {
	job  *rootNode
	done func(blob []byte, found bool, err error)
}

// jobRankData asks for the data of the one rank m names (node.Name Op
// "rankdata"); done is called once.
func (run *multiRun) jobRankData(m *node.Name, done func(blob []byte, found bool, err error)) {
	if len(m.Procs) != 1 || len(m.Procs[0].Ranks) != 1 {
		done(nil, false, fmt.Errorf("rank data across jobs: want one rank of one job, got %v", m.Procs))
		return
	}
	p, rank := m.Procs[0], m.Procs[0].Ranks[0]
	run.mu.Lock()
	jobs, _, err := run.jobsCollProcs([]agent.JobRanks{p}) // the job runs and holds the rank
	if err != nil {
		run.mu.Unlock()
		done(nil, false, fmt.Errorf("rank data of rank %d of job %s: %w", rank, p.Job, err))
		return
	}
	job := jobs[0]
	n := slices.IndexFunc(job.spec.Nodes, func(rs []int) bool { return slices.Contains(rs, rank) })
	run.rdSeq++
	id := run.rdSeq
	run.rdWaits[id] = jobRankWait{job: job, done: done}
	run.mu.Unlock()
	job.send(n, netio.Frame{Type: node.FrameKVS, Payload: node.Encode(node.KVSMsg{Op: node.KVSRankData, ID: id, Src: rank})})
}

// jobRankDataDone takes node i of job r's answer to rank-data request
// m.ID (node.KVSRankVal).
func (run *multiRun) jobRankDataDone(r *rootNode, m *node.KVSMsg) {
	run.mu.Lock()
	w, ok := run.rdWaits[m.ID]
	if ok && w.job == r {
		delete(run.rdWaits, m.ID)
	}
	run.mu.Unlock()
	if !ok || w.job != r {
		return
	}
	var err error
	if m.Err != "" {
		err = errors.New(m.Err)
	}
	w.done(m.Blob, m.Found && err == nil, err)
}

// dropJobRankData fails the rank-data requests waiting for job r's
// nodes, which ended. Under run.mu; done is called after it is released
// (returned).
func (run *multiRun) dropJobRankData(r *rootNode) []func() {
	var later []func()
	for id, w := range run.rdWaits {
		if w.job == r {
			delete(run.rdWaits, id)
			later = append(later, func() { w.done(nil, false, fmt.Errorf("job %s ended", r.spec.JobID)) })
		}
	}
	return later
}
