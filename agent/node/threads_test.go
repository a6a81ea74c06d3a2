package node

import (
	"testing"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// threads counts this process's OS threads.
func threads(t *testing.T) int {
	t.Helper()
	n, err := sys.Threads(0)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// holdThreads leaves the process with at least n threads once its
// goroutines are gone: the threads stay, idle, for the runtime to reuse
// (a goroutine that ended still locked would take its thread with it).
func TestHoldThreads(t *testing.T) {
	n := threads(t) + 4
	holdThreads(n)
	if got := threads(t); got < n {
		t.Errorf("%d threads after holding %d", got, n)
	}
}
