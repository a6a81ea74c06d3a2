package daemon

import (
	"errors"
	"fmt"
	"sync"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/jobsdir"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/netio"
)

// The daemon's directory of jobs. Runs launched separately on the same
// daemons find each other through the names kept at the daemon of their
// first node (names.go); to connect (PMIx_Connect between an
// MPI_Comm_accept server and its clients, then fences and a disconnect
// over both jobs) they need someone who knows both runs' jobs, which
// neither pmirun does. So each run registers its jobs on its name session
// (Op "jobreg": where the job runs and which agent process runs each
// node; "jobunreg" when it ends; all of them when the session ends), and
// sends here what a node asks about a job of another run:
//
//   - "jobs": a collective across jobs naming it, entered by one agent
//     process (Agents[0]), completed by the daemon's jobsdir.Dir once
//     every process hosting a participant entered, through whichever run;
//   - "joblayout": where that job runs;
//   - "rankdata": the data of one of its ranks, which the daemon asks of
//     the run that registered the job (a request of its own on that run's
//     session, Op "rankdata", answered with Op OpAnswer and the same ID)
//     and hands back.

// OpAnswer marks a run's answer to a request of the daemon on a name
// session.
const OpAnswer = "answer"

// maxJobsPerSession bounds the jobs one run registers at once.
const maxJobsPerSession = agent.MaxNamesPerJob

// Bounds on what one run's session has waiting for other runs at once:
// its rank-data requests (each waits for the run that registered the
// job) and its entries in collectives across jobs (each holds its data
// until every process entered), as a text connection's requests are
// bounded (agent.MaxPendingPerConn). A request over them is refused at
// once; the daemon's memory stays bounded by its sessions.
const (
	maxSessionWaiting      = agent.MaxPendingPerConn
	maxSessionWaitingBytes = 64 << 20 // four of the largest entries a frame carries
)

// session is one run's name session as the directory sees it.
type session struct {
	c netio.Conn
	s *Server

	mu     sync.Mutex                 // guards the fields below
	jobs   map[string]bool            // the jobs it registered and did not withdraw
	asks   map[uint64]func(node.Name) // the daemon's requests to it waiting for its answer, by ID
	closed bool                       // the session ended: asks (from other sessions) fail at once
	// waits are its own requests waiting for other runs (wait), by a
	// number of the session's own, with the data they hold in all:
	// bounded, and withdrawn when the session ends (a run that has gone
	// waits for nothing).
	waits        map[uint64]*waiting
	waitSeq      uint64
	waitingBytes int
}

// waiting is one request of a session waiting for other runs.
type waiting struct {
	bytes  int
	cancel func() // takes the request back where it waits; nil until known
}

func (s *Server) newSession(c netio.Conn) *session {
	return &session{c: c, s: s, jobs: map[string]bool{}, asks: map[uint64]func(node.Name){}, waits: map[uint64]*waiting{}}
}

// end withdraws the session's jobs, fails the daemon's requests waiting
// for its answers and takes back its own requests waiting for other
// runs.
func (ss *session) end() {
	ss.mu.Lock()
	ss.closed = true
	jobs, asks, waits := ss.jobs, ss.asks, ss.waits
	ss.jobs, ss.asks, ss.waits = nil, nil, nil
	ss.mu.Unlock()
	for id := range jobs {
		ss.s.dir.Remove(id)
	}
	for _, done := range asks {
		done(node.Name{Err: "the run of that job ended"})
	}
	for _, w := range waits {
		if w.cancel != nil {
			w.cancel()
		}
	}
}

// serveJob serves m, a request about jobs; it reports false if m is not
// one. reply answers it (m's ID set).
func (ss *session) serveJob(m *node.Name, reply func(node.Name)) bool {
	fail := func(err error) { reply(node.Name{Err: err.Error()}) }
	switch m.Op {
	case "jobreg":
		if m.Layout == nil {
			fail(errors.New("register a job: no layout"))
			return true
		}
		ss.mu.Lock()
		n := len(ss.jobs)
		ss.mu.Unlock()
		if n >= maxJobsPerSession {
			fail(fmt.Errorf("register job %s: %w: this run has %d jobs registered", m.Name, agent.ErrQuota, n))
			return true
		}
		if err := ss.s.dir.Add(m.Name, jobsdir.Job[*session]{Layout: *m.Layout, Agents: m.Agents, Owner: ss}); err != nil {
			fail(fmt.Errorf("register a job: %w", err))
			return true
		}
		ss.mu.Lock()
		ss.jobs[m.Name] = true // the session's own loop: end, which withdraws them, runs after it
		ss.mu.Unlock()
		reply(node.Name{})
	case "jobunreg":
		ss.mu.Lock()
		mine := ss.jobs[m.Name]
		delete(ss.jobs, m.Name)
		ss.mu.Unlock()
		if mine {
			ss.s.dir.Remove(m.Name)
		}
		reply(node.Name{})
	case "jobs":
		if len(m.Agents) != 1 {
			fail(fmt.Errorf("%s across jobs: %d entering processes, want 1", m.Name, len(m.Agents)))
			return true
		}
		w, err := ss.wait(m.Name+" across jobs", len(m.Data))
		if err != nil {
			fail(err)
			return true
		}
		withdraw := ss.s.dir.Enter(m.Name, m.Procs, m.Agents[0], m.Data, func(all []byte, err error) {
			ss.waited(w)
			if err != nil {
				fail(err)
				return
			}
			reply(node.Name{Data: all})
		})
		ss.cancelWith(w, withdraw)
	case "joblayout":
		if len(m.Procs) != 1 {
			fail(fmt.Errorf("layout across jobs: want one job, got %v", m.Procs))
			return true
		}
		j, err := ss.s.dir.Find(m.Procs[0].Job)
		if err != nil {
			fail(fmt.Errorf("layout of job %s: %w", m.Procs[0].Job, err))
			return true
		}
		reply(node.Name{Layout: &j.Layout})
	case "rankdata":
		if len(m.Procs) != 1 || len(m.Procs[0].Ranks) != 1 {
			fail(fmt.Errorf("rank data across jobs: want one rank of one job, got %v", m.Procs))
			return true
		}
		j, err := ss.s.dir.Find(m.Procs[0].Job)
		if err != nil {
			fail(fmt.Errorf("rank data of job %s: %w", m.Procs[0].Job, err))
			return true
		}
		w, err := ss.wait("rank data of job "+m.Procs[0].Job, 0)
		if err != nil {
			fail(err)
			return true
		}
		owner := j.Owner
		id := owner.ask(node.Name{Op: "rankdata", Procs: m.Procs}, func(a node.Name) {
			ss.waited(w)
			reply(node.Name{Data: a.Data, NotFound: a.NotFound, Err: a.Err})
		})
		ss.cancelWith(w, func() { owner.forget(id) })
	case OpAnswer:
		ss.mu.Lock()
		done := ss.asks[m.ID]
		delete(ss.asks, m.ID)
		ss.mu.Unlock()
		if done != nil {
			done(*m)
		}
	default:
		return false
	}
	return true
}

// wait enters a request of session ss, holding n bytes, that waits for
// other runs, or refuses it over the session's bounds; waited ends it.
func (ss *session) wait(what string, n int) (uint64, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.waits) >= maxSessionWaiting || ss.waitingBytes+n > maxSessionWaitingBytes {
		return 0, fmt.Errorf("%s: %w: this run has %d requests holding %d bytes waiting for other runs, at most %d and %d",
			what, agent.ErrQuota, len(ss.waits), ss.waitingBytes, maxSessionWaiting, maxSessionWaitingBytes)
	}
	ss.waitSeq++
	ss.waits[ss.waitSeq] = &waiting{bytes: n}
	ss.waitingBytes += n
	return ss.waitSeq, nil
}

// waited ends request id of wait: it was answered.
func (ss *session) waited(id uint64) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if w := ss.waits[id]; w != nil {
		delete(ss.waits, id)
		ss.waitingBytes -= w.bytes
	}
}

// cancelWith says how request id of wait is taken back if the session
// ends first (nil: it was answered already).
func (ss *session) cancelWith(id uint64, cancel func()) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if w := ss.waits[id]; w != nil {
		w.cancel = cancel
	}
}

// ask sends the run of session ss request m; done gets its answer, or a
// failure if the session ends first. It returns the request's ID.
func (ss *session) ask(m node.Name, done func(node.Name)) uint64 {
	m.ID = ss.s.askSeq.Add(1)
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		done(node.Name{Err: "the run of that job ended"})
		return m.ID
	}
	ss.asks[m.ID] = done
	ss.mu.Unlock()
	ss.s.reply(ss.c, FrameName, node.Encode(m))
	return m.ID
}

// forget drops request id of ask, unanswered: whoever asked has gone. An
// answer that comes later is dropped as one that came twice.
func (ss *session) forget(id uint64) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.asks, id)
}
