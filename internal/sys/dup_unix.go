//go:build unix

package sys

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// DupFile returns a close-on-exec duplicate of descriptor fd as a file of
// the caller's, leaving fd as it is: a descriptor named by an inherited
// variable can be tried without taking it from the program when it
// turns out not to be what the variable says.
func DupFile(fd int, name string) (*os.File, error) {
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicate descriptor %d: %w", fd, err)
	}
	return os.NewFile(uintptr(d), name), nil
}
