//go:build linux

package sys

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// OnlineCPUs returns how many CPUs this process may run on: the online CPUs
// in its affinity mask (sched_getaffinity(2)). This, not the machine's CPU
// count, is what decides whether busy-waiting parties can all run at once.
func OnlineCPUs() (int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 0, fmt.Errorf("count online cpus: %w", errnoErr("sched_getaffinity", err))
	}
	n := set.Count()
	if n < 1 {
		return 0, fmt.Errorf("count online cpus: affinity mask is empty")
	}
	return n, nil
}
