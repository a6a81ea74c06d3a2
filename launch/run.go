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

// event is what a node's rank waiters and agent report to its loop.
type event struct {
	kind      evKind
	rank      int
	code      int    // exit or abort code
	sig       int    // signal that killed the rank
	msg       string // abort message or error text
	spoke     bool
	finalized bool
}

// events adapts agent callbacks to a node's event channel.
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

// rankProc is one rank's process, owned by its node.
type rankProc struct {
	rank   int
	cmd    *exec.Cmd
	pid    int
	exited bool
}

// early reports a failure before any rank started.
func early(cfg Config, code int, msg string) error {
	if cfg.Stderr != nil {
		fmt.Fprintf(cfg.Stderr, "pmirun: %s\n", msg)
	}
	return &JobError{Code: code, Msg: msg}
}

// Run runs the job described by cfg and returns when every rank has been
// reaped. The error is nil when every rank succeeded; a *JobError carries
// the exit code and the reason otherwise.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.validate(); err != nil {
		return early(cfg, 2, err.Error())
	}
	if cfg.multiNode() {
		return runMulti(ctx, cfg)
	}
	path, err := lookProg(cfg.Prog)
	if err != nil {
		return early(cfg, 127, fmt.Sprintf("cannot run %q: %v", cfg.Prog, err))
	}
	rec := perf.NewRecorder()
	ranks := make([]int, cfg.Size)
	for i := range ranks {
		ranks[i] = i
	}
	var n *node
	f := &fate{stderr: cfg.Stderr, end: func(*JobError) { n.kill() }}
	n, err = newNode(cfg, nodeSpec{size: cfg.Size, ranks: ranks, mapping: BlockMapping(cfg.Size, 1, cfg.Size)}, rec, f.event)
	if err != nil {
		return early(cfg, 1, err.Error())
	}
	n.start(path)

	var timeout <-chan time.Time
	if cfg.Timeout > 0 {
		t := time.NewTimer(cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	done := ctx.Done()
	for n.live() > 0 {
		select {
		case ev := <-n.evch:
			n.handle(ev)
		case sig := <-cfg.Signals:
			cfg.Logger.Info("forwarding signal to ranks", "signal", sig)
			n.signal(sig)
		case <-timeout:
			timeout = nil
			f.fail(&JobError{Code: ExitTimeout, Msg: fmt.Sprintf("job timed out after %v", cfg.Timeout)})
		case <-done:
			done = nil
			f.fail(&JobError{Code: 1, Msg: fmt.Sprintf("job cancelled: %v", context.Cause(ctx))})
		case <-n.killTime:
			n.killNow()
		}
	}
	n.drain()
	n.close()
	report(cfg, rec)
	if f.failure != nil {
		return f.failure
	}
	return nil
}

// report prints the start-up summary and writes the trace.
func report(cfg Config, rec *perf.Recorder) {
	if cfg.Verbose {
		fmt.Fprintf(cfg.Stderr, "pmirun: %s\n", rec.Summary(cfg.Size))
	}
	if cfg.TracePath != "" {
		if err := writeTrace(cfg.TracePath, rec); err != nil {
			fmt.Fprintf(cfg.Stderr, "pmirun: write trace: %v\n", err)
		}
	}
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

func describeExit(ev event) string {
	if ev.sig != 0 {
		return fmt.Sprintf("killed by signal %d (%s)", ev.sig, sys.SignalName(ev.sig))
	}
	if ev.msg != "" {
		return "failed: " + ev.msg
	}
	return fmt.Sprintf("exited with code %d", ev.code)
}

func signalName(sig int) string { return sys.SignalName(sig) }

// baseEnv is every rank's environment before the per-rank variables: the
// caller's environment without variables of any PMI or PMIx launcher (a
// stale PMI_PORT, or PMIX_* next to PMI_SIZE, would mislead MPI), plus the
// job's variables and --env.
func baseEnv(cfg Config, size, localSize int) []string {
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
		"PMI_SIZE="+strconv.Itoa(size),
		"PMI_JOBID="+cfg.JobID,
		"MPI_LOCALNRANKS="+strconv.Itoa(localSize),
	)
	return append(env, cfg.Env...)
}

// startRank forks global rank r, local index li.
func startRank(cfg Config, path string, env []string, r, li int, ag *agent.Agent, out *output, segFile *os.File) (*rankProc, error) {
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
	renv = append(renv, "PMI_RANK="+strconv.Itoa(r), "MPI_LOCALRANKID="+strconv.Itoa(li))
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
	if err := ag.Serve(li, conn); err != nil {
		_ = cmd.Process.Kill()
		return nil, err
	}
	return &rankProc{rank: r, cmd: cmd, pid: cmd.Process.Pid}, nil
}
