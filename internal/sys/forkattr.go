package sys

import "time"

// ForkAttr is what a child takes from the thread that forks it, set on
// that thread for the fork only (StartWith): set in the child after the
// fork, it would race with the child's first instructions, and Go's fork
// runs no code of ours in the child. The umask is the process's, not
// the thread's: set for one fork, it is set for that fork alone by
// keeping every other fork of StartWith out meanwhile.
type ForkAttr struct {
	// CPUs is the child's CPU affinity; nil = the thread's own.
	CPUs []int
	// TimerSlack is the child's timer slack (PR_SET_TIMERSLACK): how much
	// later than asked the kernel may end its timed sleeps, to end
	// several at once. Each thread the child creates inherits it, and it
	// survives exec. 0 = the thread's own (50 µs unless changed).
	TimerSlack time.Duration
	// Umask is the child's file mode creation mask; nil = the
	// process's own.
	Umask *int
}

// zero reports whether a asks nothing of the forking thread (Umask is
// the process's).
func (a ForkAttr) zero() bool { return len(a.CPUs) == 0 && a.TimerSlack == 0 }
