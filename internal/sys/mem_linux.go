//go:build linux

package sys

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// PeakRSS is this process's peak resident set size in bytes (VmHWM in
// /proc/self/status).
func PeakRSS() (int64, error) {
	v, err := statusField(0, "VmHWM")
	if err != nil {
		return 0, fmt.Errorf("read peak RSS: %w", err)
	}
	kb, err := strconv.ParseInt(strings.TrimSuffix(v, " kB"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read peak RSS: VmHWM %q: %w", v, err)
	}
	return kb << 10, nil
}

// FileMemory is the memory f holds (fstat's blocks): for a memfd, the
// pages of it that were touched, whoever maps it — a shared segment's
// resident size, counted once however many processes map it.
func FileMemory(f *os.File) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", f.Name(), errnoErr("fstat", err))
	}
	return st.Blocks * 512, nil
}
