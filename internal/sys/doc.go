// Package sys is fastpmi's one door to the kernel: the only package that
// imports golang.org/x/sys/unix or syscall. Everything above it (shm, netio,
// agent, launch) asks for kernel services through the small functions here.
//
// The model: each function wraps one system call, returns errors that name
// the operation ("create memfd: ..."), and maps ENOSYS (and the equivalent
// "unknown operation" answers of older kernels) to ErrNotSupported, so a
// caller can fall back with errors.Is instead of decoding errno values.
// Feature probes whose answer cannot change while the process runs (for
// example MADV_POPULATE_WRITE) are made once and cached.
//
// Platform code lives in _linux.go files; the _other.go files are honest
// stubs that return ErrNotSupported, so the module builds everywhere and the
// portable paths of its users still test off Linux.
//
// Lifetimes: functions returning an *os.File hand ownership of the
// descriptor to the caller, who closes it. Nothing here starts goroutines
// or keeps state beyond cached feature probes.
package sys

import "errors"

// ErrNotSupported reports that the kernel (or the platform) lacks a
// feature: the system call answered ENOSYS, or this build is not for Linux.
// Callers test for it with errors.Is and fall back.
var ErrNotSupported = errors.New("not supported by this kernel or platform")

// ErrTimedOut reports that a bounded wait (FutexWait) ended because its
// timeout expired, not because the word changed or a waker woke it.
var ErrTimedOut = errors.New("timed out")

// Room is how much more of one resource this process's control groups
// let it use: the least of limit − usage over its cgroup and every
// ancestor that sets a limit (containers and Slurm jobs limit a cgroup;
// /proc/meminfo and RLIMIT_NPROC do not see those limits).
type Room struct {
	Left  uint64 // Limit − Used, or 0 when the cgroup is already over
	Limit uint64 // the binding limit (bytes or tasks)
	Used  uint64 // the cgroup's usage when read
	File  string // the limit's file, e.g. /sys/fs/cgroup/pids/job1/pids.max
}
