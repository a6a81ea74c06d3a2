package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/jobsdir"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/netio"
	"github.com/fastpmi/fastpmi/shm"
)

// Config configures a Server.
type Config struct {
	Listen string // address to listen on, e.g. ":7070" or "127.0.0.1:0"
	Secret []byte // the daemon's secret (LoadSecret)
	// MaxJobs bounds the jobs running at once; more are refused (default
	// DefaultMaxJobs).
	MaxJobs int
	Logger  *slog.Logger
	// Starter, when set, plays the ranks of jobs of virtual ranks
	// (node.Spec.Virtual); without one such jobs are refused.
	Starter node.Starter
}

func (c *Config) validate() error {
	if c.Listen == "" {
		return errors.New("daemon: no listen address")
	}
	if len(c.Secret) < minSecret {
		return fmt.Errorf("daemon: secret of %d bytes, want at least %d", len(c.Secret), minSecret)
	}
	if c.MaxJobs == 0 {
		c.MaxJobs = DefaultMaxJobs
	}
	if c.MaxJobs < 1 {
		return fmt.Errorf("daemon: max jobs %d, want at least 1", c.MaxJobs)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// firstFrameTimeout bounds how long an authenticated connection may take
// to say what it wants.
const firstFrameTimeout = 10 * time.Second

// outputTimeout bounds how long the ranks' output, after their job was
// ended (pmirun's Kill, the daemon's shutdown), waits for a pmirun that
// does not read it; after that the output is dropped. While the job runs
// and pmirun lives, output waits for it as long as it takes (Server.run).
const outputTimeout = 30 * time.Second

// Server is a running daemon: New listens, Serve accepts until its
// context ends.
type Server struct {
	cfg   Config
	tr    netio.Transport
	ln    netio.Listener
	start time.Time

	conns  sync.WaitGroup         // one goroutine per accepted connection (and its job)
	names  *agent.Local           // the name service (names.go), each session's names capped; safe for concurrent use
	dir    *jobsdir.Dir[*session] // the jobs runs registered on their name sessions (jobs.go); safe for concurrent use
	askSeq atomic.Uint64          // the daemon's requests to runs (session.ask)
	// sleeper is where idle jobs' agents sleep, so that idle jobs hold
	// no thread each; closed once every job has ended (Serve). nil where
	// the kernel cannot (shm.NewSleeper).
	sleeper *shm.Sleeper

	mu      sync.Mutex // guards the fields below
	jobs    map[*job]struct{}
	ranks   int  // the local ranks of jobs
	closing bool // Serve is shutting down: no new job
	served  uint64
	refused uint64
}

// job is one node of one job being run.
type job struct {
	spec   *node.Spec
	idx    int
	c      netio.Conn
	cancel context.CancelCauseFunc // a *node.Ending cause is told to pmirun
	start  time.Time
	// out ends when the ranks' output (on c) stops waiting for pmirun to
	// read it (run); until then a send on c may wait for pmirun.
	out        context.Context
	dropOutput context.CancelFunc
}

// New listens on cfg.Listen with the daemon's secret.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tr, err := NewTransport(cfg.Secret, cfg.Logger)
	if err != nil {
		return nil, err
	}
	ln, err := tr.Listen(cfg.Listen)
	if err != nil {
		tr.Close()
		return nil, fmt.Errorf("daemon: %w", err)
	}
	return &Server{cfg: cfg, tr: tr, ln: ln, start: time.Now(), jobs: map[*job]struct{}{}, names: agent.NewLocalNames(0),
		dir: jobsdir.New[*session]("on this daemon"), sleeper: shm.NewSleeper()}, nil
}

// NewTransport makes the transport of connections to or from a daemon:
// authenticated with the daemon's secret, frames bounded by MaxFrame. It
// always uses Go's net backend: these connections carry submissions,
// output and status, never a collective, and an io_uring ring costs a
// job's start 1-100 ms to set up and tear down on a busy machine (each
// job's own links follow its --netio).
func NewTransport(secret []byte, log *slog.Logger) (netio.Transport, error) {
	return netio.New(netio.Config{Backend: netio.BackendNet, Secret: secret, Logger: log, MaxFrameSize: MaxFrame})
}

// Addr is the address the daemon listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve accepts connections until ctx ends, then shuts down: it stops
// accepting, tells each job's pmirun why (node.Ending), ends every job's
// ranks and waits for every goroutine it started. It returns nil after a
// shutdown.
func (s *Server) Serve(ctx context.Context) error {
	// Jobs are not children of ctx: they end after their pmirun was told.
	jctx, cancelJobs := context.WithCancel(context.Background())
	defer cancelJobs()
	for {
		c, err := s.ln.Accept(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.cfg.Logger.Error("daemon: accept", "err", err)
			}
			break
		}
		s.conns.Go(func() { s.handle(jctx, c) })
	}
	s.ln.Close()
	s.mu.Lock()
	s.closing = true
	jobs := make([]*job, 0, len(s.jobs))
	for j := range s.jobs {
		jobs = append(jobs, j)
	}
	s.mu.Unlock()
	why := &node.Ending{Msg: "daemon shutting down"}
	if h, err := os.Hostname(); err == nil {
		why.Msg = "daemon on " + h + " shutting down"
	}
	var tell sync.WaitGroup
	for _, j := range jobs {
		tell.Go(func() {
			// Output a pmirun does not read holds the submission (run):
			// it waits a second more, then is dropped.
			drop := time.AfterFunc(time.Second, j.dropOutput)
			defer drop.Stop()
			// On the submission, for a node not yet linked to pmirun; the
			// node itself says it again on its link to pmirun, ahead of
			// the events of the ranks it ends.
			sctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = j.c.Send(sctx, netio.Frame{Type: FrameNotice, Payload: node.Encode(why)})
			cancel()
			j.cancel(why)
		})
	}
	tell.Wait()
	cancelJobs()
	s.names.Close() // lookups still waiting for a name are answered
	s.conns.Wait()
	s.sleeper.Close()
	return s.tr.Close()
}

// Status reports the daemon's jobs and resources.
func (s *Server) Status() Status {
	st := Status{PID: os.Getpid(), Addr: s.Addr().String(), Uptime: time.Since(s.start), MaxJobs: s.cfg.MaxJobs}
	s.mu.Lock()
	for j := range s.jobs {
		st.Jobs = append(st.Jobs, JobStatus{JobID: j.spec.JobID, Node: j.idx, Ranks: len(j.spec.Nodes[j.idx]), Running: time.Since(j.start)})
	}
	st.Served, st.Refused = s.served, s.refused
	st.Strangers = s.ln.Refused()
	s.mu.Unlock()
	st.Goroutines = runtime.NumGoroutine()
	st.FDs, st.Memfds, st.Threads = procCounts()
	return st
}

// handle serves one authenticated connection.
func (s *Server) handle(jctx context.Context, c netio.Conn) {
	defer c.Close()
	fctx, cancel := context.WithTimeout(jctx, firstFrameTimeout)
	f, err := c.Recv(fctx)
	cancel()
	if err != nil {
		s.cfg.Logger.Warn("daemon: no request", "peer", c.RemoteAddr(), "err", err)
		return
	}
	switch f.Type {
	case FrameStatus:
		s.reply(c, FrameStatus, node.Encode(s.Status()))
	case FrameSubmit:
		s.submit(jctx, c, f.Payload)
	case FrameName:
		s.serveNames(jctx, c, f)
	default:
		s.refuse(c, fmt.Sprintf("first frame of type %#x: want a submission, a status request or a name request", f.Type))
	}
}

func (s *Server) reply(c netio.Conn, typ uint16, payload []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), firstFrameTimeout)
	defer cancel()
	_ = c.Send(ctx, netio.Frame{Type: typ, Payload: payload})
}

// refuse answers a submission the daemon will not run.
func (s *Server) refuse(c netio.Conn, why string) {
	s.mu.Lock()
	s.refused++
	s.mu.Unlock()
	s.cfg.Logger.Warn("daemon: refused submission", "peer", c.RemoteAddr(), "why", why)
	s.reply(c, FrameExit, node.Encode(Exit{Err: "daemon refused the job: " + why}))
}

// check validates a submission as the daemon will run it.
func (s *Server) check(sub *Submit) error {
	if sub.Spec == nil {
		return errors.New("no job spec")
	}
	if err := sub.Spec.Validate(); err != nil {
		return fmt.Errorf("job spec: %w", err)
	}
	switch {
	case sub.Node < 0 || sub.Node >= len(sub.Spec.Nodes):
		return fmt.Errorf("node index %d: want 0..%d", sub.Node, len(sub.Spec.Nodes)-1)
	case sub.Spec.Root == "":
		return errors.New("job spec: no root address to dial")
	case len(sub.Spec.Secret) < minSecret:
		return errors.New("job spec: no job secret")
	case sub.Spec.Virtual != "" && s.cfg.Starter == nil:
		return fmt.Errorf("this daemon plays no virtual ranks (%q)", sub.Spec.Virtual)
	}
	return nil
}

// submit runs one node of a job to its end.
func (s *Server) submit(jctx context.Context, c netio.Conn, payload []byte) {
	var sub Submit
	if err := node.DecodeSpec(payload, &sub); err != nil {
		s.refuse(c, err.Error())
		return
	}
	if err := s.check(&sub); err != nil {
		s.refuse(c, err.Error())
		return
	}
	ctx, cancel := context.WithCancelCause(jctx)
	defer cancel(nil)
	j := &job{spec: sub.Spec, idx: sub.Node, c: c, cancel: cancel, start: time.Now()}
	j.out, j.dropOutput = context.WithCancel(context.Background())
	defer j.dropOutput()
	ranks := len(sub.Spec.Nodes[sub.Node])
	s.mu.Lock()
	busy, closing := len(s.jobs) >= s.cfg.MaxJobs, s.closing
	limit := s.filesLocked(ranks)
	if limit == nil {
		limit = s.tasksLocked(ranks)
	}
	if !busy && !closing && limit == nil {
		s.jobs[j] = struct{}{}
		s.ranks += ranks
	}
	s.mu.Unlock()
	switch {
	case closing:
		s.refuse(c, "the daemon is shutting down")
		return
	case busy:
		s.refuse(c, fmt.Sprintf("%d jobs running, the most it runs at once (pmid --max-jobs)", s.cfg.MaxJobs))
		return
	case limit != nil:
		s.refuse(c, limit.Error())
		return
	}
	s.run(ctx, j, s.cfg.Logger.With("job", sub.Spec.JobID))
	s.mu.Lock()
	delete(s.jobs, j)
	s.ranks -= ranks
	s.served++
	s.mu.Unlock()
}

// Descriptors a daemon holds, counted against RLIMIT_NOFILE before it
// takes a job: per local rank its PMI socket end, two output pipe ends
// and its pidfd (and with PMIx the server library's end of the rank's
// connection); per job its submission, its link to pmirun, its listener
// for peer agents, its /dev/null, segment memfd, and its transport's
// descriptors (an io_uring and an eventfd each way with --netio uring).
const (
	rankFiles = 5
	jobFiles  = 8
)

// filesLocked refuses a job of ranks local ranks that the daemon would
// lack descriptors for (sys.FileRoom): a rank that cannot be forked would
// fail its job at start, and a spawning parent sees a refused spawn
// instead. The caller holds s.mu.
func (s *Server) filesLocked(ranks int) error {
	room, lim, ok := sys.FileRoom()
	need := rankFiles*(s.ranks+ranks) + jobFiles*(len(s.jobs)+1)
	if ok && uint64(need) > room {
		return fmt.Errorf("no descriptors for %d more ranks: the daemon would hold about %d for its %d jobs, more than the %d it allows itself (RLIMIT_NOFILE %d less a sixteenth; see ulimit -n)",
			ranks, need, len(s.jobs)+1, room, lim)
	}
	return nil
}

// Tasks a daemon takes of its user's RLIMIT_NPROC, which counts every
// thread of the user's processes, beside its ranks: its own threads and
// its guard's (daemonTasks), and per job running or starting, the forks
// in flight and the threads they block (jobTasks). Generous, as a
// launcher's (launch's launcherTasks): where the Go runtime cannot make
// a thread it needs, the daemon aborts, and every job with it.
const (
	daemonTasks = 24
	jobTasks    = 8
)

// tasksLocked refuses a job of ranks local ranks that the daemon's
// RLIMIT_NPROC has no room for, counting its running jobs' ranks (not
// what they started, nor the user's other processes). The caller holds
// s.mu.
func (s *Server) tasksLocked(ranks int) error {
	lim, err := sys.ProcessLimit()
	need := uint64(s.ranks+ranks) + daemonTasks + jobTasks*uint64(len(s.jobs)+1)
	if err == nil && lim > 0 && need > lim {
		return fmt.Errorf("no room for %d more ranks: the daemon would run about %d processes and threads for its %d jobs, more than RLIMIT_NPROC %d allows (see ulimit -u)",
			ranks, need, len(s.jobs)+1, lim)
	}
	return nil
}

// run runs j's node with its input and output on the submission
// connection, and ends the submission with an Exit frame; it returns when
// the node has ended and the connection's reader and the input forwarder
// are done. jlog is the job's logger: the node's agent adds the node to
// what it logs, and so does run.
func (s *Server) run(ctx context.Context, j *job, jlog *slog.Logger) {
	log := jlog.With("node", j.idx)
	// The ranks' output and the Exit frame wait for pmirun to read them
	// as long as it lives and the job runs, as a pipe would (pmirun |
	// less): out ends when the node gives pmirun up (Lost), when the
	// submission is lost, or outputTimeout after the job was ended (a
	// second after the daemon began to shut down, Serve); output is
	// dropped after that.
	out, dropOutput := j.out, j.dropOutput
	stopDrop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(outputTimeout, dropOutput)
		context.AfterFunc(out, func() { t.Stop() })
	})
	defer stopDrop()
	var (
		helpers sync.WaitGroup
		stdin   io.Reader
		pr      *io.PipeReader
		pw      *io.PipeWriter
		input   chan []byte // rank 0's input, closed at its end (owned by the reader)
	)
	if j.idx == j.spec.StdinNode() {
		pr, pw = io.Pipe()
		stdin = pr
		input = make(chan []byte, 256) // at most 256 frames held: MaxFrame each
		helpers.Go(func() {
			for b := range input {
				if _, err := pw.Write(b); err != nil {
					continue // rank 0 is gone: drain
				}
			}
			pw.Close()
		})
	}
	// The reader ends when the connection does: pmirun closes it, or
	// handle's deferred Close after the Exit frame. Until then it feeds
	// rank 0's input and turns Kill or a lost pmirun into ending the job.
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		open := input != nil
		defer func() {
			if open {
				close(input)
			}
		}()
		for {
			f, err := j.c.Recv(context.Background())
			if err != nil {
				j.cancel(nil)
				dropOutput()
				return
			}
			switch f.Type {
			case FrameStdin:
				if open {
					select {
					case input <- f.Payload:
					case <-ctx.Done():
					}
				}
			case FrameStdinEOF:
				if open {
					open = false
					close(input)
				}
			case FrameKill:
				j.cancel(nil)
			default:
				log.Warn("daemon: unexpected frame on a submission", "type", f.Type)
			}
		}
	}()
	host, _, _ := net.SplitHostPort(j.c.LocalAddr().String())
	err := node.RunAgent(ctx, j.spec, node.AgentOptions{
		Index:   j.idx,
		Listen:  net.JoinHostPort(host, "0"), // peers reach it where pmirun reached the daemon
		Stdin:   stdin,
		Stdout:  &frameWriter{ctx: out, c: j.c, typ: FrameStdout},
		Stderr:  &frameWriter{ctx: out, c: j.c, typ: FrameStderr},
		Logger:  jlog,
		Sleeper: s.sleeper,
		Lost:    dropOutput,
	})
	if pr != nil {
		pr.Close() // the input forwarder drains
	}
	ex := Exit{}
	if err != nil {
		ex.Err = err.Error()
		log.Warn("daemon: job node ended", "err", err)
	}
	// After the output, as pmirun reads it.
	_ = j.c.Send(out, netio.Frame{Type: FrameExit, Payload: node.Encode(ex)})
	// Close flushes the Exit frame; the reader's Recv then fails and it
	// closes input, which ends the forwarder.
	j.c.Close()
	<-readerDone
	helpers.Wait()
}

// frameWriter sends what a node's Output writes — whole lines — as frames
// of type typ on a submission connection, each waiting for pmirun until
// ctx ends.
type frameWriter struct {
	ctx context.Context
	c   netio.Conn
	typ uint16
}

func (w *frameWriter) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 { // a line longer than a frame goes in pieces
		n := min(len(p), MaxFrame)
		if err := w.c.Send(w.ctx, netio.Frame{Type: w.typ, Payload: p[:n]}); err != nil {
			return 0, err
		}
		p = p[n:]
	}
	return total, nil
}
