package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/shm"
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
	stdout io.Writer    // cfg.Stdout and cfg.Stderr (Run's outputChecks, which serialise writes), shared by every job's output
	stderr io.Writer
	first  *forkJob // the command line's job
	// jobs are the jobs whose nodes are open, in start order: the first
	// one stays to the end, a spawned one goes once its Live is 0 (handle).
	jobs  []*forkJob
	procs int // the rank processes of jobs, counted against the universe size
	njobs int // jobs started so far: the next one's Spec.Jobno
	// The loop waits for events of every job's node on one bell, not on
	// each node's channel: a storm of spawns leaves thousands of jobs
	// live, and a select over all of them cost O(jobs) per event.
	// readyJobs are the jobs whose nodes have queued events since the
	// loop last took them (ready); bell has one slot.
	readyMu   sync.Mutex
	readyJobs []*forkJob
	bell      chan struct{}
	// spawns carries the agents' spawn calls to the loop; quit is closed
	// when the loop is over, so that a late call is refused instead of
	// blocking its agent.
	spawns chan spawnCall
	quit   chan struct{}
	local  []string // this machine's names, for spawn's host info keys
	// sleeper is where every job's agent sleeps when idle, so that a
	// storm's live jobs hold no thread each; closed after every node.
	sleeper *shm.Sleeper
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
	rec   *perf.Recorder // a spawned job's own trace, merged into the run's once its node is closed (traced); nil if untraced
	procs int            // its rank processes, counted against the universe size; 0 once they have ended
	// closing is set by the loop as it hands the node to a closer; the
	// node's events go through forkRoot.late from then on.
	closing atomic.Bool
	// ready says the job is among forkRoot.readyJobs, not yet taken by
	// the loop: set by forkRoot.ready (the node's goroutines), cleared by
	// the loop before it reads the node's events.
	ready atomic.Bool
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
		stdout: cfg.Stdout, stderr: cfg.Stderr, // Run's outputChecks: they serialise the jobs' writes
		spawns: make(chan spawnCall), quit: make(chan struct{}), late: make(chan lateEvent),
		bell:  make(chan struct{}, 1),
		local: localNames(), sleeper: shm.NewSleeper(),
	}
	r.fate = &fate{stderr: r.stderr, end: func(*JobError) { r.killAll() }}
	r.intr = interrupts{stderr: r.stderr}
	j, err := r.newJob(spec, rec, cfg.Stdin)
	if err != nil {
		defer report(cfg, rec) // a trace of what there was: never an older file's
		return early(cfg, 1, err.Error())
	}
	if err := j.n.Resolve(); err != nil {
		j.n.Close()
		defer report(cfg, rec)
		return early(cfg, node.ExitCodeFor(err), err.Error())
	}
	r.first = j
	r.jobs, r.njobs, r.procs = []*forkJob{r.first}, 1, j.procs
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
		r.close(j)
	}
	r.sleeper.Close()
	report(cfg, rec)
	if e := r.fate.outcome(); e != nil {
		return e
	}
	return nil
}

// newJob creates job spec and its node, whose events the run's fate
// judges under the job's number (emit).
func (r *forkRoot) newJob(spec *node.Spec, rec *perf.Recorder, stdin io.Reader) (*forkJob, error) {
	j := &forkJob{spec: spec, procs: spec.Size}
	if spec.Jobno > 0 {
		j.rec = rec
	}
	n, err := node.New(spec, node.Options{
		Stdin: stdin, Stdout: r.stdout, Stderr: r.stderr, Logger: r.cfg.Logger, Perf: rec,
		Upstream: forkUpstream{Local: agent.NewLocal(), r: r, jobno: spec.Jobno, jobID: spec.JobID},
		Emit:     func(e agent.Event) { r.emit(j, e) },
		Ready:    func() { r.ready(j) },
		Sleeper:  r.sleeper,
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
	r.fate.jobEvent(j.spec.Jobno, "", e)
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
			r.fate.jobEvent(le.jobno, "", le.ev)
		case <-done:
			return
		}
	}
}

// loop runs until every rank of every job has ended and been judged.
func (r *forkRoot) loop(ctx context.Context) {
	var timeout <-chan time.Time
	if r.cfg.Timeout > 0 {
		t := time.NewTimer(r.cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	done := ctx.Done()
	var ready []*forkJob
	for r.live() {
		select {
		case c := <-r.spawns:
			r.spawn(c)
		case le := <-r.late:
			r.fate.jobEvent(le.jobno, "", le.ev)
		case sig := <-r.cfg.Signals:
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
		case <-timeout:
			timeout = nil
			r.fate.fail(&JobError{Code: ExitTimeout, Msg: fmt.Sprintf("job timed out after %v", r.cfg.Timeout)})
		case <-done:
			done = nil
			r.fate.fail(&JobError{Code: 1, Msg: fmt.Sprintf("job cancelled: %v", context.Cause(ctx))})
		case <-r.bell:
			ready = r.takeReady(ready[:0])
			for _, j := range ready {
				r.handle(j)
			}
			clear(ready) // no job is kept alive by the loop's scratch
		}
	}
}

// ready is a node's Options.Ready: job j has events queued. It names j to
// the loop once until the loop takes it (forkJob.ready) and rings the
// loop's bell; it never blocks.
func (r *forkRoot) ready(j *forkJob) {
	if !j.ready.CompareAndSwap(false, true) {
		return
	}
	r.readyMu.Lock()
	r.readyJobs = append(r.readyJobs, j)
	r.readyMu.Unlock()
	select {
	case r.bell <- struct{}{}:
	default: // rung already: the loop takes every job named so far
	}
}

// takeReady appends to dst the jobs named since the last call.
func (r *forkRoot) takeReady(dst []*forkJob) []*forkJob {
	r.readyMu.Lock()
	defer r.readyMu.Unlock()
	dst = append(dst, r.readyJobs...)
	clear(r.readyJobs)
	r.readyJobs = r.readyJobs[:0]
	return dst
}

// handle passes job j's queued events to its node, and hands a spawned
// job that has ended to a closer. It takes at most handleBatch events, so
// that one busy job does not hold up the others: if more are queued it
// names j again, behind the jobs already named.
func (r *forkRoot) handle(j *forkJob) {
	if j.closing.Load() {
		return // named before it ended: its closer takes what is left
	}
	j.ready.Store(false) // before the reads: an event queued after them names j again
	evs := j.n.Events()
	for range handleBatch {
		select {
		case ev := <-evs:
			j.n.Handle(ev)
		default:
			return
		}
		if j.n.Live() == 0 {
			// Its processes have ended: they no longer count against
			// the universe size, though the first job stays in jobs.
			r.procs -= j.procs
			j.procs = 0
		}
		if j.spec.Jobno > 0 && j.n.Live() == 0 {
			// A spawned job's resources go as soon as it has ended
			// (a parent may spawn thousands); the loop never touches
			// its node again.
			i := slices.Index(r.jobs, j)
			r.jobs = slices.Delete(r.jobs, i, i+1)
			r.fate.jobOver(j.spec.Jobno)
			j.closing.Store(true)
			r.closers.Go(func() { r.close(j) })
			return
		}
	}
	r.ready(j)
}

// close closes job j's node and adds a spawned job's trace to the run's,
// on a process of its own ("job J node 0 (in pmirun)"), on the run's
// clock.
func (r *forkRoot) close(j *forkJob) {
	j.n.Close()
	if j.rec != nil {
		r.rec.Merge(perf.NodeInfo{Node: 0, Job: j.spec.Jobno, Offset: j.rec.Start().Sub(r.rec.Start()), Local: true}, j.rec.Events())
	}
}

// handleBatch bounds the events handle takes from one job at a time.
const handleBatch = 64

// live reports whether any job has a rank not yet judged: the first job,
// or any spawned one (jobs holds only spawned jobs with a live rank).
func (r *forkRoot) live() bool {
	return r.first.n.Live() > 0 || len(r.jobs) > 1
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
	if err := req.fits(r.cfg.UniverseSize, r.procs); err != nil {
		return "", err
	}
	if err := r.filesFor(req.size); err != nil {
		return "", err
	}
	jobno := r.njobs
	spec, _ := req.childSpec(root, c.parentID, c.rank, jobno, req.place(1, nil))
	if err := spec.Validate(); err != nil {
		return "", err
	}
	var rec *perf.Recorder
	if r.rec.Tracing() {
		rec = perf.NewTracer(0)
	}
	j, err := r.newJob(spec, rec, nil)
	if err != nil {
		return "", err
	}
	if err := j.n.Resolve(); err != nil {
		j.n.Close()
		return "", err
	}
	r.jobs = append(r.jobs, j)
	r.njobs++
	r.procs += j.procs
	j.n.Start()
	return spec.JobID, nil
}

// filesFor refuses a spawn of size processes for which pmirun would not
// have the descriptors (sys.FileRoom): a rank that cannot be forked would
// end the whole run, where a refused spawn is an error its parent sees.
// It counts the live jobs' ranks and nodes.
func (r *forkRoot) filesFor(size int) error {
	room, lim, ok := sys.FileRoom()
	need := launcherFiles(r.cfg.MPI)*(r.procs+size) + jobFiles*(len(r.jobs)+1) + launcherFilesFixed
	if ok && uint64(need) > room {
		return fmt.Errorf("%d more processes: pmirun would hold about %d descriptors for its %d live jobs, more than the %d it allows itself (RLIMIT_NOFILE %d less a sixteenth; see ulimit -n)",
			size, need, len(r.jobs)+1, room, lim)
	}
	return nil
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
