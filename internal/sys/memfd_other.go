//go:build !linux

package sys

import (
	"fmt"
	"os"
)

// MemfdCreate needs memfd_create(2), which only Linux has.
func MemfdCreate(name string) (*os.File, error) {
	return nil, fmt.Errorf("create memfd %q: %w", name, ErrNotSupported)
}

// SealSize needs memfd seals, which only Linux has.
func SealSize(f *os.File) error {
	return fmt.Errorf("seal memfd size: %w", ErrNotSupported)
}

// CanPopulateWrite is false: MADV_POPULATE_WRITE is Linux's.
func CanPopulateWrite() bool { return false }

// PopulateWrite needs MADV_POPULATE_WRITE; callers touch the pages instead.
func PopulateWrite(b []byte) error {
	return fmt.Errorf("populate pages: %w", ErrNotSupported)
}
