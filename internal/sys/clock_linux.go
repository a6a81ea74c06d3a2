//go:build linux

package sys

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// MonotonicNanos reads CLOCK_MONOTONIC (clock_gettime(2)) in nanoseconds.
// It is one clock for every process on the machine, so readings taken by
// different processes there can be compared; the monotonic reading of a
// time.Time cannot, as it counts from its own process's start.
func MonotonicNanos() (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read monotonic clock: %w", errnoErr("clock_gettime", err))
	}
	return ts.Nano(), nil
}

// ProcessCPUNanos reads CLOCK_PROCESS_CPUTIME_ID: the CPU time, user and
// system, that every thread of this process has used, in nanoseconds.
func ProcessCPUNanos() (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return 0, fmt.Errorf("read process CPU clock: %w", errnoErr("clock_gettime", err))
	}
	return ts.Nano(), nil
}
