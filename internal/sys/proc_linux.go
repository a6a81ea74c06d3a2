//go:build linux

package sys

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Signals the launcher forwards to ranks or sends when it ends a job.
var (
	SIGINT  os.Signal = unix.SIGINT
	SIGTERM os.Signal = unix.SIGTERM
	SIGHUP  os.Signal = unix.SIGHUP
	SIGKILL os.Signal = unix.SIGKILL
	SIGQUIT os.Signal = unix.SIGQUIT
	SIGUSR1 os.Signal = unix.SIGUSR1
	SIGUSR2 os.Signal = unix.SIGUSR2
)

// ForwardedSignals are the signals pmirun catches and passes on to every
// rank (SIGQUIT included: caught, it prints no Go stack dump).
var ForwardedSignals = []os.Signal{SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}

// RankProcAttr returns the process attributes for a rank the launcher
// forks: its own session, and so its own process group (so the launcher
// can signal the rank and everything it started), and SIGKILL when the
// launcher dies (the parent-death signal), so that no rank outlives a
// killed launcher. The parent-death signal reaches the rank only, not
// what the rank started; the rest of its group is the guard's
// (internal/guard).
//
// The session, as Hydra gives its ranks: where the kernel groups tasks
// by session for the scheduler (autogroup, on by default in Debian's
// kernels), every rank then competes for the CPUs as a group of its own,
// as the other sessions on the machine do, instead of the whole job
// sharing the one group of the launcher's session. On a machine busy
// with other users' work that is the difference between a job's fair
// share and one share for the whole job: an MPICH hello of 16 ranks
// beside 20 busy processes took 10-12 s with ranks in the launcher's
// session and 1.6 s in their own (Hydra 1.4-1.6 s). A rank has no
// controlling terminal then: pmirun relays a terminal's input through a
// pipe anyway, and output goes through pipes.
func RankProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
}

// GuardProcAttr returns the process attributes for a process's guard
// (internal/guard): a process group of its own, so that neither a
// terminal's Ctrl-C (sent to the foreground group) nor a kill of the
// launcher's group reaches it before the launcher acts, and no
// parent-death signal: it must outlive its parent by the time it takes
// to kill the ranks' groups.
func GuardProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// SignalGroup sends sig to the process group pgid (the rank's group). A
// pgid below 2 is refused (EINVAL): kill(-1) would signal every process
// the user may signal, kill(0) the caller's own group.
func SignalGroup(pgid int, sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok || pgid < 2 {
		return syscall.EINVAL
	}
	return unix.Kill(-pgid, s)
}

// IsGroupGone reports whether err, from SignalGroup, says the group has
// no process left (ESRCH): its id may be reused from then on.
func IsGroupGone(err error) bool { return errors.Is(err, unix.ESRCH) }

// GroupGone reports whether the process group pgid has no process left
// (kill(-pgid, 0) answers ESRCH). Only then may a launcher forget a
// rank's group: the kernel does not reuse a group's id while any member
// lives, but may once the group is empty.
func GroupGone(pgid int) bool {
	return pgid >= 2 && errors.Is(unix.Kill(-pgid, 0), unix.ESRCH)
}

// SignalProcess sends sig to the one process pid (not its group); tests use
// it to kill an agent mid-job.
func SignalProcess(pid int, sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return syscall.EINVAL
	}
	return unix.Kill(pid, s)
}

// Socketpair returns a connected pair of Unix stream sockets as files,
// both close-on-exec; the launcher passes one end to a rank as one of its
// descriptors (StartChild), which clears close-on-exec in the child only.
func Socketpair(name string) (agentEnd, rankEnd *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, os.NewSyscallError("socketpair", err)
	}
	return os.NewFile(uintptr(fds[0]), name+"-agent"), os.NewFile(uintptr(fds[1]), name+"-rank"), nil
}

// OutputPipe returns a pipe for a child's output, both ends close-on-exec.
// The read end is in Go's poller (a read parks its goroutine, Close wakes
// it); the write end is not: it goes to the child, and the parent only
// closes it, so it skips what os.Pipe does for it (a registration with the
// poller, non-blocking mode, and both undone when exec.Cmd takes its
// descriptor and when it is closed: six system calls per pipe).
func OutputPipe() (r, w *os.File, err error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, os.NewSyscallError("pipe2", err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, os.NewSyscallError("fcntl", err)
	}
	return os.NewFile(uintptr(fds[0]), "|0"), os.NewFile(uintptr(fds[1]), "|1"), nil
}

// SignalName names a signal number ("killed", "terminated", ...).
func SignalName(sig int) string { return unix.SignalName(syscall.Signal(sig)) }

// ExitSignal is the signal that ended the process of ps, or 0 if it
// exited (or ps is nil).
func ExitSignal(ps *os.ProcessState) int {
	if ps == nil {
		return 0
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return int(ws.Signal())
	}
	return 0
}

// SignalNumber returns the number of a signal value.
func SignalNumber(s os.Signal) int {
	if ss, ok := s.(syscall.Signal); ok {
		return int(ss)
	}
	return 0
}

// Signal returns the signal with number n.
func Signal(n int) os.Signal { return syscall.Signal(n) }

// IsExecFormat reports whether err is exec's "exec format error"
// (ENOEXEC): the file is there but is no program this kernel runs.
func IsExecFormat(err error) bool { return errors.Is(err, syscall.ENOEXEC) }

// Renice sets the nice value of thread tid (a process's pid names its
// main thread); raising it (a lower priority) needs no privilege for a
// process of the same user. Threads the process made before keep theirs.
func Renice(tid, nice int) error {
	if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil {
		return errnoErr("setpriority", err)
	}
	return nil
}

// ReniceProcess sets the nice value of every thread process pid has now
// (Renice of each), best effort: it returns the first error.
func ReniceProcess(pid, nice int) error {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return err
	}
	var first error
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			if err := Renice(tid, nice); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// SetBlocking puts file descriptor fd in blocking mode (O_NONBLOCK
// cleared on its open file description): an os.File made from it then
// reads and writes in plain system calls, without Go's poller.
func SetBlocking(fd int) error {
	if err := unix.SetNonblock(fd, false); err != nil {
		return errnoErr("fcntl", err)
	}
	return nil
}

// SetProcessName sets the process's name as ps -C, top and pgrep show it
// (the main thread's comm, at most 15 bytes; longer names are cut).
func SetProcessName(name string) error {
	if len(name) > 15 {
		name = name[:15]
	}
	return os.WriteFile("/proc/self/comm", []byte(name), 0)
}

// Exec replaces this process with path, run with argv and env (execve):
// same pid, same descriptors but those marked close-on-exec. It returns
// only on failure.
func Exec(path string, argv, env []string) error {
	return os.NewSyscallError("execve", unix.Exec(path, argv, env))
}

// Pids lists the ids of the processes /proc shows, as far as it can be
// read.
func Pids() []int {
	ents, _ := os.ReadDir("/proc")
	pids := make([]int, 0, len(ents))
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// HasEnv reports whether the environment process pid started with
// (/proc/PID/environ: a process of another user cannot be read) holds
// the entry "KEY=VALUE".
func HasEnv(pid int, entry string) bool {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	for kv := range bytes.SplitSeq(env, []byte{0}) {
		if string(kv) == entry {
			return true
		}
	}
	return false
}
