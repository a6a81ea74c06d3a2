//go:build linux

package sys

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// MemfdCreate creates an anonymous, size-zero, memory-backed file with
// memfd_create(2). The file has no name in any file system (nothing appears
// in /dev/shm and nothing is left behind when the process dies); name only
// labels it in /proc/PID/fd. The descriptor is close-on-exec (MFD_CLOEXEC):
// pass it to a child with exec.Cmd.ExtraFiles, which clears the flag in the
// child only. Sealing is allowed (MFD_ALLOW_SEALING) so that SealSize can
// freeze the size once the file is truncated to its final length.
func MemfdCreate(name string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("create memfd %q: %w", name, errnoErr("memfd_create", err))
	}
	return os.NewFile(uintptr(fd), "memfd:"+name), nil
}

// SealSize adds F_SEAL_SHRINK, F_SEAL_GROW and F_SEAL_SEAL to a memfd: from
// then on no process holding the descriptor can change its size, so a
// mapping of the whole file can never fault with SIGBUS because another
// process truncated it.
func SealSize(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("seal memfd size: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		_, serr = unix.FcntlInt(fd, unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
	}); err != nil {
		return fmt.Errorf("seal memfd size: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("seal memfd size: %w", errnoErr("fcntl(F_ADD_SEALS)", serr))
	}
	return nil
}

// canPopulateWrite probes MADV_POPULATE_WRITE (Linux 5.14) once, on a
// shared page of its own.
var canPopulateWrite = sync.OnceValue(func() bool {
	b, err := unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return false
	}
	defer unix.Munmap(b)
	return unix.Madvise(b, unix.MADV_POPULATE_WRITE) == nil
})

// CanPopulateWrite reports whether this kernel has MADV_POPULATE_WRITE,
// which PopulateWrite needs.
func CanPopulateWrite() bool { return canPopulateWrite() }

// PopulateWrite pre-faults b (a shared mapping) for writing with
// madvise(MADV_POPULATE_WRITE): the kernel allocates and zeroes every page
// now, in one call, instead of on first touch, and writes none of b's
// bytes (others may use them meanwhile). It returns an error wrapping
// ErrNotSupported on kernels without the advice (CanPopulateWrite); the
// caller then touches the pages itself.
func PopulateWrite(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if !canPopulateWrite() {
		return fmt.Errorf("populate pages: %w", ErrNotSupported)
	}
	err := unix.Madvise(b, unix.MADV_POPULATE_WRITE)
	if err != nil {
		return fmt.Errorf("populate pages: %w", os.NewSyscallError("madvise", err))
	}
	return nil
}

// errnoErr wraps a system call's errno: ENOSYS also wraps ErrNotSupported.
func errnoErr(op string, err error) error {
	if errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("%w: %w", ErrNotSupported, os.NewSyscallError(op, err))
	}
	return os.NewSyscallError(op, err)
}
