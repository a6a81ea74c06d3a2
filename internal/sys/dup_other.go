//go:build !linux

package sys

import (
	"fmt"
	"os"
)

// DupFile needs fcntl(F_DUPFD_CLOEXEC), which this build does not reach.
func DupFile(fd int, name string) (*os.File, error) {
	return nil, fmt.Errorf("duplicate descriptor %d: %w", fd, ErrNotSupported)
}
