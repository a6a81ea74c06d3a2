package node

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

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

// RankEvent is what a node's rank waiters and agent report to its owner's
// loop (Node.Events), to be passed to Node.Handle; it is opaque. Handle
// turns it into the Event the job's fate reads.
type RankEvent struct {
	kind      evKind
	rank      int
	code      int    // exit or abort code
	sig       int    // signal that killed the rank
	msg       string // abort message or error text
	spoke     bool
	finalized bool
}

type event = RankEvent

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

// rankProc is one rank's process, owned by its node (pid 0 for a played
// rank).
type rankProc struct {
	rank   int
	cmd    *exec.Cmd
	pid    int
	exited bool // its process ended (no more signals)
	judged bool // its end was judged and reported (counts against Node.Live)
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

// baseEnv is every rank's environment before the per-rank variables: the
// environment ranks start from (Spec.launchEnv) without variables of any
// PMI or PMIx launcher (a stale PMI_PORT, or PMIX_* next to PMI_SIZE,
// would mislead MPI), plus the job's variables and Spec.Env.
func baseEnv(spec *Spec, localSize int) []string {
	var env []string
	for _, kv := range spec.launchEnv() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PMI_") || strings.HasPrefix(k, "PMIX_") ||
			k == "MPI_LOCALNRANKS" || k == "MPI_LOCALRANKID" || k == "FASTPMI_SHM_FD" {
			continue
		}
		env = append(env, kv)
	}
	if !spec.PMIPort {
		env = append(env, "PMI_FD=3")
	}
	env = append(env,
		"PMI_SIZE="+strconv.Itoa(spec.Size),
		"PMI_JOBID="+spec.JobID,
		"MPI_LOCALNRANKS="+strconv.Itoa(localSize),
	)
	return append(env, spec.Env...)
}

// startRank forks global rank r, local index li, in the job's working
// directory.
func (n *Node) startRank(r, li int) (*rankProc, error) {
	spec := n.spec
	var agentEnd, rankEnd *os.File
	if !spec.PMIPort {
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
	stdout, err := n.out.Pipe(r, false)
	if err != nil {
		closeAgentEnd()
		return nil, err
	}
	stderr, err := n.out.Pipe(r, true)
	if err != nil {
		closeAgentEnd()
		stdout.Close()
		return nil, err
	}
	renv := make([]string, len(n.env), len(n.env)+3)
	copy(renv, n.env)
	renv = append(renv, "PMI_RANK="+strconv.Itoa(r), "MPI_LOCALRANKID="+strconv.Itoa(li))
	if spec.PMIPort {
		renv = append(renv, "PMI_ID="+n.pmiIDs[li])
	}
	cmd := &exec.Cmd{
		Path:        n.path,
		Args:        append([]string{spec.Prog}, spec.Args...),
		Env:         renv,
		Dir:         spec.Wdir,
		Stdout:      stdout,
		Stderr:      stderr,
		SysProcAttr: sys.RankProcAttr(),
	}
	if rankEnd != nil {
		cmd.ExtraFiles = []*os.File{rankEnd} // fd 3 = PMI_FD
	}
	if n.seg != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, n.seg) // FASTPMI_SHM_FD
	}
	if r == 0 && n.opt.Stdin != nil {
		cmd.Stdin = n.opt.Stdin
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
	if err := n.ag.Serve(li, conn); err != nil {
		_ = cmd.Process.Kill()
		return nil, err
	}
	return &rankProc{rank: r, cmd: cmd, pid: cmd.Process.Pid}, nil
}
