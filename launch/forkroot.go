package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/pmiwire"
)

// forkRoot is pmirun's root for the fork bootstrap: every job of the run
// — the command line's, and every job its ranks spawn — is a node.Node in
// this process, and one loop (Run's goroutine) drives them all. The
// agents' goroutines reach it only through spawns.
type forkRoot struct {
	cfg    Config
	rec    *perf.Recorder // the command line's job's recorder
	fate   *fate
	names  *agent.Local // the name service every job of the run shares
	stdout io.Writer    // cfg.Stdout and cfg.Stderr, shared by every job's output
	stderr io.Writer
	first  *forkJob   // the command line's job
	jobs   []*forkJob // the jobs whose nodes are open, in start order (the first one's stays to the end)
	njobs  int        // jobs started so far: the next one's Spec.Jobno
	// spawns carries the agents' spawn calls to the loop; quit is closed
	// when the loop is over, so that a late call is refused instead of
	// blocking its agent.
	spawns chan spawnCall
	quit   chan struct{}
	local  []string // this machine's names, for spawn's host info keys
	// closers close the nodes of spawned jobs that have ended, off the
	// loop's goroutine (unmapping a segment, waiting for output);
	// runFork waits for them. What such a node still reports comes
	// through late, to the loop and then to runFork's wait: the fate is
	// only ever touched by the loop's goroutine.
	closers sync.WaitGroup
	late    chan lateEvent
	intr    interrupts // Ctrl-Cs seen
}

// forkJob is one job of a fork run.
type forkJob struct {
	spec  *node.Spec
	n     *node.Node
	procs int // its rank processes, counted against the universe size
	// closing is set by the loop as it hands the node to a closer; the
	// node's events go through forkRoot.late from then on.
	closing atomic.Bool
}

// lateEvent is an event of a job whose node a closer is closing.
type lateEvent struct {
	jobno int
	ev    agent.Event
}

// spawnCall is a spawn request from job parent's agent.
type spawnCall struct {
	parent   int    // its Spec.Jobno
	parentID string // its job id
	rank     int    // the rank that asked
	req      *pmiwire.Spawn
	done     func(jobID string, err error)
}

// forkUpstream is a fork job's Upstream: its collectives are its own (one
// node holds the whole job), names and spawn are the root's.
type forkUpstream struct {
	*agent.Local
	r     *forkRoot
	jobno int
	jobID string
}

func (u forkUpstream) Publish(name, port string, once bool, done func(error)) {
	u.r.names.Publish(name, port, once, done)
}
func (u forkUpstream) Unpublish(name string, done func(error)) { u.r.names.Unpublish(name, done) }
func (u forkUpstream) Lookup(name string, wait time.Duration, done func(string, error)) {
	u.r.names.Lookup(name, wait, done)
}

// Spawn hands the request to the root's loop.
func (u forkUpstream) Spawn(req *pmiwire.Spawn, rank int, done func(string, error)) {
	select {
	case u.r.spawns <- spawnCall{parent: u.jobno, parentID: u.jobID, rank: rank, req: req, done: done}:
	case <-u.r.quit:
		done("", errors.New("spawn refused: the run is over"))
	}
}

// syncWriter serialises the writes of several jobs' outputs to one
// writer (each write is one whole line).
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// runFork runs cfg's job, and every job it spawns, on this machine.
func runFork(ctx context.Context, cfg Config, job *jobOut) error {
	rec := perf.NewRecorderFor(0, cfg.TracePath != "")
	job.rec = rec
	ranks := make([]int, cfg.Size)
	for i := range ranks {
		ranks[i] = i
	}
	spec := cfg.spec([][]int{ranks}, BlockMapping(cfg.Size, 1, cfg.Size))
	if wd, err := os.Getwd(); err == nil && spec.Wdir == "" {
		spec.Wdir = wd // spawned jobs start where this one did
	}
	if err := spec.Validate(); err != nil {
		return early(cfg, 2, err.Error())
	}
	r := &forkRoot{
		cfg: cfg, rec: rec, names: agent.NewLocal(),
		stdout: &syncWriter{w: cfg.Stdout}, stderr: &syncWriter{w: cfg.Stderr},
		spawns: make(chan spawnCall), quit: make(chan struct{}), late: make(chan lateEvent),
		local: localNames(),
	}
	r.fate = &fate{stderr: r.stderr, end: func(*JobError) { r.killAll() }}
	r.intr = interrupts{stderr: r.stderr}
	j, err := r.newJob(spec, rec, cfg.Stdin)
	if err != nil {
		return early(cfg, 1, err.Error())
	}
	if err := j.n.Resolve(); err != nil {
		j.n.Close()
		return early(cfg, node.ExitCodeFor(err), err.Error())
	}
	r.first = j
	r.jobs, r.njobs = []*forkJob{r.first}, 1
	j.n.Start()
	r.loop(ctx)
	close(r.quit)
	r.names.Close()
	r.waitClosers()
	if cfg.ReportPath != "" || cfg.TracePath != "" {
		// The memory counters' only readers (reading /proc/self/status
		// costs 0.1-0.2 ms of a job's end).
		r.first.n.RecordMemory()
	}
	for _, j := range r.jobs {
		j.n.Close()
	}
	report(cfg, rec)
	if r.fate.failure != nil {
		return r.fate.failure
	}
	return nil
}

// newJob creates job spec and its node, whose events the run's fate
// judges under the job's number (emit).
func (r *forkRoot) newJob(spec *node.Spec, rec *perf.Recorder, stdin io.Reader) (*forkJob, error) {
	j := &forkJob{spec: spec, procs: spec.Size}
	n, err := node.New(spec, node.Options{
		Stdin: stdin, Stdout: r.stdout, Stderr: r.stderr, Logger: r.cfg.Logger, Perf: rec,
		Upstream: forkUpstream{Local: agent.NewLocal(), r: r, jobno: spec.Jobno, jobID: spec.JobID},
		Emit:     func(e agent.Event) { r.emit(j, e) },
	})
	if err != nil {
		return nil, err
	}
	j.n = n
	return j, nil
}

// emit hands an event of job j to the run's fate. The node reports on
// its owner's goroutine, the loop's, except while a closer closes it.
func (r *forkRoot) emit(j *forkJob, e agent.Event) {
	if j.closing.Load() {
		r.late <- lateEvent{jobno: j.spec.Jobno, ev: e}
		return
	}
	r.fate.jobEvent(j.spec.Jobno, e)
}

// waitClosers waits for the closers, once the loop is over, judging what
// their nodes still report.
func (r *forkRoot) waitClosers() {
	done := make(chan struct{})
	go func() {
		r.closers.Wait()
		close(done)
	}()
	for {
		select {
		case le := <-r.late:
			r.fate.jobEvent(le.jobno, le.ev)
		case <-done:
			return
		}
	}
}

// Fixed cases of the loop's select, before two per job (its events and
// its kill timer).
const (
	caseSpawn = iota
	caseLate
	caseSignal
	caseTimeout
	caseDone
	caseJobs
)

// loop runs until every rank of every job has ended and been judged.
func (r *forkRoot) loop(ctx context.Context) {
	var timeout <-chan time.Time
	if r.cfg.Timeout > 0 {
		t := time.NewTimer(r.cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	done := ctx.Done()
	cases := make([]reflect.SelectCase, caseJobs)
	for i := range cases {
		cases[i].Dir = reflect.SelectRecv
	}
	cases[caseSpawn].Chan = reflect.ValueOf(r.spawns)
	cases[caseLate].Chan = reflect.ValueOf(r.late)
	cases[caseSignal].Chan = reflect.ValueOf(r.cfg.Signals)
	for r.live() {
		cases[caseTimeout].Chan = reflect.ValueOf(timeout)
		cases[caseDone].Chan = reflect.ValueOf(done)
		cases = cases[:caseJobs]
		for _, j := range r.jobs {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(j.n.Events())},
				reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(j.n.KillTimer())})
		}
		i, v, _ := reflect.Select(cases)
		switch i {
		case caseSpawn:
			r.spawn(v.Interface().(spawnCall))
		case caseLate:
			le := v.Interface().(lateEvent)
			r.fate.jobEvent(le.jobno, le.ev)
		case caseSignal:
			sig := v.Interface().(os.Signal)
			if r.intr.kill(sig) {
				if r.fate.failure != nil {
					r.killAllNow() // already ending: no more grace
				}
				r.fate.fail(interruptError())
				continue
			}
			r.cfg.Logger.Info("forwarding signal to ranks", "signal", sig)
			for _, j := range r.jobs {
				j.n.Signal(sig)
			}
		case caseTimeout:
			timeout = nil
			r.fate.fail(&JobError{Code: ExitTimeout, Msg: fmt.Sprintf("job timed out after %v", r.cfg.Timeout)})
		case caseDone:
			done = nil
			r.fate.fail(&JobError{Code: 1, Msg: fmt.Sprintf("job cancelled: %v", context.Cause(ctx))})
		default:
			ji := (i - caseJobs) / 2
			j := r.jobs[ji]
			if (i-caseJobs)%2 == 0 {
				j.n.Handle(v.Interface().(node.RankEvent))
			} else {
				j.n.KillNow()
			}
			if j.spec.Jobno > 0 && j.n.Live() == 0 {
				// A spawned job's resources go as soon as it has ended
				// (a parent may spawn thousands); the loop never touches
				// its node again.
				r.jobs = slices.Delete(r.jobs, ji, ji+1)
				j.closing.Store(true)
				r.closers.Go(j.n.Close)
			}
		}
	}
}

// live reports whether any job has a rank not yet judged.
func (r *forkRoot) live() bool {
	for _, j := range r.jobs {
		if j.n.Live() > 0 {
			return true
		}
	}
	return false
}

// killAll ends every job's ranks.
func (r *forkRoot) killAll() {
	for _, j := range r.jobs {
		j.n.Kill()
	}
}

// killAllNow sends every job's ranks SIGKILL.
func (r *forkRoot) killAllNow() {
	for _, j := range r.jobs {
		j.n.KillNow()
	}
}

// spawn starts the job c asks for, on this machine, and answers c.
func (r *forkRoot) spawn(c spawnCall) {
	jobID, err := r.startSpawn(c)
	if err != nil {
		spawnFailed(r.stderr, c.parent, err)
	}
	c.done(jobID, err)
}

func (r *forkRoot) startSpawn(c spawnCall) (string, error) {
	if r.fate.failure != nil {
		return "", errors.New("the run is ending")
	}
	root := r.first.spec
	req, err := newSpawnReq(c.req, func(h string) []int {
		for _, l := range r.local {
			if strings.EqualFold(h, l) {
				return []int{0}
			}
		}
		return nil
	}, []int{0}, root.Wdir)
	if err != nil {
		return "", err
	}
	live := 0
	for _, j := range r.jobs {
		live += j.procs
	}
	if err := req.fits(r.cfg.UniverseSize, live); err != nil {
		return "", err
	}
	jobno := r.njobs
	spec, _ := req.childSpec(root, c.parentID, c.rank, jobno, req.place(1, nil))
	if err := spec.Validate(); err != nil {
		return "", err
	}
	j, err := r.newJob(spec, nil, nil)
	if err != nil {
		return "", err
	}
	if err := j.n.Resolve(); err != nil {
		j.n.Close()
		return "", err
	}
	r.jobs = append(r.jobs, j)
	r.njobs++
	j.n.Start()
	return spec.JobID, nil
}

// localNames are the names a spawn's host info key may give this machine.
func localNames() []string {
	names := []string{"localhost", "127.0.0.1", "::1"}
	if h, err := os.Hostname(); err == nil {
		names = append(names, h)
		if short, _, ok := strings.Cut(h, "."); ok {
			names = append(names, short)
		}
	}
	return names
}
