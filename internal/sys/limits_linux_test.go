//go:build linux

package sys

import (
	"os"
	"testing"
)

// Threads reads a process's thread count: this one's, by 0 or by its
// pid; a process that does not exist is an error.
func TestThreads(t *testing.T) {
	n, err := Threads(0)
	if err != nil || n < 1 {
		t.Fatalf("Threads(0) = %d, %v", n, err)
	}
	if m, err := Threads(os.Getpid()); err != nil || m < 1 {
		t.Errorf("Threads(own pid) = %d, %v", m, err)
	}
	if _, err := Threads(1 << 30); err == nil {
		t.Error("Threads of a pid that does not exist: no error")
	}
}

// The kernel's ephemeral port range is read and sane.
func TestEphemeralPorts(t *testing.T) {
	lo, hi, err := EphemeralPorts()
	if err != nil || lo < 1 || hi < lo || hi > 65535 {
		t.Fatalf("EphemeralPorts() = %d, %d, %v", lo, hi, err)
	}
}
