//go:build linux

package sys

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// StartWith runs start — which forks a process — on a thread that has
// the attributes a asks for, so that the child has them from its first
// instruction, and gives the thread back its own afterwards. A thread
// whose own could not be restored dies with the calling goroutine rather
// than serve others.
func StartWith(a ForkAttr, start func() error) error {
	if a.zero() {
		return start()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// keep runs in a deferred restore that failed: the thread is never
	// unlocked, so it ends with the goroutine.
	keep := func(err error) {
		if err != nil {
			runtime.LockOSThread()
		}
	}
	if len(a.CPUs) > 0 {
		var want, old unix.CPUSet
		for _, c := range a.CPUs {
			want.Set(c)
		}
		if err := unix.SchedGetaffinity(0, &old); err != nil {
			return errnoErr("sched_getaffinity", err)
		}
		if err := unix.SchedSetaffinity(0, &want); err != nil {
			return fmt.Errorf("bind to cpus %v: %w", a.CPUs, errnoErr("sched_setaffinity", err))
		}
		defer func() { keep(unix.SchedSetaffinity(0, &old)) }()
	}
	if a.TimerSlack > 0 {
		old, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
		if err != nil {
			return errnoErr("prctl PR_GET_TIMERSLACK", err)
		}
		if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(a.TimerSlack.Nanoseconds()), 0, 0, 0); err != nil {
			return fmt.Errorf("timer slack %v: %w", a.TimerSlack, errnoErr("prctl PR_SET_TIMERSLACK", err))
		}
		defer func() { keep(unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(old), 0, 0, 0)) }()
	}
	return start()
}
