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

// FutexVec is the list of words one FutexVec.Wait sleeps on (futex_waitv,
// Linux 5.16): one thread waits for any of up to FutexVecMax words. Its
// entries are the kernel's struct futex_waitv; the words are shared
// futexes, like FutexWait's, woken by FutexWake.
type FutexVec struct {
	ws []futexWaitv
}

// futexWaitv is the kernel's struct futex_waitv.
type futexWaitv struct {
	val   uint64
	uaddr uint64
	flags uint32
	_     uint32
}

// The kernel's layout: 24 bytes.
var _ [24 - unsafe.Sizeof(futexWaitv{})]struct{}
var _ [unsafe.Sizeof(futexWaitv{}) - 24]struct{}

// FutexVecMax is the most words one FutexVec.Wait takes (FUTEX_WAITV_MAX).
const FutexVecMax = 128

const futex2SizeU32 = 0x02 // FUTEX2_SIZE_U32; no FUTEX2_PRIVATE: shared

// Reset empties v, keeping its memory.
func (v *FutexVec) Reset() { v.ws = v.ws[:0] }

// Len is the number of words in v.
func (v *FutexVec) Len() int { return len(v.ws) }

// Add appends a word to sleep on while *addr == val. addr must be 4-byte
// aligned and must not move while v holds it (shared mapping, or Go memory
// kept alive by the caller).
func (v *FutexVec) Add(addr *uint32, val uint32) {
	v.ws = append(v.ws, futexWaitv{val: uint64(val), uaddr: uint64(uintptr(unsafe.Pointer(addr))), flags: futex2SizeU32})
}

// Wait sleeps while every word of v holds its value, at most timeout (a
// negative timeout waits without bound). It returns the index of the word
// a FutexWake woke, or -1 when a word already differed (EAGAIN) or a
// signal interrupted the sleep: callers re-check their words. It returns
// ErrTimedOut when the timeout expired, and ErrNotSupported when the
// kernel has no futex_waitv (before 5.16) or a filter forbids it.
func (v *FutexVec) Wait(timeout time.Duration) (int, error) {
	if len(v.ws) == 0 || len(v.ws) > FutexVecMax {
		return -1, fmt.Errorf("futex_waitv: %d words, want 1 to %d", len(v.ws), FutexVecMax)
	}
	var ts unix.Timespec
	var tsp unsafe.Pointer
	if timeout >= 0 {
		// futex_waitv takes an absolute time on the given clock.
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			return -1, fmt.Errorf("futex_waitv: %w", err)
		}
		ts = unix.NsecToTimespec(unix.TimespecToNsec(ts) + int64(timeout))
		tsp = unsafe.Pointer(&ts)
	}
	r, _, e := unix.Syscall6(unix.SYS_FUTEX_WAITV, uintptr(unsafe.Pointer(&v.ws[0])), uintptr(len(v.ws)), 0,
		uintptr(tsp), unix.CLOCK_MONOTONIC, 0)
	switch e {
	case 0:
		return int(r), nil
	case unix.EAGAIN, unix.EINTR:
		return -1, nil
	case unix.ETIMEDOUT:
		return -1, ErrTimedOut
	case unix.ENOSYS, unix.EPERM:
		return -1, fmt.Errorf("futex_waitv: %w", ErrNotSupported)
	default:
		return -1, fmt.Errorf("wait on futexes: %w", errnoErr("futex_waitv", e))
	}
}
