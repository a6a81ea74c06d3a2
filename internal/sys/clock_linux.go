//go:build linux

package sys

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"os"

	"golang.org/x/sys/unix"
)

// MonotonicNanos reads CLOCK_MONOTONIC (clock_gettime(2)) in nanoseconds.
// It is one clock for every process on the machine, so readings taken by
// different processes there can be compared; the monotonic reading of a
// time.Time cannot, as it counts from its own process's start.
func MonotonicNanos() (int64, error) { return clockNanos(unix.CLOCK_MONOTONIC, "monotonic clock") }

// ProcessCPUNanos reads CLOCK_PROCESS_CPUTIME_ID: the CPU time, user and
// system, that every thread of this process has used, in nanoseconds.
func ProcessCPUNanos() (int64, error) {
	return clockNanos(unix.CLOCK_PROCESS_CPUTIME_ID, "process CPU clock")
}

// clockNanos reads clock id, called name in errors, in nanoseconds.
func clockNanos(id int32, name string) (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(id, &ts); err != nil {
		return 0, fmt.Errorf("read %s: %w", name, errnoErr("clock_gettime", err))
	}
	return ts.Nano(), nil
}

// BootID identifies this boot of this machine: a hash of the kernel's
// random boot id (/proc/sys/kernel/random/boot_id). Processes, network
// namespaces and containers on one machine share it, and with it
// CLOCK_MONOTONIC; two machines, or two boots, differ.
func BootID() (uint64, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return 0, fmt.Errorf("read boot id: %w", err)
	}
	id := bytes.TrimSpace(b)
	if len(id) == 0 {
		return 0, fmt.Errorf("read boot id: /proc/sys/kernel/random/boot_id is empty")
	}
	h := fnv.New64a()
	h.Write(id)
	return h.Sum64(), nil
}
