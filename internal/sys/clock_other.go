//go:build !linux

package sys

import "fmt"

// MonotonicNanos is implemented for Linux only, where CLOCK_MONOTONIC is
// known to be one clock for the whole machine.
func MonotonicNanos() (int64, error) {
	return 0, fmt.Errorf("read monotonic clock: %w", ErrNotSupported)
}

// ProcessCPUNanos is implemented for Linux only.
func ProcessCPUNanos() (int64, error) {
	return 0, fmt.Errorf("read process CPU clock: %w", ErrNotSupported)
}

// BootID is implemented for Linux only.
func BootID() (uint64, error) {
	return 0, fmt.Errorf("read boot id: %w", ErrNotSupported)
}
