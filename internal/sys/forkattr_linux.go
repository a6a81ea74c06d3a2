//go:build linux

package sys

import (
	"fmt"
	"runtime"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// forkMask keeps StartWith's forks out while one of them has the
// process's umask set for its child (ForkAttr.Umask other than the
// process's own): those hold it exclusively, every other holds it
// shared, so forks asking for the process's own umask (a daemon's
// user's, most often) still run several at once. Forks made otherwise
// (not ranks) may see such a umask.
var forkMask sync.RWMutex

// ownUmask is the process's own umask, read once under forkMask held
// shared (so never while a StartWith has it changed): StartWith is the
// only code that changes it, and it puts it back.
var ownUmask = sync.OnceValues(Umask)

// isOwnUmask reports whether mask is the process's own umask; called
// with forkMask held shared, and only for a fork that asks for a umask
// (a daemon's job), so other processes never read it.
func isOwnUmask(mask int) bool {
	own, err := ownUmask()
	return err == nil && own == mask
}

// StartWith runs start — which forks a process, or makes a file with
// a Umask alone — on a thread that has the attributes a asks for, so
// that the child has them from its first instruction, and gives the
// thread back its own afterwards. A thread whose own could not be
// restored dies with the calling goroutine rather than serve others.
func StartWith(a ForkAttr, start func() error) error {
	forkMask.RLock()
	if a.Umask != nil && !isOwnUmask(*a.Umask) {
		forkMask.RUnlock()
		forkMask.Lock()
		defer forkMask.Unlock()
		defer unix.Umask(unix.Umask(*a.Umask))
	} else {
		defer forkMask.RUnlock()
	}
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

// Umask reads the process's file mode creation mask from
// /proc/self/status (Linux 4.7), where umask(2) would change it to read
// it.
func Umask() (int, error) {
	v, err := statusField(0, "Umask")
	if err != nil {
		return 0, fmt.Errorf("read umask: %w", err)
	}
	m, err := strconv.ParseUint(v, 8, 12)
	if err != nil {
		return 0, fmt.Errorf("read umask: %q in /proc/self/status: %w", v, err)
	}
	return int(m), nil
}
