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
