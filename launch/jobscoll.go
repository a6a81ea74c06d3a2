package launch

import (
	"errors"
	"fmt"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/jobsdir"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/netio"
)

// Collectives across the run's jobs (agent/jobs.go): a PMIx fence over
// the ranks of a parent and the job it spawned, PMIx_Connect and
// PMIx_Disconnect. The run's directory of jobs (agent/jobsdir) holds
// every job once its agents said hello (which agent process runs each
// node: node.Hello's host and pid) until it ends, and completes each
// collective once every process that hosts a participant has entered.
// A collective naming a job of another run goes to the daemons' directory
// instead (daemonjobs.go), where runs launched separately on the same
// daemons register their jobs.

// joined enters job r, whose agents all said hello, in the run's
// directory (and the daemons', for a run on daemons).
func (run *multiRun) joined(r *rootNode, hellos []node.Hello) {
	j := jobsdir.Job[*rootNode]{Layout: run.layout(r), Owner: r}
	for _, h := range hellos {
		j.Agents = append(j.Agents, h.Proc())
	}
	if err := run.dir.Add(r.spec.JobID, j); err != nil {
		r.cfg.Logger.Warn("job directory", "err", err)
		return
	}
	if d := run.daemons(); d != nil {
		d.register(r.spec.JobID, j.Layout, j.Agents)
	}
}

// layout is where job r runs, its nodes named as the run names them
// (nodeNames).
func (run *multiRun) layout(r *rootNode) agent.Layout {
	l := agent.Layout{Size: r.spec.Size, Nodes: r.spec.Nodes, Hosts: make([]string, len(r.at))}
	for i, n := range r.at {
		l.Hosts[i] = run.nodeNames[n]
	}
	return l
}

// jobsColl enters node i of job from in the collective m asks for
// (node.Name Op "jobs"); done is called once, when it completes or with
// why it cannot.
func (run *multiRun) jobsColl(from *rootNode, i int, m *node.Name, done func([]byte, error)) {
	j, err := run.dir.Find(from.spec.JobID) // there since its agents said hello: they send collectives after
	if err != nil {
		done(nil, fmt.Errorf("%s across jobs: %w", m.Name, err))
		return
	}
	me := j.Agents[i]
	if d := run.daemons(); d != nil && !run.dir.Holds(m.Procs) {
		d.jobsColl(m.Name, m.Procs, me, m.Data, done)
		return
	}
	run.dir.Enter(m.Name, m.Procs, me, m.Data, done)
}

// jobLayout answers where the one job m names runs (node.Name Op
// "joblayout", agent.JobLayout): a namespace a node registers with its
// PMIx server without ranks of it there.
func (run *multiRun) jobLayout(m *node.Name, done func(*agent.Layout, error)) {
	if len(m.Procs) != 1 {
		done(nil, fmt.Errorf("layout across jobs: want one job, got %v", m.Procs))
		return
	}
	j, err := run.dir.Find(m.Procs[0].Job)
	if d := run.daemons(); d != nil && errors.Is(err, jobsdir.ErrNotRunning) {
		d.jobLayout(m.Procs[0].Job, done)
		return
	}
	if err != nil {
		done(nil, fmt.Errorf("layout of job %s: %w", m.Procs[0].Job, err))
		return
	}
	done(&j.Layout, nil)
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
	j, err := run.dir.Find(p.Job)
	if d := run.daemons(); d != nil && errors.Is(err, jobsdir.ErrNotRunning) {
		d.rankData(p.Job, rank, done)
		return
	}
	n := -1
	if err == nil {
		if n = jobsdir.NodeOf(&j.Layout, rank); n < 0 {
			err = fmt.Errorf("rank %d of job %s of %d ranks", rank, p.Job, j.Layout.Size)
		}
	}
	if err != nil {
		done(nil, false, fmt.Errorf("rank data of rank %d of job %s: %w", rank, p.Job, err))
		return
	}
	job := j.Owner
	run.mu.Lock()
	if _, live := run.live[job]; !live { // ended since (ended drops the waits under run.mu)
		run.mu.Unlock()
		done(nil, false, fmt.Errorf("rank data of rank %d of job %s: job ended", rank, p.Job))
		return
	}
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
