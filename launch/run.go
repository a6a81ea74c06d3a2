package launch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/shm"
)

// JobError is the reason a job failed and the exit code pmirun returns.
type JobError struct {
	Code int
	Msg  string
}

func (e *JobError) Error() string { return e.Msg }

// ExitCode maps Run's error to a process exit code: 0 for nil, the job's
// code for a *JobError, 1 otherwise.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var je *JobError
	if errors.As(err, &je) {
		return je.Code
	}
	return 1
}

type evKind uint8

const (
	evExit evKind = iota
	evJudged
	evInit
	evFinalized
	evDisconnect
	evDisconnectTimer
	evAbort
	evProtocol
)

type event struct {
	kind      evKind
	rank      int
	code      int    // exit or abort code
	sig       int    // signal that killed the rank
	msg       string // abort message or error text
	spoke     bool
	finalized bool
}

// events adapts agent callbacks to the launcher's event loop.
type events struct{ ch chan<- event }

func (e events) RankInit(r int)      { e.ch <- event{kind: evInit, rank: r} }
func (e events) RankFinalized(r int) { e.ch <- event{kind: evFinalized, rank: r} }
func (e events) RankDisconnected(r int, spoke bool) {
	e.ch <- event{kind: evDisconnect, rank: r, spoke: spoke}
}
func (e events) Abort(r, code int, msg string) {
	e.ch <- event{kind: evAbort, rank: r, code: code, msg: msg}
}
func (e events) ProtocolError(r int, err error) {
	e.ch <- event{kind: evProtocol, rank: r, msg: err.Error()}
}

// rankProc is one rank's process, owned by Run's loop.
type rankProc struct {
	rank   int
	cmd    *exec.Cmd
	pid    int
	exited bool
	spoke  bool
	// silent: ended with code 0 without ever speaking PMI.
	silent bool
}

// Run runs the job described by cfg and returns when every rank has been
// reaped. The error is nil when every rank succeeded; a *JobError carries
// the exit code and the reason otherwise.
func Run(ctx context.Context, cfg Config) error {
	early := func(code int, msg string) error {
		if cfg.Stderr != nil {
			fmt.Fprintf(cfg.Stderr, "pmirun: %s\n", msg)
		}
		return &JobError{Code: code, Msg: msg}
	}
	if err := cfg.validate(); err != nil {
		return early(2, err.Error())
	}
	path, err := exec.LookPath(cfg.Prog)
	if err != nil {
		return early(127, fmt.Sprintf("cannot run %q: %v", cfg.Prog, err))
	}
	rec := perf.NewRecorder()
	evch := make(chan event, 8*cfg.Size+64)

	ranks := make([]int, cfg.Size)
	for i := range ranks {
		ranks[i] = i
	}
	ag, err := agent.New(agent.Config{
		JobID:        cfg.JobID,
		Size:         cfg.Size,
		Local:        ranks,
		Mapping:      BlockMapping(cfg.Size, 1, cfg.Size),
		UniverseSize: cfg.UniverseSize,
		Events:       events{evch},
		Logger:       cfg.Logger,
		Perf:         rec,
	})
	if err != nil {
		return early(1, err.Error())
	}
	defer ag.Close()

	out := newOutput(cfg)
	env := baseEnv(cfg)
	var segFile *os.File
	if !cfg.NoShm {
		seg, err := shm.Create(shm.Params{LocalRanks: cfg.Size, WorldSize: cfg.Size, FirstEpoch: 1})
		if err != nil {
			return early(1, fmt.Sprintf("create shared memory: %v (run with --no-shm to use PMI_FD only)", err))
		}
		if err := ag.AttachSegment(seg); err != nil {
			seg.Close()
			return early(1, err.Error())
		}
		segFile = seg.File()
		fd := 4
		if cfg.PMIPort {
			fd = 3
		}
		env = append(env, "FASTPMI_SHM_FD="+strconv.Itoa(fd))
	}
	if cfg.PMIPort {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return early(1, fmt.Sprintf("listen for PMI_PORT connections: %v", err))
		}
		ag.ServeListener(ln)
		env = append(env, "PMI_PORT="+ln.Addr().String())
	}
	procs := make([]*rankProc, cfg.Size)
	l := &loop{cfg: cfg, ag: ag, rec: rec, procs: procs, evch: evch}

	var startErr error
	for r := 0; r < cfg.Size; r++ {
		p, err := startRank(cfg, path, env, r, ag, out, segFile)
		if err != nil {
			startErr = fmt.Errorf("start rank %d: %w", r, err)
			break
		}
		procs[r] = p
		rec.Mark(perf.PhaseRankForked, r)
		go func() {
			werr := p.cmd.Wait()
			ev := event{kind: evExit, rank: p.rank}
			if ps := p.cmd.ProcessState; ps != nil {
				code, sig, signaled := sys.ExitStatus(ps)
				ev.code = code
				if signaled {
					ev.sig = sig
				}
			} else {
				ev.code, ev.msg = 1, werr.Error()
			}
			evch <- ev
		}()
	}
	if startErr != nil {
		l.fail(&JobError{Code: 1, Msg: startErr.Error()})
		// Ranks that never started are gone for the agent's collectives.
		for r := 0; r < cfg.Size; r++ {
			if procs[r] == nil {
				ag.RankGone(r, "never started")
			}
		}
	}
	l.run(ctx)
	ag.Close()
	out.wait(2 * time.Second)

	if cfg.Verbose {
		fmt.Fprintf(cfg.Stderr, "pmirun: %s\n", rec.Summary(cfg.Size))
	}
	if cfg.TracePath != "" {
		if err := writeTrace(cfg.TracePath, rec); err != nil {
			fmt.Fprintf(cfg.Stderr, "pmirun: write trace: %v\n", err)
		}
	}
	if l.failure != nil {
		return l.failure
	}
	return nil
}

func writeTrace(path string, rec *perf.Recorder) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rec.WriteChromeTrace(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// baseEnv is every rank's environment before the per-rank variables: the
// caller's environment without variables of any PMI or PMIx launcher (a
// stale PMI_PORT, or PMIX_* next to PMI_SIZE, would mislead MPI), plus the
// job's variables and --env.
func baseEnv(cfg Config) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PMI_") || strings.HasPrefix(k, "PMIX_") ||
			k == "MPI_LOCALNRANKS" || k == "MPI_LOCALRANKID" || k == "FASTPMI_SHM_FD" {
			continue
		}
		env = append(env, kv)
	}
	if !cfg.PMIPort {
		env = append(env, "PMI_FD=3")
	}
	env = append(env,
		"PMI_SIZE="+strconv.Itoa(cfg.Size),
		"PMI_JOBID="+cfg.JobID,
		"MPI_LOCALNRANKS="+strconv.Itoa(cfg.Size),
	)
	return append(env, cfg.Env...)
}

func startRank(cfg Config, path string, env []string, r int, ag *agent.Agent, out *output, segFile *os.File) (*rankProc, error) {
	var agentEnd, rankEnd *os.File
	if !cfg.PMIPort {
		var err error
		agentEnd, rankEnd, err = sys.Socketpair("pmi-" + strconv.Itoa(r))
		if err != nil {
			return nil, err
		}
		defer rankEnd.Close()
	}
	closeAgentEnd := func() {
		if agentEnd != nil {
			agentEnd.Close()
		}
	}
	stdout, err := out.pipe(r, false)
	if err != nil {
		closeAgentEnd()
		return nil, err
	}
	stderr, err := out.pipe(r, true)
	if err != nil {
		closeAgentEnd()
		stdout.Close()
		return nil, err
	}
	renv := make([]string, len(env), len(env)+3)
	copy(renv, env)
	renv = append(renv, "PMI_RANK="+strconv.Itoa(r), "MPI_LOCALRANKID="+strconv.Itoa(r))
	if cfg.PMIPort {
		renv = append(renv, "PMI_ID="+strconv.Itoa(r))
	}
	cmd := &exec.Cmd{
		Path:        path,
		Args:        append([]string{cfg.Prog}, cfg.Args...),
		Env:         renv,
		Stdout:      stdout,
		Stderr:      stderr,
		SysProcAttr: sys.RankProcAttr(),
	}
	if rankEnd != nil {
		cmd.ExtraFiles = []*os.File{rankEnd} // fd 3 = PMI_FD
	}
	if segFile != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, segFile) // FASTPMI_SHM_FD
	}
	if r == 0 && cfg.Stdin != nil {
		cmd.Stdin = cfg.Stdin
		cmd.WaitDelay = 200 * time.Millisecond // a non-file stdin must not hold Wait
	}
	err = cmd.Start()
	stdout.Close()
	stderr.Close()
	if err != nil {
		closeAgentEnd()
		return nil, err
	}
	if agentEnd == nil {
		return &rankProc{rank: r, cmd: cmd, pid: cmd.Process.Pid}, nil
	}
	conn, err := net.FileConn(agentEnd)
	agentEnd.Close()
	if err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("PMI connection: %w", err)
	}
	if err := ag.Serve(r, conn); err != nil {
		_ = cmd.Process.Kill()
		return nil, err
	}
	return &rankProc{rank: r, cmd: cmd, pid: cmd.Process.Pid}, nil
}

// loop is Run's event loop state; only Run's goroutine touches it.
type loop struct {
	cfg   Config
	ag    *agent.Agent
	rec   *perf.Recorder
	procs []*rankProc
	evch  chan event

	failure  *JobError
	killed   bool
	killTime <-chan time.Time
	anySpoke bool
	silent   []int // ranks that ended with 0 before speaking PMI
}

func (l *loop) live() int {
	n := 0
	for _, p := range l.procs {
		if p != nil && !p.exited {
			n++
		}
	}
	return n
}

// fail records the first failure and ends the job.
func (l *loop) fail(e *JobError) {
	if l.failure != nil {
		return
	}
	l.failure = e
	fmt.Fprintf(l.cfg.Stderr, "pmirun: %s\n", e.Msg)
	l.signalAll(sys.SIGTERM)
	l.killTime = time.After(l.cfg.KillGrace)
	l.killed = true
}

func (l *loop) signalAll(sig os.Signal) {
	for _, p := range l.procs {
		if p != nil && !p.exited {
			_ = sys.SignalGroup(p.pid, sig)
		}
	}
}

func (l *loop) run(ctx context.Context) {
	var timeout <-chan time.Time
	if l.cfg.Timeout > 0 {
		t := time.NewTimer(l.cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	done := ctx.Done()
	for l.live() > 0 {
		select {
		case ev := <-l.evch:
			l.handle(ev)
		case sig := <-l.cfg.Signals:
			if l.failure == nil {
				l.cfg.Logger.Info("forwarding signal to ranks", "signal", sig)
			}
			l.signalAll(sig)
		case <-timeout:
			timeout = nil
			l.fail(&JobError{Code: ExitTimeout, Msg: fmt.Sprintf("job timed out after %v", l.cfg.Timeout)})
		case <-done:
			done = nil
			l.fail(&JobError{Code: 1, Msg: fmt.Sprintf("job cancelled: %v", context.Cause(ctx))})
		case <-l.killTime:
			l.killTime = nil
			l.signalAll(sys.SIGKILL)
		}
	}
	// Drain events that raced with the last exit (e.g. a late abort) so
	// they are not lost, without waiting.
	for {
		select {
		case ev := <-l.evch:
			l.handle(ev)
		default:
			return
		}
	}
}

func (l *loop) handle(ev event) {
	switch ev.kind {
	case evExit:
		p := l.procs[ev.rank]
		if p == nil || p.exited {
			return
		}
		p.exited = true
		l.rec.Mark(perf.PhaseRankExit, ev.rank)
		if ev.sig != 0 || ev.code != 0 {
			how := describeExit(ev)
			if l.failure == nil {
				l.fail(&JobError{Code: ev.code, Msg: fmt.Sprintf("rank %d %s%s", ev.rank, how, l.stage(ev.rank))})
			}
			// Only now release the peers waiting for this rank: the failure
			// is recorded, so their own exits cannot be blamed first.
			l.ag.RankGone(ev.rank, how)
			return
		}
		// Code 0: judge once the agent has read everything the rank sent
		// (its finalize may still be in the socket).
		drained := l.ag.Drained(ev.rank)
		go func() {
			select {
			case <-drained:
			case <-time.After(500 * time.Millisecond):
			}
			spoke, fin := l.ag.RankStatus(ev.rank)
			l.evch <- event{kind: evJudged, rank: ev.rank, spoke: spoke, finalized: fin}
		}()
	case evJudged:
		if ev.finalized {
			return
		}
		if ev.spoke {
			l.fail(&JobError{Code: 1, Msg: fmt.Sprintf("rank %d exited with code 0 without calling PMI finalize", ev.rank)})
		} else {
			l.procs[ev.rank].silent = true
			l.silent = append(l.silent, ev.rank)
			l.checkSilent()
		}
		l.ag.RankGone(ev.rank, "exited with code 0 without PMI finalize")
	case evInit:
		l.anySpoke = true
		if p := l.procs[ev.rank]; p != nil {
			p.spoke = true
		}
		l.checkSilent()
	case evFinalized:
	case evDisconnect:
		p := l.procs[ev.rank]
		if p == nil || p.exited {
			return
		}
		r := ev.rank
		time.AfterFunc(l.cfg.DisconnectGrace, func() { l.evch <- event{kind: evDisconnectTimer, rank: r} })
	case evDisconnectTimer:
		if p := l.procs[ev.rank]; p != nil && !p.exited {
			l.fail(&JobError{Code: 1, Msg: fmt.Sprintf("rank %d closed its PMI connection before finalize and kept running", ev.rank)})
		}
	case evAbort:
		msg := fmt.Sprintf("rank %d called abort with exit code %d", ev.rank, ev.code)
		if ev.msg != "" {
			msg += ": " + ev.msg
		}
		l.fail(&JobError{Code: ev.code, Msg: msg})
	case evProtocol:
		l.fail(&JobError{Code: 1, Msg: fmt.Sprintf("rank %d sent malformed PMI: %s", ev.rank, ev.msg)})
	}
}

// checkSilent fails the job once a rank has ended without PMI while others
// use it: they would wait for it forever.
func (l *loop) checkSilent() {
	if len(l.silent) == 0 || !l.anySpoke || l.failure != nil {
		return
	}
	r := l.silent[0]
	l.fail(&JobError{Code: 1, Msg: fmt.Sprintf("rank %d exited with code 0 before PMI init while other ranks use PMI", r)})
}

// stage says where in PMI a failed rank was, from the agent's view.
func (l *loop) stage(r int) string {
	spoke, fin := l.ag.RankStatus(r)
	switch {
	case fin:
		return " after PMI finalize"
	case spoke:
		return " after PMI init, before finalize"
	}
	return " before PMI init"
}

func describeExit(ev event) string {
	if ev.sig != 0 {
		return fmt.Sprintf("killed by signal %d (%s)", ev.sig, sys.SignalName(ev.sig))
	}
	if ev.msg != "" {
		return "failed: " + ev.msg
	}
	return fmt.Sprintf("exited with code %d", ev.code)
}
