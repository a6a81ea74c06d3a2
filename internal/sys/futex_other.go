//go:build !linux

package sys

import (
	"fmt"
	"time"
)

// FutexWait needs futex(2), which only Linux has; callers fall back to
// polling with short sleeps.
func FutexWait(addr *uint32, val uint32, timeout time.Duration) error {
	return fmt.Errorf("wait on futex: %w", ErrNotSupported)
}

// FutexWake needs futex(2), which only Linux has.
func FutexWake(addr *uint32, n int) (int, error) {
	return 0, fmt.Errorf("wake futex: %w", ErrNotSupported)
}

// FutexVec needs futex_waitv(2), which only Linux has.
type FutexVec struct{ n int }

// FutexVecMax is the most words one FutexVec.Wait takes.
const FutexVecMax = 128

// Reset empties v.
func (v *FutexVec) Reset() { v.n = 0 }

// Len is the number of words in v.
func (v *FutexVec) Len() int { return v.n }

// Add appends a word.
func (v *FutexVec) Add(addr *uint32, val uint32) { v.n++ }

// Wait always fails with ErrNotSupported.
func (v *FutexVec) Wait(timeout time.Duration) (int, error) {
	return -1, fmt.Errorf("futex_waitv: %w", ErrNotSupported)
}
