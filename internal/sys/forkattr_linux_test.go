//go:build linux

package sys

import (
	"fmt"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A child started by StartWith has the timer slack and CPUs asked for
// from its first instruction (it reads them from /proc/self after exec),
// and the forking thread has its own back afterwards.
func TestStartWith(t *testing.T) {
	cpus, err := AllowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread() // the thread StartWith lends: its own must come back
	defer runtime.UnlockOSThread()
	slack := func() int {
		v, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	var mask unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mask); err != nil {
		t.Fatal(err)
	}
	before := slack()
	last := cpus[len(cpus)-1]
	cmd := exec.Command("sh", "-c", "cat /proc/self/timerslack_ns; grep Cpus_allowed_list /proc/self/status")
	var out strings.Builder
	cmd.Stdout = &out
	if err := StartWith(ForkAttr{CPUs: []int{last}, TimerSlack: 3 * time.Millisecond}, cmd.Start); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	want := "3000000\nCpus_allowed_list:\t" + strconv.Itoa(last) + "\n"
	if out.String() != want {
		t.Errorf("child read %q, want %q", out.String(), want)
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil {
		t.Fatal(err)
	}
	if got := slack(); got != before || after != mask {
		t.Errorf("forking thread after StartWith: slack %d, cpus %v; want its own %d, %v", got, after, before, mask)
	}
	// Nothing asked: the child has the thread's own.
	cmd = exec.Command("cat", "/proc/self/timerslack_ns")
	out.Reset()
	cmd.Stdout = &out
	if err := StartWith(ForkAttr{}, cmd.Start); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(before) + "\n"; out.String() != want {
		t.Errorf("child of a zero ForkAttr read %q, want the thread's own %q", out.String(), want)
	}
}

// A child started by StartWith with a Umask has it, and the process has
// its own back afterwards, which Umask reads without changing it.
func TestStartWithUmask(t *testing.T) {
	before, err := Umask()
	if err != nil {
		t.Fatal(err)
	}
	mask := 0o077
	if before == mask {
		mask = 0o027
	}
	cmd := exec.Command("sh", "-c", "umask")
	var out strings.Builder
	cmd.Stdout = &out
	if err := StartWith(ForkAttr{Umask: &mask}, cmd.Start); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%04o\n", mask); out.String() != want {
		t.Errorf("child's umask %q, want %q", out.String(), want)
	}
	if after, err := Umask(); err != nil || after != before {
		t.Errorf("process's umask after StartWith: %#o (%v), want its own %#o", after, err, before)
	}
}

// TestStartWithOwnUmaskShared: a fork asking for the process's own umask
// (a daemon's job of the daemon's user) changes nothing process-wide, so
// it runs beside other forks instead of keeping them all out.
func TestStartWithOwnUmaskShared(t *testing.T) {
	own, err := Umask()
	if err != nil {
		t.Fatal(err)
	}
	forkMask.RLock() // a fork going on
	defer forkMask.RUnlock()
	done := make(chan error, 1)
	go func() { done <- StartWith(ForkAttr{Umask: &own}, func() error { return nil }) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("StartWith with the process's own umask waited for the fork going on")
	}
}
