package node

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/internal/guard"
	"github.com/fastpmi/fastpmi/internal/sys"
)

// evKind is the stage of a RankEvent in the node's loop.
type evKind uint8

const (
	evAgent           evKind = iota // the agent reported ev (agent.Config.Events)
	evExit                          // the rank's process was reaped: ev.Code, ev.Sig, ev.Msg
	evJudged                        // an evExit once the agent served all the rank sent: ev.Spoke, ev.Fin
	evDisconnectTimer               // an EventDisconnected rank still runs after the grace
	evTopology                      // a rank asked for the topology file (topology.go)
	evStarted                       // the fork phase is over (Start): forks, each rank's fork
	evKillGrace                     // Kill's grace is over: SIGKILL what is left
)

// RankEvent is what a node's rank waiters and agent report to its owner's
// loop (Node.Events), to be passed to Node.Handle; it is opaque. Handle
// judges it and emits the agent.Event the job's fate reads.
type RankEvent struct {
	kind evKind
	ev   agent.Event // Rank always; the rest as kind says
	// groupGone (evExit) says the rank's process group had no process
	// left once the rank was reaped: its guard registration may end.
	groupGone bool
	// forks (evStarted) is each local rank's fork, by local index.
	forks []forked
}

type event = RankEvent

// rankProc is one rank's process, owned by its node (pid 0 for a played
// rank).
type rankProc struct {
	rank  int
	local int
	proc  *sys.Child // nil for a played rank
	pid   int
	pmi   net.Conn // the agent's end of PMI_FD (nil with PMI_PORT); set before its waiter starts
	// served says pmi was handed to the agent, by the owner once every
	// rank is forked (evStarted) or by the rank's waiter once the process
	// has ended, whichever comes first.
	served atomic.Bool
	exited bool // its process ended (no more signals to it)
	// leftBehind says processes of its group outlived it (groupGone was
	// false at its exit): the group's id stays theirs, and they get the
	// job's signals, until a signal finds the group empty.
	leftBehind bool
	judged     bool // its end was judged and reported (counts against Node.Live)
	// guarded says its process group is registered with the process's
	// guard (internal/guard): one guard.Remove is owed, made when the
	// group is found empty at the rank's exit, or at Node.Close.
	guarded bool
}

func describeExit(ev agent.Event) string {
	if ev.Sig != 0 {
		return fmt.Sprintf("killed by signal %d (%s)", ev.Sig, sys.SignalName(ev.Sig))
	}
	if ev.Msg != "" {
		return "failed: " + ev.Msg
	}
	return fmt.Sprintf("exited with code %d", ev.Code)
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
			k == "MPI_LOCALNRANKS" || k == "MPI_LOCALRANKID" || k == "FASTPMI_SHM_FD" || k == "FASTPMI_APPNUM" || k == guard.TagVar {
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
	if spec.SpawnerJobID != "" {
		env = append(env, "PMI_SPAWNED=1")
	}
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
	stdout, err := n.outFile(r, spec.OutPattern, false)
	if err != nil {
		closeAgentEnd()
		return nil, err
	}
	stderr, err := n.outFile(r, spec.ErrPattern, true)
	if err != nil {
		closeAgentEnd()
		stdout.Close()
		return nil, err
	}
	ai := n.apps[li]
	app := &spec.Apps[ai]
	renv := make([]string, len(n.env), len(n.env)+len(app.Env)+4)
	copy(renv, n.env)
	renv = append(renv, app.Env...)
	if n.pmixDir != "" {
		// A spawned Open MPI job's commands carry its parent's variables
		// (Open MPI copies its OMPI_MCA_* into them), this directory's
		// among them: the parent's goes with the parent's node.
		renv = append(renv, ompiShmDirVar+"="+n.pmixDir)
	}
	if app.Path != "" {
		renv = setEnv(renv, "PATH", app.Path)
	}
	if app.Wdir != "" {
		renv = setEnv(renv, "PWD", n.wdir(ai))
	}
	renv = append(renv, "PMI_RANK="+strconv.Itoa(r), "MPI_LOCALRANKID="+strconv.Itoa(li), "FASTPMI_APPNUM="+strconv.Itoa(ai))
	if spec.PMIPort {
		renv = append(renv, "PMI_ID="+n.pmiIDs[li])
	}
	if n.pmix != nil {
		penv, err := n.pmix.Env(li)
		if err != nil {
			closeAgentEnd()
			stdout.Close()
			stderr.Close()
			return nil, err
		}
		renv = append(renv, penv...)
	}
	stdin := n.devNull
	switch {
	case n.stdins != nil:
		stdin = n.stdins[li]
	case r == spec.StdinRank && n.opt.Stdin != nil:
		in, err := stdinFiles(n.opt.Stdin, 1)
		if err != nil {
			closeAgentEnd()
			stdout.Close()
			stderr.Close()
			return nil, err
		}
		stdin = in[0]
	}
	if stdin != n.opt.Stdin && stdin != n.devNull {
		defer stdin.Close() // the child has its copy
	}
	files := []*os.File{stdin, stdout, stderr}
	if rankEnd != nil {
		files = append(files, rankEnd) // fd 3 = PMI_FD
	}
	if n.seg != nil {
		files = append(files, n.seg) // FASTPMI_SHM_FD
	}
	var cpus []int
	if n.binds != nil {
		cpus = n.binds[li]
	}
	var proc *sys.Child
	env, path := dedupEnv(renv), n.paths[ai]
	err = sys.StartWith(sys.ForkAttr{CPUs: cpus, TimerSlack: n.slack, Umask: n.spec.Umask}, func() error {
		var err error
		if !n.shells[ai].Load() {
			proc, err = sys.StartChild(path, append([]string{app.Prog}, app.Args...), env, n.wdir(ai), files, sys.RankProcAttr())
			if err == nil || !sys.IsExecFormat(err) || !shellScript(path) {
				return err
			}
			n.shells[ai].Store(true)
		}
		// A text file without "#!": run by /bin/sh, as execvp (and a
		// shell) would run it.
		proc, err = sys.StartChild(shellPath, append([]string{shellPath, path}, app.Args...), env, n.wdir(ai), files, sys.RankProcAttr())
		return err
	})
	stdout.Close()
	stderr.Close()
	if err != nil {
		closeAgentEnd()
		return nil, err
	}
	// The rank leads its process group (sys.RankProcAttr): from now on
	// the group dies with this process, however this process ends.
	p := &rankProc{rank: r, local: li, proc: proc, pid: proc.Pid, guarded: guard.Add(proc.Pid)}
	if agentEnd == nil {
		return p, nil
	}
	p.pmi, err = net.FileConn(agentEnd)
	agentEnd.Close()
	if err != nil {
		_ = proc.Kill()
		p.unguard()
		return nil, fmt.Errorf("PMI connection: %w", err)
	}
	return p, nil
}

// unguard ends p's registration with the process's guard, if it has one.
func (p *rankProc) unguard() {
	if p.guarded {
		guard.Remove(p.pid)
		p.guarded = false
	}
}

// serve hands p's PMI connection to the agent, once: the owner does it
// once every rank is forked (evStarted), a rank's waiter as soon as its
// process has ended (an ended rank takes no CPU from the forks still to
// come, and what it sent is served before its exit is judged). A rank
// the agent refuses is killed; its exit is judged as any other.
func (n *Node) serve(p *rankProc) {
	if p.pmi == nil || !p.served.CompareAndSwap(false, true) {
		return
	}
	if err := n.ag.Serve(p.local, p.pmi); err != nil {
		n.opt.Logger.Error("serve rank", "rank", p.rank, "err", err)
		_ = p.proc.Kill()
	}
}

// outFile returns the write end of rank r's stdout (or stderr): a file
// named by pattern (relative to the job's working directory), or a pipe
// to the job's output when pattern is "".
func (n *Node) outFile(r int, pattern string, stderr bool) (*os.File, error) {
	if pattern == "" {
		return n.out.Pipe(r, stderr)
	}
	name := Expand(pattern, r, n.host, time.Time{})
	if !filepath.IsAbs(name) && n.spec.Wdir != "" {
		name = filepath.Join(n.spec.Wdir, name)
	}
	// Made with the ranks' umask (a daemon's job's is pmirun's), as the
	// ranks would make it.
	var f *os.File
	err := sys.StartWith(sys.ForkAttr{Umask: n.spec.Umask}, func() (err error) {
		f, err = os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o666)
		return err
	})
	if err != nil {
		// %v: a missing directory is not a missing program (exit 127).
		return nil, fmt.Errorf("output file of rank %d: %v", r, err)
	}
	return f, nil
}
