package node

import (
	"runtime"
	"sync"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// ThreadReserve is how many OS threads a process that forks ranks makes
// before its first rank, where a pids cgroup limits its tasks (a
// container's, a batch job's): the Go runtime makes a thread when every one it has is
// busy (a fork — forkers at once —, a read that blocks), and failing to
// is fatal (under cgo, SIGABRT), so a job whose ranks fill the cgroup
// while the rest are still forked must not need a new thread then. The
// runtime keeps idle threads and reuses them. launch's pids check counts
// them.
const ThreadReserve = forkers + 8

var reserveOnce sync.Once

// reserveThreads makes the process's thread reserve, once, where a pids
// cgroup limits the process's tasks. Not for RLIMIT_NPROC alone: it
// counts all of the user's processes, is far from reached in practice,
// and making the reserve costs a job of one rank 1.2x its start-up here.
func reserveThreads() {
	reserveOnce.Do(func() {
		if _, ok := sys.TaskRoom(); ok {
			holdThreads(ThreadReserve)
		}
	})
}

// holdThreads has n goroutines locked to n OS threads at once, then lets
// them go: the runtime makes the threads it lacks, and keeps them idle.
func holdThreads(n int) {
	var locked, done sync.WaitGroup
	release := make(chan struct{})
	locked.Add(n)
	for range n {
		done.Go(func() {
			runtime.LockOSThread()
			locked.Done()
			<-release
			runtime.UnlockOSThread()
		})
	}
	locked.Wait()
	close(release)
	done.Wait()
}
