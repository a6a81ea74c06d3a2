//go:build !linux

package sys

import "fmt"

// StartWith can set no thread attribute off Linux.
func StartWith(a ForkAttr, start func() error) error {
	if !a.zero() || a.Umask != nil {
		return ErrNotSupported
	}
	return start()
}

// Umask reads the process's file mode creation mask, which only Linux
// says without changing it.
func Umask() (int, error) { return 0, fmt.Errorf("read umask: %w", ErrNotSupported) }
