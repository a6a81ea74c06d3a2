//go:build linux

package sys

import (
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations. These are the shared (non-private) forms: no
// FUTEX_PRIVATE_FLAG, so the kernel keys a waiter by the page's backing
// object and offset and a waiter in one process is woken by a waker in
// another process that maps the same memfd page.
const (
	futexWait = 0 // FUTEX_WAIT
	futexWake = 1 // FUTEX_WAKE
)

// FutexWait sleeps while *addr == val, at most timeout (a negative timeout
// waits without bound). The kernel compares *addr with val atomically with
// queueing the waiter, so a wake that follows a change of *addr is never
// lost. It returns nil when woken, when *addr already differed (EAGAIN) and
// on a signal (EINTR): callers re-check their condition in a loop. It
// returns ErrTimedOut when the timeout expired. addr must be 4-byte aligned
// and must not move: it points into a shared mapping, or into Go memory
// kept alive by the caller.
func FutexWait(addr *uint32, val uint32, timeout time.Duration) error {
	var ts unix.Timespec
	var tsp unsafe.Pointer
	if timeout >= 0 {
		ts = unix.NsecToTimespec(int64(timeout))
		tsp = unsafe.Pointer(&ts)
	}
	_, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val), uintptr(tsp), 0, 0)
	switch e {
	case 0, unix.EAGAIN, unix.EINTR:
		return nil
	case unix.ETIMEDOUT:
		return ErrTimedOut
	default:
		return fmt.Errorf("wait on futex: %w", errnoErr("futex(FUTEX_WAIT)", e))
	}
}

// FutexWake wakes at most n waiters sleeping in FutexWait on addr and
// returns how many it woke.
func FutexWake(addr *uint32, n int) (int, error) {
	r, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, uintptr(n), 0, 0, 0)
	if e != 0 {
		return 0, fmt.Errorf("wake futex: %w", errnoErr("futex(FUTEX_WAKE)", e))
	}
	return int(r), nil
}
