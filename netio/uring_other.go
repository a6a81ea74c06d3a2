//go:build !linux

package netio

import "fmt"

func probeUring() (bool, string) { return false, "io_uring is Linux-only" }

func newUringBackend(*Config) (backend, error) {
	return nil, fmt.Errorf("start io_uring backend: %w", ErrNotSupported)
}
