package daemon

import (
	"os"
	"strings"

	"github.com/fastpmi/fastpmi/internal/sys"
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
	if n, err := sys.Threads(0); err == nil {
		threads = n
	}
	return fds, memfds, threads
}
