//go:build !unix

package sys

import (
	"fmt"
	"os"
)

// DupFile needs fcntl(F_DUPFD_CLOEXEC), a Unix call.
func DupFile(fd int, name string) (*os.File, error) {
	return nil, fmt.Errorf("duplicate descriptor %d: %w", fd, ErrNotSupported)
}
