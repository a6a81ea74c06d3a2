package launch

import (
	"context"
	"errors"
	"fmt"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/daemon"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/netio"
)

// The daemons' directory of jobs (agent/daemon's jobs.go): a run on
// daemons registers each of its jobs, once its agents said hello, with
// the daemon that keeps its names, and withdraws it when it ends. Runs
// launched separately on the same daemons find each other by name, and
// then a collective naming a job of another run (PMIx_Connect between an
// MPI_Comm_accept server and its clients, and the fences and disconnect
// that follow) is completed there, where every run's jobs are known; the
// layout of such a job, and the data of one of its ranks, are asked
// there too: the daemon asks the run that registered the job, on its
// session, for the rank's data (serveDaemon).

// daemons is the run's session with the daemons' name service and
// directory of jobs, or nil for a run not on daemons.
func (run *multiRun) daemons() *daemonNames {
	d, _ := run.names.(*daemonNames)
	return d
}

// register enters job id, laid out as l with agents as its nodes' agent
// processes, in the daemons' directory. A job missing there is only one
// that other runs cannot connect to: a failure is logged.
func (d *daemonNames) register(id string, l agent.Layout, agents []string) {
	d.call(node.Name{Op: "jobreg", Name: id, Layout: &l, Agents: agents}, func(r node.Name) {
		if r.Err != "" {
			d.log.Warn("register the job with the daemons", "job", id, "err", r.Err)
		}
	})
}

// unregister withdraws job id from the daemons' directory.
func (d *daemonNames) unregister(id string) {
	d.call(node.Name{Op: "jobunreg", Name: id}, func(node.Name) {})
}

// jobsColl enters agent process me in a collective of kind over procs,
// some of another run, with its data.
func (d *daemonNames) jobsColl(kind string, procs []agent.JobRanks, me string, data []byte, done func([]byte, error)) {
	d.call(node.Name{Op: "jobs", Name: kind, Procs: procs, Agents: []string{me}, Data: data, Wait: agent.MaxNameWait}, func(r node.Name) {
		if r.Err != "" {
			done(nil, errors.New(r.Err))
			return
		}
		done(r.Data, nil)
	})
}

// jobLayout asks where job of another run runs.
func (d *daemonNames) jobLayout(job string, done func(*agent.Layout, error)) {
	d.call(node.Name{Op: "joblayout", Procs: []agent.JobRanks{{Job: job}}}, func(r node.Name) {
		switch {
		case r.Err != "":
			done(nil, errors.New(r.Err))
		case r.Layout == nil:
			done(nil, fmt.Errorf("layout of job %s: the daemon said nothing", job))
		default:
			done(r.Layout, nil)
		}
	})
}

// rankData asks for the data of rank of job of another run.
func (d *daemonNames) rankData(job string, rank int, done func([]byte, bool, error)) {
	d.call(node.Name{Op: "rankdata", Procs: []agent.JobRanks{{Job: job, Ranks: []int{rank}}}, Wait: agent.MaxNameWait}, func(r node.Name) {
		if r.Err != "" {
			done(nil, false, errors.New(r.Err))
			return
		}
		done(r.Data, !r.NotFound, nil)
	})
}

// serveDaemon answers a request the daemon sends on the session: the data
// of a rank of one of the run's jobs, for another run (Op "rankdata").
func (run *multiRun) serveDaemon(m node.Name, answer func(node.Name)) {
	if m.Op != "rankdata" {
		answer(node.Name{ID: m.ID, Err: fmt.Sprintf("unknown request %q from the daemon", m.Op)})
		return
	}
	run.jobRankData(&m, func(blob []byte, found bool, err error) {
		resp := node.Name{ID: m.ID, Data: blob, NotFound: !found && err == nil}
		if err != nil {
			resp.Err = err.Error()
		}
		answer(resp)
	})
}

// answerDaemon sends the answer to the daemon's request m.ID.
func (d *daemonNames) answerDaemon(m node.Name) {
	m.Op = daemon.OpAnswer
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	defer cancel()
	if err := d.c.Send(ctx, netio.Frame{Type: daemon.FrameName, Payload: node.Encode(m)}); err != nil {
		d.log.Warn("answer the daemon", "err", err)
	}
}
