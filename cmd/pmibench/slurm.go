package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/internal/slurmconf"
	"github.com/fastpmi/fastpmi/internal/sys"
)

// Slurm as a peer (-slurm): pmibench starts a one-node Slurm of its own,
// the way the end-to-end tests do (tests/e2e/slurm_test.go) — a munged
// with its own key and socket, slurmctld and slurmd, every file they write
// in one temporary directory — and runs the workloads under
// "srun --mpi=pmi2" (or --mpi=pmix with -mpi pmix) as one more column.
// Each srun is a whole Slurm job: allocation by slurmctld, a step launched
// by slurmd's slurmstepd, the MPI plugin serving the ranks; that is what a
// user of a Slurm cluster waits for.
//
// The three daemons run in a PID namespace of their own (unshare --pid
// --kill-child), its init a shell that starts them: killing unshare kills
// the namespace's init, and with it every daemon, slurmstepd and rank left
// in it, whatever state they are in. unshare gets the parent-death signal
// (pmibench killed: the namespace goes too) and a UTS namespace whose host
// name is the node's, so slurmctld and slurmd know who they are. The
// daemons listen on free loopback ports found when Slurm starts, so
// several pmibench runs and the tests' own Slurms do not meet.

// slurmNode is the node's name (its UTS namespace's host name).
const slurmNode = "pmibench"

// slurmUpTimeout bounds the wait for the node to be idle.
const slurmUpTimeout = 30 * time.Second

// slurmTools are the programs a local Slurm needs.
var slurmTools = []string{"munged", "slurmctld", "slurmd", "srun", "sinfo", "unshare"}

// localSlurm is a running one-node Slurm that pmibench started.
type localSlurm struct {
	dir  string     // every file of the daemons; removed by stop
	srun string     // absolute path of srun
	env  []string   // srun's environment: pmibench's without SLURM_*, and SLURM_CONF
	cmd  *exec.Cmd  // unshare, parent of the namespace
	done chan error // receives cmd.Wait's result once
}

// startSlurm starts munged, slurmctld and slurmd and waits until the node
// is idle. Progress and the daemons' log tails on failure go to stderr.
func startSlurm(ctx context.Context, stderr io.Writer) (*localSlurm, error) {
	for _, tool := range slurmTools {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("-slurm: %s not found (%v): install munge, slurmctld, slurmd and slurm-client (make deps)", tool, err)
		}
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("-slurm: slurmd runs jobs as their users and needs root")
	}
	srun, err := exec.LookPath("srun")
	if err == nil {
		srun, err = filepath.Abs(srun)
	}
	if err != nil {
		return nil, fmt.Errorf("-slurm: %w", err)
	}
	dir, err := os.MkdirTemp("", "pmibench-slurm-")
	if err != nil {
		return nil, fmt.Errorf("-slurm: %w", err)
	}
	s := &localSlurm{dir: dir, srun: srun}
	if err := s.writeConfig(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("-slurm: %w", err)
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM_") {
			s.env = append(s.env, kv)
		}
	}
	s.env = append(s.env, "SLURM_CONF="+s.path("slurm.conf"))

	log, err := os.Create(s.path("daemons.out"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("-slurm: %w", err)
	}
	defer log.Close()
	// The namespace's init: munged first (the others authenticate with
	// it), then the two Slurm daemons, in the foreground each.
	script := `hostname "$1" || exit 1
munged --foreground --force --key-file="$2/munge.key" --socket="$2/munge.sock" --pid-file="$2/munged.pid" --log-file="$2/munged.log" --seed-file="$2/munged.seed" &
i=0; while [ ! -S "$2/munge.sock" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
slurmctld -D -i &
slurmd -D &
wait`
	s.cmd = exec.Command("unshare", "--pid", "--uts", "--mount-proc", "--fork", "--kill-child",
		"sh", "-c", script, "sh", slurmNode, dir)
	s.cmd.Env = s.env
	s.cmd.Stdout, s.cmd.Stderr = log, log
	s.cmd.SysProcAttr = sys.RankProcAttr() // own group (no Ctrl-C), dies with pmibench
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("-slurm: start unshare: %w", err)
	}
	s.done = make(chan error, 1)
	go func() { s.done <- s.cmd.Wait() }() // stop receives it
	if err := s.waitIdle(ctx); err != nil {
		fmt.Fprintf(stderr, "pmibench: slurm: %v; its daemons said:\n%s", err, s.logTail())
		s.stop(stderr)
		return nil, fmt.Errorf("-slurm: %w", err)
	}
	fmt.Fprintf(stderr, "pmibench: slurm: node %s idle (munged, slurmctld, slurmd in %s)\n", slurmNode, dir)
	return s, nil
}

func (s *localSlurm) path(name string) string { return filepath.Join(s.dir, name) }

// freePorts returns k loopback TCP ports that were free a moment ago,
// taken below the kernel's ephemeral range when there is room: a port
// from that range, closed again, can be handed to any process's outgoing
// connection before slurmctld binds it (the tests run packages side by
// side), while one below it is taken only by a process that binds it.
func freePorts(k int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	const floor = 10000 // above the well-known and the usual service ports
	lo, _, err := sys.EphemeralPorts()
	for try := 0; err == nil && lo-floor > 100 && len(ports) < k && try < 200; try++ {
		p := floor + mrand.IntN(lo-floor)
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			ls = append(ls, l)
			ports = append(ports, p)
		}
	}
	for len(ports) < k {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// writeConfig writes the munge key, slurm.conf and cgroup.conf: the
// tests' configuration (tests/e2e/slurm_test.go) for one node on
// loopback, with the machine's CPU count and ports of its own.
func (s *localSlurm) writeConfig() error {
	key := make([]byte, 1024)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("make a munge key: %w", err)
	}
	if err := os.WriteFile(s.path("munge.key"), key, 0o600); err != nil {
		return err
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	conf := strings.Join(append(slices.Clone(slurmconf.Fixed),
		"ClusterName=pmibench",
		"SlurmctldHost="+slurmNode+"(127.0.0.1)",
		"SlurmctldPort="+strconv.Itoa(ports[0]),
		"SlurmdPort="+strconv.Itoa(ports[1]),
		"AuthInfo=socket="+s.path("munge.sock"),
		"StateSaveLocation="+s.path("state"),
		"SlurmdSpoolDir="+s.path("spool"),
		"SlurmctldPidFile="+s.path("slurmctld.pid"),
		"SlurmdPidFile="+s.path("slurmd.pid"),
		"SlurmctldLogFile="+s.path("slurmctld.log"),
		"SlurmdLogFile="+s.path("slurmd.log"),
		fmt.Sprintf("NodeName=%s NodeAddr=127.0.0.1 CPUs=%d State=UNKNOWN", slurmNode, runtime.NumCPU()),
		"PartitionName=bench Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
	), "\n") + "\n"
	cgroup := slurmconf.Cgroup(s.path("cgroup"))
	for name, text := range map[string]string{"slurm.conf": conf, "cgroup.conf": cgroup} {
		if err := os.WriteFile(s.path(name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	for _, d := range []string{"state", "spool", "cgroup"} {
		if err := os.Mkdir(s.path(d), 0o700); err != nil {
			return err
		}
	}
	return nil
}

// waitIdle polls sinfo until the node is idle.
func (s *localSlurm) waitIdle(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, slurmUpTimeout)
	defer cancel()
	var last string
	for {
		cmd := exec.CommandContext(ctx, "sinfo", "--noheader", "--format=%T %D")
		cmd.Env = s.env
		out, err := cmd.CombinedOutput()
		last = strings.TrimSpace(string(out))
		if err == nil && last == "idle 1" {
			return nil
		}
		select {
		case err := <-s.done:
			s.done <- err // for stop
			return fmt.Errorf("daemons ended (%v) before the node was idle", err)
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("node not idle within %v: sinfo said %q", slurmUpTimeout, last)
			}
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logTail is the end of each daemon's log.
func (s *localSlurm) logTail() string {
	var b strings.Builder
	for _, name := range []string{"daemons.out", "munged.log", "slurmctld.log", "slurmd.log"} {
		raw, err := os.ReadFile(s.path(name))
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "  %s: %s\n", name, strings.ReplaceAll(lastLines(string(raw), 5), "\n", "\n    "))
	}
	return b.String()
}

// stop kills the namespace's init (which takes every other process in
// the namespace with it: the kernel kills them and the init ends only
// once they are gone), waits for unshare, which ends when its child did,
// and removes the directory. It may be called once.
func (s *localSlurm) stop(stderr io.Writer) {
	if pid := s.initPid(); pid > 0 {
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
		}
	} else {
		// No child yet (or gone): unshare's --kill-child kills it. unshare
		// ignores SIGTERM while it waits for its child.
		_ = s.cmd.Process.Kill()
	}
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	if err := os.RemoveAll(s.dir); err != nil {
		fmt.Fprintf(stderr, "pmibench: slurm: remove %s: %v\n", s.dir, err)
	}
	fmt.Fprintf(stderr, "pmibench: slurm: stopped\n")
}

// initPid is the pid of unshare's child, the namespace's init, or 0.
func (s *localSlurm) initPid() int {
	pid := strconv.Itoa(s.cmd.Process.Pid)
	raw, err := os.ReadFile(filepath.Join("/proc", pid, "task", pid, "children"))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[0])
	return n
}

// launcher is srun with the MPI plugin for mpi ("" or "pmi": pmi2, the
// plugin that serves PMI-1 and PMI-2; "pmix": pmix). -O (overcommit)
// lets N ranks share the node's CPUs, as the other launchers do.
func (s *localSlurm) launcher(mpi string) Launcher {
	plugin := "pmi2"
	if mpi == "pmix" {
		plugin = "pmix"
	}
	return Launcher{Name: "slurm", Path: s.srun, Args: []string{"--mpi=" + plugin, "--overcommit"}, Env: s.env}
}
