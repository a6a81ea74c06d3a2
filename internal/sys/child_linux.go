package sys

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Child is a process StartChild started: its pid, and where the kernel
// has pidfds (Linux 5.3) one pidfd in Go's network poller. Wait reaps it;
// Kill signals it until then, never after (its pid may be another
// process's once reaped).
type Child struct {
	Pid int

	mu     sync.Mutex // guards the fields below against Wait's reaping
	pidfd  *os.File   // non-blocking, in the poller; nil without pidfds
	reaped bool
}

// pidfdsWork reports, probed once, whether this kernel gives a child's
// pidfd at fork (clone's CLONE_PIDFD, Linux 5.2) and polls it (5.3).
var pidfdsWork = sync.OnceValue(func() bool {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
})

// StartChild forks and executes path with argv and env in dir, files as
// its descriptors 0, 1, 2, ... (made blocking, as os.StartProcess makes
// them), and attr, which it does not change. It is os.StartProcess for a
// launcher of many processes: the launcher holds one descriptor per child
// (os/exec's pidfd and a second one to wait in the poller made two: every
// descriptor a launcher holds is copied into each later child and closed
// again at its exec), and waiting takes no thread. A failure is an
// *os.PathError of Op "fork/exec", as os.StartProcess's.
func StartChild(path string, argv, env []string, dir string, files []*os.File, attr *syscall.SysProcAttr) (*Child, error) {
	fds := make([]uintptr, len(files))
	for i, f := range files {
		fds[i] = f.Fd()
	}
	a := *attr
	pidfd := -1
	if pidfdsWork() {
		a.PidFD = &pidfd
	}
	pid, _, err := syscall.StartProcess(path, argv, &syscall.ProcAttr{Dir: dir, Env: env, Files: fds, Sys: &a})
	runtime.KeepAlive(files)
	if err != nil {
		return nil, &os.PathError{Op: "fork/exec", Path: path, Err: err}
	}
	c := &Child{Pid: pid}
	if pidfd >= 0 {
		// In the poller only if non-blocking; failing that, Wait
		// blocks a thread as it does without pidfds.
		if unix.SetNonblock(pidfd, true) == nil {
			c.pidfd = os.NewFile(uintptr(pidfd), "pidfd")
		} else {
			unix.Close(pidfd)
		}
	}
	return c, nil
}

// Wait waits for the child to end — in Go's poller where it has a pidfd,
// so that a launcher waiting for tens of thousands of processes holds no
// thread per process (Go aborts past 10,000 threads, and each counts
// against RLIMIT_NPROC), else in a blocked waitid —, then reaps it and
// returns its wait status. Call it once.
func (c *Child) Wait() (syscall.WaitStatus, error) {
	// Ended, not reaped (WNOWAIT): Kill may still signal it meanwhile.
	var werr error
	ended := func(fd uintptr) bool {
		var info unix.Siginfo
		werr = unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		// Done once it ended (waitid filled info: si_signo SIGCHLD), or
		// at once where waitid cannot tell (P_PIDFD is Linux 5.4).
		return werr != nil || info.Signo != 0
	}
	var rc syscall.RawConn
	if c.pidfd != nil {
		rc, _ = c.pidfd.SyscallConn()
	}
	if rc == nil || rc.Read(ended) != nil || werr != nil {
		for {
			var info unix.Siginfo
			if err := unix.Waitid(unix.P_PID, c.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != unix.EINTR {
				break
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var ws syscall.WaitStatus
	var err error
	for {
		_, err = syscall.Wait4(c.Pid, &ws, 0, nil) // at once: it has ended
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	c.reaped = true
	if c.pidfd != nil {
		c.pidfd.Close()
		c.pidfd = nil
	}
	if err != nil {
		return 0, os.NewSyscallError("wait4", err)
	}
	return ws, nil
}

// Kill sends the child SIGKILL, through its pidfd where it has one;
// os.ErrProcessDone once Wait reaped it.
func (c *Child) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reaped {
		return os.ErrProcessDone
	}
	if c.pidfd != nil {
		rc, err := c.pidfd.SyscallConn() // not Fd: that would take the pidfd out of the poller
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.PidfdSendSignal(int(fd), unix.SIGKILL, nil, 0) }); err != nil {
			return err
		}
		return errnoErr("pidfd_send_signal", serr)
	}
	return errnoErr("kill", unix.Kill(c.Pid, unix.SIGKILL))
}

// WaitCode decodes a wait status: the exit code, or 128 plus the signal
// that killed the process (signaled true).
func WaitCode(ws syscall.WaitStatus) (code int, sig int, signaled bool) {
	if ws.Signaled() {
		return 128 + int(ws.Signal()), int(ws.Signal()), true
	}
	return ws.ExitStatus(), 0, false
}
