//go:build !linux

package sys

import (
	"os"
	"time"
)

// ProcessLimit reports no limit off Linux.
func ProcessLimit() (uint64, error) { return 0, ErrNotSupported }

// MemAvailable is not known off Linux.
func MemAvailable() (uint64, error) { return 0, ErrNotSupported }

// MemoryRoom knows no control groups off Linux.
func MemoryRoom() (Room, bool) { return Room{}, false }

// TaskRoom knows no control groups off Linux.
func TaskRoom() (Room, bool) { return Room{}, false }

// IsProcessLimit knows no process limit off Linux.
func IsProcessLimit(err error) bool { return false }

// AllowedCPUs is not known off Linux.
func AllowedCPUs() ([]int, error) { return nil, ErrNotSupported }

// CPUPlace is where a CPU sits (Linux only).
type CPUPlace struct{ CPU, Core, Socket int }

// CPUPlaces knows no topology off Linux.
func CPUPlaces(cpus []int) []CPUPlace { return nil }

// IsTerminal is false off Linux.
func IsTerminal(f *os.File) bool { return false }

// WaitReadable is true off Linux: a read may block.
func WaitReadable(f *os.File, d time.Duration) bool { return true }

// InBackground is false off Linux (IsTerminal is).
func InBackground(f *os.File) bool { return false }

// OrphanedGroup is false off Linux.
func OrphanedGroup() bool { return false }

// FileLimit is not known off Linux.
func FileLimit() (uint64, error) { return 0, ErrNotSupported }

// FileSizeLimit is not known off Linux.
func FileSizeLimit() (uint64, error) { return 0, ErrNotSupported }

// IsFileSizeLimit knows no file size limit off Linux.
func IsFileSizeLimit(err error) bool { return false }

// IsFileLimit knows no descriptor limit off Linux.
func IsFileLimit(err error) bool { return false }

// FileRoom is not known off Linux.
func FileRoom() (room, limit uint64, ok bool) { return 0, 0, false }

// RaiseFileLimit is not supported off Linux.
func RaiseFileLimit(want uint64) (uint64, error) { return 0, ErrNotSupported }

// Threads is not known off Linux.
func Threads(pid int) (int, error) { return 0, ErrNotSupported }

// EphemeralPorts is not known off Linux.
func EphemeralPorts() (lo, hi int, err error) { return 0, 0, ErrNotSupported }
