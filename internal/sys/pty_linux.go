//go:build linux

package sys

import (
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// OpenPTY opens a new pseudo-terminal: the master side and the terminal
// (slave) a program reads as its controlling terminal. Tests use it to
// run pmirun as a user's shell would.
func OpenPTY() (master, tty *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		return nil, nil, errnoErr("unlock pty", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		m.Close()
		return nil, nil, errnoErr("pty number", err)
	}
	t, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, t, nil
}

// TerminalProcAttr starts a process as a shell starts a job in the
// foreground: a session of its own whose controlling terminal is its
// descriptor fd (its stdin, 0).
func TerminalProcAttr(fd int) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: fd}
}
