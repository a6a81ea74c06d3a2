//go:build !linux

package sys

import "runtime"

// OnlineCPUs falls back to runtime.NumCPU, which honours the affinity mask
// where the platform has one.
func OnlineCPUs() (int, error) { return runtime.NumCPU(), nil }
