package node

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// threads counts this process's OS threads.
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads line in /proc/self/status")
	return 0
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
