package daemon

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// procCounts counts this process's open descriptors, its memfd segments
// among them, and its threads, from /proc; -1 where /proc does not say.
func procCounts() (fds, memfds, threads int) {
	fds, memfds, threads = -1, -1, -1
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		fds, memfds = 0, 0
		for _, e := range ents {
			fds++
			if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "/memfd:") {
				memfds++
			}
		}
		fds-- // the directory ReadDir had open
	}
	if f, err := os.Open("/proc/self/status"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "Threads:"); ok {
				if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
					threads = n
				}
			}
		}
	}
	return fds, memfds, threads
}
