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

// holdThreads leaves the process with at least n threads, idle for the
// runtime to reuse: asking again reuses them (the runtime may make one
// of its own meanwhile, no more).
func TestHoldThreads(t *testing.T) {
	before := threads(t)
	n := before + 4
	holdThreads(n)
	after := threads(t)
	if after < n {
		t.Errorf("%d threads after holding %d, had %d", after, n, before)
	}
	for range 3 {
		holdThreads(n)
	}
	if again := threads(t); again > after+1 {
		t.Errorf("holding %d three times more made %d more threads", n, again-after)
	}
}
