//go:build !linux

package sys

import (
	"fmt"
	"os"
)

// PeakRSS is implemented for Linux only.
func PeakRSS() (int64, error) { return 0, fmt.Errorf("read peak RSS: %w", ErrNotSupported) }

// FileMemory is implemented for Linux only.
func FileMemory(*os.File) (int64, error) {
	return 0, fmt.Errorf("stat file: %w", ErrNotSupported)
}
