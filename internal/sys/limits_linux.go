//go:build linux

package sys

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// softLimit returns the soft limit of resource; 0 means unlimited.
func softLimit(resource int) (uint64, error) {
	var r unix.Rlimit
	if err := unix.Getrlimit(resource, &r); err != nil {
		return 0, errnoErr("getrlimit", err)
	}
	if r.Cur == unix.RLIM_INFINITY {
		return 0, nil
	}
	return r.Cur, nil
}

// ProcessLimit returns the soft RLIMIT_NPROC, the processes (and threads)
// this user may have; 0 means unlimited.
func ProcessLimit() (uint64, error) {
	return softLimit(unix.RLIMIT_NPROC)
}

// MemAvailable returns the kernel's estimate of the memory available for
// new allocations without swapping (MemAvailable in /proc/meminfo), in
// bytes.
func MemAvailable() (uint64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read MemAvailable: %w", err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("read MemAvailable: %w", ErrNotSupported)
}

// AllowedCPUs returns the CPUs this process may run on (its affinity
// mask), in increasing order.
func AllowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, errnoErr("sched_getaffinity", err)
	}
	var cpus []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// CPUPlace is where a CPU (hardware thread) sits: its core and socket
// (package) numbers, from sysfs; -1 when the kernel does not say.
type CPUPlace struct{ CPU, Core, Socket int }

// CPUPlaces returns the place of each CPU in cpus.
func CPUPlaces(cpus []int) []CPUPlace {
	out := make([]CPUPlace, len(cpus))
	for i, c := range cpus {
		dir := "/sys/devices/system/cpu/cpu" + strconv.Itoa(c) + "/topology/"
		out[i] = CPUPlace{CPU: c, Core: readInt(dir + "core_id"), Socket: readInt(dir + "physical_package_id")}
	}
	return out
}

func readInt(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// WaitReadable waits up to d for f to have input (or to have hung up,
// so that a read returns at once) and reports whether it has. Unlike a
// read, it never stops a background job (SIGTTIN).
func WaitReadable(f *os.File, d time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, int(d.Milliseconds()))
	return err == nil && n > 0 && fds[0].Revents != 0
}

// InBackground reports whether terminal f is this process's controlling
// terminal and another process group is its foreground: a read of it
// would stop the process (SIGTTIN), as a shell's background job.
func InBackground(f *os.File) bool {
	pgrp, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCGPGRP)
	return err == nil && pgrp != unix.Getpgrp()
}

// OrphanedGroup reports whether this process's group is orphaned: no
// member has a parent in another group of the same session, so no shell
// of the session can bring it to the foreground again (its job-control
// shell exited, or it was started as "(cmd &)"). The kernel then answers
// a background read of the terminal with EIO instead of stopping the
// reader. Errors reading /proc answer false.
func OrphanedGroup() bool {
	pgrp := unix.Getpgrp()
	sid, err := unix.Getsid(0)
	if err != nil {
		return false
	}
	// The common case first: the parent is the shell that controls the
	// job.
	if ppgrp, psid, ok := procGroup(unix.Getppid()); ok && ppgrp != pgrp && psid == sid {
		return false
	}
	pids := Pids()
	if len(pids) == 0 { // /proc unreadable: it shows this process at least
		return false
	}
	for _, pid := range pids {
		ppid, g, s, ok := procStat(pid)
		if !ok || g != pgrp || s != sid {
			continue
		}
		if pg, ps, ok := procGroup(ppid); ok && pg != pgrp && ps == sid {
			return false
		}
	}
	return true
}

// procGroup is process pid's group and session.
func procGroup(pid int) (pgrp, sid int, ok bool) {
	_, pgrp, sid, ok = procStat(pid)
	return pgrp, sid, ok
}

// procStat reads process pid's parent, group and session from
// /proc/PID/stat ("pid (comm) state ppid pgrp session ...", comm holding
// any bytes, parentheses too).
func procStat(pid int) (ppid, pgrp, sid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 4 {
		return 0, 0, 0, false
	}
	var e1, e2, e3 error
	ppid, e1 = strconv.Atoi(f[1])
	pgrp, e2 = strconv.Atoi(f[2])
	sid, e3 = strconv.Atoi(f[3])
	return ppid, pgrp, sid, e1 == nil && e2 == nil && e3 == nil
}

// FileLimit returns the soft RLIMIT_NOFILE, the descriptors this process
// may hold (Go raises it to the hard limit at start-up); 0 = unlimited.
func FileLimit() (uint64, error) {
	return softLimit(unix.RLIMIT_NOFILE)
}

// FileSizeLimit returns the soft RLIMIT_FSIZE, the largest file this
// process may make (a memfd's size too), in bytes; 0 means unlimited.
func FileSizeLimit() (uint64, error) {
	return softLimit(unix.RLIMIT_FSIZE)
}

// IsFileSizeLimit reports whether err failed at the file size limit
// (EFBIG: RLIMIT_FSIZE).
func IsFileSizeLimit(err error) bool { return errors.Is(err, syscall.EFBIG) }

// IsFileLimit reports whether err failed for want of a descriptor: this
// process's RLIMIT_NOFILE (EMFILE) or the system's (ENFILE).
func IsFileLimit(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// FileRoom is how many descriptors a launcher that counts its own lets
// itself hold before it refuses more work: RLIMIT_NOFILE less a sixteenth,
// kept for what it does not count (forks in flight, whose descriptors are
// open only while they fork; jobs ending). It also returns the limit; ok
// is false when the limit is unknown or unlimited.
func FileRoom() (room, limit uint64, ok bool) {
	lim, err := FileLimit()
	if err != nil || lim == 0 {
		return 0, 0, false
	}
	return lim - lim/16, lim, true
}

// RaiseFileLimit raises RLIMIT_NOFILE, soft and hard, to want (raising
// the hard limit needs CAP_SYS_RESOURCE), or else the soft limit to the
// hard one, and returns the soft limit now in force; processes started
// after it inherit it (Go restores no other limit in them). It never
// lowers a limit.
func RaiseFileLimit(want uint64) (uint64, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, errnoErr("getrlimit", err)
	}
	if r.Max != unix.RLIM_INFINITY && r.Max < want {
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: want}) == nil {
			return want, nil
		}
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: r.Max, Max: r.Max}); err != nil {
		return r.Cur, errnoErr("setrlimit", err)
	}
	return r.Max, nil
}

// Threads returns the number of threads of process pid (0: this one),
// from the Threads line of its /proc status.
func Threads(pid int) (int, error) {
	v, err := statusField(pid, "Threads")
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("read Threads %q of /proc status: %w", v, err)
	}
	return n, nil
}

// statusField returns the value of field name ("Threads", "Umask",
// "VmHWM") of process pid's /proc status (0: this one), spaces trimmed.
func statusField(pid int, name string) (string, error) {
	path := "/proc/self/status"
	if pid != 0 {
		path = "/proc/" + strconv.Itoa(pid) + "/status"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("%s: no %s line: %w", path, name, ErrNotSupported)
}

// EphemeralPorts returns the range the kernel picks local ports from for
// connections that do not bind one (net.ipv4.ip_local_port_range).
func EphemeralPorts() (lo, hi int, err error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("read ip_local_port_range: %q", b)
	}
	if lo, err = strconv.Atoi(f[0]); err == nil {
		hi, err = strconv.Atoi(f[1])
	}
	if err != nil || lo < 1 || hi < lo || hi > 65535 {
		return 0, 0, fmt.Errorf("read ip_local_port_range: %q", b)
	}
	return lo, hi, nil
}
